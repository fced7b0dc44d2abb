//! Conversions between `f32` and the types kernels store:
//! - [`StoredFloat`], the element of the kernels that compute in `f32` and store in `f32` or
//!   `bf16`;
//! - [`bf16_to_f32`] and [`f32_to_bf16`] over slices: widening is a shift (exact, a
//!   signalling NaN kept as it is, where `half` quiets it), narrowing rounds
//!   to nearest with ties to even and keeps NaN a NaN, bit for bit `half::bf16::from_f32`,
//!   written without branches so that the AVX-512 path compiles to selects sixteen lanes wide;
//! - [`HalfFloat`], `bf16` or `f16` converted a slice at a time. `f16`'s conversions are
//!   `half`'s own slice conversions (F16C's vector instructions where `half` detects them)
//!   on every [`Isa`]: its `_on` forms change only the `bf16` path;
//! - [`through_f32`] and [`through_f32_rows`]: half-precision values widened to `f32` a chunk
//!   at a time, computed on, and rounded back once, the chunk staying in L1.
//!
//! ```
//! use burn_cpu_kernels::{Isa, convert};
//! use half::bf16;
//!
//! let x = [1.0f32, 1.0 + 1.0 / 256.0, f32::INFINITY];
//! let mut h = [bf16::ZERO; 3];
//! convert::f32_to_bf16(&x, &mut h);
//! // 1 + 2⁻⁸ lies halfway between two bf16 values: it rounds to the even one, 1.
//! assert_eq!(h.map(bf16::to_f32), [1.0, 1.0, f32::INFINITY]);
//! let mut wide = [0.0f32; 3];
//! convert::bf16_to_f32_on(Isa::PORTABLE, &h, &mut wide);
//! assert_eq!(wide, [1.0, 1.0, f32::INFINITY]);
//! // Widen, compute, round back once.
//! convert::through_f32(&mut h, |values| values.iter_mut().for_each(|v| *v *= 3.0));
//! assert_eq!(h.map(bf16::to_f32), [3.0, 3.0, f32::INFINITY]);
//! ```

use ::half::slice::HalfFloatSliceExt;
use ::half::{bf16, f16};

use crate::isa::Isa;
use crate::view::MatRef;

/// A float type a kernel reads and stores while it computes in `f32`: `f32` itself, or `bf16`
/// (widened exactly as it is read, rounded once to nearest even as it is stored). The `bf16`
/// product's output and attention's every operand are of such a type.
pub trait StoredFloat: Copy + Send + Sync + 'static + sealed::Sealed {
    /// `bf16` outputs round to nearest even as they store; `f32` ones store as they are.
    const BF16: bool;
    /// The value as `f32` (exact).
    fn to_f32(self) -> f32;
    /// `value`, rounded to this type.
    fn from_f32(value: f32) -> Self;
    /// The view as `f32`: itself for `f32`, a row-major copy in `buffer` otherwise.
    fn widen<'a>(view: MatRef<'a, Self>, buffer: &'a mut Vec<f32>) -> MatRef<'a, f32>;
}

impl StoredFloat for f32 {
    const BF16: bool = false;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(value: f32) -> Self {
        value
    }
    fn widen<'a>(view: MatRef<'a, Self>, _: &'a mut Vec<f32>) -> MatRef<'a, f32> {
        view
    }
}

impl StoredFloat for bf16 {
    const BF16: bool = true;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(value: f32) -> Self {
        bf16::from_f32(value)
    }
    fn widen<'a>(view: MatRef<'a, Self>, buffer: &'a mut Vec<f32>) -> MatRef<'a, f32> {
        let [rows, cols] = view.shape();
        buffer.clear();
        buffer.extend((0..rows).flat_map(|i| (0..cols).map(move |j| view.at(i, j).to_f32())));
        MatRef::row_major(buffer, rows, cols)
    }
}

/// `dst[i] = src[i]` as `f32` (exact: the `bf16` bits are the `f32`'s top half, so a
/// signalling NaN stays signalling, where `half::bf16::to_f32` sets its quiet bit), on the
/// path [`Isa::detected`] picks.
///
/// # Panics
/// If the slices differ in length.
pub fn bf16_to_f32(src: &[bf16], dst: &mut [f32]) {
    bf16_to_f32_on(Isa::detected(), src, dst);
}

/// [`bf16_to_f32`] on the path `isa` picks: AVX-512 where [`Isa::avx512`] holds, else the
/// portable loop. Both give the same bits.
///
/// # Panics
/// If the slices differ in length.
pub fn bf16_to_f32_on(isa: Isa, src: &[bf16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "one f32 per bf16");
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        // SAFETY: `isa.avx512()` holds only where AVX-512 (F and BW among it) was detected.
        unsafe { crate::x86_64::convert::bf16_to_f32(src, dst) };
        return;
    }
    let _ = isa;
    widen_each(src, dst);
}

