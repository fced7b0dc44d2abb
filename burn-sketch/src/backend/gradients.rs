//! What a backward pass of the sketched product is asked for, and what it returns.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;

use super::weights::float;

/// The operands of a sketched product, in the order every array of them follows:
/// `x`, then the [`SketchWeights`](super::SketchWeights) in field order.
pub const OPERANDS: [&str; 5] = ["x", "s1s", "s2s", "u1s", "u2s"];

/// Which gradients [`SketchBackend::sketched_linear_backward`](super::SketchBackend) must
/// compute. Autodiff asks only for those of tracked tensors, so an inference-time input or
/// the fixed sketches cost nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WantedGradients {
    /// `∂x`.
    pub x: bool,
    /// `∂S1s`.
    pub s1s: bool,
    /// `∂S2s`.
    pub s2s: bool,
    /// `∂U1s` (fixed in `SkLinear`; computed only if a caller tracks it).
    pub u1s: bool,
    /// `∂U2s` (likewise).
    pub u2s: bool,
}

impl WantedGradients {
    /// Every gradient.
    pub const ALL: Self = Self {
        x: true,
        s1s: true,
        s2s: true,
        u1s: true,
        u2s: true,
    };

    /// The flags in [`OPERANDS`] order.
    pub fn to_array(self) -> [bool; 5] {
        [self.x, self.s1s, self.s2s, self.u1s, self.u2s]
    }

    /// The inverse of [`to_array`](Self::to_array).
    pub fn from_array([x, s1s, s2s, u1s, u2s]: [bool; 5]) -> Self {
        Self {
            x,
            s1s,
            s2s,
            u1s,
            u2s,
        }
    }
}

/// The gradients of the sketched product, each present exactly when it was wanted.
#[derive(Debug, Clone)]
pub struct SketchGradients<B: Backend> {
    /// `∂x`, `[n, d_input]`.
    pub x: Option<Tensor<B, 2>>,
    /// `∂S1s`, `[T, d_input, k]`.
    pub s1s: Option<Tensor<B, 3>>,
    /// `∂S2s`, `[T, k, d_output]`.
    pub s2s: Option<Tensor<B, 3>>,
    /// `∂U1s`, `[T, k, d_output]`.
    pub u1s: Option<Tensor<B, 3>>,
    /// `∂U2s`, `[T, d_input, k]`.
    pub u2s: Option<Tensor<B, 3>>,
}

impl<B: Backend> SketchGradients<B> {
    /// The gradients as backend primitives, in [`OPERANDS`] order.
    pub fn into_primitives(self) -> [Option<FloatTensor<B>>; 5] {
        let primitive = |tensor: Option<Tensor<B, 3>>| tensor.map(|t| t.into_primitive().tensor());
        [
            self.x.map(|t| t.into_primitive().tensor()),
            primitive(self.s1s),
            primitive(self.s2s),
            primitive(self.u1s),
            primitive(self.u2s),
        ]
    }

    /// The inverse of [`into_primitives`](Self::into_primitives).
    pub fn from_primitives([x, s1s, s2s, u1s, u2s]: [Option<FloatTensor<B>>; 5]) -> Self {
        Self {
            x: x.map(float),
            s1s: s1s.map(float),
            s2s: s2s.map(float),
            u1s: u1s.map(float),
            u2s: u2s.map(float),
        }
    }
}
