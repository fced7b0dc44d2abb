//! `bf16` matrix products with `f32` accumulation.
//!
//! `vdpbf16ps` multiplies the 32 `bf16` pairs of two registers and adds each pair's two
//! products into one of 16 `f32` lanes. The kernel broadcasts a pair `(a[i][2p], a[i][2p+1])`
//! of the left operand and multiplies it with a panel row holding the pairs
//! `(b[2p][j], b[2p+1][j])` of 16 columns, so each instruction advances 16 outputs by two
//! steps of depth. A row-major left operand of even depth already stores its pairs that way
//! and is read in place; other layouts, and the right operand, are packed into pairs first.
//!
//! [`reference()`] is the same product in `f64`, for tests.
//!
//! ```
//! use burn_cpu_kernels::{MatRef, bf16};
//! use half::bf16 as Bf16;
//!
//! let a: Vec<Bf16> = [1.0, 2.0, 3.0, 4.0].map(Bf16::from_f32).to_vec(); // [[1, 2], [3, 4]]
//! let b: Vec<Bf16> = [1.0, 0.0, 0.0, 1.0].map(Bf16::from_f32).to_vec(); // identity
//! let mut y = vec![0.0f32; 4];
//! // y = 2·a·b, into all 2 columns of rows 2 long; not accumulated, in parallel.
//! bf16::matmul(&mut y, 2, MatRef::row_major(&a, 2, 2), MatRef::row_major(&b, 2, 2), 2.0, false, true);
//! assert_eq!(y, [2.0, 4.0, 6.0, 8.0]);
//! ```

use ::half::bf16;

use crate::Isa;
use crate::blocking::{SendPtr, for_each_block};
use crate::convert::StoredFloat;
use crate::view::MatRef;

