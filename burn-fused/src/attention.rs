//! Scaled-dot-product attention as one training operation: [`fused_attention`].
//!
//! Its semantics are burn-backend 0.21's `attention_fallback` (no softcap, no additive
//! bias), plus dropout on the probabilities: `dropout(softmax(q·kᵀ·scale + mask))·v`. The
//! dropout mask is a pure function of a seed and each score's position
//! ([`dropout_keep`]), so the backward, every backend and the kernels drop the same
//! probabilities without storing a mask.

use burn::tensor::{Bool, Tensor};

pub use burn_cpu_kernels::attention::{AttentionDropout, dropout_keep, dropout_mask};

use crate::FusedBackend;

/// The choices of one attention call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionOptions {
    /// The factor of `q·kᵀ`; `None`: `1/√d`.
    pub scale: Option<f64>,
    /// Mask key `j` for query `i` when `j > i + sk − sq` (the diagonal at the bottom-right
    /// corner, as Burn's attention).
    pub causal: bool,
    /// Dropout on the probabilities, or none.
    pub dropout: Option<AttentionDropout>,
}

impl AttentionOptions {
    /// The scale for head dimension `d`.
    pub fn scale_for(&self, d: usize) -> f64 {
        self.scale.unwrap_or_else(|| 1.0 / (d as f64).sqrt())
    }
}

/// `dropout(softmax(q·kᵀ·scale + mask))·v`, differentiable in `q`, `k` and `v` as one node.
///
/// # Shapes
/// - `q`: `[batch, heads, seq_q, d]`, `k`: `[batch, heads, seq_k, d]`,
///   `v`: `[batch, heads, seq_k, d_v]`
/// - `mask`: broadcasts to `[batch, heads, seq_q, seq_k]`, `true` at masked scores (a padding
///   mask is `[batch, 1, 1, seq_k]`)
/// - output: `[batch, heads, seq_q, d_v]`
///
/// A query that sees no key gets zeros, as in Burn's attention.
///
/// # Panics
/// If the shapes do not agree, or a dropout probability is not in `[0, 1)`.
pub fn fused_attention<B: FusedBackend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    options: AttentionOptions,
) -> Tensor<B, 4> {
    let ([b, h, sq, d], [kb, kh, sk, kd], [vb, vh, vk, _]) = (q.dims(), k.dims(), v.dims());
    assert!(
        [kb, kh, kd] == [b, h, d] && [vb, vh, vk] == [b, h, sk],
        "fused_attention: q {:?}, k {:?} and v {:?} are not [b, h, sq, d], [b, h, sk, d] and \
         [b, h, sk, dv]",
        q.dims(),
        k.dims(),
        v.dims()
    );
    if let Some(mask) = &mask {
        let target = [b, h, sq, sk];
        assert!(
            mask.dims()
                .iter()
                .zip(target)
                .all(|(&m, t)| m == t || m == 1),
            "fused_attention: the mask {:?} does not broadcast to {target:?}",
            mask.dims()
        );
    }
    if let Some(dropout) = options.dropout {
        assert!(
            (0.0..1.0).contains(&dropout.prob),
            "fused_attention: the dropout probability {} is not in [0, 1)",
            dropout.prob
        );
    }
    B::fused_attention_forward(q, k, v, mask, options).output
}
