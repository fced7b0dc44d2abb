//! Which operation, in which scope, took the time and the memory: a profiler for any Burn
//! backend, with PyTorch-compatible memory snapshots and a viewer.
//!
//! PyTorch users reach for `torch.profiler.profile(record_shapes=True)` and
//! `prof.key_averages().table(sort_by=..., row_limit=10)`, and for a trace to open in
//! Perfetto. This crate gives the same on every Burn backend:
//!
//! - [`Profiled<B>`]: a backend that is `B` with every operation recorded while a
//!   [`Profiler`] runs. Train with `Autodiff<Profiled<B>>` and the backward pass's operations
//!   are recorded too.
//! - [`scope`]: a named region (PyTorch's `record_function`); operations record the scopes
//!   open on their thread.
//! - [`Profile`]: what a run recorded, as a [`KeyAverages`] table (`Display` and JSON) and a
//!   Chrome trace ([`Profile::write_chrome_trace`]) that opens in Perfetto or
//!   `chrome://tracing`.
//! - [`Profile::write_memory_snapshot`] (PyTorch's memory snapshot, for its viewers) and
//!   [`Profile::write_viewer`] (a self-contained HTML viewer); [`StepProfiler`] and
//!   [`write_profile`] write every format for a window of training steps.
//!
//! Modules: `backend` and the generated `ops` (the forwarding), [`record`] (what an operation
//! records, in the process's one session), `table`, `trace`, `snapshot`, `viewer` and `steps`
//! (what a profile writes). On CPU backends the heap's allocations come from burn-memory's
//! allocation log ([`burn_memory::hooks`]).
//!
//! Times are host times (the inner backend's method returning) unless
//! [`ProfilerConfig::sync_each_op`] is on: a lazy backend (`Wgpu`, `Cuda`, anything under
//! Fusion) returns before the device has run the work, so its host times say where the
//! *queueing* goes, and the time of the work shows up in `sync` and in reads. Syncing after
//! every operation measures each operation's device time, at the price of the overlap that
//! makes lazy backends fast.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::tensor::{Distribution, Tensor};
//! use burn_profiler::{Profiled, Profiler, ProfilerConfig, scope};
//!
//! type B = Autodiff<Profiled<NdArray>>;
//! let device = Default::default();
//! let profiler = Profiler::start(ProfilerConfig::new().with_record_shapes(true)).unwrap();
//! let x = Tensor::<B, 2>::random([64, 32], Distribution::Default, &device).require_grad();
//! let w = Tensor::<B, 2>::random([32, 16], Distribution::Default, &device).require_grad();
//! {
//!     let _layer = scope("layer");
//!     let loss = x.clone().matmul(w.clone()).tanh().sum();
//!     let _grads = loss.backward();
//! }
//! let profile = profiler.stop();
//! let table = profile.key_averages();
//! // The forward's matmul and the two of its backward.
//! assert_eq!(table.row("float_matmul").unwrap().calls, 3);
//! println!("{}", table.sorted_by(burn_profiler::SortBy::TotalTime).limit(10));
//! ```

#![warn(missing_docs)]

mod backend;
mod error;
mod ops;
pub mod record;
mod snapshot;
mod steps;
mod sync;
mod table;
mod trace;
mod viewer;

pub use backend::Profiled;
pub use burn_memory::hooks::{AllocAction, AllocEvent};
pub use error::ProfileError;
pub use record::{OpEvent, ScopeEvent, TensorDesc};

pub use steps::{StepProfiler, write_profile};
pub use table::{KeyAverages, KeyAveragesRow, RowKind, SortBy};

use std::sync::atomic::Ordering;

use burn_memory::{DeviceMemory, MemoryUsage};
use record::{ACTIVE, OPEN_SCOPES, OpenScope, RECORDING, Recording, SESSION, Settings};
use sync::lock;

