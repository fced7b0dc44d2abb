//! The hooks through which data-parallel training reaches mixed precision: a peer's replica
//! gets mixed-precision state of its own, and a peer's step averages the still-scaled
//! gradients inside [`MixedPrecision::unscale`](crate::MixedPrecision::unscale), so that every
//! peer checks the same values and takes the same skip decision.
//!
//! Why scoped to a thread: burn-train's `TrainStep::step` takes only the model and a batch, so
//! a strategy cannot hand the user's step an argument. It runs the step inside
//! [`with_gradient_reduction`] instead, and mixed precision looks the reduction up there. No
//! reduction is in scope outside a data-parallel step, and `unscale` then leaves the gradients
//! as they are.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use burn::optim::GradientsParams;

/// Averages a step's gradients over data-parallel peers.
pub trait GradientReduction {
    /// `grads` replaced by their mean over every peer. Called at most once per step by mixed
    /// precision; an implementation that failed returns no gradients (the step is skipped)
    /// and reports its error to its strategy.
    fn reduce(&self, grads: GradientsParams) -> GradientsParams;
}

thread_local! {
    static REDUCTION: RefCell<Option<Rc<dyn GradientReduction>>> = const { RefCell::new(None) };
    static FORKING_REPLICA: Cell<bool> = const { Cell::new(false) };
}

/// Puts the previous reduction back when the scope ends, panics included.
struct Restore(Option<Rc<dyn GradientReduction>>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        REDUCTION.with(|cell| *cell.borrow_mut() = previous);
    }
}

/// Runs `step` (a training step on this thread) with `reduction` as the gradient reduction
/// that [`MixedPrecision::unscale`](crate::MixedPrecision::unscale) applies before its
/// overflow check.
pub fn with_gradient_reduction<T>(
    reduction: Rc<dyn GradientReduction>,
    step: impl FnOnce() -> T,
) -> T {
    let previous = REDUCTION.with(|cell| cell.borrow_mut().replace(reduction));
    let _restore = Restore(previous);
    step()
}

/// `grads` through the reduction in scope on this thread, or unchanged without one.
pub(crate) fn reduce_in_scope(grads: GradientsParams) -> GradientsParams {
    let reduction = REDUCTION.with(|cell| cell.borrow().clone());
    match reduction {
        Some(reduction) => reduction.reduce(grads),
        None => grads,
    }
}

/// Runs `fork` (a `Module::fork` of the model) as the making of a data-parallel peer's
/// replica: [`SharedMixedPrecision`](crate::SharedMixedPrecision), which a model's copies
/// otherwise share, gives the replica a copy of its own. Peers on threads of one process
/// would otherwise take each other's lock in the middle of a step, and count every step
/// once per peer.
pub fn fork_replica<T>(fork: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            FORKING_REPLICA.with(|flag| flag.set(false));
        }
    }
    FORKING_REPLICA.with(|flag| flag.set(true));
    let _reset = Reset;
    fork()
}

/// Whether this thread is inside [`fork_replica`].
pub(crate) fn forking_replica() -> bool {
    FORKING_REPLICA.with(Cell::get)
}
