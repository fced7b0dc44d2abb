//! burn-memory's device-memory readings and transfers for [`FastFlex`]: Flex's, since its
//! tensors are Flex's.

use burn::backend::Flex;

use crate::FastFlex;

/// Flex's: its tensors are Flex's, on the heap.
impl burn_memory::DeviceMemory for FastFlex {
    const SOURCE: burn_memory::MemorySource = <Flex as burn_memory::DeviceMemory>::SOURCE;

    fn memory_usage(
        device: &Self::Device,
        stream: burn_memory::MemoryStream,
    ) -> Result<burn_memory::MemoryUsage, burn_memory::MemoryError> {
        Flex::memory_usage(device, stream)
    }

    fn memory_capacity(device: &Self::Device) -> Option<u64> {
        Flex::memory_capacity(device)
    }
}

/// Flex's: one host memory, shared by every thread.
impl burn_memory::DeviceTransfer for FastFlex {
    const HOST_MEMORY: bool = <Flex as burn_memory::DeviceTransfer>::HOST_MEMORY;

    fn transfer_float(
        tensor: burn::tensor::ops::FloatTensor<Self>,
        device: &Self::Device,
    ) -> burn::tensor::ops::FloatTensor<Self> {
        Flex::transfer_float(tensor, device)
    }

    fn transfer_int(
        tensor: burn::tensor::ops::IntTensor<Self>,
        device: &Self::Device,
    ) -> burn::tensor::ops::IntTensor<Self> {
        Flex::transfer_int(tensor, device)
    }

    fn transfer_bool(
        tensor: burn::tensor::ops::BoolTensor<Self>,
        device: &Self::Device,
    ) -> burn::tensor::ops::BoolTensor<Self> {
        Flex::transfer_bool(tensor, device)
    }
}
