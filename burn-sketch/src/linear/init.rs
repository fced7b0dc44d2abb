//! Panther's initialisation: a dense weight, random sign sketches, and the factors derived
//! from both.

use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use serde::{Deserialize, Serialize};

use super::{SkLinear, SkLinearConfig};
use crate::backend::KernelStrategy;
use crate::{FixedSketch, SketchError};
use burn_randnla::host::{pseudo_inverse, to_device, to_host};

/// How a sketched layer converted from a dense one sets its trained factors, given the fixed
/// sketches it drew.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum SketchInit {
    /// Panther's: `S1_t = W·U1_tᵀ`, `S2_t = U2_tᵀ·W`, whose effective weight equals `W` in
    /// expectation over the sketches, but for one draw is far from it when `2·T·k` is well
    /// below the layer's width.
    #[default]
    Unbiased,
    /// The least-squares fit: the factors whose effective weight is the closest to `W`
    /// (Frobenius norm) that the drawn sketches allow. With `U1` and `U2` the stacked sketches,
    /// `P` the projector onto `U1`'s rows and `Q` onto `U2`'s columns, the fit is
    /// `W − (I − Q)·W·(I − P)`, which no other choice of factors beats.
    Fitted,
}

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
        sketch_seed: Option<u64>,
    ) -> Self {
        let device = weight.device();
        let [d_input, d_output] = weight.dims();
        let (t, k) = (num_terms, low_rank);

        let (u1, u2) = match sketch_seed {
            Some(seed) => (
                FixedSketch::seeded([t, k, d_output], k, seed.wrapping_mul(2), &device),
                FixedSketch::seeded(
                    [t, d_input, k],
                    k,
                    seed.wrapping_mul(2).wrapping_add(1),
                    &device,
                ),
            ),
            None => (
                FixedSketch::new(sign_sketch::<B>([t, k, d_output], k, &device)),
                FixedSketch::new(sign_sketch::<B>([t, d_input, k], k, &device)),
            ),
        };
        let (u1s, u2s) = (u1.val(), u2.val());

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
            u1s: u1,
            u2s: u2,
            bias: bias.map(Param::from_tensor),
            strategy: KernelStrategy::default(),
        }
    }
}

impl<B: Backend> SkLinear<B> {
    /// Replaces the trained factors by the least-squares fit of `weight` for this layer's
    /// sketches ([`SketchInit::Fitted`]).
    ///
    /// With `M = 2T·W`, `U1 = [U1_1; …; U1_T]` (`[T·k, d_out]`) and
    /// `U2 = [U2_1 … U2_T]` (`[d_in, T·k]`): `S1 = M·U1⁺` gives `M·P`, and `S2 = U2⁺·(M − M·P)`
    /// gives `Q·M·(I − P)`. The pseudo-inverses are of `T·k`-sized matrices, on the host.
    pub(crate) fn fitted_to(self, weight: Tensor<B, 2>) -> Result<Self, SketchError> {
        const OPERATION: &str = "SketchInit::Fitted";
        let device = weight.device();
        let [d_input, d_output] = weight.dims();
        let [t, k, _] = self.u1s.dims();
        let u1 = self.u1s.val().reshape([t * k, d_output]);
        let u2 = self.u2s.val().swap_dims(0, 1).reshape([d_input, t * k]);
        let u1_inverse = to_device(
            pseudo_inverse(to_host(u1.clone(), OPERATION)?.as_ref())?.as_ref(),
            &device,
        );
        let u2_inverse = to_device(
            pseudo_inverse(to_host(u2, OPERATION)?.as_ref())?.as_ref(),
            &device,
        );
        let m = weight.mul_scalar(2.0 * t as f64);
        let s1 = m.clone().matmul(u1_inverse); // [d_in, T·k]
        let rest = m - s1.clone().matmul(u1);
        let s2 = u2_inverse.matmul(rest); // [T·k, d_out]
        Ok(Self {
            s1s: Param::from_tensor(s1.reshape([d_input, t, k]).swap_dims(0, 1)),
            s2s: Param::from_tensor(s2.reshape([t, k, d_output])),
            ..self
        })
    }
}