/// `dst[i] = src[i]` rounded to `bf16`: to nearest, ties to even, NaN kept a (quiet) NaN, bit
/// for bit `half::bf16::from_f32`; on the path [`Isa::detected`] picks.
///
/// # Panics
/// If the slices differ in length.
pub fn f32_to_bf16(src: &[f32], dst: &mut [bf16]) {
    f32_to_bf16_on(Isa::detected(), src, dst);
}

/// [`f32_to_bf16`] on the path `isa` picks: AVX-512 where [`Isa::avx512`] holds, else the
/// portable loop. Both give the same bits.
///
/// # Panics
/// If the slices differ in length.
pub fn f32_to_bf16_on(isa: Isa, src: &[f32], dst: &mut [bf16]) {
    assert_eq!(src.len(), dst.len(), "one bf16 per f32");
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        // SAFETY: `isa.avx512()` holds only where AVX-512 (F and BW among it) was detected.
        unsafe { crate::x86_64::convert::f32_to_bf16(src, dst) };
        return;
    }
    let _ = isa;
    narrow_each(src, dst);
}

/// The widening loop of both paths: a `bf16` is the top half of an `f32`.
#[inline(always)]
pub(crate) fn widen_each(src: &[bf16], dst: &mut [f32]) {
    for (out, value) in dst.iter_mut().zip(src) {
        *out = f32::from_bits(u32::from(value.to_bits()) << 16);
    }
}

/// The narrowing loop of both paths: round to nearest even by adding `0x7fff` plus the kept
/// part's lowest bit, a NaN's top half with its quiet bit set; a select, not a branch.
#[inline(always)]
pub(crate) fn narrow_each(src: &[f32], dst: &mut [bf16]) {
    for (out, value) in dst.iter_mut().zip(src) {
        let bits = value.to_bits();
        let nan = bits & 0x7fff_ffff > 0x7f80_0000;
        let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
        let quiet = (bits >> 16) | 0x0040;
        *out = bf16::from_bits(if nan { quiet } else { rounded } as u16);
    }
}

/// A 16-bit float converted to and from `f32` a slice at a time: `bf16` on
/// [`bf16_to_f32_on`] and [`f32_to_bf16_on`], `f16` on `half`'s slice conversions (F16C where
/// `half` detects it, whatever the [`Isa`]). Widening is exact; narrowing rounds to nearest
/// even, as `half` rounds.
pub trait HalfFloat: Copy + Send + Sync + 'static + sealed::Half {
    /// `dst[i] = src[i]` as `f32`, on the path [`Isa::detected`] picks.
    ///
    /// # Panics
    /// If the slices differ in length.
    fn widen(src: &[Self], dst: &mut [f32]) {
        Self::widen_on(Isa::detected(), src, dst);
    }
    /// [`widen`](Self::widen) on the path `isa` picks.
    ///
    /// # Panics
    /// If the slices differ in length.
    fn widen_on(isa: Isa, src: &[Self], dst: &mut [f32]);
    /// `dst[i] = src[i]` rounded to this type, on the path [`Isa::detected`] picks.
    ///
    /// # Panics
    /// If the slices differ in length.
    fn narrow(src: &[f32], dst: &mut [Self]) {
        Self::narrow_on(Isa::detected(), src, dst);
    }
    /// [`narrow`](Self::narrow) on the path `isa` picks.
    ///
    /// # Panics
    /// If the slices differ in length.
    fn narrow_on(isa: Isa, src: &[f32], dst: &mut [Self]);
}

impl HalfFloat for bf16 {
    fn widen_on(isa: Isa, src: &[Self], dst: &mut [f32]) {
        bf16_to_f32_on(isa, src, dst);
    }
    fn narrow_on(isa: Isa, src: &[f32], dst: &mut [Self]) {
        f32_to_bf16_on(isa, src, dst);
    }
}

impl HalfFloat for f16 {
    fn widen_on(_: Isa, src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn narrow_on(_: Isa, src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src);
    }
}

/// Values per chunk of [`through_f32`]: the chunk's `f32` scratch (8 KiB) and its half values
/// (4 KiB) stay in a 32 KiB L1 data cache between the widening, the computation and the
/// rounding, so the two conversions cost no memory traffic of their own.
const CHUNK: usize = 2048;

