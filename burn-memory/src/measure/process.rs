//! The memory of this process, which is where CPU backends keep their tensors.
//!
//! Resident memory comes from `sysinfo` (every platform it supports). The peak comes from the
//! kernel's resident high-water mark (`VmHWM` in `/proc/self/status`), which Linux keeps
//! exactly, page by page, and which writing `5` to `/proc/self/clear_refs` resets to the current
//! resident size. Elsewhere the peak is the largest value this crate has sampled.

use std::sync::Mutex;

use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

use crate::MemoryError;
use crate::sync::lock;

/// One `System` for the process: `sysinfo` keeps per-process state between refreshes.
static SYSTEM: Mutex<Option<System>> = Mutex::new(None);

/// Resident memory of this process, in bytes.
pub fn resident_bytes() -> Result<u64, MemoryError> {
    #[cfg(target_os = "linux")]
    if let Some(bytes) = status_field("VmRSS:") {
        return Ok(bytes);
    }
    let pid = sysinfo::get_current_pid().map_err(MemoryError::Unsupported)?;
    let mut guard = lock(&SYSTEM);
    let system = guard.get_or_insert_with(System::new);
    system.refresh_processes_specifics(
        ProcessesToUpdate::Some(&[pid]),
        false,
        ProcessRefreshKind::nothing().with_memory(),
    );
    system
        .process(Pid::from(pid.as_u32() as usize))
        .map(|process| process.memory())
        .ok_or(MemoryError::Unsupported(
            "this process is not visible to sysinfo",
        ))
}

/// The kernel's resident high-water mark since the last [`reset_peak`], where the kernel keeps
/// one (Linux).
pub(crate) fn peak_resident_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        status_field("VmHWM:")
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Resets the kernel's high-water mark to the current resident size. Returns whether it could.
pub(crate) fn reset_peak() -> bool {
    #[cfg(target_os = "linux")]
    {
        std::fs::write("/proc/self/clear_refs", "5").is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Total physical memory of the machine, in bytes.
pub(crate) fn total_bytes() -> u64 {
    let mut system = System::new();
    system.refresh_memory();
    system.total_memory()
}

/// A `kB` field of `/proc/self/status`, in bytes.
#[cfg(target_os = "linux")]
fn status_field(name: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(name))?;
    let kib: u64 = line[name.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In its own process: other tests allocating or freeing meanwhile move the resident figure.
    #[test]
    fn resident_memory_grows_with_a_touched_buffer() {
        crate::own_process::in_own_process(
            "measure::process::tests::resident_memory_grows_with_a_touched_buffer",
            resident_memory_grows,
        );
    }

    fn resident_memory_grows() {
        let before = resident_bytes().unwrap();
        // `black_box`: in a release build the optimiser would otherwise drop the unused buffer.
        let buffer = std::hint::black_box(vec![1u8; 64 << 20]);
        let during = resident_bytes().unwrap();
        assert!(during >= before + (60 << 20), "{before} -> {during}");
        drop(buffer);
        if reset_peak() {
            let peak = peak_resident_bytes().unwrap();
            assert!(peak < during + (8 << 20), "reset left the peak at {peak}");
        }
        assert!(total_bytes() > 0);
    }
}
