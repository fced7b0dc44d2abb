//! The activation a product applies as it stores its output.

// Branch-free polynomials (within an ulp) that the loops here vectorise.
use crate::Isa;
use crate::math::{erf_f, exp_f, gelu_f};

/// The element-wise function a product applies to its output, `y = f(x·W + bias)`, as it
/// stores each value: an activation after a layer is one more pass over its largest tensor,
/// which costs no memory traffic inside the store. The CPU kernels here, the CubeCL kernels of
/// burn-sketch-kernels and the layers of burn-sketch and burn-compress share this one type.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Activation {
    /// `f(z) = z`: the plain layer.
    #[default]
    Identity,
    /// `f(z) = max(z, 0)`.
    Relu,
    /// The exact GELU, `f(z) = z·Φ(z)`, as Burn's `gelu` and PyTorch's default
    /// (`approximate='none'`), with `erf` within an ulp (see
    /// [`apply_f32`](Activation::apply_f32)).
    Gelu,
}

impl Activation {
    /// `f` of one `f32` value. GELU's `erf` is [`crate::math::erf`] (within an ulp; CubeCL's
    /// kernels use Abramowitz and Stegun's 7.1.26, within `1.5e-7`), plain arithmetic, so
    /// that a loop of it vectorises: [`apply_to`](Self::apply_to).
    #[inline(always)]
    pub fn apply_f32(self, value: f32) -> f32 {
        match self {
            Activation::Identity => value,
            Activation::Relu => value.max(0.0),
            Activation::Gelu => gelu(value),
        }
    }

    /// [`apply_f32`](Self::apply_f32) on every value, in place, on this CPU's path:
    /// [`apply_to_on`](Self::apply_to_on) with [`Isa::detected`].
    pub fn apply_to(self, values: &mut [f32]) {
        self.apply_to_on(Isa::detected(), values);
    }

