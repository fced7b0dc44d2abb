//! Gradient checkpointing: choosing Burn's autodiff checkpointing strategy at run time.
//!
//! Burn 0.21 builds checkpointing into its autodiff backend as a type parameter,
//! `Autodiff<B, C>`. Every autodiff operation declares itself compute-bound (matmul,
//! convolution: its output is kept for backward) or memory-bound (element-wise ops, activations:
//! cheap to redo). With [`BalancedCheckpointing`] the memory-bound outputs are *not* kept: the
//! backward pass recomputes them from the nearest kept tensors, so the activation memory of a
//! network drops to roughly its compute-bound outputs. [`NoCheckpointing`] keeps everything.
//! `burn_sketch::SkLinear` is one graph node whose backward keeps only its input `x` under
//! either strategy (its `[batch, 2·T·k]` intermediate is recomputed).
//!
//! Because the strategy is a type, a run-time choice (a command-line flag) needs one generic
//! function instantiated for both: write the training job once as a [`WithAutodiff`] and let
//! [`Checkpointing::run`] pick.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
//! use burn::tensor::Tensor;
//! use burn_memory::{Checkpointing, WithAutodiff};
//!
//! /// One forward and backward pass; returns the gradient's sum.
//! struct Step;
//! impl WithAutodiff<NdArray> for Step {
//!     type Output = f32;
//!     fn run<C: CheckpointStrategy>(self) -> f32 {
//!         let device = Default::default();
//!         let x = Tensor::<Autodiff<NdArray, C>, 1>::from_floats([0.1, 0.2, 0.3], &device)
//!             .require_grad();
//!         let grads = x.clone().exp().sin().sum().backward();
//!         x.grad(&grads).unwrap().sum().into_scalar()
//!     }
//! }
//! let balanced = Checkpointing::Balanced.run::<NdArray, _>(Step);
//! let none = Checkpointing::None.run::<NdArray, _>(Step);
//! assert!((balanced - none).abs() < 1e-5);
//! ```
//!
//! [`BalancedCheckpointing`]: burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing
//! [`NoCheckpointing`]: burn::backend::autodiff::checkpoint::strategy::NoCheckpointing

use std::fmt;
use std::str::FromStr;

use burn::backend::autodiff::checkpoint::strategy::{
    BalancedCheckpointing, CheckpointStrategy, NoCheckpointing,
};
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

/// Which of Burn's autodiff checkpointing strategies a training run uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Checkpointing {
    /// Keep every activation needed by backward (`NoCheckpointing`, Burn's default).
    #[default]
    None,
    /// Recompute memory-bound activations in backward (`BalancedCheckpointing`).
    Balanced,
}

/// A job (usually a training run) written once for any checkpointing strategy of
/// `Autodiff<B, C>`.
pub trait WithAutodiff<B: Backend> {
    /// What the job returns.
    type Output;
    /// Runs the job on `Autodiff<B, C>`.
    fn run<C: CheckpointStrategy>(self) -> Self::Output;
}

impl Checkpointing {
    /// Runs `job` on `Autodiff<B, NoCheckpointing>` or `Autodiff<B, BalancedCheckpointing>`.
    pub fn run<B: Backend, J: WithAutodiff<B>>(self, job: J) -> J::Output {
        match self {
            Self::None => job.run::<NoCheckpointing>(),
            Self::Balanced => job.run::<BalancedCheckpointing>(),
        }
    }
}

impl fmt::Display for Checkpointing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Balanced => "balanced",
        })
    }
}

impl FromStr for Checkpointing {
    type Err = crate::MemoryError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" | "off" => Ok(Self::None),
            "balanced" | "on" => Ok(Self::Balanced),
            other => Err(crate::MemoryError::invalid(
                "checkpointing",
                format!("`{other}`: expected `none` or `balanced`"),
            )),
        }
    }
}
