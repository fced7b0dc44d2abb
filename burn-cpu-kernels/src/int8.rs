//! `int8` matrix products with `i32` accumulation, for dynamically quantized inference.
//!
//! The scheme is PyTorch's `quantize_dynamic` with finer activation scales: weights
//! symmetric `i8` with one scale per output column, fixed at quantization time and packed
//! once ([`QuantizedMatrix`]); activations asymmetric `u8` with one scale and zero point per
//! row, computed at run time ([`QuantizedRows`]). With `x ≈ sₓ·(qₓ − zₓ)` and `w ≈ s_w·q_w`,
//!
//! ```text
//! y[i][j] = sₓ[i]·s_w[j]·(Σₚ qₓ[i][p]·q_w[p][j] − zₓ[i]·Σₚ q_w[p][j]) + bias[j]
//! ```
//!
//! The integer sum is exact in `i32` (up to a depth of 2¹⁶); `vpdpbusd` (AVX512-VNNI) adds
//! four `u8 × i8` products into each of 16 lanes, and the scales, the zero-point correction
//! and the bias are applied as the tile is stored. [`reference()`] is the same arithmetic one
//! product at a time: the kernel must match it exactly.

use crate::Isa;
use crate::activation::Activation;
use crate::blocking::{SendPtr, for_each_block, tile_shape};
use crate::view::MatRef;

/// The deepest product whose integer sums cannot overflow `i32`: `255·127·depth < 2³¹`.
pub const MAX_DEPTH: usize = 65_536;

/// A `k × n` weight quantized to `i8` per column (`w ≈ scale[j]·q[p][j]`, `|q| ≤ 127`), with
/// its column sums and its panels for the kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedMatrix {
    rows: usize,
    cols: usize,
    values: Vec<i8>,
    scales: Vec<f32>,
    col_sums: Vec<i32>,
    /// Column panels of `NR` columns, each `ceil(k/4)` rows of `NR` quads
    /// `(q[4p..4p+4][j])`, zero-padded.
    panels: Vec<u32>,
}

impl QuantizedMatrix {
    /// Quantizes `weight` per column: `scale = max|w[:, j]| / 127`, `q = round(w/scale)`.
    ///
    /// # Panics
    /// If `weight` is deeper than [`MAX_DEPTH`].
    pub fn quantize(weight: MatRef<'_, f32>) -> Self {
        let [k, n] = weight.shape();
        let scales: Vec<f32> = (0..n)
            .map(|j| {
                let max = (0..k).fold(0.0f32, |m, p| m.max(weight.at(p, j).abs()));
                if max > 0.0 && max.is_finite() {
                    max / 127.0
                } else {
                    1.0
                }
            })
            .collect();
        let values: Vec<i8> = (0..k)
            .flat_map(|p| {
                let scales = &scales;
                (0..n).map(move |j| {
                    (weight.at(p, j) / scales[j])
                        .round_ties_even()
                        .clamp(-127.0, 127.0) as i8
                })
            })
            .collect();
        Self::from_parts(k, n, values, scales)
    }

    /// A quantized matrix from its `k × n` row-major values and per-column scales (a saved
    /// one, or signs with scale 1).
    ///
    /// # Panics
    /// If the lengths disagree with the shape or `k` exceeds [`MAX_DEPTH`].
    pub fn from_parts(k: usize, n: usize, values: Vec<i8>, scales: Vec<f32>) -> Self {
        assert_eq!(values.len(), k * n, "{k}×{n} quantized values");
        assert_eq!(scales.len(), n, "{n} column scales");
        assert!(
            k <= MAX_DEPTH,
            "a depth of {k} could overflow i32 (at most {MAX_DEPTH})"
        );
        let col_sums = (0..n)
            .map(|j| (0..k).map(|p| values[p * n + j] as i32).sum())
            .collect();
        let nr = tile_shape(n).1;
        let quads = k.div_ceil(4);
        let mut panels = vec![0u32; n.div_ceil(nr) * quads * nr];
        for (panel, chunk) in panels.chunks_exact_mut(quads * nr).enumerate() {
            for p in 0..quads {
                for c in 0..nr {
                    let j = panel * nr + c;
                    if j >= n {
                        continue;
                    }
                    let quad = (0..4).fold(0u32, |q, e| {
                        let v = if 4 * p + e < k {
                            values[(4 * p + e) * n + j]
                        } else {
                            0
                        };
                        q | ((v as u8 as u32) << (8 * e))
                    });
                    chunk[p * nr + c] = quad;
                }
            }
        }
        Self {
            rows: k,
            cols: n,
            values,
            scales,
            col_sums,
            panels,
        }
    }

