//! [`CountingAllocator`]: exact heap accounting for CPU backends.
//!
//! CPU backends keep tensors on the heap, so the process's resident memory is only a proxy for
//! what they hold: it counts code and stacks, rounds to pages, and above all depends on the
//! allocator, which keeps freed memory for reuse (a second identical step raises it by nothing)
//! and maps fresh memory lazily. Counting the bytes of every allocation and free is exact and
//! cheap (a few atomic operations per call), which is why PyTorch's allocators count too.
//!
//! While an allocation log runs ([`start_log`] to [`stop_log`]), the allocator also logs
//! every allocation and free, with the [`AllocSite`] that the log's observer reports for the
//! calling thread. burn-profiler starts one while it samples a CPU backend's memory and
//! observes the operation and scope running. Logging serialises the process's allocations
//! behind one lock (that is what makes the log's order the counter's order); without a log,
//! counting takes no lock.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::sync::lock;

/// Whether an [`AllocEvent`] took or gave back memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum AllocAction {
    /// Bytes allocated.
    Alloc,
    /// Bytes freed.
    Free,
}

/// One heap allocation or free, logged by the [`CountingAllocator`] while a log runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AllocEvent {
    /// Allocation or free.
    pub action: AllocAction,
    /// The block's address.
    pub address: u64,
    /// The block's size in bytes.
    pub size: u64,
    /// Nanoseconds from the log's start.
    pub time_ns: u64,
    /// The thread, as the observer numbers it.
    pub thread: u32,
    /// The operation running on that thread at the time, if the observer knows one.
    pub op: Option<&'static str>,
    /// The innermost scope open on that thread at the time, if any (an index the observer
    /// defines: burn-profiler's scope names).
    pub scope: Option<u32>,
    /// Heap bytes in use just after the event, as the allocator counts them.
    pub in_use: u64,
}

/// What an allocation log records of the code that allocates, as its observer reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AllocSite {
    /// The calling thread's number.
    pub thread: u32,
    /// The operation running on the thread, if any.
    pub op: Option<&'static str>,
    /// The innermost scope open on the thread, if any.
    pub scope: Option<u32>,
}

/// The hook a log calls on every allocation and free: the site of the calling thread for
/// the log's `session`. It runs inside the global allocator, so it must not allocate (read
/// `const`-initialised thread-locals with `try_with`).
pub type AllocObserver = fn(session: u64) -> AllocSite;

static IN_USE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A global allocator that counts the bytes allocated and not yet freed, and their peak, around
/// another allocator: the system's by default, any with `CountingAllocator::new(inner)`.
///
/// Installed as the program's `#[global_allocator]`, it makes [`MemoryTracker`] on CPU backends
/// (NdArray, Flex) report the heap bytes in use and their exact peak, for every thread of the
/// process, instead of the resident memory and the kernel's page-level high-water mark.
///
/// ```
/// #[global_allocator]
/// static ALLOCATOR: burn_memory::CountingAllocator = burn_memory::CountingAllocator::system();
/// # fn main() {}
/// ```
///
/// [`MemoryTracker`]: crate::MemoryTracker
#[derive(Debug, Default)]
pub struct CountingAllocator<A = System> {
    inner: A,
}

impl CountingAllocator<System> {
    /// Counts around the system allocator.
    pub const fn system() -> Self {
        Self { inner: System }
    }
}

impl<A> CountingAllocator<A> {
    /// Counts around `inner`.
    pub const fn new(inner: A) -> Self {
        Self { inner }
    }
}

impl CountingAllocator {
    /// Whether a `CountingAllocator` is this program's global allocator (it has counted an
    /// allocation), so that [`MemoryTracker`](crate::MemoryTracker) on CPU backends reports
    /// exact heap bytes rather than the process's resident memory.
    pub fn is_installed() -> bool {
        counts().is_some()
    }
}