/// `f` on `values` as `f32`, each value rounded back once: the values are widened a chunk at a
/// time into a scratch that stays in L1, `f` computes on the chunk in place, and the chunk is
/// rounded back into `values`. For element-wise `f` (each output depends on its own input
/// only), the result does not depend on where the chunks fall; [`through_f32_rows`] keeps
/// rows whole.
pub fn through_f32<T: HalfFloat>(values: &mut [T], f: impl FnMut(&mut [f32])) {
    through_f32_on(Isa::detected(), values, f);
}

/// [`through_f32`] with the conversions on the path `isa` picks.
pub fn through_f32_on<T: HalfFloat>(isa: Isa, values: &mut [T], f: impl FnMut(&mut [f32])) {
    through_f32_rows_on(isa, values, 1, f);
}

/// [`through_f32`] over rows of `row_len` values, each chunk whole rows (as many as fit in
/// the L1-sized chunk, at least one): for `f` computing per row (a softmax, a norm).
///
/// # Panics
/// If `values` is not whole rows of `row_len` (`row_len` 0 with no values is fine).
pub fn through_f32_rows<T: HalfFloat>(values: &mut [T], row_len: usize, f: impl FnMut(&mut [f32])) {
    through_f32_rows_on(Isa::detected(), values, row_len, f);
}

