//! [`HalfFlex`]: Flex, with `bf16` and `f16` tensors computed at `f32`'s speed. The
//! forwarding of Burn's operation traits to Flex is generated ([`ops`], by
//! `cargo backend-ops`).

use burn::backend::Flex;
use burn::backend::flex::{FlexDevice, FlexTensor};
use burn::tensor::DType;
use burn_backend::ops::{TransactionOps, TransactionPrimitive, TransactionPrimitiveData};
use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, BackendTypes, DTypeUsageSet, ExecutionError, FloatDType, TensorData};
use half::{bf16, f16};

mod convert;
mod matmul;
mod ops;

/// Flex, with `bf16` and `f16` tensors computed at `f32`'s speed: Flex computes each half
/// value through scalar conversions and multiplies `bf16` through `f32` copies. Its primitives
/// are Flex's; `bf16` products run on [`bf16::matmul`](burn_cpu_kernels::bf16::matmul),
/// half-precision arithmetic converts once to `f32`, runs Flex's operation and rounds once, and
/// casts are one vectorised pass. Operations that only move values, and `f32`/`f64` tensors, are
/// Flex's own (the book's *bf16 and int8 on the CPU* has the measurements).
#[derive(Clone, Copy, Default, Debug)]
pub struct HalfFlex;

impl BackendTypes for HalfFlex {
    type Device = <Flex as BackendTypes>::Device;
    type FloatTensorPrimitive = <Flex as BackendTypes>::FloatTensorPrimitive;
    type FloatElem = <Flex as BackendTypes>::FloatElem;
    type IntTensorPrimitive = <Flex as BackendTypes>::IntTensorPrimitive;
    type IntElem = <Flex as BackendTypes>::IntElem;
    type BoolTensorPrimitive = <Flex as BackendTypes>::BoolTensorPrimitive;
    type BoolElem = <Flex as BackendTypes>::BoolElem;
    type QuantizedTensorPrimitive = <Flex as BackendTypes>::QuantizedTensorPrimitive;
}

impl Backend for HalfFlex {
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
        format!("half_{}", Flex::name(device))
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

impl TransactionOps<Self> for HalfFlex {
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

/// An `f32` output rounded to `dtype` (to nearest, ties to even, as `half` rounds); any other
/// tensor unchanged.
fn from_f32(tensor: FlexTensor, dtype: FloatDType) -> FlexTensor {
    match (tensor.dtype(), dtype) {
        (DType::F32, FloatDType::BF16) => convert::narrow::<bf16>(&tensor),
        (DType::F32, FloatDType::F16) => convert::narrow::<f16>(&tensor),
        _ => tensor,
    }
}

/// Flex's `float_cast`, but a vectorised pass between `f32` and `bf16`/`f16` (Flex's converts
/// every value through `f64`).
fn float_cast(tensor: FloatTensor<HalfFlex>, dtype: FloatDType) -> FloatTensor<HalfFlex> {
    match (tensor.dtype(), dtype) {
        (DType::BF16 | DType::F16, FloatDType::F32) => to_f32(tensor),
        (DType::F32, FloatDType::BF16 | FloatDType::F16) => from_f32(tensor, dtype),
        _ => <Flex as burn_backend::ops::FloatTensorOps<Flex>>::float_cast(tensor, dtype),
    }
}

/// Flex's `float_matmul`, but `bf16` products on [`cpu::bf16`](burn_cpu_kernels::bf16) and `f16`
/// ones through `f32`.
fn float_matmul(lhs: FloatTensor<HalfFlex>, rhs: FloatTensor<HalfFlex>) -> FloatTensor<HalfFlex> {
    use burn_backend::ops::FloatTensorOps;
    match (lhs.dtype(), rhs.dtype()) {
        (DType::BF16, DType::BF16) => matmul::bf16(&lhs, &rhs),
        (DType::F16, DType::F16) => from_f32(
            Flex::float_matmul(to_f32(lhs), to_f32(rhs)),
            FloatDType::F16,
        ),
        _ => Flex::float_matmul(lhs, rhs),
    }
}
