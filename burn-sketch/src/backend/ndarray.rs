//! The sketched product on NdArray, as direct matrix products on the backend's arrays.
//!
//! The algebra is the tensor-op path's ([`tensor_ops`]); only the plumbing differs. Why it
//! exists: burn-ndarray 0.21's `matmul` reshapes both operands and its result through a
//! copy, and zero-fills the result, on every call. A dense layer hardly notices, but the
//! sketched products are thin (`2Tk` of a few dozen columns), so those copies cost more
//! than the arithmetic (the book's CPU benchmark page has the measurements).
//!
//! Here every product is one [`general_mat_mul`] (matrixmultiply, the engine burn-ndarray
//! itself uses) on views of the tensors' arrays, whatever their strides:
//! - the four factors are packed into the layer's two dense factors (`A = [S1 | U2]`,
//!   `[d_in, 2Tk]`, and `B = [U1; S2]`, `[2Tk, d_out]`, in the packed order
//!   [`SketchWeights`] defines), a copy of the weights only, so that
//!   each product over `x` or `y` reads that big operand once, for any `T`;
//! - `1/(2T)` rides on the products of the thin operand as their `alpha`;
//! - the bias is the output product's starting value (`beta = 1`), not a second pass over
//!   `y`.
//!
//! Float tensors NdArray holds as `f32` or `f64` take this path; any other element type falls
//! back to the tensor-op path.

use ::ndarray::linalg::general_mat_mul;
use ::ndarray::{Array2, Array3, ArrayView1, ArrayView2, ArrayView3, Axis, Ix1, Ix2, Ix3, s};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn_ndarray::{NdArray, NdArrayTensor, SharedArray};

use super::{
    Activation, ActivationExt, KernelStrategy, SketchBackend, SketchGradients, SketchWeights,
    WantedGradients, float, tensor_ops,
};

impl<E, I, Q> SketchBackend for NdArray<E, I, Q>
where
    NdArrayTensor: From<SharedArray<E>> + From<SharedArray<I>>,
    Self: Backend<FloatTensorPrimitive = NdArrayTensor>,
{
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
        activation: Activation,
        _strategy: KernelStrategy,
    ) -> Tensor<Self, 2> {
        // The activation is a tensor operation after the product: NdArray is the reference
        // CPU backend, Flex the fast one.
        let output = forward::<f32, Self>(&x, &weights, bias.as_ref())
            .or_else(|| forward::<f64, Self>(&x, &weights, bias.as_ref()))
            .unwrap_or_else(|| tensor_ops::sketched_linear(x, weights, bias));
        activation.apply(output)
    }

    fn sketched_linear_backward(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        grad_output: Tensor<Self, 2>,
        wanted: WantedGradients,
        _strategy: KernelStrategy,
    ) -> SketchGradients<Self> {
        backward::<f32, Self>(&x, &weights, &grad_output, wanted)
            .or_else(|| backward::<f64, Self>(&x, &weights, &grad_output, wanted))
            .unwrap_or_else(|| {
                tensor_ops::sketched_linear_backward(x, weights, grad_output, wanted)
            })
    }
}

/// A float element type NdArray stores, and the matching variant of its tensor primitive.
trait Element: ::ndarray::LinalgScalar + Send + Sync {
    fn from_f64(value: f64) -> Self;
    /// The array of `tensor` if it holds this element type (sharing it, not copying).
    fn array(tensor: NdArrayTensor) -> Option<SharedArray<Self>>;
    fn tensor(array: SharedArray<Self>) -> NdArrayTensor;
}

macro_rules! element {
    ($ty:ty, $variant:ident) => {
        impl Element for $ty {
            fn from_f64(value: f64) -> Self {
                value as $ty
            }
            fn array(tensor: NdArrayTensor) -> Option<SharedArray<Self>> {
                match tensor {
                    NdArrayTensor::$variant(storage) => Some(storage.into_shared()),
                    _ => None,
                }
            }
            fn tensor(array: SharedArray<Self>) -> NdArrayTensor {
                array.into()
            }
        }
    };
}
element!(f32, F32);
element!(f64, F64);

