//! A device's memory at one moment, and byte counts that print for humans.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A number of bytes that displays as `12.3 MB` (SI units, like `nvidia-smi` and Burn's own
/// metrics).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&bytesize::ByteSize(self.0).to_string())
    }
}

/// A device's memory at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUsage {
    /// Bytes held by live allocations: on CubeCL devices, the bytes of tensors and buffers
    /// alive in the memory pools; on CPU backends (NdArray, Flex), the heap bytes in use when a
    /// [`CountingAllocator`](crate::CountingAllocator) is the global allocator, otherwise the
    /// process's resident memory.
    pub in_use: u64,
    /// Bytes the allocator holds from the device, in use or cached for reuse: on CubeCL
    /// devices, the pools' pages; on CPU backends, the process's resident memory (the operating
    /// system is the allocator there), which with a counting allocator differs from `in_use`.
    pub reserved: u64,
}

impl fmt::Display for MemoryUsage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} in use, {} reserved",
            Bytes(self.in_use),
            Bytes(self.reserved)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_print_in_si_units() {
        assert_eq!(Bytes(1_500_000).to_string(), "1.5 MB");
        assert_eq!(Bytes(512).to_string(), "512 B");
        let usage = MemoryUsage {
            in_use: 2_000_000_000,
            reserved: 3_000_000_000,
        };
        assert_eq!(usage.to_string(), "2.0 GB in use, 3.0 GB reserved");
    }
}
