//! The gradient all-reduce inside a training step, for steps that must see the mean gradients
//! before they finish: mixed precision decides whether to skip a step from the unscaled
//! gradients, and every peer must make the same decision.
//!
//! [`DataParallel`](super::DataParallel) marks each step of a peer's thread with
//! [`StepScope`]; [`MixedPrecision::unscale`](crate::MixedPrecision::unscale) calls
//! [`reduce_in_step`] on the still-scaled gradients (reducing before unscaling is PyTorch's
//! order too: the mean of scaled gradients, then one overflow check on identical values). A
//! step that did not reduce is reduced by the strategy after it returns.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;

use super::{DistributedError, Peer};

/// What a peer's current step has done with its gradients.
struct Step {
    /// The peer, a `Peer<B::InnerBackend>` for the training backend `B`.
    peer: Rc<dyn Any>,
    /// Whether this peer asks the others to stop after this step.
    stop: bool,
    /// The outcome of the reduction, once it ran: whether any peer asked to stop.
    reduced: Option<Result<bool, DistributedError>>,
}

thread_local! {
    static STEP: RefCell<Option<Step>> = const { RefCell::new(None) };
    static FORKING_REPLICA: Cell<bool> = const { Cell::new(false) };
}

/// Runs `fork` (a `Module::fork` of the model) as the making of a peer's replica: state that
/// the model's copies otherwise share, such as [`SharedMixedPrecision`](crate::SharedMixedPrecision)'s
/// loss scale, gets a copy of its own. Peers on threads of one process would otherwise take
/// each other's lock in the middle of a step, and count every step once per peer.
pub(crate) fn fork_replica<T>(fork: impl FnOnce() -> T) -> T {
    FORKING_REPLICA.with(|flag| flag.set(true));
    let forked = fork();
    FORKING_REPLICA.with(|flag| flag.set(false));
    forked
}

/// Whether this thread is forking a peer's replica (see [`fork_replica`]).
pub(crate) fn forking_replica() -> bool {
    FORKING_REPLICA.with(Cell::get)
}

/// A training step of a data-parallel peer, on this thread, while the scope lives.
pub(crate) struct StepScope;

impl StepScope {
    /// Marks the start of a step of `peer` (`Rc<Peer<Inner>>`); `stop` is this peer's request
    /// to stop after the step.
    pub(crate) fn enter(peer: Rc<dyn Any>, stop: bool) -> Self {
        STEP.with(|step| {
            *step.borrow_mut() = Some(Step {
                peer,
                stop,
                reduced: None,
            })
        });
        Self
    }

    /// What the step's own reduction gave: `None` when the step did not reduce, else whether
    /// any peer asked to stop, or the reduction's error.
    pub(crate) fn exit(self) -> Option<Result<bool, DistributedError>> {
        STEP.with(|step| step.borrow_mut().take().and_then(|step| step.reduced))
    }
}

impl Drop for StepScope {
    fn drop(&mut self) {
        STEP.with(|step| step.borrow_mut().take());
    }
}

/// Inside a data-parallel step on this thread: `grads` replaced by the mean over every peer
/// (once per step). Elsewhere, or for a module of another backend: `grads` unchanged.
///
/// A failed reduction leaves no gradients; the strategy sees the error when the step returns.
pub(crate) fn reduce_in_step<B, M>(module: &M, grads: GradientsParams) -> GradientsParams
where
    B: AutodiffBackend,
    M: Module<B>,
{
    STEP.with(|cell| {
        let mut cell = cell.borrow_mut();
        let Some(step) = cell.as_mut() else {
            return grads;
        };
        if step.reduced.is_some() {
            return grads;
        }
        let Some(peer) = step.peer.downcast_ref::<Peer<B::InnerBackend>>() else {
            return grads;
        };
        match peer.mean_gradients::<B, M>(module, grads, step.stop) {
            Ok((mean, stop)) => {
                step.reduced = Some(Ok(stop));
                mean
            }
            Err(error) => {
                step.reduced = Some(Err(error));
                GradientsParams::new()
            }
        }
    })
}