fn allocated(bytes: usize) {
    let now = IN_USE.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
    PEAK.fetch_max(now, Ordering::Relaxed);
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

fn freed(bytes: usize) {
    IN_USE.fetch_sub(bytes as u64, Ordering::Relaxed);
}

// The allocation log (burn-profiler's, while it samples a CPU backend's memory).
//
// Everything below runs inside `GlobalAlloc` methods, so none of it may allocate: the event
// buffer is allocated by `start_log` before it is put behind the lock (from the system
// allocator directly, so that its `max_entries` × 64 bytes are not counted in the heap the
// profiler samples), events are written only while it has room, the context comes from
// `const`-initialised `Cell` thread-locals (no lazy initialisation, no destructor to
// register), and `std::sync::Mutex` is a futex that allocates nothing. Nothing is excluded:
// the profiler's own records (its operation events, its scope stack) are logged like the
// model's allocations, which is what keeps the sizes adding up to the counter. While the log is on, the counter is updated and the event pushed under
// the same lock, so the events' order is the counter's order and every event's `in_use` is
// the previous event's plus or minus its size.
//
// The switch from unlocked to locked counting is the delicate moment: a thread that saw
// the log off and is about to update the counter without the lock would slip an unlogged
// change between logged events. Such threads announce themselves in `UNLOCKED` before
// reading `LOGGING` (both `SeqCst`), and `start_log` sets `LOGGING` and then waits until
// `UNLOCKED` drops to zero: with both sides sequentially consistent, either the counting
// thread sees the log on, or the starter sees that thread and waits for it. Switching off
// needs no such care: a thread that saw the log on re-checks it under the lock.

/// Whether allocations are logged: read (`SeqCst`) by every allocation.
static LOGGING: AtomicBool = AtomicBool::new(false);
/// Threads counting outside the lock right now (see above).
static UNLOCKED: AtomicU64 = AtomicU64::new(0);
/// The log, when on. Nothing under its lock can panic half-way (pushes happen only within
/// capacity), so `lock` takes over a poisoned one.
static LOG: Mutex<Option<AllocLog>> = Mutex::new(None);

/// A fixed buffer of events taken from the system allocator, not the counting one: a `Vec`
/// with another allocator than the global one needs the unstable allocator API.
struct EventBuffer {
    start: std::ptr::NonNull<AllocEvent>,
    len: usize,
    capacity: usize,
}

// SAFETY: the buffer owns its events (plain data) like a `Vec` does.
unsafe impl Send for EventBuffer {}

impl EventBuffer {
    /// A buffer for `capacity` events; `None` when the system has no memory for it.
    fn new(capacity: usize) -> Option<Self> {
        let layout = Layout::array::<AllocEvent>(capacity).ok()?;
        let start = if layout.size() == 0 {
            std::ptr::NonNull::dangling()
        } else {
            // SAFETY: the layout has a non-zero size.
            std::ptr::NonNull::new(unsafe { System.alloc(layout) }.cast::<AllocEvent>())?
        };
        Some(Self {
            start,
            len: 0,
            capacity,
        })
    }

    /// Appends `event` if there is room; allocates nothing.
    fn push(&mut self, event: AllocEvent) -> bool {
        if self.len == self.capacity {
            return false;
        }
        // SAFETY: `len < capacity`, so the slot is inside the allocation, and unwritten.
        unsafe { self.start.as_ptr().add(self.len).write(event) };
        self.len += 1;
        true
    }

    /// The events, copied into a `Vec` of the global allocator.
    fn to_vec(&self) -> Vec<AllocEvent> {
        // SAFETY: the first `len` slots are written events.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.len) }.to_vec()
    }
}

impl Drop for EventBuffer {
    fn drop(&mut self) {
        let layout = Layout::array::<AllocEvent>(self.capacity).ok();
        if let Some(layout) = layout.filter(|layout| layout.size() != 0) {
            // SAFETY: allocated by `System` with this layout in `new`; the events own nothing.
            unsafe { System.dealloc(self.start.as_ptr().cast(), layout) };
        }
    }
}

/// An allocation log, as [`stop_log`] returns it.
pub struct AllocLog {
    /// The events kept, in order; never grown.
    events: EventBuffer,
    /// Events not kept for want of room.
    dropped: u64,
    /// The log's start, from which event times count.
    started: Instant,
    /// The observer's session, passed to it on every event.
    session: u64,
    /// Reports the allocating thread's site.
    observer: AllocObserver,
}

impl std::fmt::Debug for AllocLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllocLog")
            .field("events", &self.events.len)
            .field("dropped", &self.dropped)
            .field("session", &self.session)
            .finish()
    }
}

impl AllocLog {
    /// The events kept, in order.
    pub fn events(&self) -> Vec<AllocEvent> {
        self.events.to_vec()
    }