/// The arrays behind a call's tensors, all of element type `F`.
struct Arrays<F> {
    s1s: SharedArray<F>,
    s2s: SharedArray<F>,
    u1s: SharedArray<F>,
    u2s: SharedArray<F>,
}

impl<F: Element> Arrays<F> {
    /// `None` unless every factor holds `F`.
    fn of<B: Backend<FloatTensorPrimitive = NdArrayTensor>>(
        weights: &SketchWeights<B>,
    ) -> Option<Self> {
        Some(Self {
            s1s: array(&weights.s1s)?,
            s2s: array(&weights.s2s)?,
            u1s: array(&weights.u1s)?,
            u2s: array(&weights.u2s)?,
        })
    }

    fn view(array: &SharedArray<F>) -> ArrayView3<'_, F> {
        array
            .view()
            .into_dimensionality::<Ix3>()
            .expect("factors are rank 3")
    }

    /// `A = [S1_1 … S1_T | U2_1 … U2_T]`, `[d_in, 2Tk]`.
    ///
    /// This column order differs from [`SketchWeights::factors`] (term by term), which is
    /// free here because both products use the same order.
    fn input_factor(&self) -> Array2<F> {
        pack([&self.s1s, &self.u2s], Axis(1))
    }

    /// `B = [U1_1; …; U1_T; S2_1; …; S2_T]`, `[2Tk, d_out]`: two contiguous blocks.
    fn output_factor(&self) -> Array2<F> {
        pack([&self.u1s, &self.s2s], Axis(0))
    }

    /// `α = 1/(2T)`.
    fn scale(&self) -> F {
        F::from_f64(1.0 / (2.0 * self.s1s.shape()[0] as f64))
    }
}

/// The `2T` matrices of two `[T, …]` factors side by side along `axis` of one matrix.
fn pack<F: Element>(halves: [&SharedArray<F>; 2], axis: Axis) -> Array2<F> {
    let blocks: Vec<ArrayView2<'_, F>> = halves
        .iter()
        .flat_map(|half| Arrays::view(half).into_outer_iter())
        .collect();
    ::ndarray::concatenate(axis, &blocks).expect("the factors of one layer fit together")
}

/// The array behind `tensor`, if it holds `F`.
fn array<B, const D: usize, F>(tensor: &Tensor<B, D>) -> Option<SharedArray<F>>
where
    B: Backend<FloatTensorPrimitive = NdArrayTensor>,
    F: Element,
{
    F::array(tensor.clone().into_primitive().tensor())
}

fn view2<F>(array: &SharedArray<F>) -> ArrayView2<'_, F> {
    array.view().into_dimensionality::<Ix2>().expect("rank 2")
}

fn tensor<B, F, D, const N: usize>(array: ::ndarray::Array<F, D>) -> Tensor<B, N>
where
    B: Backend<FloatTensorPrimitive = NdArrayTensor>,
    F: Element,
    D: ::ndarray::Dimension,
{
    float(F::tensor(array.into_dyn().into_shared()))
}

/// `a·b` scaled by `alpha`, into a new array.
fn product<F: Element>(alpha: F, a: &ArrayView2<'_, F>, b: &ArrayView2<'_, F>) -> Array2<F> {
    let mut c = Array2::zeros((a.nrows(), b.ncols()));
    general_mat_mul(alpha, a, b, F::zero(), &mut c);
    c
}

fn forward<F, B>(
    x: &Tensor<B, 2>,
    weights: &SketchWeights<B>,
    bias: Option<&Tensor<B, 1>>,
) -> Option<Tensor<B, 2>>
where
    F: Element,
    B: Backend<FloatTensorPrimitive = NdArrayTensor>,
{
    let arrays = Arrays::<F>::of(weights)?;
    let x = array::<B, 2, F>(x)?;
    let bias = match bias {
        Some(bias) => Some(array::<B, 1, F>(bias)?),
        None => None,
    };
    let x = view2(&x);
    let input_factor = arrays.input_factor();
    let output_factor = arrays.output_factor();

    let p = product(arrays.scale(), &x, &input_factor.view());
    let shape = (x.nrows(), output_factor.ncols());
    let (mut y, beta) = match &bias {
        Some(bias) => {
            // Row by row copies of the bias: a broadcast view's `to_owned` goes element-wise.
            let bias: ArrayView1<'_, F> = bias.view().into_dimensionality::<Ix1>().ok()?;
            let rows = bias.to_vec().repeat(shape.0);
            (Array2::from_shape_vec(shape, rows).ok()?, F::one())
        }
        None => (Array2::zeros(shape), F::zero()),
    };
    general_mat_mul(F::one(), &p, &output_factor, beta, &mut y);
    Some(tensor(y))
}

