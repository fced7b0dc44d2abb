//! [`Int8Linear`]: a trained dense or sketched layer with `int8` weights, for inference
//! (PyTorch's `quantize_dynamic`, layer by layer).
//!
//! **Storage** is Burn's own quantized tensor: symmetric `int8` (`Q8S`), stored natively, so
//! that records, saving and loading are Burn's and the file holds one byte per weight. The
//! scales are one `f32` per output, in a tensor of their own: Burn 0.21's block sizes are
//! `u8` per dimension (at most 255), too small for a block of a whole `d_input`-long column,
//! so the `int8` tensor carries the unit scale. **Compute** is this crate's [`cpu::int8`](crate::cpu::int8) kernel:
//! Burn 0.21 dequantizes a quantized tensor before any product, which would make the layer
//! slower than the `f32` one.
//!
//! A sketched layer `y = 1/(2T)·(x·A)·B + b` becomes three products: `P = x·A/(2T)` with
//! `A = [S1 | U2]`, then `y = P₁·U1 + P₂·S2 + b` over the two halves of `P`, each half
//! quantized per row on its own (their magnitudes differ). The fixed sign sketches `U1`, `U2`
//! quantize exactly: a column of signs has the scale `1/127` and the values `±127`.

use std::sync::{Arc, Mutex};

use burn::module::{Module, Param, ParamId};
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::quantization::{
    QuantLevel, QuantMode, QuantParam, QuantScheme, QuantStore, QuantValue, QuantizedBytes,
};
use burn::tensor::{DType, Tensor, TensorData};

use burn_cpu_kernels::Isa;
use burn_cpu_kernels::MatRef;
use burn_cpu_kernels::int8::{Epilogue, QuantizedMatrix, QuantizedRows, matmul_on, matmul_sum_on};
use burn_sketch::{Activation, SkLinear};

/// A dense or sketched linear layer with `int8` weights and per-row `u8` activations,
/// quantized from a trained [`Linear`] or [`SkLinear`]: a quarter of the weights' bytes, for
/// inference only. The book's "bf16 and int8 on the CPU" chapter describes the scheme.
///
/// ```
/// use burn::{backend::Flex, nn::LinearConfig, tensor::{Distribution, Tensor}};
/// let dense = LinearConfig::new(64, 32).init::<Flex>(&Default::default());
/// let int8 = burn_compress::Int8Linear::from_linear(&dense);
/// let x = Tensor::<Flex, 2>::random([8, 64], Distribution::Default, &Default::default());
/// assert!((int8.forward(x.clone()) - dense.forward(x)).abs().max().into_scalar() < 0.02);
/// ```
#[derive(Module, Debug)]
pub struct Int8Linear<B: Backend> {
    /// The quantized products, `[d_input, d_output]` of each, as Burn `int8` tensors of unit
    /// scale: a dense layer's weight; a sketched layer's `A = [S1 | U2]`, `U1` and `S2`.
    pub products: Vec<Param<Tensor<B, 2>>>,
    /// Each product's scales, one per output column.
    pub scales: Vec<Param<Tensor<B, 1>>>,
    /// Optional bias, `[d_output]`, in `f32`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// The sketched layer's number of terms `T` (its products are scaled by `1/(2T)`); 0 for
    /// a dense layer.
    #[module(skip)]
    pub num_terms: usize,
    /// The products packed for the kernel, for the parameters whose ids it lists (a loaded
    /// record brings new ids, and with them a new packing).
    #[module(skip)]
    packed: PackedCache,
}

impl<B: Backend> Int8Linear<B> {
    /// Quantizes a trained dense layer.
    pub fn from_linear(linear: &Linear<B>) -> Self {
        let weight = linear.weight.val();
        let device = weight.device();
        let [d_in, d_out] = weight.dims();
        let values = host_f32(weight);
        let matrix = QuantizedMatrix::quantize(MatRef::row_major(&values, d_in, d_out));
        Self::new(
            vec![matrix],
            linear.bias.as_ref().map(|b| b.val()),
            0,
            &device,
        )
    }