    /// [`apply_to`](Self::apply_to) on the path `isa` picks: one loop the compiler vectorises,
    /// since nothing in it is a call, bit for bit [`math::gelu_to`](crate::math::gelu_to)'s
    /// GELU on the same `isa` (both fuse their multiply-adds where [`Isa::avx512`] holds).
    ///
    /// Why not `libm`'s `erff` (burn-flex's own `gelu`): it is a scalar call per value, with
    /// branches on the input's range, so a loop of it runs one value at a time over the
    /// largest tensor of the layer.
    pub fn apply_to_on(self, isa: Isa, values: &mut [f32]) {
        if self == Activation::Identity {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if isa.avx512() {
            // SAFETY: `isa.avx512()` holds only where AVX-512 and FMA were detected.
            unsafe { crate::x86_64::math::apply_to_avx512(self, values) };
            return;
        }
        let _ = isa;
        apply_each::<false>(self, values);
    }

    /// The backward of [`apply_to`](Self::apply_to), in place: `grad ← f'(z)·grad`, from
    /// what a tracked forward keeps (`kept`): the output for ReLU, the pre-activation `z` for
    /// GELU (`f'(z) = Φ(z) + z·φ(z)`). The identity leaves `grad` as it is.
    ///
    /// # Panics
    /// If the two slices differ in length.
    pub fn backward_to(self, kept: &[f32], grad: &mut [f32]) {
        self.backward_to_on(Isa::detected(), kept, grad);
    }

    /// [`backward_to`](Self::backward_to) on the path `isa` picks.
    ///
    /// # Panics
    /// If the two slices differ in length.
    pub fn backward_to_on(self, isa: Isa, kept: &[f32], grad: &mut [f32]) {
        assert_eq!(kept.len(), grad.len(), "one kept value per gradient");
        if self == Activation::Identity {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if isa.avx512() {
            // SAFETY: `isa.avx512()` holds only where AVX-512 and FMA were detected.
            unsafe { crate::x86_64::math::backward_avx512(self, kept, grad) };
            return;
        }
        let _ = isa;
        backward_each::<false>(self, kept, grad);
    }

    /// [`apply_f32`](Self::apply_f32) in `f64`.
    pub fn apply_f64(self, value: f64) -> f64 {
        match self {
            Activation::Identity => value,
            Activation::Relu => value.max(0.0),
            Activation::Gelu => {
                0.5 * value * (1.0 + libm::erf(value * core::f64::consts::FRAC_1_SQRT_2))
            }
        }
    }
}

/// One loop per activation, chosen before it: a `match` inside the loop would keep it
/// from being vectorised. Compiled twice: here with `FMA = false`, and with `FMA = true` in
/// the AVX-512 wrapper of `x86_64/math.rs`.
#[inline(always)]
pub(crate) fn apply_each<const FMA: bool>(activation: Activation, values: &mut [f32]) {
    match activation {
        Activation::Identity => {}
        Activation::Relu => values.iter_mut().for_each(|v| *v = v.max(0.0)),
        // A `for` loop, not `for_each`: the adapter's `fold` is a separate function that
        // the compiler may leave out of line, compiled without AVX-512.
        Activation::Gelu => {
            for v in values.iter_mut() {
                *v = gelu_f::<FMA>(*v);
            }
        }
    }
}

/// One loop per activation, as [`apply_each`] (and compiled twice as it is).
#[inline(always)]
pub(crate) fn backward_each<const FMA: bool>(
    activation: Activation,
    kept: &[f32],
    grad: &mut [f32],
) {
    let pairs = grad.iter_mut().zip(kept);
    match activation {
        Activation::Identity => {}
        Activation::Relu => pairs.for_each(|(g, &y)| *g = if y > 0.0 { *g } else { 0.0 }),
        // A `for` loop, as in `apply_each`.
        Activation::Gelu => {
            for (g, &z) in pairs {
                *g *= gelu_derivative::<FMA>(z);
            }
        }
    }
}

/// `Φ(z) + z·φ(z)`: GELU's derivative, with `math`'s `erf` and `exp`.
#[inline(always)]
fn gelu_derivative<const FMA: bool>(z: f32) -> f32 {
    /// `1/√(2π)`.
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    let cdf = 0.5 * (1.0 + erf_f::<FMA>(z * core::f32::consts::FRAC_1_SQRT_2));
    cdf + z * INV_SQRT_2PI * exp_f::<FMA>(-0.5 * z * z)
}

/// The exact GELU of one value, [`math`](crate::math)'s portable (no-FMA) form.
#[inline(always)]
fn gelu(value: f32) -> f32 {
    gelu_f::<false>(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_gelu_follows_libm_s() {
        let mut worst = 0.0f64;
        for i in -20_000..=20_000 {
            let x = i as f32 / 2_000.0; // [−10, 10]
            let exact = Activation::Gelu.apply_f64(x as f64);
            let fast = Activation::Gelu.apply_f32(x) as f64;
            worst = worst.max((fast - exact).abs() / exact.abs().max(1.0));
        }
        assert!(worst < 3e-7, "{worst}");
        for x in [-100.0f32, -87.5, 0.0, 1e-30] {
            assert!(Activation::Gelu.apply_f32(x).abs() < 1e-6, "{x}");
        }
        assert_eq!(Activation::Gelu.apply_f32(100.0), 100.0);
        let mut values = [-1.0f32, 0.5, 3.0];
        Activation::Relu.apply_to(&mut values);
        assert_eq!(values, [0.0, 0.5, 3.0]);
    }

    /// `apply_to_on` and `math::map_to_on`'s GELU: the same bits on each path.
    #[test]
    fn the_activation_is_math_s_gelu_bit_for_bit() {
        let x = crate::testing::uniform(40_000, 3, [-12.0, 12.0]);
        for isa in [Isa::PORTABLE, Isa::detected()] {
            let mut activated = x.clone();
            Activation::Gelu.apply_to_on(isa, &mut activated);
            let mut mapped = vec![0.0; x.len()];
            crate::math::map_to_on(isa, crate::math::Func::Gelu, &x, &mut mapped);
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&activated), bits(&mapped), "{isa:?}");
        }
    }

    /// The derivatives against central differences of the `f64` functions.
    #[test]
    fn the_backward_is_the_derivative() {
        let z: Vec<f32> = (-400..=400).map(|i| i as f32 / 50.0).collect();
        for activation in [Activation::Relu, Activation::Gelu] {
            let kept: Vec<f32> = match activation {
                Activation::Relu => z.iter().map(|&v| activation.apply_f32(v)).collect(),
                _ => z.clone(),
            };
            for isa in [Isa::PORTABLE, Isa::detected()] {
                let mut grad = vec![2.0f32; z.len()];
                activation.backward_to_on(isa, &kept, &mut grad);
                for (&v, &g) in z.iter().zip(&grad) {
                    if v == 0.0 {
                        continue; // ReLU's kink
                    }
                    let (v, h) = (v as f64, 1e-6);
                    let slope =
                        (activation.apply_f64(v + h) - activation.apply_f64(v - h)) / (2.0 * h);
                    assert!(
                        (g as f64 - 2.0 * slope).abs() < 1e-5,
                        "{activation:?} {isa:?} at {v}: {g}"
                    );
                }
            }
        }
    }
}
