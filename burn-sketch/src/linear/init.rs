//! Panther's initialisation: a dense weight, random sign sketches, and the factors derived
//! from both.

use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

use super::{SkLinear, SkLinearConfig};
use crate::backend::KernelStrategy;

/// Draws the dense layer that a freshly initialised [`SkLinear`] estimates: weight
/// `[d_input, d_output]` and bias `[d_output]`, both uniform in `±1/√d_output`.
///
/// That bound is what PyTorch's `kaiming_uniform_(a = √5)` gives on Panther's weight, whose
/// fan-in dimension is `d_output` because of its transposed layout.
pub(crate) fn panther_dense<B: Backend>(
    config: &SkLinearConfig,
    device: &B::Device,
) -> (Tensor<B, 2>, Option<Tensor<B, 1>>) {
    let bound = 1.0 / (config.d_output as f64).sqrt();
    let uniform = Distribution::Uniform(-bound, bound);
    let weight = Tensor::random([config.d_input, config.d_output], uniform, device);
    let bias = config
        .bias
        .then(|| Tensor::random([config.d_output], uniform, device));
    (weight, bias)
}

/// A random sign sketch: every entry is `±1/√k` with equal probability, so that for a `[k, d]`
/// sketch `U`, `E[Uᵀ·U] = I`.
pub(crate) fn sign_sketch<B: Backend>(
    shape: [usize; 3],
    low_rank: usize,
    device: &B::Device,
) -> Tensor<B, 3> {
    let scale = 1.0 / (low_rank as f64).sqrt();
    Tensor::<B, 3>::random(shape, Distribution::Bernoulli(0.5), device)
        .mul_scalar(2.0 * scale)
        .sub_scalar(scale)
}

impl<B: Backend> SkLinear<B> {
    /// Builds the sketched estimate of the dense layer `x·weight + bias`.
    ///
    /// Draws `U1_t` (`[k, d_out]`) and `U2_t` (`[d_in, k]`), then sets `S1_t = W·U1_tᵀ` and
    /// `S2_t = U2_tᵀ·W`. Since `E[U1_tᵀ·U1_t] = E[U2_t·U2_tᵀ] = I`, the effective weight
    /// `1/(2T)·Σ_t (S1_t·U1_t + U2_t·S2_t)` equals `W` in expectation.
    ///
    /// All `T` terms are derived with one product each (the terms stacked along the rank
    /// axis), never by broadcasting `W` over `T`, which would materialise `T` copies of it.
    pub(crate) fn from_dense_parts(
        weight: Tensor<B, 2>,
        bias: Option<Tensor<B, 1>>,
        num_terms: usize,
        low_rank: usize,
    ) -> Self {
        let device = weight.device();
        let [d_input, d_output] = weight.dims();
        let (t, k) = (num_terms, low_rank);

        let u1s = sign_sketch::<B>([t, k, d_output], k, &device);
        let u2s = sign_sketch::<B>([t, d_input, k], k, &device);

        // [d_in, d_out] · [d_out, T·k] -> [d_in, T, k] -> [T, d_in, k]
        let s1s = weight
            .clone()
            .matmul(u1s.clone().reshape([t * k, d_output]).transpose())
            .reshape([d_input, t, k])
            .swap_dims(0, 1);
        // [T·k, d_in] · [d_in, d_out] -> [T, k, d_out]
        let s2s = u2s
            .clone()
            .swap_dims(1, 2)
            .reshape([t * k, d_input])
            .matmul(weight)
            .reshape([t, k, d_output]);

        Self {
            s1s: Param::from_tensor(s1s),
            s2s: Param::from_tensor(s2s),
            u1s: fixed(u1s),
            u2s: fixed(u2s),
            bias: bias.map(Param::from_tensor),
            strategy: KernelStrategy::default(),
        }
    }
}

/// Wraps a sketch that is part of the model's state (saved in records) but never trained:
/// with `require_grad` off, autodiff computes no gradient for it and optimizers, which only
/// update parameters that have a gradient, leave it alone.
pub(crate) fn fixed<B: Backend>(sketch: Tensor<B, 3>) -> Param<Tensor<B, 3>> {
    Param::from_tensor(sketch).set_require_grad(false)
}
