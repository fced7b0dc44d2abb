//! The sketched product on Flex, as direct `gemm` calls on the backend's buffers.
//!
//! The algebra is the tensor-op path's ([`tensor_ops`]) and NdArray's; what this path adds
//! over Flex's own (already copy-free, `gemm`-based) `matmul` is what a chain of tensor
//! operations cannot express:
//! - the four factors are packed once per call into the layer's two dense factors `A` and
//!   `B` ([packed order](SketchWeights#packed-order)), so each product over `x` or `y` reads
//!   its big operand once for any `T` (the tensor-op path concatenates `P` and `B` and, for
//!   `T > 1`, runs a broadcast batched product);
//! - `1/(2T)` is the `beta` of the product that writes the thin `P` (or `∂P`), not a pass of
//!   its own;
//! - the bias is one more rank of the output product, not a second pass over `y`;
//! - an [`Activation`] is applied right after the output product, by the same threads, as
//!   one vectorised loop per block of rows ([`activated_product`]);
//! - transposed operands (`Bᵀ`, `Aᵀ`, `xᵀ`, `Pᵀ`) are strides handed to `gemm`, never copies,
//!   and every gradient is written straight into its factor's layout;
//! - how a product uses the threads depends on its shape ([`Blocks`]).
//!
//! Float tensors Flex holds as `f32`, `f64` or `f16` take this path on `gemm` (`f16`
//! products accumulate as `gemm`'s `f16` kernels do); `bf16` ones take it on
//! [`bf16`](burn_cpu_kernels::bf16)'s kernel, accumulating in `f32` (Flex's own `matmul`
//! multiplies `bf16` through `f32` copies).

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Tensor, bf16, f16};
use burn_cpu_kernels::convert::{HalfFloat, through_f32};
use burn_fast_cpu::flex_view::{self, FlexFloat};
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::{
    Activation, ActivationExt, KernelStrategy, SketchBackend, SketchGradients, SketchWeights,
    WantedGradients, burn_activation_backward, float, tensor_ops,
};
use burn_cpu_kernels::{MatRef, gemm};

/// A strided matrix over a tensor's buffer.
type Matrix<'a, E> = MatRef<'a, E>;

impl SketchBackend for Flex {
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
        activation: Activation,
        _strategy: KernelStrategy,
    ) -> Tensor<Self, 2> {
        let bias_primitive = bias.clone().map(|bias| bias.into_primitive().tensor());
        let operands = Operands::new(&x, &weights, bias_primitive);
        match operands.dtype() {
            Some(DType::F32) => forward::<f32>(&operands, activation),
            Some(DType::F64) => forward::<f64>(&operands, activation),
            Some(DType::F16) => forward::<f16>(&operands, activation),
            Some(DType::BF16) => forward::<bf16>(&operands, activation),
            _ => activation.apply(tensor_ops::sketched_linear(x, weights, bias)),
        }
    }

    /// The loops of the fused forward (`Element::activate`), so that a tracked forward
    /// computes the same values as an untracked one.
    fn activate(z: Tensor<Self, 2>, activation: Activation) -> Tensor<Self, 2> {
        let p = z.clone().into_primitive().tensor();
        let activated = match p.dtype() {
            DType::F32 => activated::<f32>(&p, activation),
            DType::F64 => activated::<f64>(&p, activation),
            DType::F16 => activated::<f16>(&p, activation),
            DType::BF16 => activated::<bf16>(&p, activation),
            _ => None,
        };
        activated.unwrap_or_else(|| activation.apply(z))
    }

    /// Burn's `gelu_backward` on Flex calls `libm` twice per value; ours is one vectorised
    /// loop ([`Activation::backward_to`]).
    fn activation_backward(
        kept: Tensor<Self, 2>,
        grad_output: Tensor<Self, 2>,
        activation: Activation,
    ) -> Tensor<Self, 2> {
        let f32_of = |t: &Tensor<Self, 2>| {
            Some(t.clone().into_primitive().tensor()).filter(|p| p.dtype() == DType::F32)
        };
        let (kept_f32, grad_f32) = (f32_of(&kept), f32_of(&grad_output));
        match (
            kept_f32.as_ref().and_then(flex_view::values::<f32>),
            &grad_f32,
        ) {
            (Some(kept), Some(grad_primitive)) => {
                // `∂y` is often a broadcast (the gradient of a sum): Burn reads it into order.
                let mut grad = match flex_view::values::<f32>(grad_primitive) {
                    Some(grad) => grad.to_vec(),
                    None => grad_output
                        .clone()
                        .into_data()
                        .into_vec::<f32>()
                        .expect("f32"),
                };
                activation.backward_to(kept, &mut grad);
                tensor(grad, grad_output.dims())
            }
            _ => burn_activation_backward(kept, grad_output, activation),
        }
    }

    fn sketched_linear_backward(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        grad_output: Tensor<Self, 2>,
        wanted: WantedGradients,
        _strategy: KernelStrategy,
    ) -> SketchGradients<Self> {
        let grad_primitive = grad_output.clone().into_primitive().tensor();
        let operands = Operands::new(&x, &weights, Some(grad_primitive));
        match operands.dtype() {
            Some(DType::F32) => backward::<f32>(&operands, wanted),
            Some(DType::F64) => backward::<f64>(&operands, wanted),
            Some(DType::F16) => backward::<f16>(&operands, wanted),
            Some(DType::BF16) => backward::<bf16>(&operands, wanted),
            _ => tensor_ops::sketched_linear_backward(x, weights, grad_output, wanted),
        }
    }
}

