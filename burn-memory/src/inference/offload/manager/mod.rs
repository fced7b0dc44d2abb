//! The manager: where every managed module's parameters are, the device cache, the learned
//! order and its prefetcher, and the background monitor. This file holds the handle and its
//! shared state; the work is in parts by responsibility:
//!
//! - `state`: the bookkeeping behind the lock (where each module is, the device cache, the
//!   least recently used);
//! - `tiers`: registering modules and moving them between the host and the disk cache;
//! - `load`: bringing a module to the device for a call, and each thread's call (its pass);
//! - `prefetch`: the learned order and the thread that reads the next module ahead;
//! - `monitor`: the thread that offloads when the device passes its thresholds.

mod load;
mod monitor;
mod prefetch;
mod state;
mod tiers;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

use burn::tensor::Shape;

use super::OffloadConfig;
use super::cache::{CacheDir, DiskFile};
use super::summary::{OffloadSummary, TierUsage};
use crate::sync::lock;
use crate::{DeviceMemory, MemoryError, MemoryTracker};
use state::{Slot, State};

/// A module's parameters on the device, in the order they were registered.
pub(crate) type DeviceParams<B> =
    Arc<Vec<<B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive>>;

/// Moves the parameters of chosen modules between the device, host memory and a disk cache,
/// so that a model larger than the device runs, its own code unchanged.
///
/// A cheap handle: clones share one manager, which lives until its last handle and the last
/// model wrapped by it are dropped; then, or at [`cleanup`](Self::cleanup), its disk cache is
/// removed. [`wrap`](Self::wrap) makes each managed parameter lazy, loading through the manager
/// when the module's `forward` reads it; a device cache, a learned-order prefetcher and a
/// monitor thread keep the device within its thresholds. How it hooks into Burn, the tiers and
/// the settings: the book's chapter "A model larger than the device: offloading".
pub struct OffloadManager<B: DeviceMemory> {
    pub(crate) inner: Arc<Inner<B>>,
}

impl<B: DeviceMemory> Clone for OffloadManager<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<B: DeviceMemory> std::fmt::Debug for OffloadManager<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OffloadManager")
            .field("device", &self.inner.device)
            .field("device_budget", &self.inner.device_budget)
            .field("host_budget", &self.inner.host_budget)
            .finish()
    }
}

/// The manager's state, shared by its handles, the models it wrapped and its two threads.
pub(crate) struct Inner<B: DeviceMemory> {
    pub(crate) config: OffloadConfig,
    pub(crate) device: B::Device,
    device_budget: u64,
    host_budget: u64,
    started: Instant,
    tracker: MemoryTracker<B>,
    state: Mutex<State<B>>,
    /// Signalled when a prefetched module is ready.
    staged_ready: Condvar,
    cache: OnceLock<CacheDir>,
    prefetch: Mutex<Option<Sender<usize>>>,
    monitor_stop: Mutex<Option<Sender<()>>>,
    cleaned: AtomicBool,
}

/// Where one parameter of a managed module came from.
#[derive(Clone, Debug)]
pub(crate) struct ParamMeta {
    pub(crate) shape: Shape,
    pub(crate) bytes: u64,
}

impl<B: DeviceMemory> OffloadManager<B> {
    /// A manager for `device`, with its monitor and prefetcher threads started. Errors: an
    /// invalid configuration, or a device whose capacity is unknown (wgpu) without
    /// `device_budget_bytes`.
    pub fn new(config: OffloadConfig, device: &B::Device) -> Result<Self, MemoryError> {
        config.validate()?;
        let device_budget = match config.device_budget_bytes {
            Some(bytes) => bytes,
            None => B::memory_capacity(device).ok_or_else(|| {
                MemoryError::invalid(
                    "device_budget_bytes",
                    "this backend does not report its device's capacity; give a byte budget",
                )
            })?,
        };
        let host_budget = config
            .host_budget_bytes
            .unwrap_or_else(crate::measure::process::total_bytes);
        let inner = Arc::new(Inner {
            device: device.clone(),
            device_budget,
            host_budget,
            started: Instant::now(),
            tracker: MemoryTracker::new(device),
            state: Mutex::new(State::new()),
            staged_ready: Condvar::new(),
            cache: OnceLock::new(),
            prefetch: Mutex::new(None),
            monitor_stop: Mutex::new(None),
            cleaned: AtomicBool::new(false),
            config,
        });
        Inner::start_prefetcher(&inner);
        Inner::start_monitor(&inner);
        Ok(Self { inner })
    }

    /// The settings.
    pub fn config(&self) -> &OffloadConfig {
        &self.inner.config
    }

    /// The disk cache's directory, once a wrap with the disk tier on has created it.
    pub fn cache_dir(&self) -> Option<&std::path::Path> {
        self.inner.cache.get().map(CacheDir::path)
    }

