//! `exp`, `erf`, `tanh` and the exact GELU over `f32` slices, in loops the compiler
//! vectorises.
//!
//! `libm`'s `expf`/`erff` (what burn-flex calls per value) are scalar calls with branches on
//! the input's range: a loop of them runs one value at a time. Here each function is a
//! branch-free polynomial (ranges handled by clamps and selects), written once as plain
//! arithmetic and compiled twice: for the portable target (SSE2 on `x86_64`, separate
//! multiplies and adds) and inside an `avx512f,fma` wrapper chosen at run time (sixteen
//! lanes, fused multiply-adds). Long slices are cut into chunks that rayon's threads share.
//!
//! Accuracy, measured against `f64` `libm` over a dense sweep (2048 values a binade, both
//! signs, from `1e-40` to `1e4`) and the special values: the worst error over normal results
//! (the tests assert 1 ulp, 1.25 for `tanh`):
//!
//! | function | portable path | AVX-512 path |
//! |---|---|---|
//! | [`exp`] | 0.92 ulp (relative `7.6e-8`) | 0.96 ulp (relative `7.8e-8`) |
//! | [`erf`] | 0.95 ulp (relative `8.8e-8`) | 0.91 ulp (relative `8.4e-8`) |
//! | [`tanh`] | 1.10 ulp (relative `1.2e-7`) | 1.10 ulp (relative `1.2e-7`) |
//!
//! Special values: `exp(−∞) = 0`, `exp(+∞) = +∞`, `exp(x) = +∞` above `88.73`, results
//! below `2⁻¹²⁶` are denormals (within one denormal step) and `0` below `−103.98`;
//! `erf(±∞) = ±1`, `tanh(±∞) = ±1`, signed zeros kept; `NaN` gives `NaN` everywhere.

use crate::Isa;

/// Below this many elements a call runs on the calling thread: rayon's hand-off (a few
/// microseconds) would cost more than the work.
pub(crate) const PARALLEL_MIN: usize = 1 << 15;

/// Elements per rayon task for the element-wise maps: 64 KiB of `f32`, in L2.
const CHUNK: usize = 1 << 14;

