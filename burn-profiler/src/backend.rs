//! [`Profiled<B>`]: a backend that is `B`, with every operation recorded.
//!
//! The tensor primitives, devices and element types are `B`'s own, so a profiled tensor is
//! `B`'s tensor and nothing is wrapped or copied. Every method of Burn's backend traits is
//! forwarded to `B`'s, including those with a default implementation (a default would
//! decompose the operation into others and bypass `B`'s own kernel). The forwarding of the
//! operation traits is generated from Burn's sources into [`ops`](super::ops) by
//! `cargo backend-ops`; the few methods written here are the [`Backend`] trait's own
//! and the transaction, whose primitive must be rebuilt for `B`.

use std::marker::PhantomData;

use burn_backend::ops::{TransactionOps, TransactionPrimitive, TransactionPrimitiveData};
use burn_backend::{Backend, BackendTypes, DType, DTypeUsageSet, ExecutionError, TensorData};

use super::record::{Call, desc};

/// A backend that records every operation of `B` while a [`Profiler`](super::Profiler)
/// runs, and is `B` otherwise.
///
/// Use it as `Autodiff<Profiled<B>>` to record the backward pass as well: the autodiff
/// backend calls the inner backend for every forward and backward operation. The type costs
/// nothing where it is not named, and one relaxed atomic load per operation where it is
/// named but no profiler runs.
#[derive(Clone, Copy, Default, Debug)]
pub struct Profiled<B> {
    _inner: PhantomData<B>,
}

impl<B: Backend> BackendTypes for Profiled<B> {
    type Device = B::Device;
    type FloatTensorPrimitive = B::FloatTensorPrimitive;
    type FloatElem = B::FloatElem;
    type IntTensorPrimitive = B::IntTensorPrimitive;
    type IntElem = B::IntElem;
    type BoolTensorPrimitive = B::BoolTensorPrimitive;
    type BoolElem = B::BoolElem;
    type QuantizedTensorPrimitive = B::QuantizedTensorPrimitive;
}

impl<B: Backend> Backend for Profiled<B> {
    fn ad_enabled(device: &Self::Device) -> bool {
        B::ad_enabled(device)
    }

    fn memory_persistent_allocations<
        Output: Send,
        Input: Send,
        Func: Fn(Input) -> Output + Send,
    >(
        device: &Self::Device,
        input: Input,
        func: Func,
    ) -> Output {
        B::memory_persistent_allocations(device, input, func)
    }

    fn memory_cleanup(device: &Self::Device) {
        B::memory_cleanup(device)
    }

    fn name(device: &Self::Device) -> String {
        format!("profiled<{}>", B::name(device))
    }

    fn seed(device: &Self::Device, seed: u64) {
        B::seed(device, seed)
    }

    /// Recorded as the operation `sync`: on a lazy backend (Fusion, CubeCL's queue) this is
    /// where the host waits for the queued work.
    fn sync(device: &Self::Device) -> Result<(), ExecutionError> {
        let call = Call::start("sync", Vec::new);
        let result = B::sync(device);
        if let Some(call) = call {
            call.finish(Vec::new, || Ok(()));
        }
        result
    }

    fn staging<'a, Iter>(data: Iter, device: &Self::Device)
    where
        Iter: Iterator<Item = &'a mut TensorData>,
    {
        B::staging(data, device)
    }

    fn supports_dtype(device: &Self::Device, dtype: DType) -> bool {
        B::supports_dtype(device, dtype)
    }

    fn dtype_usage(device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        B::dtype_usage(device, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        B::device_count(type_id)
    }
}

impl<B: Backend> TransactionOps<Self> for Profiled<B> {
    async fn tr_execute(
        transaction: TransactionPrimitive<Self>,
    ) -> Result<TransactionPrimitiveData, ExecutionError> {
        let call = Call::start("tr_execute", || {
            let floats = transaction.read_floats.iter().map(desc);
            let ints = transaction.read_ints.iter().map(desc);
            let bools = transaction.read_bools.iter().map(desc);
            floats.chain(ints).chain(bools).collect()
        });
        let inner = TransactionPrimitive::<B>::new(
            transaction.read_floats,
            transaction.read_qfloats,
            transaction.read_ints,
            transaction.read_bools,
        );
        let result = B::tr_execute(inner).await;
        if let Some(call) = call {
            call.finish(Vec::new, || Ok(()));
        }
        result
    }
}

/// The profiled device's memory is `B`'s.
impl<B: burn_memory::DeviceMemory> burn_memory::DeviceMemory for Profiled<B> {
    const SOURCE: burn_memory::MemorySource = B::SOURCE;

    fn current_stream() -> burn_memory::MemoryStream {
        B::current_stream()
    }

    fn memory_usage(
        device: &Self::Device,
        stream: burn_memory::MemoryStream,
    ) -> Result<burn_memory::MemoryUsage, burn_memory::MemoryError> {
        B::memory_usage(device, stream)
    }

    fn memory_capacity(device: &Self::Device) -> Option<u64> {
        B::memory_capacity(device)
    }
}

/// A profiled model is placed on devices as `B`'s (the moves are not recorded).
impl<B: burn_memory::DeviceTransfer> burn_memory::DeviceTransfer for Profiled<B> {
    const HOST_MEMORY: bool = B::HOST_MEMORY;
    fn transfer_float(
        tensor: burn_backend::tensor::FloatTensor<Self>,
        device: &Self::Device,
    ) -> burn_backend::tensor::FloatTensor<Self> {
        B::transfer_float(tensor, device)
    }
    fn transfer_int(
        tensor: burn_backend::tensor::IntTensor<Self>,
        device: &Self::Device,
    ) -> burn_backend::tensor::IntTensor<Self> {
        B::transfer_int(tensor, device)
    }
    fn transfer_bool(
        tensor: burn_backend::tensor::BoolTensor<Self>,
        device: &Self::Device,
    ) -> burn_backend::tensor::BoolTensor<Self> {
        B::transfer_bool(tensor, device)
    }
}