    /// Quantizes a trained sketched layer: `A = [S1 | U2]` per column of `A`, `U1` and `S2`
    /// per output.
    pub fn from_sketched(layer: &SkLinear<B>) -> Self {
        let (a, b) = layer.weights().factors();
        let device = a.device();
        let ([d_in, rank], d_out) = (a.dims(), b.dims()[1]);
        let half = rank / 2;
        let (a, b) = (host_f32(a), host_f32(b));
        let b = MatRef::row_major(&b, rank, d_out);
        let products = vec![
            QuantizedMatrix::quantize(MatRef::row_major(&a, d_in, rank)),
            QuantizedMatrix::quantize(b.rows(0, half)),
            QuantizedMatrix::quantize(b.rows(half, half)),
        ];
        let bias = layer.bias.as_ref().map(|b| b.val());
        Self::new(products, bias, layer.num_terms(), &device)
    }

    fn new(
        matrices: Vec<QuantizedMatrix>,
        bias: Option<Tensor<B, 1>>,
        num_terms: usize,
        device: &B::Device,
    ) -> Self {
        let products: Vec<Param<Tensor<B, 2>>> = matrices
            .iter()
            .map(|m| Param::from_tensor(Tensor::from_data(to_burn(m), device)))
            .collect();
        let scales: Vec<Param<Tensor<B, 1>>> = matrices
            .iter()
            .map(|m| {
                Param::from_tensor(Tensor::from_data(
                    TensorData::new(m.scales().to_vec(), [m.shape()[1]]),
                    device,
                ))
            })
            .collect();
        let bias = bias
            .map(|b| Param::from_tensor(Tensor::from_data(b.into_data().convert::<f32>(), device)));
        let ids = param_ids(&products, &scales);
        Self {
            products,
            scales,
            bias,
            num_terms,
            packed: PackedCache(Arc::new(Mutex::new(Some((ids, Arc::new(matrices)))))),
        }
    }

    /// The size of the input features.
    pub fn d_input(&self) -> usize {
        self.products[0].dims()[0]
    }

    /// The size of the output features.
    pub fn d_output(&self) -> usize {
        self.products.last().expect("a product").dims()[1]
    }

    /// `T` and `k` of the sketched layer this was, or `None` for a dense one.
    pub fn sketch(&self) -> Option<(usize, usize)> {
        (self.num_terms > 0).then(|| {
            (
                self.num_terms,
                self.products[0].dims()[1] / (2 * self.num_terms),
            )
        })
    }

    /// Bytes the layer's tensors hold: one per weight, four per scale and bias value (and
    /// four for each `int8` tensor's unit scale).
    pub fn stored_bytes(&self) -> usize {
        let products: usize = self
            .products
            .iter()
            .map(|p| {
                let [rows, cols] = p.dims();
                rows * cols + 4 + 4 * cols
            })
            .sum();
        products + self.bias.as_ref().map_or(0, |b| 4 * b.dims()[0])
    }

    /// The packed products, rebuilt from the parameters when their ids changed.
    fn matrices(&self) -> Arc<Vec<QuantizedMatrix>> {
        let ids = param_ids(&self.products, &self.scales);
        let mut cache = self
            .packed
            .0
            .lock()
            .expect("the packing cache is never poisoned");
        if let Some((cached, matrices)) = cache.as_ref()
            && *cached == ids
        {
            return matrices.clone();
        }
        let matrices = self
            .products
            .iter()
            .zip(&self.scales)
            .map(|(p, s)| from_burn(p.val(), host_f32(s.val())))
            .collect::<Vec<_>>();
        let matrices = Arc::new(matrices);
        *cache = Some((ids, matrices.clone()));
        matrices
    }