/// `a·b + c`, fused when `FMA` (only inside the `fma` wrappers, where it is one
/// instruction; elsewhere `mul_add` would be a `libm` call).
#[inline(always)]
pub(crate) fn mul_add<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `x` clamped into `[low, high]` with `NaN` kept (comparisons with `NaN` are false, so
/// it passes both selects; `f32::clamp`/`max` would replace it).
#[inline(always)]
fn clamp_keep_nan(x: f32, low: f32, high: f32) -> f32 {
    let x = if x < low { low } else { x };
    if x > high { high } else { x }
}

/// `eˣ`'s reduction and polynomial, shared by [`exp_f`], [`exp_non_positive_f`] and
/// [`tanh_f`]: `(k, eʳ)` with `eˣ = 2ᵏ·eʳ`, for `x` within `[−110, 89]` (a `NaN` gives a
/// `NaN` `eʳ`); the callers build `2ᵏ` as suits their range. `k` is the nearest integer to
/// `x·log₂e` (found by adding `1.5·2²³`, which leaves `k` in the low mantissa bits: no
/// float-to-integer conversion, which would saturate lane by lane), `r = x − k·ln2` in two
/// parts (Cody–Waite, exact products), and `eʳ = 1 + r + r²·P(r)` with Cephes' degree-5 `P`.
#[inline(always)]
fn exp_parts<const FMA: bool>(x: f32) -> (i32, f32) {
    /// `1.5·2²³`: adding it rounds to an integer held in the low mantissa bits.
    const SHIFTER: f32 = 12_582_912.0;
    /// `ln2`'s first 9 bits (`k·LN2_HI` is exact for `|k| < 2¹⁵`) and the rest.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let shifted = mul_add::<FMA>(x, core::f32::consts::LOG2_E, SHIFTER);
    let k = shifted - SHIFTER;
    let r = mul_add::<FMA>(k, -LN2_HI, x);
    let r = mul_add::<FMA>(k, -LN2_LO, r);
    let mut p = 1.987_569_1e-4;
    p = mul_add::<FMA>(p, r, 1.398_199_9e-3);
    p = mul_add::<FMA>(p, r, 8.333_452e-3);
    p = mul_add::<FMA>(p, r, 4.166_579_6e-2);
    p = mul_add::<FMA>(p, r, 1.666_666_5e-1);
    p = mul_add::<FMA>(p, r, 0.5);
    let k = (shifted.to_bits() as i32).wrapping_sub(SHIFTER.to_bits() as i32);
    (k, mul_add::<FMA>(p, r * r, r) + 1.0)
}

/// `2ᵏ` for `−126 ≤ k ≤ 127`, built in the exponent bits.
#[inline(always)]
fn pow2(k: i32) -> f32 {
    f32::from_bits((k.wrapping_add(127) as u32) << 23)
}

/// `eˣ` ([module docs](self) for accuracy): `2ᵏ·eʳ` from [`exp_parts`], with `2ᵏ` as two
/// powers of two, so that overflow to `+∞` and denormal results come out of the final
/// multiplies without a branch.
#[inline(always)]
pub(crate) fn exp_f<const FMA: bool>(x: f32) -> f32 {
    // Below −110 every result is 0 and above 89 every result is +∞; the clamp keeps `k`
    // within the two powers of two.
    let x = clamp_keep_nan(x, -110.0, 89.0);
    let (k, e) = exp_parts::<FMA>(x);
    // k ∈ [−159, 129], split in halves each in [−80, 65]: normal powers of two.
    let k_low = k >> 1;
    let k_high = k.wrapping_sub(k_low);
    e * pow2(k_low) * pow2(k_high)
}

/// Below this, `eˣ` is not a normal `f32` (`ln` of [`f32::MIN_POSITIVE`] is `−87.3365`).
const EXP_NORMAL_MIN: f32 = -87.33;

/// `eˣ` for `x ≤ 0` (or `NaN`, kept), for softmax weights: [`exp_f`]'s value, bit for bit,
/// where that is a normal `f32` (`x ≥ −87.33`), and `0` below (`−∞` included) rather than a
/// denormal: producing or multiplying denormals costs microcode assists (a row of scores
/// reaching them took 3× as long). One power of two suffices there (`k ≥ −126`), and one
/// clamp: a few instructions fewer than [`exp_f`].
#[inline(always)]
pub(crate) fn exp_non_positive_f<const FMA: bool>(x: f32) -> f32 {
    // Not `max`: a NaN stays NaN.
    let clamped = if x < EXP_NORMAL_MIN {
        EXP_NORMAL_MIN
    } else {
        x
    };
    let (k, e) = exp_parts::<FMA>(clamped);
    // An exact product: 2ᵏ·eʳ is normal for x ≥ −87.33.
    let e = e * pow2(k);
    if x < EXP_NORMAL_MIN { 0.0 } else { e }
}

/// `erf(x)` ([module docs](self) for accuracy), after N. Juffa's vectorisable `erff`: for
/// `|x| ≤ 0.9277`, `x + x·P(x²)`; above, `1 − e^(Q(|x|))` with `Q ≈ ln erfc`, both computed
/// and one selected (no branch). Relative accuracy holds near zero too, unlike
/// Abramowitz–Stegun 7.1.26's `1 − poly·e^(−x²)` (absolute `1.5e-7`), which cancels there.
#[inline(always)]
pub(crate) fn erf_f<const FMA: bool>(x: f32) -> f32 {
    let a = x.abs();
    // Near zero: x + x·P(x²).
    let s = x * x;
    let mut small = -5.967_617e-4;
    small = mul_add::<FMA>(small, s, 4.991_194_2e-3);
    small = mul_add::<FMA>(small, s, -2.676_813_5e-2);
    small = mul_add::<FMA>(small, s, 1.128_199_3e-1);
    small = mul_add::<FMA>(small, s, -3.761_253_4e-1);
    small = mul_add::<FMA>(small, s, 1.283_791_7e-1);
    let small = mul_add::<FMA>(small, x, x);
    // Away from zero: 1 − e^Q(t); erf rounds to 1 from 3.92 on, so t stops at 4.
    let t = if a > 4.0 { 4.0 } else { a };
    let t2 = t * t;
    let r = mul_add::<FMA>(-1.728_534_7e-5, t, 3.831_971_3e-4);
    let u = mul_add::<FMA>(-3.883_964_4e-3, t, 2.425_462_2e-2);
    let mut q = mul_add::<FMA>(r, t2, u);
    q = mul_add::<FMA>(q, t, -1.067_778_8e-1);
    q = mul_add::<FMA>(q, t, -6.348_467e-1);
    q = mul_add::<FMA>(q, t, -1.287_175_1e-1);
    q = mul_add::<FMA>(q, t, -t);
    let large = (1.0 - exp_f::<FMA>(q)).copysign(x);
    if a > 0.927_734_4 { large } else { small }
}

/// `tanh(x)` ([module docs](self) for accuracy): for `|x| < 0.625` the odd polynomial
/// `x + x³·P(x²)` (relative accuracy near zero); above, `1 − 2/(e^(2|x|) + 1)`, which has
/// no cancellation there (`tanh ≥ 0.55`) and reaches `±1` by itself.
#[inline(always)]
pub(crate) fn tanh_f<const FMA: bool>(x: f32) -> f32 {
    let a = x.abs();
    let s = x * x;
    // A least-squares fit of (tanh(x)/x − 1)/x² on [0, 0.625] (weighted to relative
    // error): within 1.1e-9 relative in exact arithmetic.
    let mut p = 2.153_617_6e-3;
    for c in [
        -8.189_974e-3,
        2.170_626_3e-2,
        -5.394_789_2e-2,
        1.333_321_6e-1,
        -3.333_333e-1,
    ] {
        p = mul_add::<FMA>(p, s, c);
    }
    // Both branches on |x|, one sign at the end (rounding is symmetric).
    let small = mul_add::<FMA>(p * s, a, a);
    // e^(2t) with t ≤ 10: 2ᵏ·eʳ with k ≤ 29, one power of two and no clamp (the value of
    // `exp_f(2t)`, whose two powers multiply exactly too).
    let t = if a > 10.0 { 10.0 } else { a };
    let (k, e) = exp_parts::<FMA>(2.0 * t);
    let e2t = e * pow2(k);
    let large = 1.0 - 2.0 / (e2t + 1.0);
    (if a < 0.625 { small } else { large }).copysign(x)
}

/// The exact GELU `x·Φ(x) = x·(1 + erf(x/√2))/2` with [`erf_f`].
#[inline(always)]
pub(crate) fn gelu_f<const FMA: bool>(x: f32) -> f32 {
    0.5 * x * (1.0 + erf_f::<FMA>(x * core::f32::consts::FRAC_1_SQRT_2))
}

/// `eˣ` of one value, on the portable path ([module docs](self) for accuracy).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_f::<false>(x)
}