/// An element type this path multiplies: `gemm`'s own, or `bf16` on our kernel (its tensors
/// read through [`flex_view`]).
trait Element: FlexFloat + 'static {
    const ZERO: Self;
    const ONE: Self;
    fn from_f64(value: f64) -> Self;
    /// The engine of one product (`gemm`, or [`bf16_call`]).
    const GEMM: Product<Self>;
    /// `activation` of every value, in place (half types through `f32`).
    fn activate(values: &mut [Self], activation: Activation);
}

/// One product: `dst = beta·lhs·rhs`, or `+=` with `accumulate`, into the first columns of
/// `dst`'s rows of `stride` elements.
type Product<E> = fn(&mut [E], usize, Matrix<'_, E>, Matrix<'_, E>, E, bool, gemm::Parallelism);

macro_rules! element {
    ($ty:ty, $zero:expr, $one:expr, $from:expr, $gemm:path, $activate:expr) => {
        impl Element for $ty {
            const ZERO: Self = $zero;
            const ONE: Self = $one;
            fn from_f64(value: f64) -> Self {
                $from(value)
            }
            const GEMM: Product<Self> = $gemm;
            fn activate(values: &mut [Self], activation: Activation) {
                $activate(values, activation)
            }
        }
    };
}
element!(
    f32,
    0.0,
    1.0,
    |v: f64| v as f32,
    gemm,
    |v, a: Activation| a.apply_to(v)
);
element!(
    f64,
    0.0,
    1.0,
    |v: f64| v,
    gemm,
    |v: &mut [f64], a: Activation| v.iter_mut().for_each(|v| *v = a.apply_f64(*v))
);
element!(
    f16,
    f16::ZERO,
    f16::ONE,
    f16::from_f64,
    gemm,
    activate_half::<f16>
);
element!(
    bf16,
    bf16::ZERO,
    bf16::ONE,
    bf16::from_f64,
    bf16_call,
    activate_half::<bf16>
);

/// `activation` of half-precision values: ReLU on the values themselves, others through
/// `f32` in chunks that stay in L1 ([`through_f32`]; the conversions and
/// [`Activation::apply_to`] each a vectorised loop).
fn activate_half<T: HalfFloat>(values: &mut [T], activation: Activation)
where
    [T]: HalfFloatSliceExt,
{
    if activation == Activation::Relu {
        // On the bits: a set sign bit (bit 15 of both half types) becomes +0.
        let bits: &mut [u16] = values.reinterpret_cast_mut();
        bits.iter_mut()
            .for_each(|b| *b = if *b & 0x8000 != 0 { 0 } else { *b });
        return;
    }
    through_f32(values, |wide| activation.apply_to(wide));
}

/// One `bf16` product on [`burn_cpu_kernels::bf16`]'s kernel (`f32` accumulation), threaded by the
/// kernel itself unless `parallelism` says one thread.
fn bf16_call(
    dst: &mut [bf16],
    stride: usize,
    lhs: Matrix<'_, bf16>,
    rhs: Matrix<'_, bf16>,
    beta: bf16,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    let parallel = !matches!(parallelism, gemm::Parallelism::None);
    burn_cpu_kernels::bf16::matmul(dst, stride, lhs, rhs, beta.to_f32(), accumulate, parallel);
}