/// What a [`Profiler`] records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfilerConfig {
    /// Record the shapes and element types of each operation's inputs (PyTorch's
    /// `record_shapes`). Off by default: it costs a small allocation per operation.
    pub record_shapes: bool,
    /// Sync the device after every operation, so each records its device time. Off by
    /// default: on a lazy backend it serialises the work it measures.
    pub sync_each_op: bool,
    /// The most events (operations and scopes) kept; later ones are counted in
    /// [`Profile::dropped`] (PyTorch's `max_entries`). At least 1.
    pub max_entries: usize,
}

impl ProfilerConfig {
    /// Host times, no shapes, up to a million events.
    pub fn new() -> Self {
        Self {
            record_shapes: false,
            sync_each_op: false,
            max_entries: 1_000_000,
        }
    }

    /// Sets [`record_shapes`](Self::record_shapes).
    pub fn with_record_shapes(mut self, record_shapes: bool) -> Self {
        self.record_shapes = record_shapes;
        self
    }

    /// Sets [`sync_each_op`](Self::sync_each_op).
    pub fn with_sync_each_op(mut self, sync_each_op: bool) -> Self {
        self.sync_each_op = sync_each_op;
        self
    }

    /// Sets [`max_entries`](Self::max_entries).
    pub fn with_max_entries(mut self, max_entries: usize) -> Self {
        self.max_entries = max_entries;
        self
    }
}

impl Default for ProfilerConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// A running profiling session: operations of every [`Profiled`] backend, on every thread,
/// are recorded from [`start`](Self::start) to [`stop`](Self::stop). One runs per process at
/// a time. Dropped without `stop`, it ends and discards what it recorded.
#[derive(Debug)]
#[must_use = "a profiler records until it is stopped; dropping it discards the recording"]
pub struct Profiler {
    session: u64,
}

impl Profiler {
    /// Starts recording.
    ///
    /// # Errors
    /// [`ProfileError::Invalid`] for `max_entries = 0`; [`ProfileError::Running`] when
    /// another profiler is running in the process.
    pub fn start(config: ProfilerConfig) -> Result<Self, ProfileError> {
        Self::start_sampling(config, None, false)
    }

