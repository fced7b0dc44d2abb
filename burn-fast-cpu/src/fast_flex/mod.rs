//! [`FastFlex`]: Flex, with the operations models spend their time in computed here, one
//! module per concept: [`linear`](mod@linear), [`matmul`](mod@matmul), [`attention`](mod@attention),
//! [`elementwise`](mod@elementwise), [`rows`](mod@rows) (softmax, layer norm), [`mask`](mod@mask)
//! and [`convert`](mod@convert) (`f32` ↔ half), all reading Flex's tensors through
//! [`flex_view`](crate::flex_view). The forwarding of Burn's operation traits to Flex is
//! generated ([`ops`], by `cargo backend-ops`).
//!
//! # When a fast path does not apply
//! Every fast path that covers only some operands (an `f64` tensor, mixed types, a rank, a
//! dimension or a mask store it does not read) returns a [`FastPath`]: `Ok` with its output,
//! or `Err` with the operands it took by value handed back unchanged, on which the caller
//! runs Flex's own operation. No fast path panics on a case it does not cover; the products
//! of [`matmul`](mod@matmul) are called only for the types they compute.

// A `FastPath`'s `Err` is the operands themselves (a few 120-byte tensors), moved back once to
// Flex's operation: boxing them would allocate on every fallback to save a few stack moves.
#![allow(clippy::result_large_err)]

use burn::backend::Flex;
use burn::backend::flex::{FlexDevice, FlexTensor};
use burn::tensor::DType;
use burn_backend::ops::{TransactionOps, TransactionPrimitive, TransactionPrimitiveData};
use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, BackendTypes, DTypeUsageSet, ExecutionError, FloatDType, TensorData};
use half::{bf16, f16};

use crate::flex_view;

mod attention;
mod convert;
mod elementwise;
mod linear;
mod mask;
mod matmul;
mod ops;
mod rows;
mod weights;

/// Flex, with the operations a model spends its time in on this project's CPU kernels, in
/// `f32`, `bf16` and `f16`; its tensors are Flex's. Flex broadcasts `linear`'s weight into a
/// batched product, calls a scalar `erff` per GELU value, copies broadcast masks and permuted
/// tensors one element at a time, and computes half precision through scalar conversions:
/// `FastFlex` runs `linear` (and its backward) as one product, GELU, `exp`, `erf`, `tanh`,
/// softmax and layer norm on vectorised kernels, in place where it holds the only copy, and
/// everything else as Flex does (the book's *CPU, against PyTorch* has the measurements).
#[derive(Clone, Copy, Default, Debug)]
pub struct FastFlex;

impl BackendTypes for FastFlex {
    type Device = <Flex as BackendTypes>::Device;
    type FloatTensorPrimitive = <Flex as BackendTypes>::FloatTensorPrimitive;
    type FloatElem = <Flex as BackendTypes>::FloatElem;
    type IntTensorPrimitive = <Flex as BackendTypes>::IntTensorPrimitive;
    type IntElem = <Flex as BackendTypes>::IntElem;
    type BoolTensorPrimitive = <Flex as BackendTypes>::BoolTensorPrimitive;
    type BoolElem = <Flex as BackendTypes>::BoolElem;
    type QuantizedTensorPrimitive = <Flex as BackendTypes>::QuantizedTensorPrimitive;
}

impl Backend for FastFlex {
    fn ad_enabled(device: &FlexDevice) -> bool {
        Flex::ad_enabled(device)
    }

    fn memory_persistent_allocations<
        Output: Send,
        Input: Send,
        Func: Fn(Input) -> Output + Send,
    >(
        device: &FlexDevice,
        input: Input,
        func: Func,
    ) -> Output {
        Flex::memory_persistent_allocations(device, input, func)
    }

    fn memory_cleanup(device: &FlexDevice) {
        Flex::memory_cleanup(device)
    }

    fn name(device: &FlexDevice) -> String {
        format!("fast_{}", Flex::name(device))
    }

    fn seed(device: &FlexDevice, seed: u64) {
        Flex::seed(device, seed)
    }

    fn sync(device: &FlexDevice) -> Result<(), ExecutionError> {
        Flex::sync(device)
    }

    fn staging<'a, Iter>(data: Iter, device: &FlexDevice)
    where
        Iter: Iterator<Item = &'a mut TensorData>,
    {
        Flex::staging(data, device)
    }