/// `erf(x)` of one value, on the portable path ([module docs](self) for accuracy).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    erf_f::<false>(x)
}

/// `tanh(x)` of one value, on the portable path ([module docs](self) for accuracy).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    tanh_f::<false>(x)
}

/// An element-wise function of this module, for [`map_to_on`] and [`map_in_place_on`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Func {
    /// [`exp`].
    Exp,
    /// [`erf`].
    Erf,
    /// [`tanh`].
    Tanh,
    /// The exact GELU, `x·(1 + erf(x/√2))/2`, with [`erf`].
    Gelu,
}

/// `dst[i] = exp(src[i])`, vectorised, in parallel when long.
///
/// # Panics
/// If the slices differ in length.
pub fn exp_to(src: &[f32], dst: &mut [f32]) {
    map_to_on(Func::Exp, Isa::detected(), src, dst);
}

/// `values[i] = exp(values[i])`, vectorised, in parallel when long.
pub fn exp_in_place(values: &mut [f32]) {
    map_in_place_on(Func::Exp, Isa::detected(), values);
}

/// `dst[i] = erf(src[i])`, vectorised, in parallel when long.
///
/// # Panics
/// If the slices differ in length.
pub fn erf_to(src: &[f32], dst: &mut [f32]) {
    map_to_on(Func::Erf, Isa::detected(), src, dst);
}

/// `values[i] = erf(values[i])`, vectorised, in parallel when long.
pub fn erf_in_place(values: &mut [f32]) {
    map_in_place_on(Func::Erf, Isa::detected(), values);
}

/// `dst[i] = tanh(src[i])`, vectorised, in parallel when long.
///
/// # Panics
/// If the slices differ in length.
pub fn tanh_to(src: &[f32], dst: &mut [f32]) {
    map_to_on(Func::Tanh, Isa::detected(), src, dst);
}

/// `values[i] = tanh(values[i])`, vectorised, in parallel when long.
pub fn tanh_in_place(values: &mut [f32]) {
    map_in_place_on(Func::Tanh, Isa::detected(), values);
}

/// `dst[i] = gelu(src[i])` (the exact GELU), vectorised, in parallel when long: what
/// [`Activation::apply_to`](crate::Activation::apply_to) computes, on all threads.
///
/// # Panics
/// If the slices differ in length.
pub fn gelu_to(src: &[f32], dst: &mut [f32]) {
    map_to_on(Func::Gelu, Isa::detected(), src, dst);
}

/// `values[i] = gelu(values[i])`, vectorised, in parallel when long.
pub fn gelu_in_place(values: &mut [f32]) {
    map_in_place_on(Func::Gelu, Isa::detected(), values);
}

