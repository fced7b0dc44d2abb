//! What a profiled operation records, and where: the one recording session of the process.
//!
//! [`Profiled`](super::Profiled)'s forwarding methods call [`Call::start`] before the inner
//! backend's operation and [`Call::finish`] after it. When no [`Profiler`](super::Profiler)
//! is running, `start` is one relaxed atomic load and returns `None`: the forwarding costs
//! nothing else. When one runs, the call is timed on the host, its inputs' shapes are taken
//! if the session records shapes, the device is synced after it if the session syncs each
//! operation, and an [`OpEvent`] is appended to the session (up to its `max_entries`; later
//! events are counted as dropped).

use std::cell::{Cell, RefCell};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use burn::tensor::DType;
use burn::tensor::TensorMetadata;
use burn::tensor::backend::ExecutionError;
use serde::Serialize;

use burn_memory::MemoryUsage;
use burn_memory::hooks::AllocSite;

use crate::sync::lock;

/// A tensor an operation read or produced: its shape and element type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorDesc {
    /// The dimensions.
    pub shape: Vec<usize>,
    /// The element type.
    pub dtype: DType,
}

impl TensorDesc {
    /// The tensor's size in bytes (elements times the element size).
    pub fn bytes(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * self.dtype.size() as u64
    }
}

/// The [`TensorDesc`] of a backend tensor primitive.
pub fn desc<T: TensorMetadata>(tensor: &T) -> TensorDesc {
    TensorDesc {
        shape: tensor.shape().to_vec(),
        dtype: tensor.dtype(),
    }
}

/// One recorded backend operation.
#[derive(Debug, Clone, Serialize)]
pub struct OpEvent {
    /// The backend method, as Burn names it (`float_matmul`, `conv2d`, `sync`).
    pub name: &'static str,
    /// A small number for the thread that called it (1 for the first thread seen).
    pub thread: u32,
    /// Nanoseconds from the session's start to the call.
    pub start_ns: u64,
    /// Nanoseconds the call took on the host (the inner backend's method returning).
    pub host_ns: u64,
    /// Nanoseconds from the call to the device having finished it, when the session syncs
    /// each operation (see [`ProfilerConfig::sync_each_op`](super::ProfilerConfig)).
    pub device_ns: Option<u64>,
    /// The tensor inputs, when the session records shapes.
    pub inputs: Vec<TensorDesc>,
    /// The tensor outputs.
    pub outputs: Vec<TensorDesc>,
    /// The scopes open on the calling thread, outermost first (indices into
    /// [`Profile::scope_names`](super::Profile)).
    pub scopes: Vec<u32>,
    /// The device's memory just after the call, when the profiler samples memory
    /// ([`Profiler::start_with_memory`](super::Profiler::start_with_memory)).
    pub memory: Option<MemoryUsage>,
}

impl OpEvent {
    /// Bytes of the tensors the operation produced.
    pub fn output_bytes(&self) -> u64 {
        self.outputs.iter().map(TensorDesc::bytes).sum()
    }

    /// The time the operation is charged: device time when measured, else host time.
    pub fn time_ns(&self) -> u64 {
        self.device_ns.unwrap_or(self.host_ns)
    }
}

/// One user scope ([`scope`](super::scope)) as it ran on a thread.
#[derive(Debug, Clone, Serialize)]
pub struct ScopeEvent {
    /// Index into [`Profile::scope_names`](super::Profile).
    pub name: u32,
    /// The thread it ran on.
    pub thread: u32,
    /// Nanoseconds from the session's start to the scope's opening.
    pub start_ns: u64,
    /// Nanoseconds it stayed open.
    pub duration_ns: u64,
    /// Scopes around it on its thread (0: outermost).
    pub depth: u32,
    /// Still open when the session stopped: closed then, and reported.
    pub left_open: bool,
}

/// What a running session is told to record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settings {
    pub max_entries: usize,
}

/// Reads the profiled device's memory.
pub(crate) type Sampler = Box<dyn Fn() -> Option<MemoryUsage> + Send>;

/// The events of the running session.
pub(crate) struct Recording {
    pub settings: Settings,
    pub sampler: Option<Sampler>,
    pub started: Instant,
    pub ops: Vec<OpEvent>,
    pub scopes: Vec<ScopeEvent>,
    pub scope_names: Vec<String>,
    pub dropped: u64,
}

