//! What the offload manager may do, and when.

use std::path::PathBuf;

use burn::config::Config;

use crate::MemoryError;

/// Settings of an [`OffloadManager`](super::OffloadManager).
///
/// Thresholds are fractions of a budget: the device budget is
/// [`device_budget_bytes`](Self::device_budget_bytes) where given, else the device's capacity
/// (`DeviceMemory::memory_capacity`; wgpu reports none, so it needs a byte budget). The host
/// budget is [`host_budget_bytes`](Self::host_budget_bytes) where given, else the machine's RAM.
#[derive(Config, Debug)]
pub struct OffloadConfig {
    /// Device usage (fraction of the device budget) above which managed modules leave the
    /// device cache, least recently used first.
    #[config(default = 0.85)]
    pub device_offload_threshold: f64,
    /// Device usage above which every cached module leaves the device at once.
    #[config(default = 0.95)]
    pub device_emergency_threshold: f64,
    /// Device usage up to which a loaded module may stay cached on the device for the next call.
    #[config(default = 0.70)]
    pub device_reload_threshold: f64,
    /// Host-tier usage (fraction of the host budget) above which modules spill to disk.
    #[config(default = 0.90)]
    pub host_offload_threshold: f64,
    /// How often the background monitor reads memory, in milliseconds.
    #[config(default = 100)]
    pub check_interval_ms: u64,
    /// Offloaded parameters may stay in host memory.
    #[config(default = true)]
    pub host_tier: bool,
    /// Offloaded parameters may go to the disk cache.
    #[config(default = true)]
    pub disk_tier: bool,
    /// Compress disk-cache files with zstd (level 1): about 8–11 % smaller on f32 weights, at
    /// about 650 MB/s each way (see the book's memory studies). Needs the `compress` feature,
    /// and is on by default where it is built.
    #[config(default = "cfg!(feature = \"compress\")")]
    pub compress_disk_cache: bool,
    /// Offload every managed parameter while wrapping, one at a time, so a model larger than the
    /// device never lands on it whole.
    #[config(default = true)]
    pub eager_offload: bool,
    /// Offload 1-D parameters too; off by default, since biases and norm scales are small and
    /// every forward reads them.
    #[config(default = false)]
    pub offload_1d_parameters: bool,
    /// The most bytes the disk cache may hold; a module that would pass it stays on the host.
    #[config(default = 50_000_000_000)]
    pub max_disk_bytes: u64,
    /// The most modules one decision moves (a monitor tick, one eviction on the load path).
    #[config(default = 10)]
    pub offload_batch_size: usize,
    /// Read the module that will run next ahead, in the order learned from the first pass.
    #[config(default = true)]
    pub prefetch: bool,
    /// The device budget in bytes, in place of the device's capacity.
    #[config(default = "None")]
    pub device_budget_bytes: Option<u64>,
    /// The host budget in bytes, in place of the machine's RAM.
    #[config(default = "None")]
    pub host_budget_bytes: Option<u64>,
    /// Where the disk cache goes: a directory the manager creates and removes on cleanup; a
    /// fresh one under the system's temporary directory when not given.
    #[config(default = "None")]
    pub cache_dir: Option<PathBuf>,
}

impl OffloadConfig {
    /// For a device much smaller than the model: offload early, compress the disk cache and
    /// move more modules per decision.
    pub fn for_low_memory() -> Self {
        Self::new()
            .with_device_offload_threshold(0.70)
            .with_device_emergency_threshold(0.85)
            .with_device_reload_threshold(0.50)
            .with_host_offload_threshold(0.75)
            .with_check_interval_ms(50)
            .with_offload_batch_size(20)
            .with_compress_disk_cache(cfg!(feature = "compress"))
    }

    /// For latency: keep more on the device, an uncompressed disk cache and prefetch.
    pub fn for_high_performance() -> Self {
        Self::new()
            .with_device_offload_threshold(0.90)
            .with_device_emergency_threshold(0.98)
            .with_device_reload_threshold(0.80)
            .with_host_offload_threshold(0.95)
            .with_offload_batch_size(5)
            .with_compress_disk_cache(false)
            .with_prefetch(true)
    }

