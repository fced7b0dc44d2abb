//! Hooks for burn-data-parallel and burn-profiler; not a user API.
//!
//! They reach state of this crate that those crates need and a model's code never touches, so
//! the split into crates needs no feature flag. They may change with those crates.
//!
//! - Data parallel, through mixed precision: [`with_gradient_reduction`] runs a step with a
//!   [`GradientReduction`] in scope, and [`fork_replica`] gives a peer's replica mixed-precision
//!   state of its own.
//! - The profiler's allocation log: while one runs ([`start_log`] to [`stop_log`]),
//!   [`CountingAllocator`](crate::CountingAllocator) logs every allocation and free as an
//!   [`AllocEvent`]; [`heap_counts`] reads its counters.

mod replica;

pub use crate::measure::heap::{
    AllocAction, AllocEvent, AllocLog, AllocObserver, AllocSite, counts as heap_counts, start_log,
    stop_log,
};
pub use replica::{GradientReduction, fork_replica, with_gradient_reduction};
pub(crate) use replica::{forking_replica, reduce_in_scope};