    fn supports_dtype(device: &FlexDevice, dtype: DType) -> bool {
        Flex::supports_dtype(device, dtype)
    }

    fn dtype_usage(device: &FlexDevice, dtype: DType) -> DTypeUsageSet {
        Flex::dtype_usage(device, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        Flex::device_count(type_id)
    }
}

impl TransactionOps<Self> for FastFlex {
    async fn tr_execute(
        transaction: TransactionPrimitive<Self>,
    ) -> Result<TransactionPrimitiveData, ExecutionError> {
        let inner = TransactionPrimitive::<Flex>::new(
            transaction.read_floats,
            transaction.read_qfloats,
            transaction.read_ints,
            transaction.read_bools,
        );
        Flex::tr_execute(inner).await
    }
}

/// What a fast path returns: its output, or the operands it took by value (`T`), unchanged,
/// where it does not apply (the [module docs](self) have the convention).
type FastPath<T> = Result<FlexTensor, T>;

/// The half-precision type of the first of `tensors` held in one (the type a `via_f32`
/// operation rounds its float output to), or `None` where none is: then Flex's own
/// operation runs unchanged.
fn half_dtype(tensors: &[&FlexTensor]) -> Option<FloatDType> {
    tensors.iter().find_map(|tensor| match tensor.dtype() {
        DType::BF16 => Some(FloatDType::BF16),
        DType::F16 => Some(FloatDType::F16),
        _ => None,
    })
}

/// `tensor` as `f32` where it is `bf16` or `f16` (one vectorised pass, keeping its layout
/// where the layout covers its buffer without gaps); any other tensor unchanged.
fn to_f32(tensor: FlexTensor) -> FlexTensor {
    match tensor.dtype() {
        DType::BF16 => convert::widen::<bf16>(&tensor),
        DType::F16 => convert::widen::<f16>(&tensor),
        _ => tensor,
    }
}

/// A tensor's values as `f32`, row-major (a bias, a norm's `gamma` and `beta`).
///
/// # Panics
/// If the tensor is not `f32`, `bf16` or `f16`.
fn f32_values(tensor: &FlexTensor) -> Vec<f32> {
    let t = flex_view::contiguous(&to_f32(tensor.clone()));
    flex_view::values::<f32>(&t).expect("contiguous").to_vec()
}

/// An `f32` output rounded to `dtype` (to nearest, ties to even, as `half` rounds); any other
/// tensor unchanged.
fn from_f32(tensor: FlexTensor, dtype: FloatDType) -> FlexTensor {
    match (tensor.dtype(), dtype) {
        (DType::F32, FloatDType::BF16) => convert::narrow::<bf16>(&tensor),
        (DType::F32, FloatDType::F16) => convert::narrow::<f16>(&tensor),
        _ => tensor,
    }
}

/// `op` on `tensors` as `f32` where one of them is `bf16` or `f16`, its float output rounded
/// once to the first one's half type: widen, compute, round back, for a whole operation (a
/// slice's values go through [`through_f32`](burn_cpu_kernels::convert::through_f32)).
/// Without a half-precision operand, `op` on `tensors` as they are.
fn via_f32<const N: usize>(
    tensors: [FlexTensor; N],
    op: impl FnOnce([FlexTensor; N]) -> FlexTensor,
) -> FlexTensor {
    let refs: Vec<&FlexTensor> = tensors.iter().collect();
    match half_dtype(&refs) {
        Some(dtype) => from_f32(op(tensors.map(to_f32)), dtype),
        None => op(tensors),
    }
}

/// Flex's `float_cast`, but a vectorised pass between `f32` and `bf16`/`f16` (Flex's converts
/// every value through `f64`).
fn float_cast(tensor: FloatTensor<FastFlex>, dtype: FloatDType) -> FloatTensor<FastFlex> {
    match (tensor.dtype(), dtype) {
        (DType::BF16 | DType::F16, FloatDType::F32) => to_f32(tensor),
        (DType::F32, FloatDType::BF16 | FloatDType::F16) => from_f32(tensor, dtype),
        _ => <Flex as burn_backend::ops::FloatTensorOps<Flex>>::float_cast(tensor, dtype),
    }
}

/// The number of products of a batched `matmul` (the leading dimensions broadcast).
fn batch_count(lhs: &FlexTensor, rhs: &FlexTensor) -> usize {
    let (a, b) = (lhs.layout().shape(), rhs.layout().shape());
    let rank = a.num_dims();
    if b.num_dims() != rank {
        return 0;
    }
    (0..rank - 2).map(|d| a[d].max(b[d])).product()
}

/// Multiply-adds per product of a batched `matmul`: `m · k · n`.
fn product_size(lhs: &FlexTensor, rhs: &FlexTensor) -> usize {
    let (a, b) = (lhs.layout().shape(), rhs.layout().shape());
    let rank = a.num_dims();
    a[rank - 2] * a[rank - 1] * b[rank - 1]
}

/// Flex's `float_matmul`, but `bf16` products on [`cpu::bf16`](burn_cpu_kernels::bf16), many
/// small `f32` products on [`sgemm`](burn_cpu_kernels::sgemm)'s kernel ([`matmul`](mod@matmul))
/// and `f16` ones through `f32`.
fn float_matmul(lhs: FloatTensor<FastFlex>, rhs: FloatTensor<FastFlex>) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    match (lhs.dtype(), rhs.dtype()) {
        (DType::BF16, DType::BF16) => matmul::bf16(&lhs, &rhs),
        (DType::F16, DType::F16) => via_f32([lhs, rhs], |[lhs, rhs]| Flex::float_matmul(lhs, rhs)),
        // Many small products (attention's heads); 2-D products, few products and tiny ones
        // (a short sentence's heads, where `gemm` on one thread is quicker) are Flex's `gemm`.
        (DType::F32, DType::F32)
            if lhs.layout().num_dims() >= 3
                && batch_count(&lhs, &rhs) >= 2 * rayon::current_num_threads()
                && product_size(&lhs, &rhs) >= 1 << 15 =>
        {
            matmul::f32_batched(&lhs, &rhs)
        }
        _ => Flex::float_matmul(lhs, rhs),
    }
}

