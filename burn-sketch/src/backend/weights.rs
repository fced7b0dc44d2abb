//! The tensors of one sketched product, as passed to a backend, and the one order in which
//! every implementation packs them.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

/// The four factor tensors of a sketched layer, in Panther's layouts: the trainable `s1s`
/// (`[T, d_input, k]`) and `s2s` (`[T, k, d_output]`), and the fixed sign sketches `u1s`
/// (`[T, k, d_output]`) and `u2s` (`[T, d_input, k]`).
///
/// Every implementation of the product multiplies through the two dense factors that
/// [`factors`](Self::factors) builds, with the rank axis in blocks:
/// `A = [S1_1 … S1_T | U2_1 … U2_T]` (`[d_input, 2Tk]`) and
/// `B = [U1_1; …; U1_T; S2_1; …; S2_T]` (`[2Tk, d_output]`); the book's "Backends and kernels"
/// says why this order.
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
    /// The four tensors in the order `[s1s, s2s, u1s, u2s]`, the order of the fields.
    pub fn into_array(self) -> [Tensor<B, 3>; 4] {
        [self.s1s, self.s2s, self.u1s, self.u2s]
    }

    /// The inverse of [`into_array`](Self::into_array).
    pub fn from_array([s1s, s2s, u1s, u2s]: [Tensor<B, 3>; 4]) -> Self {
        Self { s1s, s2s, u1s, u2s }
    }

    /// The four tensors as backend primitives, in [`into_array`](Self::into_array)'s order:
    /// what backend wrappers (autodiff, fusion) pass to their inner backend.
    pub fn into_primitives(self) -> [FloatTensor<B>; 4] {
        self.into_array()
            .map(|tensor| tensor.into_primitive().tensor())
    }

    /// The inverse of [`into_primitives`](Self::into_primitives).
    pub fn from_primitives(primitives: [FloatTensor<B>; 4]) -> Self {
        Self::from_array(primitives.map(float))
    }

    /// `(T, d_input, k, d_output)`.
    pub fn dims(&self) -> (usize, usize, usize, usize) {
        let [terms, d_input, k] = self.s1s.dims();
        (terms, d_input, k, self.s2s.dims()[2])
    }

    /// The two dense factors of the layer, `A` (`[d_input, 2Tk]`) and `B` (`[2Tk, d_output]`),
    /// in the [packed order](Self#packed-order), such that the layer's weight is `A·B / (2T)`.
    ///
    /// `B` is one concatenation of two tensors that are already `[Tk, d_output]` matrices; `A`
    /// is one stack (a copy) that moves the term axis inward.
    pub fn factors(self) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let (terms, d_input, k, d_output) = self.dims();
        let rank = 2 * terms * k;
        let a = Tensor::stack::<4>(vec![self.s1s.swap_dims(0, 1), self.u2s.swap_dims(0, 1)], 1)
            .reshape([d_input, rank]);
        let b = Tensor::cat(vec![self.u1s, self.s2s], 0).reshape([rank, d_output]);
        (a, b)
    }
}

/// Wraps a float primitive as a tensor: backend implementations move between the two.
pub(crate) fn float<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}
