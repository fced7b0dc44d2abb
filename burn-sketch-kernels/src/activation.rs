//! The activation a forward kernel applies in its output pass, after the scale and bias.
//!
//! Why fuse it: an activation after a product is one more pass over the `n × d_out` output,
//! written by the product and read straight back; applied as each output element is written,
//! it costs no memory traffic at all.

use cubecl::prelude::*;

/// The element-wise function applied to each output element, `y = f(α·sum + bias)`.
/// A compile-time argument of the forward kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `f(z) = z`: the plain product.
    #[default]
    Identity,
    /// `f(z) = max(z, 0)`.
    Relu,
    /// The exact GELU, `f(z) = z·Φ(z) = z/2·(1 + erf(z/√2))`, as Burn's `gelu` and PyTorch's
    /// default `approximate='none'`.
    Gelu,
}

/// `activation` applied to `value` on the device.
// `f32::erf` is CubeCL's (`Erf`); the standard library's is unstable and not this one.
#[allow(unstable_name_collisions)]
#[cube]
pub fn activate(value: f32, #[comptime] activation: Activation) -> f32 {
    match activation {
        Activation::Identity => value,
        Activation::Relu => f32::max(value, 0.0),
        Activation::Gelu => {
            // 1/√2
            0.5 * value * (1.0 + f32::erf(value * 0.70710677))
        }
    }
}

impl Activation {
    /// The reference of [`activate()`], in `f64` with `libm`'s error function: what the
    /// kernels are tested against (their `erf` is CubeCL's polynomial, within `1.5e-7`).
    pub fn reference(self, value: f64) -> f64 {
        match self {
            Activation::Identity => value,
            Activation::Relu => value.max(0.0),
            Activation::Gelu => {
                0.5 * value * (1.0 + libm::erf(value * core::f64::consts::FRAC_1_SQRT_2))
            }
        }
    }
}