/// The primitives of one call: `x`, the four factors, and the bias (forward) or `∂y`
/// (backward).
struct Operands {
    x: FlexTensor,
    /// `[s1s, s2s, u1s, u2s]`, in whatever layout they have: `SkLinear`'s initialisation
    /// leaves some as transposed views, which the packing reads through their strides.
    factors: [FlexTensor; 4],
    extra: Option<FlexTensor>,
}

impl Operands {
    fn new(x: &Tensor<Flex, 2>, weights: &SketchWeights<Flex>, extra: Option<FlexTensor>) -> Self {
        Self {
            x: x.clone().into_primitive().tensor(),
            factors: weights.clone().into_primitives(),
            extra,
        }
    }

    /// The common dtype of every operand, if they share one.
    fn dtype(&self) -> Option<DType> {
        let dtype = self.x.dtype();
        let same = self
            .factors
            .iter()
            .chain(&self.extra)
            .all(|t| t.dtype() == dtype);
        same.then_some(dtype)
    }

    /// `(T, d_input, k, d_output)`.
    fn dims(&self) -> (usize, usize, usize, usize) {
        let s1s = self.factors[0].layout().shape();
        (s1s[0], s1s[1], s1s[2], self.factors[1].layout().shape()[2])
    }

    /// `A = [S1_1 … S1_T | U2_1 … U2_T]`, `[d_in, 2Tk]`, row-major.
    fn input_factor<E: Element>(&self) -> Vec<E> {
        let (terms, d_input, k, _) = self.dims();
        let halves = [&self.factors[0], &self.factors[3]];
        let mut packed = Vec::with_capacity(d_input * 2 * terms * k);
        for row in 0..d_input {
            for half in halves {
                for term in 0..terms {
                    flex_view::extend_with_row::<E>(&mut packed, half, &[term, row], k);
                }
            }
        }
        packed
    }

    /// `B = [U1_1; …; U1_T; S2_1; …; S2_T]`, `[2Tk, d_out]`, row-major.
    fn output_factor<E: Element>(&self) -> Vec<E> {
        let (terms, _, k, d_output) = self.dims();
        let mut packed = Vec::with_capacity(2 * terms * k * d_output);
        for half in [&self.factors[2], &self.factors[1]] {
            for term in 0..terms {
                for row in 0..k {
                    flex_view::extend_with_row::<E>(&mut packed, half, &[term, row], d_output);
                }
            }
        }
        packed
    }

    /// `α = 1/(2T)`.
    fn scale<E: Element>(&self) -> E {
        E::from_f64(1.0 / (2.0 * self.dims().0 as f64))
    }
}

/// How a product's rows are shared among rayon's threads.
#[derive(Clone, Copy)]
struct Blocks {
    /// Rows per block (the last may have fewer).
    rows: usize,
    /// What each block's `gemm` call may use.
    parallelism: gemm::Parallelism,
}

impl Blocks {
    /// Rows a block needs for a single-threaded `gemm` to run at full speed on it.
    const MIN_ROWS: usize = 32;

    /// For an `m × k` by `k × n` product: one block per thread, each a single-threaded `gemm`,
    /// when the product is deep (`k ≥ n`) and every block gets [`MIN_ROWS`](Self::MIN_ROWS);
    /// otherwise one block that `gemm` threads itself.
    ///
    /// Why split the rows ourselves, and only then: on the sketched layer's deep, thin
    /// products (`x·A`, `∂y·Bᵀ`, `xᵀ·∂P`: a `d_in` or batch-long depth, `2Tk` columns)
    /// independent row blocks, which share nothing but the read-only right operand, beat
    /// `gemm`'s own threading, while on the shallow, wide ones (`P·B`, `∂P·Aᵀ`, `Pᵀ·∂y`:
    /// depth `2Tk` or the batch, `d_out` or `d_in` columns) `gemm`'s own split is as fast or
    /// faster (`cargo xtask products` measures both, per product).
    fn of(m: usize, k: usize, n: usize) -> Self {
        let threads = rayon::current_num_threads();
        if threads > 1 && m >= threads * Self::MIN_ROWS && k >= n {
            Self {
                rows: m.div_ceil(threads),
                parallelism: gemm::Parallelism::None,
            }
        } else {
            Self {
                rows: m.max(1),
                parallelism: gemm::Parallelism::Rayon(0),
            }
        }
    }
}