    /// `[k, n]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// The quantized values, `k × n` row-major.
    pub fn values(&self) -> &[i8] {
        &self.values
    }

    /// One scale per column.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// `scale[j]·q[p][j]`, row-major: what the quantized weight stands for.
    pub fn dequantize(&self) -> Vec<f32> {
        self.values
            .iter()
            .enumerate()
            .map(|(i, &q)| q as f32 * self.scales[i % self.cols])
            .collect()
    }
}

/// Activations quantized to `u8` per row (`x ≈ scale[i]·(q[i][p] − zero[i])`), each row
/// padded with zeros to a multiple of four.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedRows {
    rows: usize,
    depth: usize,
    values: Vec<u8>,
    scales: Vec<f32>,
    zeros: Vec<i32>,
}

impl QuantizedRows {
    /// Quantizes each row of `x` (`m × k`) over `[min(x, 0), max(x, 0)]`, so that zero is
    /// exact: `scale = (max − min)/255`, `zero = round(−min/scale)`,
    /// `q = clamp(round(x/scale) + zero, 0, 255)`.
    pub fn quantize(x: MatRef<'_, f32>, parallel: bool) -> Self {
        use rayon::prelude::*;
        let [m, k] = x.shape();
        let padded = k.div_ceil(4) * 4;
        let mut values = vec![0u8; m * padded];
        let mut scales = vec![0.0f32; m];
        let mut zeros = vec![0i32; m];
        let quantize_row =
            |(i, ((row, scale), zero)): (usize, ((&mut [u8], &mut f32), &mut i32))| {
                let source = x.rows(i, 1);
                let (s, z) = if source.col_stride == 1 || k <= 1 {
                    let start = source.offset;
                    quantize_slice(&source.data[start..start + k], &mut row[..k])
                } else {
                    let copy: Vec<f32> = (0..k).map(|p| source.at(0, p)).collect();
                    quantize_slice(&copy, &mut row[..k])
                };
                (*scale, *zero) = (s, z);
            };
        let chunk = padded.max(1);
        if parallel && m * k >= 1 << 15 {
            values
                .par_chunks_mut(chunk)
                .zip(scales.par_iter_mut())
                .zip(zeros.par_iter_mut())
                .enumerate()
                .for_each(quantize_row);
        } else {
            values
                .chunks_mut(chunk)
                .zip(scales.iter_mut())
                .zip(zeros.iter_mut())
                .enumerate()
                .for_each(quantize_row);
        }
        Self {
            rows: m,
            depth: k,
            values,
            scales,
            zeros,
        }
    }

    /// `[m, k]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.depth]
    }

    fn padded(&self) -> usize {
        self.depth.div_ceil(4) * 4
    }

    fn value(&self, i: usize, p: usize) -> u8 {
        self.values[i * self.padded() + p]
    }
}

/// One row's scale and zero point, its values written to `out`: the AVX-512 path where the
/// CPU has it, the same arithmetic in scalar code elsewhere (both round ties to even).
fn quantize_slice(x: &[f32], out: &mut [u8]) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    let (min, max) = if Isa::detected().avx512() {
        // SAFETY: AVX-512 was detected.
        unsafe { avx512::min_max(x) }
    } else {
        min_max(x)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (min, max) = min_max(x);
    let scale = if max > min { (max - min) / 255.0 } else { 1.0 };
    let inverse = 1.0 / scale;
    let zero = (-min * inverse).round_ties_even().clamp(0.0, 255.0) as i32;
    #[cfg(target_arch = "x86_64")]
    if Isa::detected().avx512() {
        // SAFETY: AVX-512 was detected; `out` is as long as `x`.
        unsafe { avx512::quantize(x, out, inverse, zero) };
        return (scale, zero);
    }
    for (q, &v) in out.iter_mut().zip(x) {
        *q = ((v * inverse).round_ties_even() as i32 + zero).clamp(0, 255) as u8;
    }
    (scale, zero)
}

