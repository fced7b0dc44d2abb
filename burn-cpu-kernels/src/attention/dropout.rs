//! Dropout on attention's probabilities, as a pure function of a seed and the probability's
//! position: the forward, the backward (which recomputes the probabilities rather than
//! storing them) and any reference elsewhere draw the same keep decisions without sharing a
//! mask tensor.

/// Dropout on the normalised attention probabilities: each `P_ij` is kept with probability
/// `1 − prob` and then scaled by `1/(1 − prob)`, or set to 0, the decision being
/// [`dropout_keep`]`(self, index)`. The forward's row statistics (its log-sum-exp) are those
/// of the probabilities before dropout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionDropout {
    /// The probability of dropping a probability, in `[0, 1)`.
    pub prob: f32,
    /// The seed of the keep decisions: a step of training uses a fresh one.
    pub seed: u64,
}

/// SplitMix64's increment (the golden ratio's fraction in 64 bits).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output for the state `x`: `x + GAMMA`, then its finaliser (xor-shift 30,
/// multiply by `0xBF58_476D_1CE4_E5B9`, xor-shift 27, multiply by `0x94D0_49BB_1331_11EB`,
/// xor-shift 31), all wrapping.
#[inline(always)]
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether dropout keeps the probability at `index`, where for query `i` and key `j` of head
/// `(bi, hi)` in a `[b, h, sq, sk]` problem `index = ((bi·h + hi)·sq + i)·sk + j`.
///
/// Exactly: with `mix(x)` SplitMix64's output for the state `x` (`z = x + 0x9E37_79B9_7F4A_7C15`
/// wrapping; `z = (z ^ z >> 30)·0xBF58_476D_1CE4_E5B9`; `z = (z ^ z >> 27)·0x94D0_49BB_1331_11EB`;
/// `z ^ z >> 31`, products wrapping), `hash = mix(seed ^ mix(index))` and the probability is kept
/// when `(hash >> 40) as f32 · 2⁻²⁴ ≥ prob` (24 uniform bits, exact in `f32`). A pure function,
/// so that the forward, the backward and a tensor-op reference agree bit for bit.
#[inline(always)]
pub fn dropout_keep(dropout: AttentionDropout, index: u64) -> bool {
    let hash = mix(dropout.seed ^ mix(index));
    (hash >> 40) as f32 * (1.0 / (1u64 << 24) as f32) >= dropout.prob
}

/// The keep decisions of a `[b, h, sq, sk]` problem, row-major (`true` = kept): element
/// `((bi·h + hi)·sq + i)·sk + j` is [`dropout_keep`] of that index. For references and tests
/// (it is the `O(b·h·sq·sk)` tensor the kernels never form).
///
/// # Panics
/// If `dropout.prob` is not in `[0, 1)`.
pub fn dropout_mask(dropout: AttentionDropout, shape: [usize; 4]) -> Vec<bool> {
    dropout.check();
    let count: usize = shape.iter().product();
    (0..count as u64)
        .map(|index| dropout_keep(dropout, index))
        .collect()
}

impl AttentionDropout {
    /// # Panics
    /// If the probability is not in `[0, 1)`.
    pub(super) fn check(self) {
        assert!(
            (0.0..1.0).contains(&self.prob),
            "attention dropout: the probability must be in [0, 1), got {}",
            self.prob
        );
    }

    /// `1/(1 − prob)`, the factor of a kept probability.
    pub(super) fn keep_scale(self) -> f32 {
        1.0 / (1.0 - self.prob)
    }

    /// `row[j] ← row[j]·z_j` with `z_j` the scaled keep decision of `first + j`.
    #[inline(always)]
    pub(super) fn apply(self, row: &mut [f32], first: u64) {
        let scale = self.keep_scale();
        for (j, x) in row.iter_mut().enumerate() {
            *x = if dropout_keep(self, first + j as u64) {
                *x * scale
            } else {
                0.0
            };
        }
    }
}