/// `dst = beta·lhs·rhs`, or `dst += beta·lhs·rhs` with `accumulate`, for a row-major `dst`,
/// its rows in [`Blocks`].
fn product<E: Element>(
    dst: &mut [E],
    lhs: Matrix<'_, E>,
    rhs: Matrix<'_, E>,
    beta: E,
    accumulate: bool,
) {
    product_into(dst, rhs.shape()[1], lhs, rhs, beta, accumulate);
}

/// [`product`] into the first columns of a row-major `dst` whose rows are `stride` long.
fn product_into<E: Element>(
    dst: &mut [E],
    stride: usize,
    lhs: Matrix<'_, E>,
    rhs: Matrix<'_, E>,
    beta: E,
    accumulate: bool,
) {
    let ([m, k], [k2, n]) = (lhs.shape(), rhs.shape());
    assert_eq!(k2, k, "inner dimensions");
    assert!(
        n <= stride && dst.len() == m * stride,
        "a {m}×{stride} destination"
    );
    if n == 0 {
        return;
    }
    let blocks = Blocks::of(m, k, n);
    dst.par_chunks_mut(blocks.rows * stride)
        .enumerate()
        .for_each(|(i, block)| {
            let lhs = lhs.rows(i * blocks.rows, block.len() / stride);
            (E::GEMM)(
                block,
                stride,
                lhs,
                rhs,
                beta,
                accumulate,
                blocks.parallelism,
            );
        });
}

/// `dst = f(lhs·rhs)` for a row-major `dst`: the product as [`product`] computes it, then `f`
/// over each thread's block of rows, one vectorised loop ([`Element::activate`]).
///
/// Why not inside the product's tiles: `gemm` has no epilogue, so that takes one `gemm` call
/// per cache-sized tile, which is no faster than this pass (an output of the sizes a layer
/// has stays in the last-level cache, where the pass reads it back), and its other summation
/// order would make the untracked forward differ from the tracked one, which takes
/// [`product`] (segment checkpointing replays a segment tracked and needs the same values).
fn activated_product<E: Element>(
    dst: &mut [E],
    lhs: Matrix<'_, E>,
    rhs: Matrix<'_, E>,
    activation: Activation,
) {
    product(dst, lhs, rhs, E::ONE, false);
    let rows = lhs.shape()[0].div_ceil(rayon::current_num_threads()).max(1);
    let n = rhs.shape()[1];
    dst.par_chunks_mut(rows * n.max(1))
        .for_each(|block| E::activate(block, activation));
}

/// `activation` of a contiguous primitive of element type `E`, as a new tensor; `None` for a
/// strided one.
fn activated<E: Element>(z: &FlexTensor, activation: Activation) -> Option<Tensor<Flex, 2>> {
    let mut values = flex_view::values::<E>(z)?.to_vec();
    E::activate(&mut values, activation);
    let [rows, cols] = [z.layout().shape()[0], z.layout().shape()[1]];
    Some(tensor(values, [rows, cols]))
}

/// A contiguous Flex tensor of `shape` over `values`.
fn tensor<E: Element, const D: usize>(values: Vec<E>, shape: [usize; D]) -> Tensor<Flex, D> {
    float(flex_view::tensor(values, shape))
}

/// The rank-1 `tensor`'s values, through its stride.
fn values<E: Element>(tensor: &FlexTensor) -> Vec<E> {
    let len = tensor.layout().shape()[0];
    let mut values = Vec::with_capacity(len);
    flex_view::extend_with_row(&mut values, tensor, &[], len);
    values
}

/// `y = f(α·(x·A)·B + bias)` as two products: `P = α·x·A`, then `y = P·B`, with the bias as
/// one more rank of the second product (`[P | 1]·[B; bias]`), so that `y` is written once, by
/// `gemm`, rather than filled with the bias and then read back (or added in a second pass),
/// then `f` ([`activated_product`]).
fn forward<E: Element>(operands: &Operands, activation: Activation) -> Tensor<Flex, 2> {
    let (terms, d_input, k, d_output) = operands.dims();
    let rank = 2 * terms * k;
    let x = flex_view::matrix::<E>(&operands.x);
    let rows = x.shape()[0];
    let bias = operands.extra.as_ref().map(values::<E>);
    let width = rank + usize::from(bias.is_some());

    let (a, b) = rayon::join(
        || operands.input_factor::<E>(),
        || {
            let mut b = operands.output_factor::<E>();
            b.extend(bias.iter().flatten());
            b
        },
    );
    let mut p = vec![E::ZERO; rows * width];
    if bias.is_some() {
        p.chunks_exact_mut(width).for_each(|row| row[rank] = E::ONE);
    }
    product_into(
        &mut p,
        width,
        x,
        Matrix::row_major(&a, d_input, rank),
        operands.scale(),
        false,
    );
    drop(a);
    let mut y = vec![E::ZERO; rows * d_output];
    let (p, b) = (
        Matrix::row_major(&p, rows, width),
        Matrix::row_major(&b, width, d_output),
    );
    match activation {
        Activation::Identity => product(&mut y, p, b, E::ONE, false),
        activation => activated_product(&mut y, p, b, activation),
    }
    tensor(y, [rows, d_output])
}

