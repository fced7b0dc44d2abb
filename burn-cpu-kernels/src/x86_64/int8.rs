//! The `int8` product on AVX512-VNNI ([`crate::int8::matmul_sum_on`] where
//! [`Isa::avx512_vnni`](crate::Isa::avx512_vnni) holds): `vpdpbusd` on a tile of
//! `MR × 16·NV` `i32` accumulators, the epilogue applied as each tile is stored; and the
//! activations' quantization on AVX-512 ([`crate::int8::QuantizedRows::quantize_on`] where
//! [`Isa::avx512`](crate::Isa::avx512) holds).
//!
//! The product's functions enable `fma` besides VNNI (which [`Isa::avx512_vnni`]
//! implies through [`Isa::avx512`]): the store's GELU is [`gelu_f::<true>`](gelu_f), fused as
//! every GELU on an `avx512` path is, and one instruction only where `fma` is enabled.
//!
//! The safe `#[target_feature]` functions need only their features (calling them is `unsafe`
//! elsewhere for that reason); the `unsafe fn`s also need what their `# Safety` sections say.
//!
//! [`Isa::avx512_vnni`]: crate::Isa::avx512_vnni
//! [`Isa::avx512`]: crate::Isa::avx512

use std::arch::x86_64::*;

use crate::activation::Activation;
use crate::blocking::{SendPtr, for_each_block, tile_shape};
use crate::int8::{Epilogue, QuantizedMatrix, QuantizedRows};
use crate::math::gelu_f;

/// `(min(x, 0), max(x, 0))`, non-finite values ignored, 16 lanes at a time: non-finite lanes
/// are masked out of the comparisons, so it gives the portable loop's result.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut lo, mut hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for chunk in x.chunks(16) {
        let lanes: __mmask16 = if chunk.len() == 16 {
            0xFFFF
        } else {
            (1 << chunk.len()) - 1
        };
        // SAFETY: the masked lanes are `chunk`'s elements.
        let v = unsafe { _mm512_maskz_loadu_ps(lanes, chunk.as_ptr()) };
        // fpclass 0x99: quiet NaN, +∞, −∞, signalling NaN.
        let finite = lanes & !_mm512_fpclass_ps_mask::<0x99>(v);
        lo = _mm512_mask_min_ps(lo, finite, lo, v);
        hi = _mm512_mask_max_ps(hi, finite, hi, v);
    }
    (_mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi))
}

/// `out = clamp(round(x·inverse) + zero, 0, 255)`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
pub(crate) fn quantize(x: &[f32], out: &mut [u8], inverse: f32, zero: i32) {
    let (inv, z) = (_mm512_set1_ps(inverse), _mm512_set1_epi32(zero));
    let (lo, hi) = (_mm512_setzero_si512(), _mm512_set1_epi32(255));
    for (chunk, q) in x.chunks(16).zip(out.chunks_mut(16)) {
        let mask: __mmask16 = if chunk.len() == 16 {
            0xFFFF
        } else {
            (1 << chunk.len()) - 1
        };
        // SAFETY: the masked lanes are `chunk`'s and `q`'s elements.
        unsafe {
            let v = _mm512_maskz_loadu_ps(mask, chunk.as_ptr());
            let r = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv)), z);
            let r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
            _mm512_mask_cvtepi32_storeu_epi8(q.as_mut_ptr().cast(), mask, r);
        }
    }
}

/// [`crate::int8::matmul_sum_on`] on this path, its arguments checked: at least one product,
/// all of `m × n` outputs with agreeing depths, `dst` `m` rows of `stride ≥ n`, `n` bias
/// values if any.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")]
pub(crate) fn matmul(
    dst: &mut [f32],
    stride: usize,
    products: &[(&QuantizedRows, &QuantizedMatrix)],
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    let (m, n) = (products[0].0.rows, products[0].1.cols);
    let (mr, nr) = tile_shape(n);
    let out = SendPtr(dst.as_mut_ptr());
    for_each_block([m, n], [mr, nr], parallel, |i0, rows, j0, cols| {
        // SAFETY: blocks are disjoint rows or panel-aligned columns of `dst`; the
        // features were detected by the caller.
        unsafe {
            let dst = out.get();
            let block = [i0, rows, j0, cols];
            match nr {
                16 => block_with::<16, 1>(dst, stride, products, epilogue, block),
                32 => block_with::<12, 2>(dst, stride, products, epilogue, block),
                _ => block_with::<6, 4>(dst, stride, products, epilogue, block),
            }
        }
    });
}