/// `dst = alpha·lhs·rhs`, or `dst += alpha·lhs·rhs` with `accumulate`, into the first
/// `rhs.cols` columns of a row-major `dst` whose rows are `stride` long; products accumulate
/// in `f32`. With `parallel`, rayon's threads share the output (each a block of rows or of
/// columns). The [module docs](self) have an example.
///
/// # Panics
/// If the inner dimensions differ or `dst` is not `lhs.rows × stride` with
/// `stride ≥ rhs.cols`.
pub fn matmul<O: StoredFloat>(
    dst: &mut [O],
    stride: usize,
    lhs: MatRef<'_, bf16>,
    rhs: MatRef<'_, bf16>,
    alpha: f32,
    accumulate: bool,
    parallel: bool,
) {
    let ([m, k], [k2, n]) = (lhs.shape(), rhs.shape());
    assert_eq!(k, k2, "inner dimensions: {m}×{k} by {k2}×{n}");
    assert!(
        n <= stride && dst.len() == m * stride,
        "a {m}×{stride} destination (stride ≥ {n}) has {} elements",
        dst.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::detected().avx512_bf16() {
        // SAFETY: AVX512-BF16 (with F, BW, VL, DQ) was detected; `dst` holds `m` rows of
        // `stride ≥ n` elements and both views were bounds-checked when made.
        unsafe { avx512::matmul(dst, stride, lhs, rhs, alpha, accumulate, parallel) };
        return;
    }
    portable(dst, stride, lhs, rhs, alpha, accumulate, parallel);
}

/// The product on `f32` copies of both operands, multiplied by `gemm`.
fn portable<O: StoredFloat>(
    dst: &mut [O],
    stride: usize,
    lhs: MatRef<'_, bf16>,
    rhs: MatRef<'_, bf16>,
    alpha: f32,
    accumulate: bool,
    parallel: bool,
) {
    let ([m, k], n) = (lhs.shape(), rhs.shape()[1]);
    let widen = |view: MatRef<'_, bf16>| -> Vec<f32> {
        let [rows, cols] = view.shape();
        (0..rows)
            .flat_map(|i| (0..cols).map(move |j| view.at(i, j).to_f32()))
            .collect()
    };
    let (a, b) = (widen(lhs), widen(rhs));
    let mut product = vec![0.0f32; m * n];
    let parallelism = if parallel {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    super::gemm(
        &mut product,
        n,
        MatRef::row_major(&a, m, k),
        MatRef::row_major(&b, k, n),
        1.0,
        false,
        parallelism,
    );
    for (row, values) in dst.chunks_exact_mut(stride).zip(product.chunks_exact(n)) {
        for (out, &value) in row.iter_mut().zip(values) {
            let base = if accumulate { out.to_f32() } else { 0.0 };
            *out = O::from_f32(base + alpha * value);
        }
    }
}

/// `alpha·lhs·rhs` in `f64` on the `bf16` values, row-major: the tests' reference.
pub fn reference(lhs: MatRef<'_, bf16>, rhs: MatRef<'_, bf16>, alpha: f32) -> Vec<f64> {
    let ([m, k], n) = (lhs.shape(), rhs.shape()[1]);
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let sum: f64 = (0..k)
                .map(|p| lhs.at(i, p).to_f64() * rhs.at(p, j).to_f64())
                .sum();
            out[i * n + j] = alpha as f64 * sum;
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{MatRef, SendPtr, StoredFloat, bf16, for_each_block};
    use crate::blocking::tile_shape;

    /// Packs the `k × width` view `m` as `ceil(k/2)` rows of `width` pairs
    /// `(m[2p][w], m[2p+1][w])` (zero past `k` or past the view's width, up to `padded`).
    ///
    /// Three layouts, fastest first: contiguous rows (two rows interleaved 16 columns at a
    /// time, masked at the end), a pair adjacent in memory (one 32-bit read per column), any
    /// strides.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    fn pack_pairs(out: &mut Vec<u32>, m: MatRef<'_, bf16>, padded: usize) {
        let [k, width] = m.shape();
        let pairs = k.div_ceil(2);
        out.clear();
        out.resize(pairs * padded, 0);
        if k == 0 || width == 0 {
            return;
        }
        let (base, row_stride, col_stride) = m.raw_parts();
        let base = base.cast::<u16>();
        for p in 0..pairs {
            let row = &mut out[p * padded..p * padded + width];
            let has_hi = 2 * p + 1 < k;
            // SAFETY: `MatRef::strided` checked that every element of the view lies in its
            // buffer; the reads below stay inside rows 2p and 2p + 1 (when `has_hi`) and
            // columns `0..width`, and the masked lanes past `width` are not read.
            unsafe {
                let lo = base.offset(2 * p as isize * row_stride);
                let hi = base.wrapping_offset((2 * p as isize + 1) * row_stride);
                if col_stride == 1 {
                    for w in (0..width).step_by(16) {
                        let lanes = (width - w).min(16);
                        let mask = ((1u32 << lanes) - 1) as __mmask16;
                        let l = _mm256_maskz_loadu_epi16(mask, lo.add(w).cast());
                        let h = if has_hi {
                            _mm256_maskz_loadu_epi16(mask, hi.add(w).cast())
                        } else {
                            _mm256_setzero_si256()
                        };
                        let packed = _mm512_or_si512(
                            _mm512_cvtepu16_epi32(l),
                            _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)),
                        );
                        _mm512_mask_storeu_epi32(row.as_mut_ptr().add(w).cast(), mask, packed);
                    }
                } else if row_stride == 1 && has_hi {
                    for (c, slot) in row.iter_mut().enumerate() {
                        *slot = lo
                            .offset(c as isize * col_stride)
                            .cast::<u32>()
                            .read_unaligned();
                    }
                } else {
                    for (c, slot) in row.iter_mut().enumerate() {
                        let offset = c as isize * col_stride;
                        let h = if has_hi { *hi.offset(offset) } else { 0 };
                        *slot = *lo.offset(offset) as u32 | (h as u32) << 16;
                    }
                }
            }
        }
    }

    /// See [`super::matmul`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
    pub(super) fn matmul<O: StoredFloat>(
        dst: &mut [O],
        stride: usize,
        lhs: MatRef<'_, bf16>,
        rhs: MatRef<'_, bf16>,
        alpha: f32,
        accumulate: bool,
        parallel: bool,
    ) {
        let ([m, _], n) = (lhs.shape(), rhs.shape()[1]);
        let out = SendPtr(dst.as_mut_ptr());
        let (mr, nr) = tile_shape(n);
        for_each_block([m, n], [mr, nr], parallel, |i0, rows, j0, cols| {
            // SAFETY: each block writes only its rows `i0..i0 + rows` and columns
            // `j0..j0 + cols` of `dst`, disjoint from every other block's; the features were
            // detected by the caller.
            unsafe {
                let dst = out.get().add(i0 * stride + j0);
                let (lhs, rhs) = (lhs.rows(i0, rows), rhs.cols(j0, cols));
                match nr {
                    16 => block_with::<O, 16, 1>(dst, stride, lhs, rhs, alpha, accumulate),
                    32 => block_with::<O, 12, 2>(dst, stride, lhs, rhs, alpha, accumulate),
                    _ => block_with::<O, 6, 4>(dst, stride, lhs, rhs, alpha, accumulate),
                }
            }
        });
    }

    /// The block in tiles of `MR` rows by `16·NV` columns: one panel of the right operand
    /// packed at a time, every row tile multiplied with it.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
    unsafe fn block_with<O: StoredFloat, const MR: usize, const NV: usize>(
        dst: *mut O,
        stride: usize,
        lhs: MatRef<'_, bf16>,
        rhs: MatRef<'_, bf16>,
        alpha: f32,
        accumulate: bool,
    ) {
        let nr = 16 * NV;
        let ([m, k], n) = (lhs.shape(), rhs.shape()[1]);
        let pairs = k.div_ceil(2);
        // A row-major left operand of even depth is its own packing: row i's pair p is the
        // 32 bits at element 2p. Otherwise each row tile is packed as pairs × MR.
        let in_place = lhs.col_stride == 1 && k % 2 == 0 && lhs.row_stride % 2 == 0 && k > 0;
        let mut packed_lhs = Vec::new();
        if !in_place {
            let tiles = m.div_ceil(MR);
            let mut tile = Vec::new();
            packed_lhs.reserve(tiles * pairs * MR);
            for t in 0..tiles {
                let rows = MR.min(m - t * MR);
                pack_pairs(&mut tile, lhs.rows(t * MR, rows).t(), MR);
                packed_lhs.extend_from_slice(&tile);
            }
        }
        let mut panel = Vec::new();
        for j in (0..n).step_by(nr) {
            let cols = nr.min(n - j);
            pack_pairs(&mut panel, rhs.cols(j, cols), nr);
            for i in (0..m).step_by(MR) {
                let rows = MR.min(m - i);
                let (a, row_step, pair_step): (*const u32, usize, usize) = if in_place {
                    // In units of u32 (a pair): rows are row_stride/2 pairs apart.
                    let base = lhs
                        .data
                        .as_ptr()
                        .wrapping_add((lhs.offset as isize + i as isize * lhs.row_stride) as usize);
                    (base.cast(), lhs.row_stride as usize / 2, 1)
                } else {
                    (packed_lhs[(i / MR) * pairs * MR..].as_ptr(), 1, MR)
                };
                // SAFETY: rows past `rows` re-read the last valid row (their results are not
                // stored); the panel has `pairs × nr` pairs; `dst` covers the tile's rows
                // and its first `cols` columns.
                unsafe {
                    tile::<O, MR, NV>(
                        pairs,
                        a,
                        row_step,
                        pair_step,
                        rows,
                        panel.as_ptr(),
                        cols,
                        dst.add(i * stride + j),
                        stride,
                        alpha,
                        accumulate,
                    )
                }
            }
        }
    }

    /// `MR × 16·NV` outputs over the whole depth, in registers, then stored once.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<O: StoredFloat, const MR: usize, const NV: usize>(
        pairs: usize,
        a: *const u32,
        row_step: usize,
        pair_step: usize,
        rows: usize,
        panel: *const u32,
        cols: usize,
        dst: *mut O,
        stride: usize,
        alpha: f32,
        accumulate: bool,
    ) {
        let a_rows: [*const u32; MR] =
            std::array::from_fn(|r| a.wrapping_add(r.min(rows - 1) * row_step));
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for p in 0..pairs {
            // SAFETY: the caller's panel holds `pairs × 16·NV` pairs, every row pointer
            // `pairs` pairs `pair_step` apart.
            unsafe {
                let b: [__m512bh; NV] = std::array::from_fn(|v| {
                    std::mem::transmute(_mm512_loadu_si512(panel.add((p * NV + v) * 16).cast()))
                });
                for (acc, row) in acc.iter_mut().zip(&a_rows) {
                    let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(
                        row.add(p * pair_step).read_unaligned() as i32,
                    ));
                    for (acc, &b) in acc.iter_mut().zip(&b) {
                        *acc = _mm512_dpbf16_ps(*acc, a, b);
                    }
                }
            }
        }
        let alpha = _mm512_set1_ps(alpha);
        for (r, acc) in acc.iter().enumerate().take(rows) {
            for (v, &value) in acc.iter().enumerate() {
                let col = 16 * v;
                if col >= cols {
                    break;
                }
                let mask: __mmask16 = if cols - col >= 16 {
                    0xFFFF
                } else {
                    (1 << (cols - col)) - 1
                };
                // SAFETY: the masked lanes are the tile's columns inside `dst`.
                unsafe {
                    let out = dst.add(r * stride + col);
                    store::<O>(out, mask, _mm512_mul_ps(alpha, value), accumulate);
                }
            }
        }
    }

    /// Stores the `mask`ed lanes of `value` at `out` (added to what is there with
    /// `accumulate`), rounding to `bf16` for `bf16` outputs.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
    #[inline]
    unsafe fn store<O: StoredFloat>(out: *mut O, mask: __mmask16, value: __m512, accumulate: bool) {
        // SAFETY: the caller guarantees the masked lanes lie in `dst`.
        unsafe {
            if O::BF16 {
                let out = out.cast::<u16>();
                let value = if accumulate {
                    let old = _mm256_maskz_loadu_epi16(mask, out.cast());
                    let old =
                        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(old)));
                    _mm512_add_ps(old, value)
                } else {
                    value
                };
                let rounded: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(value));
                _mm256_mask_storeu_epi16(out.cast(), mask, rounded);
            } else {
                let out = out.cast::<f32>();
                let value = if accumulate {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), value)
                } else {
                    value
                };
                _mm512_mask_storeu_ps(out, mask, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1): a small LCG, so that failures reproduce.
    pub(crate) fn values(len: usize, seed: u64) -> Vec<bf16> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                bf16::from_f32(((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
            })
            .collect()
    }

    /// The largest error relative to the reference's largest magnitude.
    fn check<O: StoredFloat>(got: &[O], stride: usize, want: &[f64], n: usize, tolerance: f64) {
        let scale = want.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
        for (i, row) in want.chunks(n).enumerate() {
            for (j, &w) in row.iter().enumerate() {
                let g = got[i * stride + j].to_f32() as f64;
                assert!(
                    (g - w).abs() / scale <= tolerance,
                    "({i}, {j}): {g} against {w} (scale {scale})"
                );
            }
        }
    }

    fn case(m: usize, k: usize, n: usize, transpose_lhs: bool, transpose_rhs: bool) {
        let a = values(m * k, (m * 31 + k) as u64);
        let b = values(k * n, (n * 17 + k) as u64);
        // Transposed views read the same values from the transposed buffer.
        let (at, bt): (Vec<bf16>, Vec<bf16>) = (
            (0..k * m).map(|q| a[(q % m) * k + q / m]).collect(),
            (0..n * k).map(|q| b[(q % k) * n + q / k]).collect(),
        );
        let lhs = if transpose_lhs {
            MatRef::row_major(&at, k, m).t()
        } else {
            MatRef::row_major(&a, m, k)
        };
        let rhs = if transpose_rhs {
            MatRef::row_major(&bt, n, k).t()
        } else {
            MatRef::row_major(&b, k, n)
        };
        let want = reference(lhs, rhs, 0.5);
        let stride = n + 3;
        for parallel in [false, true] {
            let mut y = vec![0.0f32; m * stride];
            matmul(&mut y, stride, lhs, rhs, 0.5, false, parallel);
            check(&y, stride, &want, n, 1e-5);
            // Accumulating adds the same product again.
            matmul(&mut y, stride, lhs, rhs, 0.5, true, parallel);
            let twice: Vec<f64> = want.iter().map(|v| 2.0 * v).collect();
            check(&y, stride, &twice, n, 1e-5);
            // Rounded to bf16 on the way out: 8 bits of mantissa.
            let mut y = vec![bf16::ZERO; m * stride];
            matmul(&mut y, stride, lhs, rhs, 0.5, false, parallel);
            check(&y, stride, &want, n, 1e-2);
        }
    }

    #[test]
    fn products_match_the_reference_on_odd_shapes() {
        for &(m, k, n) in &[
            (1, 1, 1),
            (1, 64, 1),
            (7, 3, 5),
            (13, 33, 17),
            (6, 64, 64),
            (37, 130, 65),
            (64, 31, 100),
            (256, 512, 32),
            (33, 16, 129),
        ] {
            for (tl, tr) in [(false, false), (true, false), (false, true), (true, true)] {
                case(m, k, n, tl, tr);
            }
        }
    }

    #[test]
    fn the_portable_path_matches_the_kernel() {
        let (m, k, n) = (45, 100, 70);
        let (a, b) = (values(m * k, 3), values(k * n, 4));
        let (lhs, rhs) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n));
        let mut fast = vec![0.0f32; m * n];
        let mut slow = vec![0.0f32; m * n];
        matmul(&mut fast, n, lhs, rhs, 1.0, false, true);
        portable(&mut slow, n, lhs, rhs, 1.0, false, true);
        let want = reference(lhs, rhs, 1.0);
        check(&fast, n, &want, n, 1e-5);
        check(&slow, n, &want, n, 1e-5);
    }

    #[test]
    fn several_threads_at_once_get_their_own_results() {
        std::thread::scope(|scope| {
            for t in 0..4 {
                scope.spawn(move || case(50 + t, 70, 90 - t, t % 2 == 0, false));
            }
        });
    }
}