/// The closed forms of [`tensor_ops::sketched_linear_backward`] with `A` and `B` packed:
/// `∂P = α·∂y·Bᵀ`, `∂x = ∂P·Aᵀ`, `∂S1_t`/`∂U2_t` = `xᵀ·∂P` (term `t`'s block of columns),
/// and `∂U1`/`∂S2` = `(α·x·A)ᵀ·∂y` (their half). Each gradient is written in its factor's
/// layout: `[T, d_in, k]` one term per product, `[T, k, d_out]` (a `[Tk, d_out]` matrix) one
/// half per product. Only the halves of `P` that a wanted gradient needs are recomputed: for
/// `SkLinear`, whose sketches `U1`/`U2` are fixed, that is `x·U2` alone, half of `x·A`.
/// `B` is dropped once `∂P` is done, `A` once `∂x` and the `P` halves are.
fn backward<E: Element>(operands: &Operands, wanted: WantedGradients) -> SketchGradients<Flex> {
    let (terms, d_input, k, d_output) = operands.dims();
    let (half, rank) = (terms * k, 2 * terms * k);
    let x = flex_view::matrix::<E>(&operands.x);
    let grad_output = flex_view::matrix::<E>(operands.extra.as_ref().expect("∂y"));
    let rows = x.shape()[0];
    let scale = operands.scale::<E>();

    let grad_p = (wanted.x || wanted.s1s || wanted.u2s).then(|| {
        let b = operands.output_factor::<E>();
        let mut grad_p = vec![E::ZERO; rows * rank];
        product(
            &mut grad_p,
            grad_output,
            Matrix::row_major(&b, rank, d_output).t(),
            scale,
            false,
        );
        grad_p
    });
    let (grad_x, output_grads) = {
        let a = (wanted.x || wanted.u1s || wanted.s2s).then(|| operands.input_factor::<E>());
        let a = a.as_deref().map(|a| Matrix::row_major(a, d_input, rank));
        let grad_x = grad_p.as_deref().filter(|_| wanted.x).map(|grad_p| {
            let mut grad_x = vec![E::ZERO; rows * d_input];
            let grad_p = Matrix::row_major(grad_p, rows, rank);
            product(&mut grad_x, grad_p, a.expect("packed").t(), E::ONE, false);
            tensor(grad_x, [rows, d_input])
        });
        // Half `h` (0: U1, 1: S2) of `∂B`, as `[T, k, d_out]`, from `α·x·A`'s half `h`.
        let output_grad = |h: usize| {
            let mut p = vec![E::ZERO; rows * half];
            let a_half = a.expect("packed").cols(h * half, half);
            product(&mut p, x, a_half, scale, false);
            let mut out = vec![E::ZERO; half * d_output];
            let p = Matrix::row_major(&p, rows, half);
            product(&mut out, p.t(), grad_output, E::ONE, false);
            tensor(out, [terms, k, d_output])
        };
        let u1s = wanted.u1s.then(|| output_grad(0));
        let s2s = wanted.s2s.then(|| output_grad(1));
        (grad_x, (u1s, s2s))
    };

    // Half `h` (0: S1, 1: U2) of `∂A`, as `[T, d_in, k]`.
    let input_grad = |h: usize| {
        let grad_p = Matrix::row_major(grad_p.as_deref().expect("wanted"), rows, rank);
        let mut out = vec![E::ZERO; terms * d_input * k];
        for (t, term) in out.chunks_exact_mut(d_input * k).enumerate() {
            let block = grad_p.cols((h * terms + t) * k, k);
            product(term, x.t(), block, E::ONE, false);
        }
        tensor(out, [terms, d_input, k])
    };
    let (u1s, s2s) = output_grads;

    SketchGradients {
        x: grad_x,
        s1s: wanted.s1s.then(|| input_grad(0)),
        u2s: wanted.u2s.then(|| input_grad(1)),
        u1s,
        s2s,
    }
}
