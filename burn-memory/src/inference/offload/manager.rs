//! The manager: where every managed module's parameters are, the device cache, the learned
//! order and its prefetcher, and the background monitor.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use burn::tensor::Shape;
use burn::tensor::backend::Backend;

use super::OffloadConfig;
use super::cache::{CacheDir, DiskFile};
use super::host::HostTensor;
use super::summary::{OffloadCounters, OffloadSummary, TierUsage};
use crate::{DeviceMemory, MemoryError, MemorySource, MemoryTracker};

/// A module's parameters on the device, in the order they were registered.
pub(crate) type DeviceParams<B> =
    Arc<Vec<<B as burn::tensor::backend::BackendTypes>::FloatTensorPrimitive>>;

/// Moves the parameters of chosen modules between the device, host memory and a disk cache,
/// so that a model larger than the device runs.
///
/// A cheap handle: clones share one manager. The manager lives until its last handle and the
/// last model wrapped by it are dropped; then, or at [`cleanup`](Self::cleanup), its disk cache
/// is removed.
///
/// # How parameters come back to the device
///
/// [`wrap`](Self::wrap) replaces each managed parameter by a lazy `Param` whose initialiser
/// asks the manager for the module's parameters: Burn runs it the first time the module's
/// own `forward` reads the parameter, so the model's code is unchanged. Burn keeps a lazy
/// parameter's value once computed and has no hook after a forward, so the wrapped model hands
/// out short-lived copies of itself (cloning a lazy parameter does not run it): one per call
/// in [`OffloadedModel::run`](super::OffloadedModel::run), one per layer in
/// [`OffloadedModel::forward_layers`](super::OffloadedModel::forward_layers), whose device
/// memory is released when the copy is dropped.
///
/// The device cache keeps loaded modules for the next call while the device is below the
/// reload threshold (less two modules' worth for the module running and the next), and the
/// monitor empties it, least recently used first, when the device passes the offload
/// threshold. The host tier spills to the disk cache past the host threshold. The prefetcher
/// reads the module that will run next (the order learned on the first pass) on its own
/// thread while the current one computes; the upload to the device stays on the calling
/// thread, whose stream the model runs on.
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

struct Slot<B: Backend> {
    path: String,
    params: Vec<ParamMeta>,
    bytes: u64,
    host: Option<Arc<Vec<HostTensor>>>,
    disk: Option<DiskFile>,
    device: Option<DeviceParams<B>>,
    last_used: u64,
}

enum Staged<B: Backend> {
    Pending,
    Ready(Result<Loaded<B>, MemoryError>),
}

/// A module read ahead: on CPU backends already a tensor (the prefetcher's thread made it), on
/// device backends the bytes to upload (uploads stay on the thread whose stream runs the
/// model).
enum Loaded<B: Backend> {
    Host(Vec<HostTensor>),
    Device(DeviceParams<B>),
}

/// One call of the wrapped model on one thread.
struct Pass<B: Backend> {
    depth: usize,
    position: usize,
    /// The module this pass loaded last: its other parameters come from here.
    current: Option<(usize, DeviceParams<B>)>,
    error: Option<MemoryError>,
}

struct State<B: Backend> {
    modules: Vec<Slot<B>>,
    tick: u64,
    host_bytes: u64,
    disk_bytes: u64,
    cached_bytes: u64,
    largest: u64,
    order: Vec<usize>,
    learning: bool,
    passes: HashMap<ThreadId, Pass<B>>,
    staged: HashMap<usize, Staged<B>>,
    counters: OffloadCounters,
}