/// `dst[i] = func(src[i])` on the path `isa` picks: what the named functions ([`exp_to`],
/// …) call, and what tests and benchmarks call to compare the paths.
///
/// # Panics
/// If the slices differ in length.
pub fn map_to_on(func: Func, isa: Isa, src: &[f32], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "one output per input");
    let avx512 = isa.avx512();
    if src.len() < PARALLEL_MIN {
        map_chunk(func, avx512, Some(src), dst);
    } else {
        use rayon::prelude::*;
        src.par_chunks(CHUNK)
            .zip(dst.par_chunks_mut(CHUNK))
            .for_each(|(src, dst)| map_chunk(func, avx512, Some(src), dst));
    }
}

/// `values[i] = func(values[i])` on the path `isa` picks.
pub fn map_in_place_on(func: Func, isa: Isa, values: &mut [f32]) {
    let avx512 = isa.avx512();
    if values.len() < PARALLEL_MIN {
        map_chunk(func, avx512, None, values);
    } else {
        use rayon::prelude::*;
        values
            .par_chunks_mut(CHUNK)
            .for_each(|values| map_chunk(func, avx512, None, values));
    }
}

/// One chunk, on one thread: `dst = func(src)`, or `dst = func(dst)` without `src`.
fn map_chunk(func: Func, avx512: bool, src: Option<&[f32]>, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        // SAFETY: `avx512` is true only where AVX-512F and FMA were detected.
        unsafe { map_avx512(func, src, dst) };
        return;
    }
    let _ = avx512;
    map_each::<false>(func, src, dst);
}

/// [`map_each`] compiled for AVX-512 with fused multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
fn map_avx512(func: Func, src: Option<&[f32]>, dst: &mut [f32]) {
    map_each::<true>(func, src, dst);
}

