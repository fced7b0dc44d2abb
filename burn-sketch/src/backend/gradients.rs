//! What a backward pass of the sketched product is asked for, and what it returns.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

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