enum Source<B: Backend> {
    Staged(Result<Loaded<B>, MemoryError>),
    Host(Arc<Vec<HostTensor>>),
    Disk(DiskFile),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
            state: Mutex::new(State {
                modules: Vec::new(),
                tick: 0,
                host_bytes: 0,
                disk_bytes: 0,
                cached_bytes: 0,
                largest: 0,
                order: Vec::new(),
                learning: true,
                passes: HashMap::new(),
                staged: HashMap::new(),
                counters: OffloadCounters::default(),
            }),
            staged_ready: Condvar::new(),
            cache: OnceLock::new(),
            prefetch: Mutex::new(None),
            monitor_stop: Mutex::new(None),
            cleaned: AtomicBool::new(false),
            config,
        });
        Inner::start_threads(&inner);
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
    fn start_threads(inner: &Arc<Self>) {
        let (prefetch, requests) = mpsc::channel::<usize>();
        let weak: Weak<Self> = Arc::downgrade(inner);
        std::thread::Builder::new()
            .name("burn-memory-prefetch".into())
            .spawn(move || {
                while let Ok(module) = requests.recv() {
                    let Some(inner) = weak.upgrade() else { return };
                    inner.prefetch_now(module);
                }
            })
            .expect("the operating system refused to start the offload prefetcher's thread");
        *lock(&inner.prefetch) = Some(prefetch);

        let (stop, stopped) = mpsc::channel::<()>();
        let weak: Weak<Self> = Arc::downgrade(inner);
        let interval = Duration::from_millis(inner.config.check_interval_ms);
        std::thread::Builder::new()
            .name("burn-memory-offload-monitor".into())
            .spawn(move || {
                loop {
                    match stopped.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    let started = Instant::now();
                    inner.monitor_tick();
                    let mut state = lock(&inner.state);
                    state.counters.monitor_ticks += 1;
                    state.counters.monitor_busy_seconds += started.elapsed().as_secs_f64();
                }
            })
            .expect("the operating system refused to start the offload monitor's thread");
        *lock(&inner.monitor_stop) = Some(stop);
    }

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

    pub(crate) fn ensure_alive(&self) -> Result<(), MemoryError> {
        if self.cleaned.load(Ordering::Acquire) {
            return Err(MemoryError::invalid(
                "offload manager",
                "it was cleaned up; its modules' parameters are gone",
            ));
        }
        Ok(())
    }

    /// Registers a parameter of the module at `path` (a new module when the path is new) and
    /// returns the module's index and the parameter's index in it.
    pub(crate) fn register(&self, path: &str, meta: ParamMeta) -> (usize, usize) {
        let mut state = lock(&self.state);
        let module = match state.modules.iter().rposition(|slot| slot.path == path) {
            Some(module) => module,
            None => {
                state.modules.push(Slot {
                    path: path.to_string(),
                    params: Vec::new(),
                    bytes: 0,
                    host: None,
                    disk: None,
                    device: None,
                    last_used: 0,
                });
                state.modules.len() - 1
            }
        };
        let slot = &mut state.modules[module];
        slot.bytes += meta.bytes;
        slot.params.push(meta);
        let (index, bytes) = (slot.params.len() - 1, slot.bytes);
        state.largest = state.largest.max(bytes);
        (module, index)
    }

    /// Places a freshly wrapped module's parameters on the host or disk tier (host first, while
    /// the host is below its threshold), and in the device cache when `device` is given and
    /// there is room. On a disk error the data stays on the host (the module stays loadable)
    /// and the error is returned.
    pub(crate) fn place(
        &self,
        module: usize,
        data: Vec<HostTensor>,
        device: Option<DeviceParams<B>>,
    ) -> Result<(), MemoryError> {
        let (bytes, host_room) = {
            let state = lock(&self.state);
            let bytes = state.modules[module].bytes;
            let room = (state.host_bytes + bytes) as f64
                <= self.config.host_offload_threshold * self.host_budget as f64;
            (bytes, room)
        };
        let to_host = self.config.host_tier && (host_room || !self.config.disk_tier);
        let result = if to_host {
            Ok(())
        } else {
            match self.write_to_disk(module, &data) {
                Ok(true) => {
                    let mut state = lock(&self.state);
                    state.counters.offloads += 1;
                    if let Some(params) = device {
                        let limit = self.cache_limit(&state);
                        state.admit(module, params, limit);
                    }
                    return Ok(());
                }
                Ok(false) if self.config.host_tier => Ok(()),
                Ok(false) => Err(MemoryError::OffloadDiskFull {
                    needed: bytes,
                    limit: self.config.max_disk_bytes,
                }),
                Err(error) => Err(error),
            }
        };
        let mut state = lock(&self.state);
        state.modules[module].host = Some(Arc::new(data));
        state.host_bytes += bytes;
        state.counters.offloads += 1;
        if let Some(params) = device {
            let limit = self.cache_limit(&state);
            state.admit(module, params, limit);
        }
        result
    }

    /// Writes a module to the disk cache if it has room: `Ok(false)` (and a warning, once per
    /// module) when `max_disk_bytes` would be passed.
    fn write_to_disk(&self, module: usize, data: &[HostTensor]) -> Result<bool, MemoryError> {
        let bytes: u64 = data.iter().map(HostTensor::len).sum();
        {
            let mut state = lock(&self.state);
            if state.disk_bytes + bytes > self.config.max_disk_bytes {
                state.counters.disk_full += 1;
                tracing::warn!(
                    "offload disk cache full ({} of {} bytes): {} stays on the host",
                    state.disk_bytes,
                    self.config.max_disk_bytes,
                    state.modules[module].path
                );
                return Ok(false);
            }
            // Reserve the room before writing, so that concurrent spills cannot overshoot.
            state.disk_bytes += bytes;
        }
        let written = self.cache_dir().and_then(|dir| {
            dir.write(
                &format!("m{module:05}"),
                data,
                self.config.compress_disk_cache,
            )
        });
        let mut state = lock(&self.state);
        state.disk_bytes -= bytes;
        let file = written?;
        state.disk_bytes += file.len;
        state.counters.spills_to_disk += 1;
        state.counters.bytes_to_disk += file.len;
        state.modules[module].disk = Some(file);
        Ok(true)
    }

    /// Moves a host-tier module to disk; `false` when it cannot (no room, a write error:
    /// warned, the module stays on the host).
    fn spill(&self, module: usize) -> bool {
        let data = {
            let state = lock(&self.state);
            match (&state.modules[module].host, &state.modules[module].disk) {
                (Some(data), None) => data.clone(),
                _ => return false,
            }
        };
        match self.write_to_disk(module, &data) {
            Ok(true) => {
                let mut state = lock(&self.state);
                if state.modules[module].host.take().is_some() {
                    state.host_bytes -= state.modules[module].bytes;
                }
                true
            }
            Ok(false) => false,
            Err(error) => {
                tracing::warn!("cannot spill a module to disk, it stays on the host: {error}");
                false
            }
        }
    }

    /// Bytes the device cache may hold: the reload threshold of the budget, less two modules
    /// (the one running and the next).
    fn cache_limit(&self, state: &State<B>) -> u64 {
        let limit = self.config.device_reload_threshold * self.device_budget as f64;
        (limit as u64).saturating_sub(2 * state.largest)
    }

    /// Forgets modules whose wrap failed: their data is dropped and their files removed.
    pub(crate) fn forget(&self, modules: &[usize]) {
        let mut state = lock(&self.state);
        for &module in modules {
            state.evict(module);
            let slot = &mut state.modules[module];
            let host = slot.host.take().map_or(0, |_| slot.bytes);
            let file = slot.disk.take();
            state.host_bytes -= host;
            if let Some(file) = file {
                state.disk_bytes -= file.len;
                if let Some(dir) = self.cache.get() {
                    dir.remove(&file);
                }
            }
        }
    }

    /// The parameters of `module` on the device, for a lazy parameter's initialiser.
    pub(crate) fn fetch(&self, module: usize) -> Result<DeviceParams<B>, MemoryError> {
        self.ensure_alive()?;
        let thread = std::thread::current().id();
        let mut state = lock(&self.state);
        if let Some(Pass {
            current: Some((current, params)),
            ..
        }) = state.passes.get(&thread)
            && *current == module
        {
            return Ok(params.clone());
        }
        state.tick += 1;
        let tick = state.tick;
        let next = state.advance(thread, module, self.config.prefetch);
        state.modules[module].last_used = tick;
        if let Some(params) = state.modules[module].device.clone() {
            state.counters.cache_hits += 1;
            state.set_current(thread, module, params.clone());
            drop(state);
            self.request_prefetch(next);
            return Ok(params);
        }
        let source = loop {
            match state.staged.remove(&module) {
                Some(Staged::Ready(result)) => {
                    state.counters.prefetch_hits += 1;
                    break Source::Staged(result);
                }
                Some(Staged::Pending) => {
                    state.staged.insert(module, Staged::Pending);
                    state = self
                        .staged_ready
                        .wait(state)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                None => break state.source(module)?,
            }
        };
        let from_disk = match &source {
            Source::Disk(_) => true,
            Source::Host(_) => false,
            Source::Staged(_) => state.modules[module].host.is_none(),
        };
        drop(state);
        self.request_prefetch(next);
        let params = match source {
            Source::Staged(result) => match result? {
                Loaded::Device(params) => params,
                Loaded::Host(data) => self.upload(&data),
            },
            Source::Host(data) => self.upload(&data),
            Source::Disk(file) => self.upload(&self.cache_dir()?.read(&file)?),
        };
        let mut state = lock(&self.state);
        let bytes = state.modules[module].bytes;
        if from_disk {
            state.counters.loads_from_disk += 1;
            state.counters.bytes_from_disk += bytes;
        } else {
            state.counters.loads_from_host += 1;
            state.counters.bytes_from_host += bytes;
        }
        let limit = self.cache_limit(&state);
        state.admit(module, params.clone(), limit);
        state.set_current(thread, module, params.clone());
        Ok(params)
    }

    fn load_into_cache(&self, module: usize) -> Result<(), MemoryError> {
        let params = self.fetch(module)?;
        let mut state = lock(&self.state);
        state.admit(module, params, u64::MAX);
        state.release_current(std::thread::current().id());
        Ok(())
    }

    fn request_prefetch(&self, next: Option<usize>) {
        let Some(module) = next else { return };
        {
            let mut state = lock(&self.state);
            if state.modules[module].device.is_some() || state.staged.contains_key(&module) {
                return;
            }
            state.staged.insert(module, Staged::Pending);
            state.counters.prefetches += 1;
        }
        let sent = lock(&self.prefetch)
            .as_ref()
            .is_some_and(|sender| sender.send(module).is_ok());
        if !sent {
            lock(&self.state).staged.remove(&module);
            self.staged_ready.notify_all();
        }
    }

    /// Tensors on the device over `data`: zero-copy on CPU backends, one upload on others.
    fn upload(&self, data: &[HostTensor]) -> DeviceParams<B> {
        Arc::new(
            data.iter()
                .map(|data| B::float_from_data(data.to_data(), &self.device))
                .collect(),
        )
    }

    /// Reads a module ahead, on the prefetcher's thread.
    fn prefetch_now(&self, module: usize) {
        let source = lock(&self.state).source(module);
        let result = source.and_then(|source| {
            let data = match source {
                Source::Host(data) => data.to_vec(),
                Source::Disk(file) => self.cache_dir()?.read(&file)?,
                Source::Staged(result) => return result,
            };
            Ok(if B::SOURCE == MemorySource::Process {
                Loaded::Device(self.upload(&data))
            } else {
                Loaded::Host(data)
            })
        });
        let mut state = lock(&self.state);
        if let Some(Staged::Pending) = state.staged.get(&module) {
            state.staged.insert(module, Staged::Ready(result));
        }
        drop(state);
        self.staged_ready.notify_all();
    }

    fn monitor_tick(&self) {
        let in_use = match self.tracker.sample() {
            Ok(usage) => usage.in_use,
            Err(error) => {
                tracing::warn!("offload monitor cannot read the device: {error}");
                return;
            }
        };
        let ratio = in_use as f64 / self.device_budget as f64;
        {
            let mut state = lock(&self.state);
            let count = if ratio > self.config.device_emergency_threshold {
                usize::MAX
            } else if ratio > self.config.device_offload_threshold {
                self.config.offload_batch_size
            } else {
                0
            };
            for module in state.least_recently_used(count, |slot| slot.device.is_some()) {
                state.evict(module);
            }
        }
        if !self.config.disk_tier {
            return;
        }
        let spill_over = |state: &State<B>| {
            state.host_bytes as f64 > self.config.host_offload_threshold * self.host_budget as f64
        };
        let candidates = {
            let state = lock(&self.state);
            if !spill_over(&state) {
                return;
            }
            state.least_recently_used(self.config.offload_batch_size, |slot| {
                slot.host.is_some() && slot.disk.is_none()
            })
        };
        for module in candidates {
            if !spill_over(&lock(&self.state)) || !self.spill(module) {
                break;
            }
        }
    }

    pub(crate) fn begin_pass(&self) {
        let thread = std::thread::current().id();
        let mut state = lock(&self.state);
        state
            .passes
            .entry(thread)
            .or_insert(Pass {
                depth: 0,
                position: 0,
                current: None,
                error: None,
            })
            .depth += 1;
    }

    /// Ends this thread's call; the first error a load met during it, if any.
    pub(crate) fn end_pass(&self) -> Result<(), MemoryError> {
        let thread = std::thread::current().id();
        let mut state = lock(&self.state);
        let Some(pass) = state.passes.get_mut(&thread) else {
            return Ok(());
        };
        pass.depth -= 1;
        if pass.depth > 0 {
            return Ok(());
        }
        let pass = state.passes.remove(&thread).expect("present above");
        match pass.error {
            Some(error) => Err(error),
            None => {
                if !state.order.is_empty() {
                    state.learning = false;
                }
                Ok(())
            }
        }
    }

    /// Drops the module this thread's call holds (between layers).
    pub(crate) fn release_current(&self) {
        lock(&self.state).release_current(std::thread::current().id());
    }

    /// Keeps the first error of this thread's call, for `end_pass`.
    pub(crate) fn record_error(&self, error: MemoryError) {
        let thread = std::thread::current().id();
        let mut state = lock(&self.state);
        match state.passes.get_mut(&thread) {
            Some(pass) => {
                pass.error.get_or_insert(error);
            }
            None => tracing::error!("offloaded parameter could not be loaded: {error}"),
        }
    }

    /// The first error of this thread's call so far.
    pub(crate) fn has_error(&self) -> bool {
        let thread = std::thread::current().id();
        lock(&self.state)
            .passes
            .get(&thread)
            .is_some_and(|pass| pass.error.is_some())
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

impl<B: Backend> State<B> {
    fn find(&self, path: &str) -> Result<usize, MemoryError> {
        self.modules
            .iter()
            .position(|slot| slot.path == path)
            .ok_or_else(|| MemoryError::invalid("module", format!("no managed module at `{path}`")))
    }

    /// Where to load `module` from: the host tier first.
    fn source(&self, module: usize) -> Result<Source<B>, MemoryError> {
        let slot = &self.modules[module];
        match (&slot.host, &slot.disk) {
            (Some(data), _) => Ok(Source::Host(data.clone())),
            (None, Some(file)) => Ok(Source::Disk(file.clone())),
            (None, None) => Err(MemoryError::invalid(
                "offload manager",
                format!(
                    "`{}` has no copy left (the manager was cleaned up)",
                    slot.path
                ),
            )),
        }
    }

    /// Follows the learned order: the module to prefetch next, or `None` (no prefetch, still
    /// learning, or the order just changed and is learned again).
    fn advance(&mut self, thread: ThreadId, module: usize, prefetch: bool) -> Option<usize> {
        let pass = self.passes.get_mut(&thread)?;
        let position = pass.position;
        pass.position += 1;
        if self.order.get(position) == Some(&module) {
            // On the learned order.
        } else if self.learning && position == self.order.len() {
            self.order.push(module);
        } else {
            self.order.truncate(position);
            self.order.push(module);
            self.learning = true;
            self.counters.order_resets += 1;
            self.staged
                .retain(|_, staged| matches!(staged, Staged::Pending));
            return None;
        }
        if !prefetch || self.learning {
            return None;
        }
        let next = self.order.get(position + 1).or(self.order.first()).copied();
        next.filter(|&next| next != module)
    }

    fn set_current(&mut self, thread: ThreadId, module: usize, params: DeviceParams<B>) {
        if let Some(pass) = self.passes.get_mut(&thread) {
            pass.current = Some((module, params));
        }
    }

    fn release_current(&mut self, thread: ThreadId) {
        if let Some(pass) = self.passes.get_mut(&thread) {
            pass.current = None;
        }
    }

    /// Keeps `params` in the device cache if the cache stays within `limit`.
    fn admit(&mut self, module: usize, params: DeviceParams<B>, limit: u64) {
        let bytes = self.modules[module].bytes;
        if self.modules[module].device.is_none() && self.cached_bytes + bytes <= limit {
            self.modules[module].device = Some(params);
            self.cached_bytes += bytes;
        }
    }

    fn evict(&mut self, module: usize) {
        if self.modules[module].device.take().is_some() {
            self.cached_bytes -= self.modules[module].bytes;
            self.counters.offloads += 1;
        }
    }

    /// Up to `count` modules matching `filter`, least recently used first.
    fn least_recently_used(&self, count: usize, filter: impl Fn(&Slot<B>) -> bool) -> Vec<usize> {
        let mut modules: Vec<usize> = (0..self.modules.len())
            .filter(|&m| filter(&self.modules[m]))
            .collect();
        modules.sort_by_key(|&m| self.modules[m].last_used);
        modules.truncate(count);
        modules
    }
}
