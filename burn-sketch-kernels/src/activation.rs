//! The activation a forward kernel applies in its output pass, after the scale and bias.
//!
//! Why fuse it: an activation after a product is one more pass over the `n × d_out` output,
//! written by the product and read straight back; applied as each output element is written,
//! it costs no memory traffic at all.

use cubecl::prelude::*;

/// The element-wise function applied to each output element, `y = f(α·sum + bias)`: the
/// workspace's one `Activation` (burn-cpu-kernels), a compile-time argument of the forward
/// kernels. Its [`apply_f64`](Activation::apply_f64) is the reference they are tested against
/// (their `erf` is CubeCL's polynomial, within `1.5e-7`).
pub use burn_cpu_kernels::Activation;

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