/// Burn's `linear` as one 2-D product for any rank of `x` ([`linear`](mod@linear)); `f64`
/// and mixed types on Flex's operations.
fn linear(
    x: FloatTensor<FastFlex>,
    weight: FloatTensor<FastFlex>,
    bias: Option<FloatTensor<FastFlex>>,
) -> FloatTensor<FastFlex> {
    linear::forward(x, weight, bias)
        .unwrap_or_else(|(x, weight, bias)| flex_linear(x, weight, bias))
}

/// `linear` composed of Flex's operations: `x` flattened to 2-D, one product, the bias added.
fn flex_linear(x: FlexTensor, weight: FlexTensor, bias: Option<FlexTensor>) -> FlexTensor {
    use burn_backend::ops::FloatTensorOps;
    let dims = x.layout().shape().to_vec();
    let k = dims[dims.len() - 1];
    let n = weight.layout().shape()[1];
    let m = dims[..dims.len() - 1].iter().product::<usize>();
    let x = Flex::float_reshape(x, burn::tensor::Shape::from(vec![m, k]));
    let mut out = Flex::float_matmul(x, weight);
    if let Some(bias) = bias {
        let bias = Flex::float_reshape(bias, burn::tensor::Shape::from(vec![1, n]));
        out = Flex::float_add(out, bias);
    }
    let mut out_dims = dims;
    *out_dims.last_mut().expect("rank ≥ 1") = n;
    Flex::float_reshape(out, burn::tensor::Shape::from(out_dims))
}

/// The gradient of `linear` for `x`: one product `output_grad · weightᵀ`.
fn linear_x_backward(
    weight: FloatTensor<FastFlex>,
    output_grad: FloatTensor<FastFlex>,
) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    linear::x_backward(weight, output_grad).unwrap_or_else(|(weight, output_grad)| {
        let transposed = Flex::float_swap_dims(weight, 0, 1);
        flex_linear(output_grad, transposed, None)
    })
}

/// The gradient of `linear` for its weight: one product `xᵀ · output_grad` over every
/// position of the batch.
fn linear_weight_backward(
    x: FloatTensor<FastFlex>,
    output_grad: FloatTensor<FastFlex>,
) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    let (x, output_grad) = match linear::weight_backward(x, output_grad) {
        Ok(grad) => return grad,
        Err(operands) => operands,
    };
    let dims = x.layout().shape().to_vec();
    let k = dims[dims.len() - 1];
    let m = dims[..dims.len() - 1].iter().product::<usize>();
    let g_dims = output_grad.layout().shape().to_vec();
    let n = g_dims[g_dims.len() - 1];
    let x = Flex::float_reshape(x, burn::tensor::Shape::from(vec![m, k]));
    let g = Flex::float_reshape(output_grad, burn::tensor::Shape::from(vec![m, n]));
    Flex::float_matmul(Flex::float_swap_dims(x, 0, 1), g)
}