    /// Events not kept because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

/// Starts logging every allocation and free into a buffer of `max_entries` events
/// (allocated here, before any lock is taken), with times from `started` and each event's
/// site from `observer(session)`. Replaces a log that is running. Does nothing when no
/// `CountingAllocator` is the global allocator.
pub fn start_log(max_entries: usize, started: Instant, session: u64, observer: AllocObserver) {
    if counts().is_none() {
        return;
    }
    let Some(events) = EventBuffer::new(max_entries) else {
        tracing::warn!("profiler: no memory for {max_entries} allocation events; not logged");
        return;
    };
    let log = AllocLog {
        events,
        dropped: 0,
        started,
        session,
        observer,
    };
    let previous = lock(&LOG).replace(log);
    LOGGING.store(true, Ordering::SeqCst);
    while UNLOCKED.load(Ordering::SeqCst) != 0 {
        std::hint::spin_loop();
    }
    // A log left by a profiler that was never stopped (none is: dropping one stops it);
    // freed outside the lock all the same.
    drop(previous);
}

/// Stops logging and returns the log, if one was on.
pub fn stop_log() -> Option<AllocLog> {
    let mut log = lock(&LOG);
    LOGGING.store(false, Ordering::SeqCst);
    log.take()
}

/// Runs `inner` (the inner allocator's call) and counts what it did: it frees `old` (if any)
/// and, when `new_size` is given, returns a block of that size (null: it failed, and `old`
/// stays). When the log is on, `inner` runs under the log's lock: otherwise a block freed by
/// `inner` could be handed to another thread, and its allocation logged, before its free
/// is.
fn count(
    old: Option<(*mut u8, usize)>,
    new_size: Option<usize>,
    inner: impl FnOnce() -> *mut u8,
) -> *mut u8 {
    UNLOCKED.fetch_add(1, Ordering::SeqCst);
    if !LOGGING.load(Ordering::SeqCst) {
        let new = inner();
        count_unlocked(old, new_size, new);
        UNLOCKED.fetch_sub(1, Ordering::SeqCst);
        return new;
    }
    UNLOCKED.fetch_sub(1, Ordering::SeqCst);
    let mut guard = lock(&LOG);
    let new = inner();
    let Some(log) = guard.as_mut() else {
        // Switched off meanwhile; counting under the lock keeps the order all the same.
        count_unlocked(old, new_size, new);
        return new;
    };
    if new_size.is_some() && new.is_null() {
        return new;
    }
    let time_ns = log.started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
    let AllocSite { thread, op, scope } = (log.observer)(log.session);
    let mut push = |action, address: *mut u8, size: usize, in_use| {
        let event = AllocEvent {
            action,
            address: address as usize as u64,
            size: size as u64,
            time_ns,
            thread,
            op,
            scope,
            in_use,
        };
        if !log.events.push(event) {
            log.dropped += 1;
        }
    };
    if let Some((address, size)) = old {
        let now = IN_USE.fetch_sub(size as u64, Ordering::Relaxed) - size as u64;
        push(AllocAction::Free, address, size, now);
    }
    if let Some(size) = new_size {
        allocated(size);
        push(
            AllocAction::Alloc,
            new,
            size,
            IN_USE.load(Ordering::Relaxed),
        );
    }
    new
}

/// Counts without logging: a resize counts only its difference, as the program sees one
/// block that changed size; a failed allocation or resize counts nothing.
fn count_unlocked(old: Option<(*mut u8, usize)>, new_size: Option<usize>, new: *mut u8) {
    let Some(size) = new_size else {
        freed(old.map_or(0, |(_, size)| size));
        return;
    };
    if new.is_null() {
        return;
    }
    match size.checked_sub(old.map_or(0, |(_, size)| size)) {
        Some(grown) => allocated(grown),
        None => freed(old.map_or(0, |(_, size)| size) - size),
    }
}

// SAFETY: every call is forwarded unchanged to `inner`, which upholds `GlobalAlloc`'s
// contract; the counting only reads `layout` and the pointers, and allocates nothing.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAllocator<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees on `layout` are passed on.
        count(None, Some(layout.size()), || unsafe {
            self.inner.alloc(layout)
        })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        count(None, Some(layout.size()), || unsafe {
            self.inner.alloc_zeroed(layout)
        })
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(Some((ptr, layout.size())), None, || {
            // SAFETY: `ptr` was allocated by `inner` with `layout`, as the caller guarantees.
            unsafe { self.inner.dealloc(ptr, layout) };
            std::ptr::null_mut()
        });
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Logged as a free of the old block and an allocation of the new one (what a memory
        // viewer draws); counted without the log as one block that changed size.
        count(Some((ptr, layout.size())), Some(new_size), || {
            // SAFETY: the caller's guarantees on `ptr`, `layout` and `new_size` are passed on.
            unsafe { self.inner.realloc(ptr, layout, new_size) }
        })
    }
}

/// Heap bytes in use and their peak since the last reset, if a [`CountingAllocator`] is the
/// global allocator (it has counted at least one allocation).
pub fn counts() -> Option<(u64, u64)> {
    INSTALLED
        .load(Ordering::Relaxed)
        .then(|| (IN_USE.load(Ordering::Relaxed), PEAK.load(Ordering::Relaxed)))
}

/// Starts a new peak period at the bytes in use now.
pub(crate) fn reset_peak() {
    PEAK.store(IN_USE.load(Ordering::Relaxed), Ordering::Relaxed);
}