    /// Checks every setting: thresholds in (0, 1] with reload < offload ≤ emergency, non-zero
    /// budgets, interval and batch size, and at least one tier to offload to.
    pub fn validate(&self) -> Result<(), MemoryError> {
        let thresholds = [
            ("device_offload_threshold", self.device_offload_threshold),
            (
                "device_emergency_threshold",
                self.device_emergency_threshold,
            ),
            ("device_reload_threshold", self.device_reload_threshold),
            ("host_offload_threshold", self.host_offload_threshold),
        ];
        for (name, value) in thresholds {
            if !(value > 0.0 && value <= 1.0) {
                return Err(MemoryError::invalid(
                    name,
                    format!("{value}: a threshold is a fraction in (0, 1]"),
                ));
            }
        }
        if self.compress_disk_cache && !cfg!(feature = "compress") {
            return Err(MemoryError::invalid(
                "compress_disk_cache",
                "compression needs burn-memory's `compress` feature, which this build left out",
            ));
        }
        if self.device_reload_threshold >= self.device_offload_threshold {
            return Err(MemoryError::invalid(
                "device_reload_threshold",
                format!(
                    "{} is not below the offload threshold {}: modules would be reloaded and \
                     offloaded in turn",
                    self.device_reload_threshold, self.device_offload_threshold
                ),
            ));
        }
        if self.device_emergency_threshold < self.device_offload_threshold {
            return Err(MemoryError::invalid(
                "device_emergency_threshold",
                format!(
                    "{} is below the offload threshold {}",
                    self.device_emergency_threshold, self.device_offload_threshold
                ),
            ));
        }
        for (name, budget) in [
            ("device_budget_bytes", self.device_budget_bytes),
            ("host_budget_bytes", self.host_budget_bytes),
        ] {
            if budget == Some(0) {
                return Err(MemoryError::invalid(name, "a budget of 0 bytes"));
            }
        }
        if self.check_interval_ms == 0 {
            return Err(MemoryError::invalid("check_interval_ms", "0 ms"));
        }
        if self.offload_batch_size == 0 {
            return Err(MemoryError::invalid("offload_batch_size", "0 modules"));
        }
        if self.disk_tier && self.max_disk_bytes == 0 {
            return Err(MemoryError::invalid(
                "max_disk_bytes",
                "0 bytes with the disk tier on",
            ));
        }
        if !self.host_tier && !self.disk_tier {
            return Err(MemoryError::invalid(
                "tiers",
                "neither the host nor the disk tier is on: offloaded parameters have nowhere to go",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones_and_valid() {
        let config = OffloadConfig::new();
        assert_eq!(config.device_offload_threshold, 0.85);
        assert_eq!(config.device_emergency_threshold, 0.95);
        assert_eq!(config.device_reload_threshold, 0.70);
        assert_eq!(config.host_offload_threshold, 0.90);
        assert_eq!(config.check_interval_ms, 100);
        assert!(config.host_tier && config.disk_tier);
        assert_eq!(config.compress_disk_cache, cfg!(feature = "compress"));
        assert!(config.eager_offload && config.prefetch && !config.offload_1d_parameters);
        assert_eq!(config.max_disk_bytes, 50_000_000_000);
        assert_eq!(config.offload_batch_size, 10);
        config.validate().unwrap();
        OffloadConfig::for_low_memory().validate().unwrap();
        OffloadConfig::for_high_performance().validate().unwrap();
    }

    #[test]
    fn bad_settings_are_typed_errors_naming_the_setting() {
        let cases = [
            (
                OffloadConfig::new().with_device_offload_threshold(0.0),
                "device_offload_threshold",
            ),
            (
                OffloadConfig::new().with_host_offload_threshold(1.5),
                "host_offload_threshold",
            ),
            (
                OffloadConfig::new().with_device_reload_threshold(f64::NAN),
                "device_reload_threshold",
            ),
            (
                OffloadConfig::new().with_device_reload_threshold(0.9),
                "device_reload_threshold",
            ),
            (
                OffloadConfig::new().with_device_emergency_threshold(0.8),
                "device_emergency_threshold",
            ),
            (
                OffloadConfig::new().with_device_budget_bytes(Some(0)),
                "device_budget_bytes",
            ),
            (
                OffloadConfig::new().with_host_budget_bytes(Some(0)),
                "host_budget_bytes",
            ),
            (
                OffloadConfig::new().with_check_interval_ms(0),
                "check_interval_ms",
            ),
            (
                OffloadConfig::new().with_offload_batch_size(0),
                "offload_batch_size",
            ),
            (
                OffloadConfig::new().with_max_disk_bytes(0),
                "max_disk_bytes",
            ),
            (
                OffloadConfig::new()
                    .with_host_tier(false)
                    .with_disk_tier(false),
                "tiers",
            ),
        ];
        for (config, setting) in cases {
            match config.validate() {
                Err(MemoryError::Invalid { name, .. }) => assert_eq!(name, setting),
                other => panic!("{setting}: expected an Invalid error, got {other:?}"),
            }
        }
    }
}