    /// The dense weight `[d_input, d_output]` the quantized layer applies.
    pub fn to_dense_weight(&self) -> Tensor<B, 2> {
        let matrices = self.matrices();
        let device = self.products[0].device();
        let dense = |m: &QuantizedMatrix| {
            let [k, n] = m.shape();
            Tensor::<B, 2>::from_data(TensorData::new(m.dequantize(), [k, n]), &device)
        };
        match self.sketch() {
            None => dense(&matrices[0]),
            Some((terms, _)) => {
                let a = dense(&matrices[0]);
                let b = Tensor::cat(vec![dense(&matrices[1]), dense(&matrices[2])], 0);
                a.matmul(b).div_scalar(2.0 * terms as f32)
            }
        }
    }

    /// Applies the layer to the input's last dimension, on the host's `int8` kernel.
    ///
    /// # Shapes
    /// - input: `[..., d_input]`
    /// - output: `[..., d_output]`
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        self.forward_activated(input, Activation::Identity)
    }

    /// [`forward`](Self::forward) followed by `activation`, applied by the kernel's store as
    /// each output tile is written.
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    pub fn forward_activated<const D: usize>(
        &self,
        input: Tensor<B, D>,
        activation: Activation,
    ) -> Tensor<B, D> {
        self.forward_activated_on(Isa::detected(), input, activation)
    }

    /// [`forward`](Self::forward) on the kernels' path `isa` picks: [`Isa::PORTABLE`] runs
    /// the portable `int8` product on any CPU, for comparing the paths in one process.
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    pub fn forward_on<const D: usize>(&self, isa: Isa, input: Tensor<B, D>) -> Tensor<B, D> {
        self.forward_activated_on(isa, input, Activation::Identity)
    }

    /// [`forward_activated`](Self::forward_activated) on the kernels' path `isa` picks.
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    pub fn forward_activated_on<const D: usize>(
        &self,
        isa: Isa,
        input: Tensor<B, D>,
        activation: Activation,
    ) -> Tensor<B, D> {
        let dims = input.dims();
        let (d_in, d_out) = (self.d_input(), self.d_output());
        let rows = dims[..D - 1].iter().product::<usize>();
        let device = input.device();
        let dtype = input.dtype();
        let x = input.reshape([rows, d_in]);
        let y = match flex_input(&x) {
            // Flex's own buffer, read in place (a shared input is not copied).
            Some(values) => self.forward_host(isa, &values, rows, activation),
            None => self.forward_host(isa, &host_f32(x), rows, activation),
        };
        let mut out = dims;
        out[D - 1] = d_out;
        let y = Tensor::<B, 2>::from_data(TensorData::new(y, [rows, d_out]), &device);
        let y = if dtype == DType::F32 {
            y
        } else {
            y.cast(dtype)
        };
        y.reshape(out)
    }

    /// `y` for the row-major `rows × d_input` input `x`.
    fn forward_host(&self, isa: Isa, x: &[f32], rows: usize, activation: Activation) -> Vec<f32> {
        let matrices = self.matrices();
        let (d_in, d_out) = (self.d_input(), self.d_output());
        let bias = self.bias.as_ref().map(|b| host_f32(b.val()));
        let bias = bias.as_deref();
        let x = QuantizedRows::quantize_on(isa, MatRef::row_major(x, rows, d_in), true);
        let mut y = vec![0.0f32; rows * d_out];
        match self.sketch() {
            None => {
                let e = Epilogue {
                    alpha: 1.0,
                    bias,
                    accumulate: false,
                    activation,
                };
                matmul_on(isa, &mut y, d_out, &x, &matrices[0], e, true);
            }
            Some((terms, k)) => {
                let half = terms * k;
                let mut p = vec![0.0f32; rows * 2 * half];
                let alpha = 1.0 / (2.0 * terms as f32);
                let e = Epilogue {
                    alpha,
                    bias: None,
                    accumulate: false,
                    activation: Activation::Identity,
                };
                matmul_on(isa, &mut p, 2 * half, &x, &matrices[0], e, true);
                let p = MatRef::row_major(&p, rows, 2 * half);
                let (p1, p2) = (
                    QuantizedRows::quantize_on(isa, p.cols(0, half), true),
                    QuantizedRows::quantize_on(isa, p.cols(half, half), true),
                );
                let e = Epilogue {
                    alpha: 1.0,
                    bias,
                    accumulate: false,
                    activation,
                };
                let halves = [(&p1, &matrices[1]), (&p2, &matrices[2])];
                matmul_sum_on(isa, &mut y, d_out, &halves, e, true);
            }
        }
        y
    }
}

