//! The `bf16` product on AVX512-BF16 ([`crate::bf16::matmul_on`] where
//! [`Isa::avx512_bf16`](crate::Isa::avx512_bf16) holds): operands packed into pairs,
//! `vdpbf16ps` on a tile of `MR × 16·NV` `f32` accumulators, each tile stored once.
//!
//! The safe `#[target_feature]` functions need only their features (calling them is `unsafe`
//! elsewhere for that reason); the `unsafe fn`s also need what their `# Safety` sections say.

use std::arch::x86_64::*;

use half::bf16;

use crate::blocking::{SendPtr, for_each_block, tile_shape};
use crate::convert::StoredFloat;
use crate::view::MatRef;

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

/// [`crate::bf16::matmul_on`] on this path, its arguments checked: `dst` holds
/// `lhs.rows` rows of `stride ≥ rhs.cols` elements and the inner dimensions agree.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
pub(crate) fn matmul<O: StoredFloat>(
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
///
/// # Safety
/// `dst` points at the block's first element in a row-major output whose rows are `stride`
/// apart and which holds the block's `lhs.rows × rhs.cols` elements; no other thread
/// touches them meanwhile.
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
///
/// # Safety
/// `rows ≥ 1`; each of the first `rows` row pointers `a + r·row_step` can read `pairs` pairs
/// `pair_step` apart; `panel` holds `pairs × 16·NV` pairs; `dst` holds `rows` rows of
/// `stride` elements apart, each with `cols ≤ 16·NV` writable elements.
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
///
/// # Safety
/// The `mask`ed lanes of the 16 elements at `out` are readable and writable.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]
#[inline]
unsafe fn store<O: StoredFloat>(out: *mut O, mask: __mmask16, value: __m512, accumulate: bool) {
    // SAFETY: the caller guarantees the masked lanes lie in `dst`.
    unsafe {
        if O::BF16 {
            let out = out.cast::<u16>();
            let value = if accumulate {
                let old = _mm256_maskz_loadu_epi16(mask, out.cast());
                let old = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(old)));
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
