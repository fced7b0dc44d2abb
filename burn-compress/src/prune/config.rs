//! What to prune and how much: [`PruneConfig`], [`PruneMethod`], [`Norm`].

use burn::config::Config;
use serde::{Deserialize, Serialize};

use crate::CompressError;

/// The norm that ranks the output rows (channels) of a layer in structured pruning.
///
/// PyTorch's `ln_structured` takes the order `n` of the norm; [`Norm::from_order`] does the
/// same for `1`, `2` and `∞`, the ones with a use in pruning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Norm {
    /// `Σ|w|`: a row's total weight.
    L1,
    /// `√Σw²`: a row's energy, the usual choice.
    L2,
    /// `max|w|`: a row's largest weight.
    Inf,
}

impl Norm {
    /// The norm of order `n`: `1`, `2` or `f64::INFINITY`.
    ///
    /// # Errors
    /// [`CompressError::Unsupported`] for any other order.
    pub fn from_order(n: f64) -> Result<Self, CompressError> {
        match n {
            1.0 => Ok(Self::L1),
            2.0 => Ok(Self::L2),
            n if n == f64::INFINITY => Ok(Self::Inf),
            _ => Err(CompressError::Unsupported {
                what: format!("pruning by the L{n} norm (1, 2 and infinity are supported)"),
            }),
        }
    }
}

/// Which weights a pruning removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PruneMethod {
    /// Unstructured: the weights of smallest magnitude, anywhere in each trained tensor
    /// (PyTorch's `l1_unstructured`). Gives sparse tensors of the same shape: smaller only to a
    /// sparse format or a compressor, no faster on dense kernels.
    Magnitude,
    /// Structured: whole output rows of a `Linear` (output channels of a `Conv2d`, output
    /// features of a `SkLinear`) of smallest norm, their bias included (PyTorch's
    /// `ln_structured` over the output dimension). The layer can then be shrunk
    /// ([`shrink_pair`](super::shrink_pair)) into smaller dense tensors, which is what makes
    /// it faster.
    Structured(Norm),
}

/// How much of a layer to prune, and how: [`prune`](Self::prune) turns a layer into its masked
/// form (the [module docs](crate::prune) have an example).
#[derive(Config, Debug)]
pub struct PruneConfig {
    /// The fraction to remove, in `[0, 1]`: of each tensor's weights ([`PruneMethod::Magnitude`])
    /// or of the layer's output rows ([`PruneMethod::Structured`]). The count removed is
    /// `round(amount · n)`, halves rounded away from zero.
    pub amount: f64,
    /// Which weights are removed.
    #[config(default = "PruneMethod::Magnitude")]
    pub method: PruneMethod,
}

impl PruneConfig {
    /// Checks that `amount` is a fraction.
    ///
    /// # Errors
    /// [`CompressError::InvalidFraction`] for an amount outside `[0, 1]` or NaN.
    pub fn validate(&self) -> Result<(), CompressError> {
        if (0.0..=1.0).contains(&self.amount) {
            Ok(())
        } else {
            Err(CompressError::InvalidFraction {
                name: "amount",
                value: self.amount,
            })
        }
    }

    /// Prunes `layer`: computes its mask from its current weights and returns the layer
    /// wrapped with it (a [`MaskedLinear`](super::MaskedLinear) for a `Linear`, ...), whose
    /// forward multiplies the weights by the mask.
    ///
    /// # Errors
    /// As [`validate`](Self::validate); [`CompressError::Unsupported`] if the weights cannot be
    /// read back from the device as floats.
    pub fn prune<L: Prune>(&self, layer: L) -> Result<L::Masked, CompressError> {
        self.validate()?;
        layer.prune(self)
    }

    /// How many of `n` items this configuration removes: `round(amount · n)`.
    pub fn count(&self, n: usize) -> usize {
        ((self.amount * n as f64).round() as usize).min(n)
    }
}

/// A layer that [`PruneConfig::prune`] can prune: `Linear`, `Conv2d` and [`SkLinear`](burn_sketch::SkLinear).
pub trait Prune: Sized {
    /// The layer with its mask, trained as the layer is and made plain again by its
    /// `make_permanent`.
    type Masked;

    /// The layer with the mask that `config` picks from its current weights. `config` has been
    /// validated; call it through [`PruneConfig::prune`].
    ///
    /// # Errors
    /// [`CompressError::Unsupported`] if the weights cannot be read back as floats.
    fn prune(self, config: &PruneConfig) -> Result<Self::Masked, CompressError>;
}