impl Recording {
    pub fn new(settings: Settings, sampler: Option<Sampler>) -> Self {
        Self {
            settings,
            sampler,
            started: Instant::now(),
            ops: Vec::new(),
            scopes: Vec::new(),
            scope_names: Vec::new(),
            dropped: 0,
        }
    }

    /// The index of a scope name, added on first use.
    pub fn intern(&mut self, name: &str) -> u32 {
        match self.scope_names.iter().position(|known| known == name) {
            Some(index) => index as u32,
            None => {
                self.scope_names.push(name.to_owned());
                (self.scope_names.len() - 1) as u32
            }
        }
    }

    fn has_room(&mut self) -> bool {
        let room = self.ops.len() + self.scopes.len() < self.settings.max_entries;
        if !room {
            self.dropped += 1;
        }
        room
    }
}

/// Whether a session runs: the only thing a profiled operation reads when none does.
pub(crate) static ACTIVE: AtomicBool = AtomicBool::new(false);
/// The running session's `record_shapes` and `sync_each_op`, set before [`ACTIVE`]: read by
/// every profiled operation, so kept out of the session's mutex.
pub(crate) static RECORD_SHAPES: AtomicBool = AtomicBool::new(false);
pub(crate) static SYNC_EACH_OP: AtomicBool = AtomicBool::new(false);
/// The running session, or `None`.
pub(crate) static RECORDING: Mutex<Option<Recording>> = Mutex::new(None);
/// Bumped at each session start, so that a thread's scope stack from an earlier session is
/// not mistaken for this one's.
pub(crate) static SESSION: AtomicU64 = AtomicU64::new(0);
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

/// An open scope on this thread: its interned name, start and session.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpenScope {
    pub name: u32,
    pub start: Instant,
    pub session: u64,
}

thread_local! {
    /// The thread's number, 0 until first asked. `const`-initialised, like the two below,
    /// because the allocator reads it: a lazily initialised thread-local may allocate on
    /// first use, and registers a destructor.
    static THREAD: Cell<u32> = const { Cell::new(0) };
    pub(crate) static OPEN_SCOPES: RefCell<Vec<OpenScope>> = const { RefCell::new(Vec::new()) };
    /// The operation running on this thread, for the allocation log: set by [`Call::start`],
    /// restored by [`Call::finish`].
    static CURRENT_OP: Cell<Option<&'static str>> = const { Cell::new(None) };
    /// The innermost scope open on this thread and its session, for the allocation log
    /// (`OPEN_SCOPES` cannot be read from the allocator: it may be borrowed mutably while
    /// it grows).
    static CURRENT_SCOPE: Cell<Option<(u64, u32)>> = const { Cell::new(None) };
}

/// The calling thread's number in the trace. Allocates nothing (the allocator calls it).
pub(crate) fn thread_number() -> u32 {
    THREAD
        .try_with(|thread| {
            if thread.get() == 0 {
                thread.set(NEXT_THREAD.fetch_add(1, Ordering::Relaxed) as u32);
            }
            thread.get()
        })
        .unwrap_or(0)
}

/// Makes `scope` (of `session`) this thread's innermost scope for the allocation log, and
/// returns the one it replaces, to restore when it closes.
pub(crate) fn enter_scope(session: u64, scope: u32) -> Option<(u64, u32)> {
    CURRENT_SCOPE
        .try_with(|current| current.replace(Some((session, scope))))
        .ok()
        .flatten()
}

/// Restores the innermost scope [`enter_scope`] replaced.
pub(crate) fn leave_scope(previous: Option<(u64, u32)>) {
    let _ = CURRENT_SCOPE.try_with(|current| current.set(previous));
}

/// The allocation log's observer: what an allocation made now on this thread records of its
/// context (the thread's number, the operation running, and the innermost scope of
/// `session`). Called by the allocator, so it allocates nothing: `try_with` on `const`
/// cells, which also answers during thread teardown.
pub(crate) fn alloc_site(session: u64) -> AllocSite {
    let op = CURRENT_OP.try_with(Cell::get).ok().flatten();
    let scope = CURRENT_SCOPE
        .try_with(Cell::get)
        .ok()
        .flatten()
        .and_then(|(open_in, scope)| (open_in == session).then_some(scope));
    AllocSite {
        thread: thread_number(),
        op,
        scope,
    }
}

