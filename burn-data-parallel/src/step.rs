//! The gradient all-reduce inside a training step, for steps that must see the mean gradients
//! before they finish: mixed precision decides whether to skip a step from the unscaled
//! gradients, and every peer must make the same decision.
//!
//! The strategy runs each step of a peer inside burn-memory's
//! [`with_gradient_reduction`](burn_memory::hooks::with_gradient_reduction) with a [`StepReduction`];
//! [`MixedPrecision::unscale`](burn_memory::MixedPrecision::unscale) calls it on the
//! still-scaled gradients (reducing before unscaling is PyTorch's order too: the mean of
//! scaled gradients, then one overflow check on identical values). A step that did not reduce
//! is reduced by the strategy after it returns.

use std::cell::RefCell;
use std::rc::Rc;

use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn_memory::hooks::GradientReduction;

use crate::bucket::GradientLayout;
use crate::{DistributedError, Peer};

/// One step of a peer: its reduction, run at most once.
pub(crate) struct StepReduction<B: Backend> {
    peer: Rc<Peer<B>>,
    layout: Rc<GradientLayout>,
    /// Whether this peer asks the others to stop after this step.
    stop: bool,
    /// The outcome of the reduction, once it ran: whether any peer asked to stop.
    reduced: RefCell<Option<Result<bool, DistributedError>>>,
}

impl<B: Backend> StepReduction<B> {
    /// A step of `peer`, whose model's trained parameters are laid out as `layout`; `stop` is
    /// this peer's request to stop after the step.
    pub(crate) fn new(peer: Rc<Peer<B>>, layout: Rc<GradientLayout>, stop: bool) -> Self {
        Self {
            peer,
            layout,
            stop,
            reduced: RefCell::new(None),
        }
    }

    /// What the step's own reduction gave: `None` when the step did not reduce, else whether
    /// any peer asked to stop, or the reduction's error.
    pub(crate) fn outcome(&self) -> Option<Result<bool, DistributedError>> {
        self.reduced.borrow_mut().take()
    }
}

impl<B: Backend> GradientReduction for StepReduction<B> {
    /// The mean over every peer, once per step. A failed reduction leaves no gradients; the
    /// strategy sees the error when the step returns.
    fn reduce(&self, grads: GradientsParams) -> GradientsParams {
        let mut reduced = self.reduced.borrow_mut();
        if reduced.is_some() {
            return grads;
        }
        match self.peer.mean_gradients_of(&self.layout, grads, self.stop) {
            Ok((mean, stop)) => {
                *reduced = Some(Ok(stop));
                mean
            }
            Err(error) => {
                *reduced = Some(Err(error));
                GradientsParams::new()
            }
        }
    }
}
