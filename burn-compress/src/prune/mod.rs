//! Pruning: weights removed by magnitude or whole output rows removed by norm, held as masks
//! through fine-tuning, then made permanent or shrunk into smaller layers.
//!
//! PyTorch's `torch.nn.utils.prune`, for Burn's `Linear` and `Conv2d` and for [`SkLinear`](burn_sketch::SkLinear)'s
//! trained factors (its fixed sketches are never pruned):
//!
//! - [`PruneConfig`] says how much and how: [`PruneMethod::Magnitude`] removes the weights of
//!   smallest `|w|` anywhere (`l1_unstructured`); [`PruneMethod::Structured`] removes whole
//!   output rows of smallest [`Norm`] (`ln_structured`, `dim` = the output). Its
//!   [`prune`](PruneConfig::prune) turns a layer into a [`MaskedLinear`], [`MaskedConv2d`] or
//!   [`MaskedSkLinear`].
//! - A masked layer's forward multiplies the weights by the mask, so fine-tuning cannot bring a
//!   pruned weight back: it gets no gradient. `make_permanent` returns the plain layer with the
//!   zeros stored (`prune.remove`).
//! - Zeros save nothing on dense kernels. Structured pruning does once [`shrink_pair`] drops
//!   the removed rows of one layer and the matching inputs of the next ([`Shrink`]): smaller
//!   tensors, a proportionally cheaper product.
//! - [`SparsityReport`] counts the zeros per layer.
//!
//! Masks are chosen on the host, once, with ties broken toward the lower index, so the same
//! weights give the same mask on every backend.
//!
//! ```
//! use burn::backend::Flex;
//! use burn::nn::LinearConfig;
//! use burn::tensor::{Distribution, Tensor};
//! use burn_compress::prune::{Norm, PruneConfig, PruneMethod, SparsityReport, shrink_pair};
//!
//! let device = Default::default();
//! let first = LinearConfig::new(37, 23).init::<Flex>(&device);
//! let second = LinearConfig::new(23, 11).init::<Flex>(&device);
//!
//! // Unstructured: 80% of the weights of smallest magnitude, masked in the forward.
//! let masked = PruneConfig::new(0.8).prune(first.clone()).unwrap();
//! let report = SparsityReport::new().with("first", &masked);
//! assert_eq!(report.layers[0].zeros, 681); // round(0.8 · 37 · 23)
//! let plain = masked.make_permanent(); // a `Linear` again, zeros stored
//!
//! // Structured: the 12 output rows of smallest L2 norm, then the pair shrunk.
//! let masked = PruneConfig::new(0.5)
//!     .with_method(PruneMethod::Structured(Norm::L2))
//!     .prune(first)
//!     .unwrap();
//! let keep = masked.kept_outputs().unwrap().unwrap();
//! let (small_first, small_second) = shrink_pair(&masked.make_permanent(), &second, &keep).unwrap();
//! assert_eq!(small_first.weight.dims(), [37, 11]);
//! assert_eq!(small_second.weight.dims(), [11, 11]);
//! let x = Tensor::<Flex, 2>::random([4, 37], Distribution::Default, &device);
//! assert_eq!(small_second.forward(small_first.forward(x)).dims(), [4, 11]);
//! # let _ = plain;
//! ```

mod config;
mod conv;
mod linear;
mod mask;
mod report;
mod shrink;
mod sketched;

pub use config::{Norm, Prune, PruneConfig, PruneMethod};
pub use conv::MaskedConv2d;
pub use linear::MaskedLinear;
pub use report::{LayerSparsity, Sparsity, SparsityReport};
pub use shrink::{Shrink, shrink_pair};
pub use sketched::MaskedSkLinear;