/// [`through_f32_rows`] with the conversions on the path `isa` picks.
///
/// # Panics
/// As [`through_f32_rows`].
pub fn through_f32_rows_on<T: HalfFloat>(
    isa: Isa,
    values: &mut [T],
    row_len: usize,
    mut f: impl FnMut(&mut [f32]),
) {
    if values.is_empty() {
        return;
    }
    assert!(
        row_len > 0 && values.len().is_multiple_of(row_len),
        "{} values are not whole rows of {row_len}",
        values.len()
    );
    let chunk = (CHUNK / row_len).max(1) * row_len;
    let mut stack = [0.0f32; CHUNK];
    let mut heap = Vec::new();
    let scratch: &mut [f32] = if chunk <= CHUNK {
        &mut stack[..chunk]
    } else {
        heap.resize(chunk, 0.0);
        &mut heap
    };
    for piece in values.chunks_mut(chunk) {
        let wide = &mut scratch[..piece.len()];
        T::widen_on(isa, piece, wide);
        f(wide);
        T::narrow_on(isa, wide, piece);
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::bf16 {}

    pub trait Half {}
    impl Half for super::bf16 {}
    impl Half for super::f16 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both paths of this CPU: the portable loops and the detected ones.
    fn paths() -> [Isa; 2] {
        [Isa::PORTABLE, Isa::detected()]
    }

    /// Special values first (zeros, infinities, quiet and signalling NaNs, subnormals, ties
    /// to even and to odd, the largest finite value, which rounds to infinity), then a
    /// pseudo-random sweep of bit patterns; an odd length, so both paths run their tails.
    fn f32_bits() -> Vec<u32> {
        let mut bits = vec![
            0x0000_0000,
            0x8000_0000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0x7f80_0001, // a signalling NaN: quieted
            0xffbf_ffff,
            0xffff_ffff,
            0x0000_0001, // the smallest subnormal
            0x8000_0001,
            0x007f_ffff, // the largest subnormal
            0x0080_0000,
            0x0000_8000, // a tie, even: down
            0x0001_8000, // a tie, odd: up
            0x8001_8000,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_8001,
            0x7f7f_ffff, // rounds to infinity
            0xff7f_ffff,
        ];
        // Xorshift over raw bit patterns (every exponent, NaNs included), which a generator
        // of values in a range does not give.
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        bits.extend((0..100_003).map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u32
        }));
        bits
    }

    #[test]
    fn narrowing_is_half_bit_for_bit() {
        let bits = f32_bits();
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        for isa in paths() {
            let mut dst = vec![bf16::ZERO; src.len()];
            f32_to_bf16_on(isa, &src, &mut dst);
            for (i, (value, got)) in src.iter().zip(&dst).enumerate() {
                let want = bf16::from_f32(*value);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{}: value {i} ({:#010x})",
                    isa.name(),
                    bits[i]
                );
            }
        }
    }

    /// Every `bf16` bit pattern: `half`'s bits, except that a signalling NaN stays the same
    /// signalling NaN (a shift keeps every bit; `half` sets the quiet bit).
    #[test]
    fn widening_is_half_bit_for_bit_on_every_bf16() {
        let src: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        for isa in paths() {
            let mut dst = vec![0.0f32; src.len()];
            bf16_to_f32_on(isa, &src, &mut dst);
            for (value, got) in src.iter().zip(&dst) {
                let bits = value.to_bits();
                let signalling = bits & 0x7fff > 0x7f80 && bits & 0x0040 == 0;
                let want = if signalling {
                    u32::from(bits) << 16
                } else {
                    value.to_f32().to_bits()
                };
                assert_eq!(got.to_bits(), want, "{}: {bits:#06x}", isa.name());
            }
        }
    }

    #[test]
    fn the_default_forms_are_the_detected_path() {
        let src: Vec<f32> = f32_bits().into_iter().map(f32::from_bits).collect();
        let (mut got, mut want) = (vec![bf16::ZERO; src.len()], vec![bf16::ZERO; src.len()]);
        f32_to_bf16(&src, &mut got);
        f32_to_bf16_on(Isa::detected(), &src, &mut want);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(g, w)| g.to_bits() == w.to_bits())
        );
        let (mut wide, mut wide_on) = (vec![0.0f32; got.len()], vec![0.0f32; got.len()]);
        bf16_to_f32(&got, &mut wide);
        bf16_to_f32_on(Isa::detected(), &got, &mut wide_on);
        assert!(
            wide.iter()
                .zip(&wide_on)
                .all(|(g, w)| g.to_bits() == w.to_bits())
        );
    }

    #[test]
    #[should_panic(expected = "one bf16 per f32")]
    fn narrowing_checks_lengths() {
        f32_to_bf16_on(Isa::PORTABLE, &[1.0, 2.0], &mut [bf16::ZERO]);
    }

    #[test]
    #[should_panic(expected = "one f32 per bf16")]
    fn widening_checks_lengths() {
        bf16_to_f32_on(Isa::PORTABLE, &[bf16::ONE], &mut [0.0, 0.0]);
    }

    /// `f` on each value of `x` as `f32`, rounded once by `half`: the reference.
    fn rounded_once<T: Copy>(
        x: &[T],
        to: fn(T) -> f32,
        from: fn(f32) -> T,
        f: impl Fn(f32) -> f32,
    ) -> Vec<T> {
        x.iter().map(|&v| from(f(to(v)))).collect()
    }

    fn through_f32_is_rounded_once<T: HalfFloat + PartialEq + std::fmt::Debug>(
        to: fn(T) -> f32,
        from: fn(f32) -> T,
    ) {
        // Several chunks and a partial last one.
        let x: Vec<T> = crate::testing::uniform(3 * CHUNK + 37, 5, [-4.0, 4.0])
            .into_iter()
            .map(from)
            .collect();
        let want = rounded_once(&x, to, from, |v| v * 3.0 + 0.1);
        for isa in paths() {
            let mut got = x.clone();
            through_f32_on(isa, &mut got, |values| {
                assert!(values.len() <= CHUNK, "an L1-sized chunk");
                values.iter_mut().for_each(|v| *v = *v * 3.0 + 0.1);
            });
            assert_eq!(got, want, "{}", isa.name());
        }
        let mut got = x.clone();
        through_f32(&mut got, |values| {
            values.iter_mut().for_each(|v| *v = *v * 3.0 + 0.1)
        });
        assert_eq!(got, want, "the default form");
    }

    #[test]
    fn through_f32_rounds_once_in_both_half_types() {
        through_f32_is_rounded_once::<bf16>(bf16::to_f32, bf16::from_f32);
        through_f32_is_rounded_once::<f16>(f16::to_f32, f16::from_f32);
    }

    #[test]
    fn through_f32_rows_keeps_rows_whole() {
        // Rows shorter than a chunk, not dividing it, and longer than one.
        for row_len in [1, 3, 700, CHUNK, CHUNK + 5] {
            let rows = 7;
            let x: Vec<bf16> = crate::testing::uniform_bf16(rows * row_len, 9, [-1.0, 1.0]);
            // Each value minus its row's first: wrong wherever a chunk splits a row.
            let want: Vec<bf16> = x
                .chunks(row_len)
                .flat_map(|row| {
                    let first = row[0].to_f32();
                    rounded_once(row, bf16::to_f32, bf16::from_f32, move |v| v - first)
                })
                .collect();
            for isa in paths() {
                let mut got = x.clone();
                through_f32_rows_on(isa, &mut got, row_len, |values| {
                    assert!(values.len().is_multiple_of(row_len), "whole rows");
                    for row in values.chunks_mut(row_len) {
                        let first = row[0];
                        row.iter_mut().for_each(|v| *v -= first);
                    }
                });
                assert_eq!(got, want, "{} rows of {row_len}", isa.name());
            }
        }
        // No values: nothing to do, whatever the row length.
        through_f32_rows::<f16>(&mut [], 0, |_| unreachable!("no chunk"));
    }

    #[test]
    #[should_panic(expected = "not whole rows")]
    fn through_f32_rows_checks_rows() {
        through_f32_rows(&mut [bf16::ONE; 5], 2, |_| {});
    }
}
