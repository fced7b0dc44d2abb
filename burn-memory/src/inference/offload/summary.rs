//! What the offload manager holds where, and what it has moved.

use std::fmt;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

/// One tier's bytes against its budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TierUsage {
    /// Bytes in the tier: the device's in-use memory (all of it, not only managed modules),
    /// the host tier's parameter bytes, the disk cache's file bytes.
    pub bytes: u64,
    /// The tier's budget: the device budget, the host budget, `max_disk_bytes`.
    pub budget: u64,
}

impl TierUsage {
    /// `bytes / budget`.
    pub fn ratio(&self) -> f64 {
        self.bytes as f64 / self.budget.max(1) as f64
    }
}

/// Totals since the manager started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OffloadCounters {
    /// Modules taken off the device: at wrap time and out of the device cache.
    pub offloads: u64,
    /// Modules moved from the host tier to the disk cache.
    pub spills_to_disk: u64,
    /// Bytes written to the disk cache (after compression).
    pub bytes_to_disk: u64,
    /// Modules loaded onto the device from the host tier.
    pub loads_from_host: u64,
    /// Modules loaded onto the device from the disk cache.
    pub loads_from_disk: u64,
    /// Parameter bytes loaded from the host tier.
    pub bytes_from_host: u64,
    /// Parameter bytes loaded from the disk cache.
    pub bytes_from_disk: u64,
    /// Loads answered by the device cache.
    pub cache_hits: u64,
    /// Loads whose data the prefetcher had read ahead.
    pub prefetch_hits: u64,
    /// Modules the prefetcher read ahead.
    pub prefetches: u64,
    /// Times a pass ran modules in another order than the learned one (the order is relearned).
    pub order_resets: u64,
    /// Modules that stayed on the host because the disk cache was full.
    pub disk_full: u64,
    /// Readings the background monitor took.
    pub monitor_ticks: u64,
    /// Seconds the background monitor spent working (reading memory and deciding).
    pub monitor_busy_seconds: f64,
}

/// A snapshot of an [`OffloadManager`](super::OffloadManager).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OffloadSummary {
    /// The device: memory in use against the device budget.
    pub device: TierUsage,
    /// The host tier: parameter bytes held in RAM against the host budget.
    pub host: TierUsage,
    /// The disk cache: file bytes against `max_disk_bytes`.
    pub disk: TierUsage,
    /// Modules under management.
    pub managed_modules: usize,
    /// Their offloadable parameter bytes.
    pub managed_bytes: u64,
    /// Modules with a copy in the device cache.
    pub modules_on_device: usize,
    /// Modules held in the host tier.
    pub modules_on_host: usize,
    /// Modules in the disk cache.
    pub modules_on_disk: usize,
    /// Seconds since the manager started.
    pub seconds: f64,
    /// Totals since the manager started.
    pub counters: OffloadCounters,
}

impl OffloadSummary {
    /// Parameter bytes loaded onto the device, from both tiers.
    pub fn bytes_loaded(&self) -> u64 {
        self.counters.bytes_from_host + self.counters.bytes_from_disk
    }

    /// The monitor's working time as a fraction of the manager's lifetime.
    pub fn monitor_overhead(&self) -> f64 {
        self.counters.monitor_busy_seconds / self.seconds.max(f64::MIN_POSITIVE)
    }
}

impl fmt::Display for OffloadSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counters;
        let tier = |f: &mut fmt::Formatter<'_>, name: &str, usage: &TierUsage, modules: usize| {
            writeln!(
                f,
                "  {name:<7}{:>11} of {:>11} ({:5.1} %), {modules} modules",
                ByteSize(usage.bytes).to_string(),
                ByteSize(usage.budget).to_string(),
                100.0 * usage.ratio()
            )
        };
        writeln!(
            f,
            "offload: {} modules, {} of parameters",
            self.managed_modules,
            ByteSize(self.managed_bytes)
        )?;
        tier(f, "device", &self.device, self.modules_on_device)?;
        tier(f, "host", &self.host, self.modules_on_host)?;
        tier(f, "disk", &self.disk, self.modules_on_disk)?;
        writeln!(
            f,
            "  loads: {} from host ({}), {} from disk ({}); {} device-cache hits, {} of {} \
             prefetches used",
            c.loads_from_host,
            ByteSize(c.bytes_from_host),
            c.loads_from_disk,
            ByteSize(c.bytes_from_disk),
            c.cache_hits,
            c.prefetch_hits,
            c.prefetches
        )?;
        writeln!(
            f,
            "  offloads: {}, spills to disk: {} ({} written), disk full: {}, order relearned: {}",
            c.offloads,
            c.spills_to_disk,
            ByteSize(c.bytes_to_disk),
            c.disk_full,
            c.order_resets
        )?;
        write!(
            f,
            "  monitor: {} readings, {:.3} % of the time",
            c.monitor_ticks,
            100.0 * self.monitor_overhead()
        )
    }
}