    /// Starts recording, and after each operation reads `device`'s memory into the
    /// operation's [`memory`](OpEvent::memory): the timeline of bytes in use and reserved,
    /// and [`Profile::peak`] with the operation and scopes where it peaked. `B` is the
    /// backend the memory belongs to (`NdArray`, `Wgpu`…, not `Profiled`): on CPU backends
    /// with a [`CountingAllocator`](burn_memory::CountingAllocator), the heap counted exactly
    /// (including the profiler's own records, a few hundred bytes per operation); on CubeCL
    /// backends, the memory pools. On a lazy backend the memory after an operation is that
    /// of the work run so far; with [`ProfilerConfig::sync_each_op`] it is the operation's.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_with_memory<B: DeviceMemory>(
        config: ProfilerConfig,
        device: &B::Device,
    ) -> Result<Self, ProfileError> {
        let sampler: record::Sampler = if B::SOURCE == burn_memory::MemorySource::Process
            && burn_memory::hooks::heap_counts().is_some()
        {
            cpu_sampler()
        } else {
            let device = device.clone();
            Box::new(move || B::memory_usage(&device, B::current_stream()).ok())
        };
        // Heap blocks are the tensors' memory only on CPU backends; elsewhere they would be
        // the host side's bookkeeping.
        let log_allocations = B::SOURCE == burn_memory::MemorySource::Process;
        Self::start_sampling(config, Some(sampler), log_allocations)
    }

    fn start_sampling(
        config: ProfilerConfig,
        sampler: Option<record::Sampler>,
        log_allocations: bool,
    ) -> Result<Self, ProfileError> {
        if config.max_entries == 0 {
            return Err(ProfileError::Invalid {
                name: "max_entries",
                message: "0 would record nothing; use at least 1".into(),
            });
        }
        let mut recording = lock(&RECORDING);
        if recording.is_some() {
            return Err(ProfileError::Running);
        }
        let new = Recording::new(
            Settings {
                max_entries: config.max_entries,
            },
            sampler,
        );
        let started = new.started;
        *recording = Some(new);
        let session = SESSION.fetch_add(1, Ordering::Relaxed) + 1;
        if log_allocations {
            // Under `RECORDING`'s lock, so that no other profiler starts meanwhile; the
            // allocator never takes that lock, so allocating the log's buffer here is safe.
            burn_memory::hooks::start_log(config.max_entries, started, session, record::alloc_site);
        }
        record::RECORD_SHAPES.store(config.record_shapes, Ordering::Relaxed);
        record::SYNC_EACH_OP.store(config.sync_each_op, Ordering::Relaxed);
        ACTIVE.store(true, Ordering::Relaxed);
        Ok(Self { session })
    }

    /// Stops recording and returns what was recorded. Scopes still open on the calling
    /// thread are closed now and marked [`left_open`](ScopeEvent::left_open), with a warning
    /// (scopes open on other threads at this moment are not seen).
    pub fn stop(self) -> Profile {
        let left_open = OPEN_SCOPES.with(|stack| {
            let stack = stack.borrow();
            stack
                .iter()
                .enumerate()
                .filter(|(_, scope)| scope.session == self.session)
                .map(|(depth, scope)| (*scope, depth as u32))
                .collect::<Vec<_>>()
        });
        for &(scope, depth) in left_open.iter().rev() {
            record::close_scope(scope, depth, true);
        }
        let (recording, log) = self.end();
        let mut profile = Profile::from(recording);
        if let Some(log) = log {
            profile.allocations = log.events();
            profile.dropped += log.dropped();
        }
        for scope in profile.scopes.iter().filter(|scope| scope.left_open) {
            tracing::warn!(
                "profiler: scope `{}` was still open when the profiler stopped; closed there",
                profile.scope_names[scope.name as usize]
            );
        }
        if profile.dropped > 0 {
            tracing::warn!(
                "profiler: {} events (operations, scopes, allocations) past max_entries were \
                 not recorded",
                profile.dropped
            );
        }
        profile
    }

    /// Ends the session, if still this one, returning its recording and allocation log.
    fn end(&self) -> (Option<Recording>, Option<burn_memory::hooks::AllocLog>) {
        let mut recording = lock(&RECORDING);
        if SESSION.load(Ordering::Relaxed) != self.session {
            return (None, None);
        }
        ACTIVE.store(false, Ordering::Relaxed);
        let log = burn_memory::hooks::stop_log();
        (recording.take(), log)
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        self.end();
    }
}

/// Everything one [`Profiler`] run recorded.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Profile {
    /// The operations, in the order they finished.
    pub ops: Vec<OpEvent>,
    /// The scopes, in the order they closed.
    pub scopes: Vec<ScopeEvent>,
    /// The scope names the events refer to by index.
    pub scope_names: Vec<String>,
    /// Heap allocations and frees, in order, on CPU backends with a
    /// [`CountingAllocator`](burn_memory::CountingAllocator), when the profiler sampled memory
    /// ([`Profiler::start_with_memory`]); empty elsewhere. Every allocation of the process
    /// is there, the profiler's own records included, so that the sizes add up exactly to
    /// the counted bytes in use: each event's [`in_use`](AllocEvent::in_use) is the previous
    /// one's plus or minus its size. At most `max_entries` of them.
    pub allocations: Vec<AllocEvent>,
    /// Events not recorded because `max_entries` was reached: operations and scopes past
    /// `max_entries` of them, and allocations and frees past `max_entries` of those (the
    /// allocation log keeps the first ones, so that what it holds stays consistent).
    pub dropped: u64,
}

impl From<Option<Recording>> for Profile {
    fn from(recording: Option<Recording>) -> Self {
        match recording {
            Some(recording) => Self {
                ops: recording.ops,
                scopes: recording.scopes,
                scope_names: recording.scope_names,
                allocations: Vec::new(),
                dropped: recording.dropped,
            },
            None => Self::default(),
        }
    }
}