/// `(min(x, 0), max(x, 0))`, non-finite values ignored.
fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .filter(|v| v.is_finite())
        .fold((0.0f32, 0.0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// What the store applies to each output tile: `alpha·(integer sum, corrected)` plus `bias`,
/// added to `dst` with `accumulate`, then the `activation`.
#[derive(Clone, Copy, Debug)]
pub struct Epilogue<'a> {
    /// A factor on every output (a sketched layer's `1/(2T)`).
    pub alpha: f32,
    /// Added to each row, one value per output column.
    pub bias: Option<&'a [f32]>,
    /// Add to what `dst` holds instead of overwriting it.
    pub accumulate: bool,
    /// Applied to each output last, after the bias (and the sum, with `accumulate`).
    pub activation: Activation,
}

/// `dst = alpha·(x·w) + bias` (or `+=` with `accumulate`) for quantized `x` (`m × k`) and
/// `w` (`k × n`), into a row-major `dst` of `m` rows of `stride ≥ n`. With `parallel`,
/// rayon's threads share the output.
///
/// # Panics
/// If the shapes disagree.
pub fn matmul(
    dst: &mut [f32],
    stride: usize,
    x: &QuantizedRows,
    w: &QuantizedMatrix,
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    matmul_sum(dst, stride, &[(x, w)], epilogue, parallel);
}

/// `dst = alpha·Σₛ xₛ·wₛ + bias` (or `+=` with `accumulate`): several products of the same
/// output shape, each with its own scales, summed in one pass over `dst` (each output tile
/// takes every product while it is in cache). A sketched layer's output is two such products.
///
/// # Panics
/// If there is no product or the shapes disagree.
pub fn matmul_sum(
    dst: &mut [f32],
    stride: usize,
    products: &[(&QuantizedRows, &QuantizedMatrix)],
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    let m = products.first().expect("at least one product").0.rows;
    let n = products[0].1.cols;
    for (x, w) in products {
        let ([rows, k], [k2, cols]) = (x.shape(), w.shape());
        assert!(
            k == k2 && rows == m && cols == n,
            "a {rows}×{k} by {k2}×{cols} product in a sum of {m}×{n} ones"
        );
    }
    assert!(
        n <= stride && dst.len() == m * stride,
        "a {m}×{stride} destination"
    );
    if let Some(bias) = epilogue.bias {
        assert_eq!(bias.len(), n, "{n} bias values");
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::detected().avx512_vnni() {
        // SAFETY: AVX512-VNNI (with F, BW, VL, DQ) was detected and the shapes checked.
        unsafe { avx512::matmul(dst, stride, products, epilogue, parallel) };
        return;
    }
    let out = SendPtr(dst.as_mut_ptr());
    for_each_block([m, n], [8, 64], parallel, |i0, rows, j0, cols| {
        for i in i0..i0 + rows {
            for j in j0..j0 + cols {
                let value: f32 = products
                    .iter()
                    .enumerate()
                    .map(|(s, (x, w))| {
                        let k = x.depth;
                        let sum: i32 = (0..k)
                            .map(|p| x.value(i, p) as i32 * w.values[p * n + j] as i32)
                            .sum();
                        // The bias once, with the last product.
                        let last = s + 1 == products.len();
                        let e = Epilogue {
                            bias: epilogue.bias.filter(|_| last),
                            ..epilogue
                        };
                        finish(x, w, i, j, sum, e)
                    })
                    .sum();
                // SAFETY: each block writes only its own rows and columns of `dst`.
                unsafe {
                    let slot = out.get().add(i * stride + j);
                    let value = if epilogue.accumulate {
                        *slot + value
                    } else {
                        value
                    };
                    *slot = epilogue.activation.apply_f32(value);
                }
            }
        }
    });
}

/// One output from its integer sum: the zero point removed, scaled, biased.
fn finish(
    x: &QuantizedRows,
    w: &QuantizedMatrix,
    i: usize,
    j: usize,
    sum: i32,
    e: Epilogue<'_>,
) -> f32 {
    let corrected = sum - x.zeros[i] * w.col_sums[j];
    let bias = e.bias.map_or(0.0, |b| b[j]);
    e.alpha * (x.scales[i] * w.scales[j]) * corrected as f32 + bias
}

/// The integer sums `Σₚ qₓ[i][p]·q_w[p][j]`, row-major, one product at a time: the tests'
/// reference for the kernel, which must match it exactly.
pub fn reference(x: &QuantizedRows, w: &QuantizedMatrix) -> Vec<i32> {
    let ([m, k], n) = (x.shape(), w.cols);
    (0..m * n)
        .map(|q| {
            let (i, j) = (q / n, q % n);
            (0..k)
                .map(|p| x.value(i, p) as i32 * w.values[p * n + j] as i32)
                .sum()
        })
        .collect()
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{
        Activation, Epilogue, QuantizedMatrix, QuantizedRows, SendPtr, for_each_block, tile_shape,
    };

    /// [`super::min_max`], 16 lanes at a time: non-finite lanes are masked out of the
    /// comparisons, so both give the same result.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) fn min_max(x: &[f32]) -> (f32, f32) {
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
    pub(super) fn quantize(x: &[f32], out: &mut [u8], inverse: f32, zero: i32) {
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

    /// See [`super::matmul_sum`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
    pub(super) fn matmul(
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
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")]
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

    /// `alpha·sₓ·s_w·(sum − zₓ·Σq_w) + bias`, each row's lanes masked to the tile's width.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
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
                        // Through memory, for `apply_to`'s vectorised loop.
                        Activation::Gelu => {
                            let mut lanes = [0.0f32; 16];
                            _mm512_storeu_ps(lanes.as_mut_ptr(), value);
                            Activation::Gelu.apply_to(&mut lanes);
                            value = _mm512_loadu_ps(lanes.as_ptr());
                        }
                    }
                    _mm512_mask_storeu_ps(out, mask, value);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u64, spread: f32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.3) * spread
            })
            .collect()
    }

    /// The kernel's outputs against [`reference`]'s integer sums with the same epilogue (ReLU
    /// without a bias, GELU with one).
    fn case(m: usize, k: usize, n: usize, with_bias: bool) {
        let (xv, wv) = (
            values(m * k, (m + 7 * k) as u64, 4.0),
            values(k * n, (n + k) as u64, 0.2),
        );
        let bias = values(n, 99, 1.0);
        let x = QuantizedRows::quantize(MatRef::row_major(&xv, m, k), true);
        let w = QuantizedMatrix::quantize(MatRef::row_major(&wv, k, n));
        let sums = reference(&x, &w);
        // Each activation of the store, the identity in the other tests.
        let activation = if with_bias {
            Activation::Gelu
        } else {
            Activation::Relu
        };
        let epilogue = Epilogue {
            alpha: 0.25,
            bias: with_bias.then_some(&bias[..]),
            accumulate: false,
            activation,
        };
        for parallel in [false, true] {
            let stride = n + 1;
            let mut y = vec![f32::NAN; m * stride];
            matmul(&mut y, stride, &x, &w, epilogue, parallel);
            for i in 0..m {
                for j in 0..n {
                    let sum = finish(&x, &w, i, j, sums[i * n + j], epilogue);
                    let want = activation.apply_f32(sum);
                    let got = y[i * stride + j];
                    // The same integer sum; only the f32 epilogue's fused multiply-add may
                    // round differently.
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "{m}×{k}×{n} ({i}, {j}): {got} against {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn products_match_the_integer_reference_on_odd_shapes() {
        for &(m, k, n) in &[
            (1, 1, 1),
            (1, 5, 3),
            (7, 3, 17),
            (13, 33, 33),
            (6, 64, 64),
            (37, 130, 65),
            (256, 257, 32),
            (3, 1000, 129),
        ] {
            case(m, k, n, true);
            case(m, k, n, false);
        }
    }

    #[test]
    fn the_integer_sums_are_exact() {
        // Values whose products sum far past f32's 24-bit mantissa: an f32 accumulator would
        // round on the way, exact integer sums round once, at the store.
        let (m, k, n) = (5, 4096, 20);
        let x = QuantizedRows {
            rows: m,
            depth: k,
            values: (0..m * k).map(|i| (200 + i * 37 % 56) as u8).collect(),
            scales: vec![1.0; m],
            zeros: vec![0; m],
        };
        let w = QuantizedMatrix::from_parts(
            k,
            n,
            (0..k * n).map(|i| (100 + i * 53 % 28) as i8).collect(),
            vec![1.0; n],
        );
        let sums = reference(&x, &w);
        let mut y = vec![0.0f32; m * n];
        let e = Epilogue {
            alpha: 1.0,
            bias: None,
            accumulate: false,
            activation: Activation::Identity,
        };
        matmul(&mut y, n, &x, &w, e, true);
        for (got, want) in y.iter().zip(&sums) {
            assert_eq!(*got, *want as f32);
        }
        // And the sums are large: 4096 products of up to 255·127.
        assert!(sums.iter().any(|s| s.abs() > 1 << 24));
    }

    #[test]
    fn quantization_round_trips_within_half_a_step() {
        let (m, k) = (9, 77);
        let xv = values(m * k, 5, 6.0);
        let x = QuantizedRows::quantize(MatRef::row_major(&xv, m, k), false);
        for i in 0..m {
            for p in 0..k {
                let back = x.scales[i] * (x.value(i, p) as i32 - x.zeros[i]) as f32;
                assert!((back - xv[i * k + p]).abs() <= 0.5 * x.scales[i] + 1e-6);
            }
        }
        let w = QuantizedMatrix::quantize(MatRef::row_major(&xv, m, k));
        for (q, (v, d)) in xv.iter().zip(w.dequantize()).enumerate() {
            assert!((v - d).abs() <= 0.5 * w.scales[q % k] + 1e-6);
        }
        // A zero row stays zero, with a usable scale.
        let zeros = QuantizedRows::quantize(MatRef::row_major(&[0.0; 8], 2, 4), false);
        assert_eq!(zeros.scales, [1.0, 1.0]);
        assert!(zeros.values.iter().all(|&q| q as i32 == zeros.zeros[0]));
    }

    #[test]
    fn the_vector_range_is_the_scalar_one_non_finite_values_left_out() {
        let mut x = values(1000, 8, 10.0);
        x[3] = f32::NAN;
        x[500] = f32::INFINITY;
        x[999] = f32::NEG_INFINITY;
        x[17] = -1e6;
        for len in [0, 1, 5, 16, 17, 999, 1000] {
            let want = min_max(&x[..len]);
            #[cfg(target_arch = "x86_64")]
            if Isa::detected().avx512() {
                // SAFETY: AVX-512 was detected.
                assert_eq!(unsafe { avx512::min_max(&x[..len]) }, want, "{len} values");
            }
            assert!(want.0.is_finite() && want.1.is_finite());
        }
        assert_eq!(min_max(&x).0, -1e6);
    }

    #[test]
    fn a_sum_of_products_is_the_products_accumulated() {
        let (m, n) = (29, 70);
        let (k1, k2) = (13, 40);
        let x1 = QuantizedRows::quantize(MatRef::row_major(&values(m * k1, 1, 2.0), m, k1), true);
        let x2 = QuantizedRows::quantize(MatRef::row_major(&values(m * k2, 2, 9.0), m, k2), true);
        let w1 = QuantizedMatrix::quantize(MatRef::row_major(&values(k1 * n, 3, 1.0), k1, n));
        let w2 = QuantizedMatrix::quantize(MatRef::row_major(&values(k2 * n, 4, 0.1), k2, n));
        let bias = values(n, 5, 1.0);
        let e = Epilogue {
            alpha: 0.5,
            bias: Some(&bias),
            accumulate: false,
            activation: Activation::Identity,
        };
        let mut fused = vec![0.0f32; m * n];
        matmul_sum(&mut fused, n, &[(&x1, &w1), (&x2, &w2)], e, true);
        let mut apart = vec![0.0f32; m * n];
        matmul(&mut apart, n, &x1, &w1, Epilogue { bias: None, ..e }, false);
        matmul(
            &mut apart,
            n,
            &x2,
            &w2,
            Epilogue {
                accumulate: true,
                ..e
            },
            false,
        );
        assert_eq!(fused, apart);
    }

    #[test]
    fn accumulate_adds_to_the_destination() {
        let (m, k, n) = (4, 10, 6);
        let xv = values(m * k, 1, 1.0);
        let x = QuantizedRows::quantize(MatRef::row_major(&xv, m, k), false);
        let w = QuantizedMatrix::quantize(MatRef::row_major(&values(k * n, 2, 1.0), k, n));
        let e = Epilogue {
            alpha: 1.0,
            bias: None,
            accumulate: false,
            activation: Activation::Identity,
        };
        let mut once = vec![0.0f32; m * n];
        matmul(&mut once, n, &x, &w, e, false);
        let mut twice = once.clone();
        matmul(
            &mut twice,
            n,
            &x,
            &w,
            Epilogue {
                accumulate: true,
                ..e
            },
            false,
        );
        for (a, b) in once.iter().zip(&twice) {
            assert!((2.0 * a - b).abs() <= 1e-5 * a.abs().max(1.0));
        }
    }
}