/// The gradient of `linear` for its bias: the sum over every position of the batch.
fn linear_bias_backward(output_grad: FloatTensor<FastFlex>) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    let output_grad = match linear::bias_backward(output_grad) {
        Ok(grad) => return grad,
        Err(output_grad) => output_grad,
    };
    let dims = output_grad.layout().shape().to_vec();
    let n = dims[dims.len() - 1];
    let m = dims[..dims.len() - 1].iter().product::<usize>();
    let g = Flex::float_reshape(output_grad, burn::tensor::Shape::from(vec![m, n]));
    Flex::float_reshape(
        Flex::float_sum_dim(g, 0),
        burn::tensor::Shape::from(vec![n]),
    )
}

/// The exact GELU, vectorised ([`math::gelu_in_place`](burn_cpu_kernels::math::gelu_in_place));
/// Flex's calls a scalar `erff` per value. `f64` is Flex's.
fn gelu(tensor: FloatTensor<FastFlex>) -> FloatTensor<FastFlex> {
    use burn_backend::ops::ActivationOps;
    elementwise::gelu(tensor).unwrap_or_else(Flex::gelu)
}

/// GELU's backward, vectorised as [`gelu`].
fn gelu_backward(x: FloatTensor<FastFlex>, grad: FloatTensor<FastFlex>) -> FloatTensor<FastFlex> {
    use burn_backend::ops::ActivationOps;
    elementwise::gelu_backward(x, grad).unwrap_or_else(|(x, grad)| Flex::gelu_backward(x, grad))
}

/// Scaled-dot-product attention fused per block of queries
/// ([`attention`](mod@attention)); other ranks and `f64` are Flex's.
fn attention(
    query: FloatTensor<FastFlex>,
    key: FloatTensor<FastFlex>,
    value: FloatTensor<FastFlex>,
    mask: Option<burn_backend::tensor::BoolTensor<FastFlex>>,
    attn_bias: Option<FloatTensor<FastFlex>>,
    options: burn_backend::ops::AttentionModuleOptions,
) -> FloatTensor<FastFlex> {
    use burn_backend::ops::ModuleOps;
    if query.dtype() == DType::F16 {
        return via_f32([query, key, value], |[query, key, value]| {
            attention(query, key, value, mask, attn_bias.map(to_f32), options)
        });
    }
    attention::forward((query, key, value, mask, attn_bias), &options).unwrap_or_else(
        |(query, key, value, mask, attn_bias)| {
            Flex::attention(query, key, value, mask, attn_bias, options)
        },
    )
}

/// `eˣ`, vectorised; `f64` is Flex's.
fn float_exp(tensor: FloatTensor<FastFlex>) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    elementwise::exp(tensor).unwrap_or_else(Flex::float_exp)
}

/// `erf`, vectorised; `f64` is Flex's.
fn float_erf(tensor: FloatTensor<FastFlex>) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    elementwise::erf(tensor).unwrap_or_else(Flex::float_erf)
}

/// `tanh`, vectorised; `f64` is Flex's.
fn float_tanh(tensor: FloatTensor<FastFlex>) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    elementwise::tanh(tensor).unwrap_or_else(Flex::float_tanh)
}

/// Softmax over the last dimension on the row kernels ([`rows`](mod@rows)); other
/// dimensions and `f64` are Flex's.
fn softmax(tensor: FloatTensor<FastFlex>, dim: usize) -> FloatTensor<FastFlex> {
    use burn_backend::ops::ActivationOps;
    rows::softmax(tensor, dim)
        .unwrap_or_else(|tensor| via_f32([tensor], |[t]| Flex::softmax(t, dim)))
}

/// Log-softmax over the last dimension, as [`softmax`].
fn log_softmax(tensor: FloatTensor<FastFlex>, dim: usize) -> FloatTensor<FastFlex> {
    use burn_backend::ops::ActivationOps;
    rows::log_softmax(tensor, dim)
        .unwrap_or_else(|tensor| via_f32([tensor], |[t]| Flex::log_softmax(t, dim)))
}