/// The block in tiles of `MR` rows by `16·NV` columns, each tile taking every product in
/// turn (the first stores or accumulates as `epilogue` says, the others accumulate; the
/// bias comes with the last).
///
/// # Safety
/// `dst` is the output of [`matmul`]'s checked shapes (`m` rows of `stride` elements), the
/// block `[i0, rows, j0, cols]` lies inside it with `j0` a multiple of `16·NV` (panels are
/// that wide), and no other thread touches the block meanwhile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")]
unsafe fn block_with<const MR: usize, const NV: usize>(
    dst: *mut f32,
    stride: usize,
    products: &[(&QuantizedRows, &QuantizedMatrix)],
    epilogue: Epilogue<'_>,
    [i0, rows, j0, cols]: [usize; 4],
) {
    let nr = 16 * NV;
    let zeros = [0.0f32; 64];
    for j in (j0..j0 + cols).step_by(nr) {
        let width = nr.min(j0 + cols - j);
        for i in (i0..i0 + rows).step_by(MR) {
            let height = MR.min(i0 + rows - i);
            for (s, &(x, w)) in products.iter().enumerate() {
                let last = s + 1 == products.len();
                let e = Epilogue {
                    bias: epilogue.bias.filter(|_| last),
                    accumulate: epilogue.accumulate || s > 0,
                    activation: if last {
                        epilogue.activation
                    } else {
                        Activation::Identity
                    },
                    ..epilogue
                };
                let bias = e.bias.map_or(&zeros[..], |b| &b[j..]);
                let quads = x.depth.div_ceil(4);
                let panel = &w.panels[(j / nr) * quads * nr..][..quads * nr];
                let a: [*const u32; MR] = std::array::from_fn(|r| {
                    x.values[(i + r.min(height - 1)) * x.padded()..]
                        .as_ptr()
                        .cast::<u32>()
                });
                // SAFETY: each row holds `quads` quads (padded to four values), the panel
                // `quads × nr`; the tile's rows and columns lie in `dst`.
                unsafe {
                    let mut acc = [[_mm512_setzero_si512(); NV]; MR];
                    for p in 0..quads {
                        let b: [__m512i; NV] = std::array::from_fn(|v| {
                            _mm512_loadu_si512(panel.as_ptr().add((p * NV + v) * 16).cast())
                        });
                        for (acc, row) in acc.iter_mut().zip(&a) {
                            let av = _mm512_set1_epi32(row.add(p).read_unaligned() as i32);
                            for (acc, &b) in acc.iter_mut().zip(&b) {
                                *acc = _mm512_dpbusd_epi32(*acc, av, b);
                            }
                        }
                    }
                    store::<MR, NV>(
                        &acc,
                        dst.add(i * stride + j),
                        stride,
                        x,
                        w,
                        e,
                        bias,
                        [i, height, j, width],
                    );
                }
            }
        }
    }
}

/// `alpha·sₓ·s_w·(sum − zₓ·Σq_w) + bias` (plus what `dst` holds with `accumulate`), then the
/// activation, each row's lanes masked to the tile's width.
///
/// # Safety
/// `dst` holds the tile's `height ≤ MR` rows, `stride` elements apart, each with `width`
/// writable elements; the tile's rows `i..i + height` are rows of `x` and its columns
/// `j..j + width` columns of `w`; when `epilogue.bias` is given, `bias` (the bias from column
/// `j` on) has at least `width` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn store<const MR: usize, const NV: usize>(
    acc: &[[__m512i; NV]; MR],
    dst: *mut f32,
    stride: usize,
    x: &QuantizedRows,
    w: &QuantizedMatrix,
    epilogue: Epilogue<'_>,
    bias: &[f32],
    [i, height, j, width]: [usize; 4],
) {
    for v in 0..NV {
        let col = 16 * v;
        if col >= width {
            break;
        }
        let mask: __mmask16 = if width - col >= 16 {
            0xFFFF
        } else {
            (1 << (width - col)) - 1
        };
        // SAFETY: the masked lanes are the tile's columns, inside `w`'s vectors, `bias`
        // (when given: `n − j` values) and `dst`.
        unsafe {
            let sums = _mm512_maskz_loadu_epi32(mask, w.col_sums[j + col..].as_ptr().cast());
            let scales = _mm512_maskz_loadu_ps(mask, w.scales[j + col..].as_ptr());
            let scales = _mm512_mul_ps(scales, _mm512_set1_ps(epilogue.alpha));
            let bias = if epilogue.bias.is_some() {
                _mm512_maskz_loadu_ps(mask, bias[col..].as_ptr())
            } else {
                _mm512_setzero_ps()
            };
            for (r, acc) in acc.iter().enumerate().take(height) {
                let corrected = _mm512_sub_epi32(
                    acc[v],
                    _mm512_mullo_epi32(_mm512_set1_epi32(x.zeros[i + r]), sums),
                );
                let scale = _mm512_mul_ps(scales, _mm512_set1_ps(x.scales[i + r]));
                let mut value = _mm512_fmadd_ps(_mm512_cvtepi32_ps(corrected), scale, bias);
                let out = dst.add(r * stride + col);
                if epilogue.accumulate {
                    value = _mm512_add_ps(value, _mm512_maskz_loadu_ps(mask, out));
                }
                match epilogue.activation {
                    Activation::Identity => {}
                    Activation::Relu => value = _mm512_max_ps(value, _mm512_setzero_ps()),
                    // Through memory, lane by lane (a loop the compiler vectorises): fused, as
                    // `Activation::apply_to_on` computes it wherever `Isa::avx512` holds.
                    Activation::Gelu => {
                        let mut lanes = [0.0f32; 16];
                        _mm512_storeu_ps(lanes.as_mut_ptr(), value);
                        for lane in &mut lanes {
                            *lane = gelu_f::<true>(*lane);
                        }
                        value = _mm512_loadu_ps(lanes.as_ptr());
                    }
                }
                _mm512_mask_storeu_ps(out, mask, value);
            }
        }
    }
}
