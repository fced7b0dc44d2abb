//! The factor tensors of a sketched layer, as passed to a backend.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// The four factor tensors of a sketched layer, in Panther's layouts.
///
/// | field | shape | |
/// |---|---|---|
/// | `s1s` | `[T, d_input, k]` | trainable |
/// | `s2s` | `[T, k, d_output]` | trainable |
/// | `u1s` | `[T, k, d_output]` | fixed sign sketch |
/// | `u2s` | `[T, d_input, k]` | fixed sign sketch |
#[derive(Debug, Clone)]
pub struct SketchWeights<B: Backend> {
    /// Trainable left factors, `[T, d_input, k]`.
    pub s1s: Tensor<B, 3>,
    /// Trainable right factors, `[T, k, d_output]`.
    pub s2s: Tensor<B, 3>,
    /// Sign sketches multiplying `s1s` on the right, `[T, k, d_output]`.
    pub u1s: Tensor<B, 3>,
    /// Sign sketches multiplying `s2s` on the left, `[T, d_input, k]`.
    pub u2s: Tensor<B, 3>,
}

impl<B: Backend> SketchWeights<B> {
    /// The number of terms `T`.
    pub fn num_terms(&self) -> usize {
        self.s1s.dims()[0]
    }

    /// The two dense factors of the layer, `A` (`[d_input, 2Tk]`) and `B` (`[2Tk, d_output]`),
    /// such that the layer's weight is `A·B / (2T)`.
    ///
    /// The rank axis is ordered term by term: for term `t`, the `k` columns of `S1_t` are
    /// followed by the `k` columns of `U2_t` in `A`, and the rows of `U1_t` by those of `S2_t`
    /// in `B`. Then `A·B = Σ_t (S1_t·U1_t + U2_t·S2_t)`. Building `B` needs one concatenation
    /// and no transposition; `A` needs one more copy to bring the term axis inward, except when
    /// `T = 1`.
    pub fn factors(self) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let [t, d_input, k] = self.s1s.dims();
        let d_output = self.s2s.dims()[2];
        let rank = 2 * t * k;

        let a = Tensor::cat(vec![self.s1s, self.u2s], 2);
        let a = if t == 1 {
            a.reshape([d_input, rank])
        } else {
            a.swap_dims(0, 1).reshape([d_input, rank])
        };
        let b = Tensor::cat(vec![self.u1s, self.s2s], 1).reshape([rank, d_output]);
        (a, b)
    }
}