    /// Where everything is and what has moved so far.
    pub fn summary(&self) -> OffloadSummary {
        self.inner.summary()
    }

    /// Takes every managed module out of the device cache (their parameters stay on the host
    /// or disk tier); modules a call is running keep their copy until it ends.
    pub fn offload_all(&self) {
        let mut state = lock(&self.inner.state);
        let cached: Vec<usize> = (0..state.modules.len())
            .filter(|&m| state.modules[m].device.is_some())
            .collect();
        for module in cached {
            state.evict(module);
        }
    }

    /// Loads every managed module into the device cache, whatever the thresholds; the monitor
    /// offloads again once the device passes the offload threshold.
    pub fn load_all(&self) -> Result<(), MemoryError> {
        let count = lock(&self.inner.state).modules.len();
        (0..count).try_for_each(|module| self.inner.load_into_cache(module))
    }

    /// Takes the module at `path` (as in [`OffloadSelection::Module`](super::OffloadSelection::Module)) out
    /// of the device cache.
    pub fn offload_module(&self, path: &str) -> Result<(), MemoryError> {
        let mut state = lock(&self.inner.state);
        let module = state.find(path)?;
        state.evict(module);
        Ok(())
    }

    /// Loads the module at `path` into the device cache, whatever the thresholds.
    pub fn load_module(&self, path: &str) -> Result<(), MemoryError> {
        let module = lock(&self.inner.state).find(path)?;
        self.inner.load_into_cache(module)
    }

    /// Drops the device cache and the host tier, removes the disk cache and stops the
    /// background threads. Models wrapped by this manager can no longer load (their calls
    /// return an error); take a model back with
    /// [`OffloadedModel::into_inner`](super::OffloadedModel::into_inner) first.
    pub fn cleanup(&self) {
        self.inner.cleanup();
    }
}

impl<B: DeviceMemory> Inner<B> {
    /// The disk cache, created (and checked writable) on first use.
    pub(crate) fn cache_dir(&self) -> Result<&CacheDir, MemoryError> {
        if let Some(dir) = self.cache.get() {
            return Ok(dir);
        }
        let dir = CacheDir::open(self.config.cache_dir.as_deref())?;
        // Another wrap may have set it meanwhile: the same path, so nothing to remove.
        let _ = self.cache.set(dir);
        Ok(self.cache.get().expect("set above"))
    }

    /// An error once the manager was cleaned up.
    pub(crate) fn ensure_alive(&self) -> Result<(), MemoryError> {
        if self.cleaned.load(Ordering::Acquire) {
            return Err(MemoryError::invalid(
                "offload manager",
                "it was cleaned up; its modules' parameters are gone",
            ));
        }
        Ok(())
    }

    pub(crate) fn param_meta(&self, module: usize, index: usize) -> ParamMeta {
        lock(&self.state).modules[module].params[index].clone()
    }

    fn summary(&self) -> OffloadSummary {
        // A reading without a sync: the dashboard metrics call this every iteration.
        let device_bytes = self.tracker.sample().map_or(0, |usage| usage.in_use);
        let state = lock(&self.state);
        let count = |f: fn(&Slot<B>) -> bool| state.modules.iter().filter(|s| f(s)).count();
        OffloadSummary {
            device: TierUsage {
                bytes: device_bytes,
                budget: self.device_budget,
            },
            host: TierUsage {
                bytes: state.host_bytes,
                budget: self.host_budget,
            },
            disk: TierUsage {
                bytes: state.disk_bytes,
                budget: self.config.max_disk_bytes,
            },
            managed_modules: state.modules.len(),
            managed_bytes: state.modules.iter().map(|slot| slot.bytes).sum(),
            modules_on_device: count(|slot| slot.device.is_some()),
            modules_on_host: count(|slot| slot.host.is_some()),
            modules_on_disk: count(|slot| slot.disk.is_some()),
            seconds: self.started.elapsed().as_secs_f64(),
            counters: state.counters,
        }
    }

    fn cleanup(&self) {
        if self.cleaned.swap(true, Ordering::AcqRel) {
            return;
        }
        lock(&self.prefetch).take();
        lock(&self.monitor_stop).take();
        let files: Vec<DiskFile> = {
            let mut state = lock(&self.state);
            state.staged.clear();
            state.cached_bytes = 0;
            state.host_bytes = 0;
            state.disk_bytes = 0;
            state
                .modules
                .iter_mut()
                .filter_map(|slot| {
                    slot.device = None;
                    slot.host = None;
                    slot.disk.take()
                })
                .collect()
        };
        self.staged_ready.notify_all();
        if let Some(dir) = self.cache.get() {
            files.iter().for_each(|file| dir.remove(file));
            dir.remove_dir();
        }
    }
}

impl<B: DeviceMemory> Drop for Inner<B> {
    fn drop(&mut self) {
        self.cleanup();
    }
}
