//! Fused training operations for Burn: the operations a transformer's training step spends
//! its time in, each one node of the autodiff graph with its own backward.
//!
//! Burn 0.21's `Autodiff` decomposes softmax, log-softmax and layer norm into a dozen
//! element-wise and reduction nodes each, and differentiates attention through
//! `attention_fallback`, which keeps the `[batch, heads, seq, seq]` probabilities for the
//! backward; a backend never sees these operations while training. [`FusedBackend`] gives
//! each one a forward that saves only what its backward needs and a backward of its own:
//!
//! | operation | saved for the backward | FastFlex |
//! |---|---|---|
//! | [`fused_attention`] (causal and padding masks, dropout on the probabilities) | the output and each query's log-sum-exp | flash-style kernels: scores recomputed per block, never `[seq, seq]` |
//! | [`fused_layer_norm`] | each row's mean and inverse deviation | one pass per row; input, `gamma` and `beta` gradients in one pass |
//! | [`fused_softmax`], [`fused_log_softmax`] | the output | vectorised rows |
//! | [`fused_cross_entropy`] | each row's log-sum-exp (no `[rows, vocab]` probabilities) | vectorised rows |
//!
//! and one optimizer step: [`optim::FusedAdam`] (and [`optim::FusedAdamW`]), Burn's Adam with
//! each parameter's update one call ([`FusedBackend::fused_adam_step`]), one pass over its
//! buffers on FastFlex.
//!
//! Every backend has the provided methods, tensor-op compositions ([`composed`]) that are
//! correct everywhere; `Autodiff<B>` records one node per call whose backward calls `B`'s;
//! `FastFlex` (burn-fast-cpu) runs burn-cpu-kernels' kernels both ways. burn-sketch's
//! `SketchBackend` has `FusedBackend` as its supertrait, so every model built from
//! burn-compress's modules trains on these operations with no change.
//!
//! ```
//! use burn::backend::{Autodiff, Flex};
//! use burn::tensor::{Distribution, Tensor};
//! use burn_fused::{AttentionOptions, fused_attention};
//!
//! type B = Autodiff<Flex>;
//! let device = Default::default();
//! let [q, k, v] = [0, 1, 2].map(|_| {
//!     Tensor::<B, 4>::random([2, 4, 8, 16], Distribution::Default, &device).require_grad()
//! });
//! let causal = AttentionOptions { causal: true, ..AttentionOptions::default() };
//! let out = fused_attention(q.clone(), k, v, None, causal);
//! let grads = out.sum().backward();
//! assert_eq!(q.grad(&grads).unwrap().dims(), [2, 4, 8, 16]);
//! ```

#![warn(missing_docs)]

pub mod attention;
mod backend;
pub mod composed;
pub mod cross_entropy;
pub mod layer_norm;
pub mod optim;
pub mod softmax;

pub use attention::{AttentionDropout, AttentionOptions, fused_attention};
pub use backend::{AttentionForward, FusedBackend, LayerNormForward, LayerNormGradients};
pub use cross_entropy::{CrossEntropyForward, fused_cross_entropy};
pub use layer_norm::{fused_layer_norm, fused_layer_norm_module};
pub use softmax::{SoftmaxKind, fused_log_softmax, fused_softmax};