/// The closed forms of [`tensor_ops::sketched_linear_backward`] with `A` and `B` as above:
/// `∂P = α·∂y·Bᵀ`, `∂x = ∂P·Aᵀ`, `∂S1_t`/`∂U2_t` = `xᵀ·∂P` (term `t`'s block), and
/// `∂U1`/`∂S2` = `α·(x·A)ᵀ·∂y` (their half).
///
/// The factor gradients are written straight into the factors' layouts: `[T, k, d_out]` is
/// `[Tk, d_out]` in memory, so each output-side one is a single product; the input-side ones
/// are one product per term. The packed `A` and `B` are dropped as soon as their products are
/// done, so the extra memory over the tensor-op path is one copy of the weights at a time.
fn backward<F, B>(
    x: &Tensor<B, 2>,
    weights: &SketchWeights<B>,
    grad_output: &Tensor<B, 2>,
    wanted: WantedGradients,
) -> Option<SketchGradients<B>>
where
    F: Element,
    B: Backend<FloatTensorPrimitive = NdArrayTensor>,
{
    let arrays = Arrays::<F>::of(weights)?;
    let x = array::<B, 2, F>(x)?;
    let grad_output = array::<B, 2, F>(grad_output)?;
    let (x, grad_output) = (view2(&x), view2(&grad_output));
    let (terms, d_input, k) = Arrays::view(&arrays.s1s).dim();
    let (half, d_output) = (terms * k, grad_output.ncols());
    let scale = arrays.scale();

    let grad_p = (wanted.x || wanted.s1s || wanted.u2s)
        .then(|| product(scale, &grad_output, &arrays.output_factor().t()));
    let (grad_x, p) = {
        let input_factor = arrays.input_factor();
        let grad_x = grad_p
            .as_ref()
            .filter(|_| wanted.x)
            .map(|grad_p| product(F::one(), &grad_p.view(), &input_factor.t()));
        let p = (wanted.u1s || wanted.s2s).then(|| product(scale, &x, &input_factor.view()));
        (grad_x, p)
    };

    // Half `h` (0: S1, 1: U2) of `∂A`, as `[T, d_in, k]`.
    let input_grad = |h: usize| {
        let grad_p = grad_p.as_ref().expect("wanted");
        let mut out = Array3::zeros((terms, d_input, k));
        for (t, mut term) in out.outer_iter_mut().enumerate() {
            let block = h * terms + t;
            let columns = grad_p.slice(s![.., block * k..(block + 1) * k]);
            general_mat_mul(F::one(), &x.t(), &columns, F::zero(), &mut term);
        }
        tensor(out)
    };
    // Half `h` (0: U1, 1: S2) of `∂B`, as `[T, k, d_out]`.
    let output_grad = |h: usize| {
        let p = p.as_ref().expect("wanted");
        let columns = p.slice(s![.., h * half..(h + 1) * half]);
        let mut out = Array2::zeros((half, d_output));
        general_mat_mul(F::one(), &columns.t(), &grad_output, F::zero(), &mut out);
        tensor(
            out.into_shape_with_order((terms, k, d_output))
                .expect("a standard-layout array"),
        )
    };

    Some(SketchGradients {
        x: grad_x.map(tensor),
        s1s: wanted.s1s.then(|| input_grad(0)),
        u2s: wanted.u2s.then(|| input_grad(1)),
        u1s: wanted.u1s.then(|| output_grad(0)),
        s2s: wanted.s2s.then(|| output_grad(1)),
    })
}