/// Burn's scheme for the stored values: symmetric `int8`, stored natively, one scale for the
/// tensor (the unit one: the per-output scales live in their own tensor).
fn scheme() -> QuantScheme {
    QuantScheme::default()
        .with_value(QuantValue::Q8S)
        .with_mode(QuantMode::Symmetric)
        .with_store(QuantStore::Native)
        .with_param(QuantParam::F32)
        .with_level(QuantLevel::Tensor)
}

/// `m`'s values (`k × n`) as Burn's quantized tensor data of unit scale.
fn to_burn(m: &QuantizedMatrix) -> TensorData {
    TensorData::quantized(m.values().to_vec(), m.shape(), scheme(), &[1.0])
}

/// The matrix behind Burn's quantized `[k, n]` tensor and its per-output `scales`.
fn from_burn<B: Backend>(tensor: Tensor<B, 2>, scales: Vec<f32>) -> QuantizedMatrix {
    let [k, n] = tensor.dims();
    let data = tensor.into_data();
    let DType::QFloat(scheme) = data.dtype else {
        panic!(
            "an Int8Linear product must be a quantized tensor, found {:?}",
            data.dtype
        );
    };
    let num_elements = data.num_elements();
    let (values, params) = QuantizedBytes {
        bytes: data.into_bytes(),
        scheme,
        num_elements,
    }
    .into_vec_i8();
    assert_eq!(params.scales, [1.0], "an int8 tensor of unit scale");
    QuantizedMatrix::from_parts(k, n, values, scales)
}

/// A contiguous `f32` Flex tensor's buffer, shared rather than copied; `None` on other
/// backends, element types and layouts.
#[cfg(feature = "flex")]
fn flex_input<B: Backend>(x: &Tensor<B, 2>) -> Option<FlexValues> {
    use burn::backend::Flex;
    let x = (x as &dyn std::any::Any).downcast_ref::<Tensor<Flex, 2>>()?;
    let tensor = x.clone().into_primitive().tensor();
    let layout = tensor.layout();
    let (contiguous, offset, len) = (
        layout.is_contiguous(),
        layout.start_offset(),
        layout.num_elements(),
    );
    (tensor.dtype() == DType::F32 && contiguous).then_some(FlexValues {
        tensor,
        offset,
        len,
    })
}

#[cfg(not(feature = "flex"))]
fn flex_input<B: Backend>(_: &Tensor<B, 2>) -> Option<Vec<f32>> {
    None
}

/// A Flex tensor's values, borrowed from its buffer.
#[cfg(feature = "flex")]
struct FlexValues {
    tensor: burn::backend::flex::FlexTensor,
    offset: usize,
    len: usize,
}

#[cfg(feature = "flex")]
impl std::ops::Deref for FlexValues {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.tensor.storage::<f32>()[self.offset..self.offset + self.len]
    }
}

/// The tensor's values as `f32`, row-major.
fn host_f32<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 values after the conversion")
}

/// The ids of a layer's products and scales, in order: what a packing was made from.
fn param_ids<B: Backend>(
    products: &[Param<Tensor<B, 2>>],
    scales: &[Param<Tensor<B, 1>>],
) -> Vec<ParamId> {
    let products = products.iter().map(|p| p.id);
    products.chain(scales.iter().map(|s| s.id)).collect()
}

/// The products packed for the kernel, with the parameter ids they were packed from.
type Packing = (Vec<ParamId>, Arc<Vec<QuantizedMatrix>>);

/// The packing, shared by clones of a layer.
#[derive(Clone, Default)]
struct PackedCache(Arc<Mutex<Option<Packing>>>);

impl std::fmt::Debug for PackedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PackedCache")
    }
}
