//! `exp`, `erf`, `tanh` and the exact GELU over `f32` slices, in loops the compiler
//! vectorises.
//!
//! `libm`'s `expf`/`erff` (what burn-flex calls per value) are scalar calls with branches on
//! the input's range: a loop of them runs one value at a time. Here each function is a
//! branch-free polynomial (ranges handled by clamps and selects), written once as plain
//! arithmetic and compiled twice: for the portable target (SSE2 on `x86_64`, separate
//! multiplies and adds) and inside an AVX-512 wrapper (`x86_64/math.rs`, sixteen lanes,
//! fused multiply-adds) taken where [`Isa::avx512`] holds. Long slices are cut into chunks
//! that rayon's threads share.
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

/// Below this many elements a call runs on the calling thread: rayon's hand-off would cost
/// more than the work.
pub(crate) const PARALLEL_MIN: usize = 1 << 15;

/// Lanes of the row kernels' partial sums: one `zmm` register of `f32`, so that the loops
/// below vectorise into one accumulator on AVX-512 (and split evenly on narrower vectors).
pub(crate) const LANES: usize = 16;

/// The lanes' sum, pairwise (the same order on every path).
#[inline(always)]
pub(crate) fn lane_sum(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

/// `Σ x`, by [`LANES`] partial sums, then the tail.
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    let body = x.len() / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    for c in x[..body].chunks_exact(LANES) {
        acc.iter_mut().zip(c).for_each(|(s, &x)| *s += x);
    }
    x[body..].iter().fold(lane_sum(acc), |s, &x| s + x)
}

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
/// denormal: producing or multiplying denormals takes microcode assists (a slow path of the
/// CPU), and a softmax weight that small changes nothing. One power of two suffices there
/// (`k ≥ −126`), and one clamp: a few instructions fewer than [`exp_f`].
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
    map_to_on(Isa::detected(), Func::Exp, src, dst);
}

/// `values[i] = exp(values[i])`, vectorised, in parallel when long.
pub fn exp_in_place(values: &mut [f32]) {
    map_in_place_on(Isa::detected(), Func::Exp, values);
}

/// `dst[i] = erf(src[i])`, vectorised, in parallel when long.
///
/// # Panics
/// If the slices differ in length.
pub fn erf_to(src: &[f32], dst: &mut [f32]) {
    map_to_on(Isa::detected(), Func::Erf, src, dst);
}

/// `values[i] = erf(values[i])`, vectorised, in parallel when long.
pub fn erf_in_place(values: &mut [f32]) {
    map_in_place_on(Isa::detected(), Func::Erf, values);
}

/// `dst[i] = tanh(src[i])`, vectorised, in parallel when long.
///
/// # Panics
/// If the slices differ in length.
pub fn tanh_to(src: &[f32], dst: &mut [f32]) {
    map_to_on(Isa::detected(), Func::Tanh, src, dst);
}

/// `values[i] = tanh(values[i])`, vectorised, in parallel when long.
pub fn tanh_in_place(values: &mut [f32]) {
    map_in_place_on(Isa::detected(), Func::Tanh, values);
}

/// `dst[i] = gelu(src[i])` (the exact GELU), vectorised, in parallel when long: what
/// [`Activation::apply_to`](crate::Activation::apply_to) computes, on all threads.
///
/// # Panics
/// If the slices differ in length.
pub fn gelu_to(src: &[f32], dst: &mut [f32]) {
    map_to_on(Isa::detected(), Func::Gelu, src, dst);
}

/// `values[i] = gelu(values[i])`, vectorised, in parallel when long.
pub fn gelu_in_place(values: &mut [f32]) {
    map_in_place_on(Isa::detected(), Func::Gelu, values);
}

/// `dst[i] = func(src[i])` on the path `isa` picks (the AVX-512 one where [`Isa::avx512`]
/// holds): what the named functions ([`exp_to`], …) call with [`Isa::detected`], and what
/// tests and benchmarks call to compare the paths.
///
/// # Panics
/// If the slices differ in length.
pub fn map_to_on(isa: Isa, func: Func, src: &[f32], dst: &mut [f32]) {
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

/// `values[i] = func(values[i])` on the path `isa` picks: what the named `_in_place`
/// functions call with [`Isa::detected`].
pub fn map_in_place_on(isa: Isa, func: Func, values: &mut [f32]) {
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
        // SAFETY: `avx512` is `isa.avx512()`, true only where AVX-512 and FMA were detected.
        unsafe { crate::x86_64::math::map_avx512(func, src, dst) };
        return;
    }
    let _ = avx512;
    map_each::<false>(func, src, dst);
}

/// One loop per function and form, chosen before it: a `match` inside would keep the
/// loop from being vectorised. Compiled twice: here with `FMA = false`, and with
/// `FMA = true` in the AVX-512 wrapper of `x86_64/math.rs`.
#[inline(always)]
pub(crate) fn map_each<const FMA: bool>(func: Func, src: Option<&[f32]>, dst: &mut [f32]) {
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
mod tests;