/// The scopes open on this thread in the current session, outermost first.
fn open_scopes(session: u64) -> Vec<u32> {
    OPEN_SCOPES.with(|stack| {
        stack
            .borrow()
            .iter()
            .filter(|scope| scope.session == session)
            .map(|scope| scope.name)
            .collect()
    })
}

fn nanos(duration: std::time::Duration) -> u64 {
    duration.as_nanos().min(u64::MAX as u128) as u64
}

/// A backend operation being recorded; made by [`Call::start`].
#[derive(Debug)]
pub struct Call {
    name: &'static str,
    inputs: Vec<TensorDesc>,
    sync_each_op: bool,
    started: Instant,
    /// The operation this one runs inside on the same thread (a `Profiled<Profiled<B>>`'s
    /// outer one), restored as the current operation when this one finishes.
    outer_op: Option<&'static str>,
}

impl Call {
    /// Starts recording operation `name`, or returns `None` when no session runs. `inputs`
    /// describes the operation's tensor inputs; it is called only when the session records
    /// shapes, and must be called before the inputs are moved into the inner backend.
    #[inline]
    pub fn start(name: &'static str, inputs: impl FnOnce() -> Vec<TensorDesc>) -> Option<Self> {
        if !ACTIVE.load(Ordering::Relaxed) {
            return None;
        }
        let inputs = if RECORD_SHAPES.load(Ordering::Relaxed) {
            inputs()
        } else {
            Vec::new()
        };
        let outer_op = CURRENT_OP
            .try_with(|op| op.replace(Some(name)))
            .ok()
            .flatten();
        Some(Self {
            name,
            inputs,
            sync_each_op: SYNC_EACH_OP.load(Ordering::Relaxed),
            started: Instant::now(),
            outer_op,
        })
    }

    /// Finishes the record once the inner backend's method has returned: `outputs`
    /// describes the tensors it produced, and `sync` waits for the device to finish (the
    /// generated code syncs the device of an output tensor, or of a `device` argument; `Ok`
    /// where there is neither). `sync` is called only when the session syncs each
    /// operation; a failed sync is reported as a warning and leaves the device time out.
    pub fn finish(
        mut self,
        outputs: impl FnOnce() -> Vec<TensorDesc>,
        sync: impl FnOnce() -> Result<(), ExecutionError>,
    ) {
        let host = self.started.elapsed();
        // The operation's own allocations are over; the record's are the profiler's.
        let _ = CURRENT_OP.try_with(|op| op.set(self.outer_op));
        let device = if self.sync_each_op {
            match sync() {
                Ok(()) => Some(nanos(self.started.elapsed())),
                Err(error) => {
                    tracing::warn!("profiler: syncing after {} failed: {error}", self.name);
                    None
                }
            }
        } else {
            None
        };
        let outputs = outputs();
        let thread = thread_number();
        let session = SESSION.load(Ordering::Relaxed);
        let scopes = open_scopes(session);
        let mut recording = lock(&RECORDING);
        let Some(recording) = recording.as_mut() else {
            return;
        };
        if !recording.has_room() {
            return;
        }
        let start_ns = nanos(self.started.saturating_duration_since(recording.started));
        let memory = recording.sampler.as_ref().and_then(|sample| sample());
        recording.ops.push(OpEvent {
            name: self.name,
            thread,
            start_ns,
            host_ns: nanos(host),
            device_ns: device,
            inputs: std::mem::take(&mut self.inputs),
            outputs,
            scopes,
            memory,
        });
    }
}

impl Drop for Call {
    /// Restores the thread's current operation also when the inner backend panicked and
    /// [`finish`](Self::finish) never ran, so that later allocations are not charged to it.
    fn drop(&mut self) {
        let _ = CURRENT_OP.try_with(|op| op.set(self.outer_op));
    }
}

/// Records a scope that has closed (or is closed at the session's end).
pub(crate) fn close_scope(scope: OpenScope, depth: u32, left_open: bool) {
    let end = Instant::now();
    let thread = thread_number();
    let mut recording = lock(&RECORDING);
    let Some(recording) = recording.as_mut() else {
        return;
    };
    if SESSION.load(Ordering::Relaxed) != scope.session || !recording.has_room() {
        return;
    }
    recording.scopes.push(ScopeEvent {
        name: scope.name,
        thread,
        start_ns: nanos(scope.start.saturating_duration_since(recording.started)),
        duration_ns: nanos(end.saturating_duration_since(scope.start)),
        depth,
        left_open,
    });
}