/// One loop per function and form, chosen before it: a `match` inside would keep the
/// loop from being vectorised.
#[inline(always)]
fn map_each<const FMA: bool>(func: Func, src: Option<&[f32]>, dst: &mut [f32]) {
    #[inline(always)]
    fn each(src: Option<&[f32]>, dst: &mut [f32], f: impl Fn(f32) -> f32) {
        match src {
            Some(src) => dst.iter_mut().zip(src).for_each(|(d, &s)| *d = f(s)),
            None => dst.iter_mut().for_each(|d| *d = f(*d)),
        }
    }
    match func {
        Func::Exp => each(src, dst, exp_f::<FMA>),
        Func::Erf => each(src, dst, erf_f::<FMA>),
        Func::Tanh => each(src, dst, tanh_f::<FMA>),
        Func::Gelu => each(src, dst, gelu_f::<FMA>),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every binade from `1e-40` (denormals) to `1e4`, 2048 values each, both signs, with
    /// zeros, infinities, `NaN` and the edges of `exp`'s range.
    fn sweep() -> Vec<f32> {
        let mut xs = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
        ];
        xs.extend([
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45,
            88.72,
            88.73,
            -87.33,
            -103.9,
            -104.0,
        ]);
        let mut x = 1e-40f32;
        while x < 1e4 {
            xs.push(x);
            xs.push(-x);
            x = x * (1.0 + 1.0 / 2048.0) + 1e-45;
        }
        xs
    }

    /// `(worst relative error, worst error in ulps)` of `f` against `exact` on `xs`, over
    /// the results that are normal `f32`s, with special values required to match exactly.
    fn worst(xs: &[f32], got: &[f32], exact: impl Fn(f64) -> f64, name: &str) -> (f64, f64) {
        let (mut rel, mut ulps) = (0.0f64, 0.0f64);
        for (&x, &y) in xs.iter().zip(got) {
            let want = exact(x as f64);
            let want32 = want as f32;
            if want.is_nan() {
                assert!(y.is_nan(), "{name}({x}) = {y}, want NaN");
                continue;
            }
            if !want32.is_normal() {
                // Infinite, zero or denormal: exact or within one denormal step.
                let ok = y == want32 || (y as f64 - want).abs() <= f32::from_bits(1) as f64;
                assert!(ok, "{name}({x}) = {y}, want {want}");
                assert_eq!(
                    y.is_sign_negative(),
                    want32.is_sign_negative(),
                    "{name}({x})"
                );
                continue;
            }
            let err = (y as f64 - want).abs();
            let ulp = (want32.abs().to_bits() + 1) as f64;
            let ulp = f32::from_bits(ulp as u32) as f64 - want32.abs() as f64;
            rel = rel.max(err / want.abs());
            ulps = ulps.max(err / ulp);
        }
        (rel, ulps)
    }

    fn check(func: Func, exact: impl Fn(f64) -> f64 + Copy, bounds: [(f64, f64); 2]) {
        let xs = sweep();
        for (isa, (max_rel, max_ulps)) in [Isa::PORTABLE, Isa::detected()].into_iter().zip(bounds) {
            let mut got = vec![0.0; xs.len()];
            map_to_on(func, isa, &xs, &mut got);
            let mut again = xs.clone();
            map_in_place_on(func, isa, &mut again);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                again.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{func:?}: in place and out of place agree"
            );
            let (rel, ulps) = worst(&xs, &got, exact, &format!("{func:?} {isa:?}"));
            eprintln!("{func:?} {isa:?}: relative {rel:.3e}, {ulps:.2} ulp");
            assert!(
                rel <= max_rel && ulps <= max_ulps,
                "{func:?} {isa:?}: {rel:e}, {ulps} ulp"
            );
        }
    }

    #[test]
    fn exp_follows_libm() {
        check(Func::Exp, libm::exp, [(1e-7, 1.0), (1e-7, 1.0)]);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(0.0), 1.0);
    }

    /// Softmax weights: [`exp_f`] bit for bit where it is normal, `0` below, for both
    /// choices of `FMA` (a call to `fmaf` here, with the same results as the instruction).
    #[test]
    fn exp_non_positive_is_exp_without_denormals() {
        for i in 0..=200_000 {
            let x = -(i as f32) / 2_000.0; // [−100, 0]
            let pairs = [
                (exp_non_positive_f::<false>(x), exp_f::<false>(x)),
                (exp_non_positive_f::<true>(x), exp_f::<true>(x)),
            ];
            for (got, exp) in pairs {
                if x >= EXP_NORMAL_MIN {
                    assert!(exp.is_normal(), "{x}");
                    assert_eq!(got.to_bits(), exp.to_bits(), "{x}");
                } else {
                    assert_eq!(got.to_bits(), 0, "{x}");
                }
            }
        }
        for exp in [exp_non_positive_f::<false>, exp_non_positive_f::<true>] {
            assert_eq!(exp(0.0), 1.0);
            assert_eq!(exp(-0.0), 1.0);
            assert_eq!(exp(f32::NEG_INFINITY), 0.0);
            assert_eq!(exp(f32::MIN), 0.0);
            assert!(exp(f32::NAN).is_nan());
        }
    }

    #[test]
    fn erf_follows_libm() {
        check(Func::Erf, libm::erf, [(1e-7, 1.0), (1e-7, 1.0)]);
        assert_eq!(erf(f32::INFINITY), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
        assert!(erf(-0.0).is_sign_negative());
    }

    #[test]
    fn tanh_follows_libm() {
        check(Func::Tanh, libm::tanh, [(1.3e-7, 1.25), (1.3e-7, 1.25)]);
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
    }

    #[test]
    fn gelu_follows_the_exact_gelu() {
        let xs: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 / 4_000.0).collect();
        for isa in [Isa::PORTABLE, Isa::detected()] {
            let mut got = vec![0.0; xs.len()];
            map_to_on(Func::Gelu, isa, &xs, &mut got);
            for (&x, &y) in xs.iter().zip(&got) {
                let x = x as f64;
                let want = 0.5 * x * (1.0 + libm::erf(x * core::f64::consts::FRAC_1_SQRT_2));
                // Relative, plus where x ≪ 0 the rounding of 1 + erf (an ulp of 1, halved),
                // as in any f32 GELU of this formula.
                let bound = 3e-7 * want.abs() + 3e-8 * x.abs();
                assert!(
                    (y as f64 - want).abs() <= bound,
                    "{isa:?} {x}: {y}, want {want}"
                );
            }
        }
    }

    /// Long slices are cut into chunks for rayon: the same results as one pass.
    #[test]
    fn parallel_maps_agree_with_serial_ones() {
        let xs: Vec<f32> = (0..PARALLEL_MIN * 3 + 17)
            .map(|i| (i as f32).sin() * 6.0)
            .collect();
        for func in [Func::Exp, Func::Erf, Func::Tanh, Func::Gelu] {
            let mut long = vec![0.0; xs.len()];
            map_to_on(func, Isa::detected(), &xs, &mut long);
            for (chunk, want) in xs.chunks(1000).zip(long.chunks(1000)) {
                let mut short = vec![0.0; chunk.len()];
                map_to_on(func, Isa::detected(), chunk, &mut short);
                assert_eq!(short, want, "{func:?}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "one output per input")]
    fn mismatched_lengths_are_refused() {
        exp_to(&[1.0, 2.0], &mut [0.0]);
    }
}