/// Layer normalisation over the last dimension on the row kernels; `f64` is Flex's.
fn layer_norm(
    tensor: FloatTensor<FastFlex>,
    gamma: FloatTensor<FastFlex>,
    beta: Option<FloatTensor<FastFlex>>,
    epsilon: f64,
) -> FloatTensor<FastFlex> {
    use burn_backend::ops::ModuleOps;
    rows::layer_norm(tensor, &gamma, beta.as_ref(), epsilon)
        .unwrap_or_else(|tensor| Flex::layer_norm(tensor, gamma, beta, epsilon))
}

/// `mask_fill` reading a broadcast mask through its strides, in place where it can
/// ([`mask`](mod@mask)); Flex copies the mask to the tensor's shape first.
fn float_mask_fill(
    tensor: FloatTensor<FastFlex>,
    mask: burn_backend::tensor::BoolTensor<FastFlex>,
    value: burn_backend::Scalar,
) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    let fill = value.elem::<f64>();
    mask::mask_fill(tensor, &mask, fill)
        .unwrap_or_else(|tensor| Flex::float_mask_fill(tensor, mask, value))
}

/// Flex's `reshape`, but a permuted tensor whose last dimension is contiguous is copied row by
/// row ([`flex_view::contiguous`]), where Flex copies it one element at a time.
fn float_reshape(
    tensor: FloatTensor<FastFlex>,
    shape: burn::tensor::Shape,
) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    if tensor.layout().is_contiguous() {
        return Flex::float_reshape(tensor, shape);
    }
    Flex::float_reshape(flex_view::contiguous(&tensor), shape)
}

/// A scalar operation `op(value, scalar)` on every value, in place where no other tensor
/// holds the buffer, `bf16`/`f16` through an `f32` scratch a piece at a time (Flex's half
/// path, and `via_f32`, allocate a widened copy and a rounded one); `f64` is Flex's.
fn scalar_op(
    tensor: FlexTensor,
    scalar: burn_backend::Scalar,
    op: impl Fn(f32, f32) -> f32 + Copy + Sync,
    flex: fn(FlexTensor, burn_backend::Scalar) -> FlexTensor,
) -> FlexTensor {
    let s = scalar.elem::<f32>();
    elementwise::unary(tensor, |values| {
        for v in values.iter_mut() {
            *v = op(*v, s);
        }
    })
    .unwrap_or_else(|tensor| flex(tensor, scalar))
}

/// `tensor / scalar`, as [`scalar_op`].
fn float_div_scalar(
    tensor: FloatTensor<FastFlex>,
    scalar: burn_backend::Scalar,
) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    scalar_op(tensor, scalar, |v, s| v / s, Flex::float_div_scalar)
}

/// `tensor · scalar`, as [`scalar_op`].
fn float_mul_scalar(
    tensor: FloatTensor<FastFlex>,
    scalar: burn_backend::Scalar,
) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    scalar_op(tensor, scalar, |v, s| v * s, Flex::float_mul_scalar)
}

/// `tensor + scalar`, as [`scalar_op`].
fn float_add_scalar(
    tensor: FloatTensor<FastFlex>,
    scalar: burn_backend::Scalar,
) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    scalar_op(tensor, scalar, |v, s| v + s, Flex::float_add_scalar)
}

/// `lhs + rhs`: of two `bf16` or `f16` tensors of one shape, one pass through an `f32`
/// scratch; anything else (broadcasts, `f32`, which Flex adds in place) as before.
fn float_add(lhs: FloatTensor<FastFlex>, rhs: FloatTensor<FastFlex>) -> FloatTensor<FastFlex> {
    use burn_backend::ops::FloatTensorOps;
    let (lhs, rhs) = if half_dtype(&[&lhs]).is_some() {
        let add = |a: &[f32], b: &mut [f32]| {
            for (b, a) in b.iter_mut().zip(a) {
                *b += a;
            }
        };
        match elementwise::binary(lhs, rhs, add) {
            Ok(sum) => return sum,
            Err(operands) => operands,
        }
    } else {
        (lhs, rhs)
    };
    via_f32([lhs, rhs], |[lhs, rhs]| Flex::float_add(lhs, rhs))
}
