//! The backend extension trait, its outputs, and its implementations: `Autodiff<B>` (one
//! node per call), `FastFlex` (burn-cpu-kernels' kernels) and the compositions for every
//! other backend.

mod autodiff;
#[cfg(feature = "flex")]
mod fast_flex;
mod others;
#[cfg(feature = "profile")]
mod profiled;

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};

use crate::attention::AttentionOptions;
use crate::composed;
use crate::optim::AdamStep;
use crate::softmax::SoftmaxKind;

/// What [`FusedBackend::fused_attention_forward`] returns: the output, and what the backward
/// recomputes the probabilities from.
#[derive(Debug, Clone)]
pub struct AttentionForward<B: Backend> {
    /// `[batch, heads, seq_q, d_v]`.
    pub output: Tensor<B, 4>,
    /// `[batch, heads, seq_q]`: each query's log-sum-exp of its scaled, masked scores
    /// (`+∞` for a query that sees no key), in whatever float type the backend keeps it.
    pub lse: Tensor<B, 3>,
}

/// What [`FusedBackend::fused_layer_norm_forward`] returns.
#[derive(Debug, Clone)]
pub struct LayerNormForward<B: Backend> {
    /// `[rows, n]`.
    pub output: Tensor<B, 2>,
    /// `[rows]`: each row's mean.
    pub mean: Tensor<B, 1>,
    /// `[rows]`: each row's `1/√(var + ε)` (biased variance).
    pub rstd: Tensor<B, 1>,
}

/// The gradients of a layer norm; a parameter's is `None` when it was not asked for.
#[derive(Debug, Clone)]
pub struct LayerNormGradients<B: Backend> {
    /// `[rows, n]`.
    pub x: Tensor<B, 2>,
    /// `[n]`.
    pub gamma: Option<Tensor<B, 1>>,
    /// `[n]`.
    pub beta: Option<Tensor<B, 1>>,
}

/// What [`FusedBackend::fused_cross_entropy_forward`] returns.
#[derive(Debug, Clone)]
pub struct CrossEntropyForward<B: Backend> {
    /// `[1]`: the mean loss over the rows whose target is not ignored (0 if none is).
    pub loss: Tensor<B, 1>,
    /// `[rows]`: each row's log-sum-exp, all the backward keeps besides the logits.
    pub lse: Tensor<B, 1>,
}

/// A backend with fused training operations.
///
/// The provided methods are the tensor-op compositions of [`composed`], valid on any
/// backend; `Autodiff<B>` records each forward as one graph node whose backward calls `B`'s
/// `*_backward` method, and a backend with kernels of its own overrides both directions. A
/// backend with nothing faster gets the compositions from an empty
/// `impl FusedBackend for MyBackend {}`.
///
/// Callers guarantee that shapes agree; the free functions ([`fused_attention`](crate::fused_attention)
/// and the others) are the checked entry points.
pub trait FusedBackend: Backend {
    /// Scaled-dot-product attention `dropout(softmax(q·kᵀ·scale + mask))·v` for `q`
    /// `[b, h, sq, d]`, `k` `[b, h, sk, d]`, `v` `[b, h, sk, dv]` and a mask (`true` =
    /// masked) that broadcasts to `[b, h, sq, sk]`, with the statistics its backward needs.
    fn fused_attention_forward(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        mask: Option<Tensor<Self, 4, Bool>>,
        options: AttentionOptions,
    ) -> AttentionForward<Self> {
        composed::attention_forward(q, k, v, mask, options)
    }

    /// The gradients `[dq, dk, dv]` of [`fused_attention_forward`](Self::fused_attention_forward)
    /// from its inputs, its output and log-sum-exp, and the output's gradient.
    #[allow(clippy::too_many_arguments)]
    fn fused_attention_backward(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        mask: Option<Tensor<Self, 4, Bool>>,
        output: Tensor<Self, 4>,
        lse: Tensor<Self, 3>,
        grad_output: Tensor<Self, 4>,
        options: AttentionOptions,
    ) -> [Tensor<Self, 4>; 3] {
        composed::attention_backward(q, k, v, mask, output, lse, grad_output, options)
    }

    /// Layer normalisation of the rows of `x` (`[rows, n]`) with `gamma` and `beta` (`[n]`).
    fn fused_layer_norm_forward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        beta: Option<Tensor<Self, 1>>,
        epsilon: f64,
    ) -> LayerNormForward<Self> {
        composed::layer_norm_forward(x, gamma, beta, epsilon)
    }

    /// The gradients of [`fused_layer_norm_forward`](Self::fused_layer_norm_forward) from
    /// its input, `gamma`, the saved statistics and the output's gradient; `gamma`'s and
    /// `beta`'s only where `wanted` (`[gamma, beta]`) says so.
    fn fused_layer_norm_backward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        mean: Tensor<Self, 1>,
        rstd: Tensor<Self, 1>,
        grad_output: Tensor<Self, 2>,
        wanted: [bool; 2],
    ) -> LayerNormGradients<Self> {
        composed::layer_norm_backward(x, gamma, mean, rstd, grad_output, wanted)
    }

    /// Softmax or log-softmax over the rows of `x` (`[rows, n]`).
    fn fused_softmax_forward(x: Tensor<Self, 2>, kind: SoftmaxKind) -> Tensor<Self, 2> {
        composed::softmax_forward(x, kind)
    }

    /// The input's gradient of [`fused_softmax_forward`](Self::fused_softmax_forward) from
    /// its output and the output's gradient.
    fn fused_softmax_backward(
        output: Tensor<Self, 2>,
        grad_output: Tensor<Self, 2>,
        kind: SoftmaxKind,
    ) -> Tensor<Self, 2> {
        composed::softmax_backward(output, grad_output, kind)
    }

    /// The mean cross-entropy of `logits` (`[rows, classes]`) against `targets` (`[rows]`),
    /// rows whose target is `ignore_index` left out.
    fn fused_cross_entropy_forward(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        ignore_index: Option<usize>,
    ) -> CrossEntropyForward<Self> {
        composed::cross_entropy_forward(logits, targets, ignore_index)
    }

    /// The logits' gradient of [`fused_cross_entropy_forward`](Self::fused_cross_entropy_forward)
    /// from the logits, the saved log-sum-exp and the loss's gradient (`[1]`).
    fn fused_cross_entropy_backward(
        logits: Tensor<Self, 2>,
        lse: Tensor<Self, 1>,
        targets: Tensor<Self, 1, Int>,
        ignore_index: Option<usize>,
        grad_loss: Tensor<Self, 1>,
    ) -> Tensor<Self, 2> {
        composed::cross_entropy_backward(logits, lse, targets, ignore_index, grad_loss)
    }

    /// One Adam (or AdamW) step on a flattened parameter: `param`, `grad` and the moments
    /// `moment_1`, `moment_2` are `[n]` (zeros before the first step), and the result is
    /// `[param, moment_1, moment_2]` after the step, each `[n]`, with Burn 0.21's `Adam`
    /// (`AdamW` where [`AdamStep::decoupled_weight_decay`]) numerics: see [`AdamStep`].
    ///
    /// An implementation may write the results into the inputs' buffers where no other
    /// tensor holds them; a tensor that shares its buffer is never changed.
    fn fused_adam_step(
        param: Tensor<Self, 1>,
        grad: Tensor<Self, 1>,
        moment_1: Tensor<Self, 1>,
        moment_2: Tensor<Self, 1>,
        step: AdamStep,
    ) -> [Tensor<Self, 1>; 3] {
        composed::adam_step(param, grad, moment_1, moment_2, step)
    }
}