/// The memory of a CPU backend with a counting allocator, cheap enough for every operation:
/// the heap count is two atomic loads, while the resident size (the "reserved" figure on
/// CPU) is a read of `/proc`, tens of microseconds, so it is refreshed at most once a
/// millisecond.
fn cpu_sampler() -> record::Sampler {
    let resident = std::sync::Mutex::new(None::<(std::time::Instant, u64)>);
    Box::new(move || {
        let (in_use, _) = burn_memory::hooks::heap_counts()?;
        let mut cached = lock(&resident);
        let stale =
            cached.is_none_or(|(at, _)| at.elapsed() >= std::time::Duration::from_millis(1));
        if stale {
            let bytes = burn_memory::measure::process::resident_bytes()
                .ok()
                .or(cached.map(|(_, bytes)| bytes))
                .unwrap_or(in_use);
            *cached = Some((std::time::Instant::now(), bytes));
        }
        let reserved = cached.map_or(in_use, |(_, bytes)| bytes);
        Some(MemoryUsage { in_use, reserved })
    })
}

/// Where a profiled run's memory peaked.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Peak {
    /// The index of the operation in [`Profile::ops`] after which the most bytes were in use.
    pub op: usize,
    /// Its name.
    pub name: &'static str,
    /// The scopes it ran in, outermost first.
    pub scopes: Vec<String>,
    /// The memory just after it.
    pub memory: MemoryUsage,
}

impl Profile {
    /// The operation after which the most bytes were in use, with its scopes; `None` when
    /// memory was not sampled ([`Profiler::start_with_memory`]).
    pub fn peak(&self) -> Option<Peak> {
        let (op, event) = self
            .ops
            .iter()
            .enumerate()
            .filter(|(_, event)| event.memory.is_some())
            .max_by_key(|(index, event)| (event.memory.map(|m| m.in_use), usize::MAX - index))?;
        Some(Peak {
            op,
            name: event.name,
            scopes: event
                .scopes
                .iter()
                .map(|&name| self.scope_names[name as usize].clone())
                .collect(),
            memory: event.memory?,
        })
    }
}

/// An open [`scope`]; closes it when dropped.
#[derive(Debug)]
#[must_use = "the scope closes when this guard is dropped"]
pub struct ScopeGuard {
    open: Option<(OpenScope, u32)>,
    /// The innermost scope before this one, for the allocation log.
    outer: Option<(u64, u32)>,
}

/// Opens a named scope on this thread until the returned guard is dropped (PyTorch's
/// `record_function`): operations recorded meanwhile carry it, and it appears in the table
/// and the trace with its own time. Costs nothing when no profiler runs.
pub fn scope(name: &str) -> ScopeGuard {
    if !ACTIVE.load(Ordering::Relaxed) {
        return ScopeGuard {
            open: None,
            outer: None,
        };
    }
    let Some(id) = lock(&RECORDING).as_mut().map(|rec| rec.intern(name)) else {
        return ScopeGuard {
            open: None,
            outer: None,
        };
    };
    let scope = OpenScope {
        name: id,
        start: std::time::Instant::now(),
        session: SESSION.load(Ordering::Relaxed),
    };
    let depth = OPEN_SCOPES.with(|stack| {
        let mut stack = stack.borrow_mut();
        stack.retain(|open| open.session == scope.session);
        stack.push(scope);
        stack.len() as u32 - 1
    });
    let outer = record::enter_scope(scope.session, id);
    ScopeGuard {
        open: Some((scope, depth)),
        outer,
    }
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        let Some((scope, depth)) = self.open.take() else {
            return;
        };
        record::leave_scope(self.outer);
        let was_open = OPEN_SCOPES.with(|stack| {
            let mut stack = stack.borrow_mut();
            match stack
                .iter()
                .rposition(|open| open.session == scope.session && open.start == scope.start)
            {
                Some(index) => {
                    stack.remove(index);
                    true
                }
                None => false,
            }
        });
        if was_open {
            record::close_scope(scope, depth, false);
        }
    }
}

/// The crate README's example, compiled and run as a doctest so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
