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
//! and the bias are applied as the tile is stored. That kernel runs where
//! [`Isa::avx512_vnni`] holds (the `_on` forms take the [`Isa`]); the portable path computes
//! the same integer sums one at a time. [`reference()`] is the same arithmetic one product at
//! a time: the kernel must match it exactly.

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
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) values: Vec<i8>,
    pub(crate) scales: Vec<f32>,
    pub(crate) col_sums: Vec<i32>,
    /// Column panels of `NR` columns, each `ceil(k/4)` rows of `NR` quads
    /// `(q[4p..4p+4][j])`, zero-padded.
    pub(crate) panels: Vec<u32>,
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
    pub(crate) rows: usize,
    pub(crate) depth: usize,
    /// `rows` rows of [`padded`](Self::padded) values.
    pub(crate) values: Vec<u8>,
    pub(crate) scales: Vec<f32>,
    pub(crate) zeros: Vec<i32>,
}

impl QuantizedRows {
    /// Quantizes each row of `x` (`m × k`) over `[min(x, 0), max(x, 0)]`, so that zero is
    /// exact: `scale = (max − min)/255`, `zero = round(−min/scale)`,
    /// `q = clamp(round(x/scale) + zero, 0, 255)`. [`quantize_on`](Self::quantize_on) with
    /// [`Isa::detected`].
    pub fn quantize(x: MatRef<'_, f32>, parallel: bool) -> Self {
        Self::quantize_on(Isa::detected(), x, parallel)
    }

    /// [`quantize`](Self::quantize) on the path `isa` picks: its range and rounding loops 16
    /// values at a time where [`Isa::avx512`] holds, one at a time elsewhere, with the same
    /// results (both round ties to even).
    pub fn quantize_on(isa: Isa, x: MatRef<'_, f32>, parallel: bool) -> Self {
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
                    quantize_slice(isa, &source.data[start..start + k], &mut row[..k])
                } else {
                    let copy: Vec<f32> = (0..k).map(|p| source.at(0, p)).collect();
                    quantize_slice(isa, &copy, &mut row[..k])
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

    /// The row length of `values`: the depth rounded up to a multiple of four.
    pub(crate) fn padded(&self) -> usize {
        self.depth.div_ceil(4) * 4
    }

    fn value(&self, i: usize, p: usize) -> u8 {
        self.values[i * self.padded() + p]
    }
}

/// One row's scale and zero point, its values written to `out`: the AVX-512 path where
/// [`Isa::avx512`] holds, the same arithmetic in scalar code elsewhere (both round ties to
/// even).
fn quantize_slice(isa: Isa, x: &[f32], out: &mut [u8]) -> (f32, i32) {
    let (min, max) = min_max_on(isa, x);
    let scale = if max > min { (max - min) / 255.0 } else { 1.0 };
    let inverse = 1.0 / scale;
    let zero = (-min * inverse).round_ties_even().clamp(0.0, 255.0) as i32;
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        // SAFETY: `isa.avx512()` holds only where AVX-512 was detected; `out` is as long as
        // `x`.
        unsafe { crate::x86_64::int8::quantize(x, out, inverse, zero) };
        return (scale, zero);
    }
    for (q, &v) in out.iter_mut().zip(x) {
        *q = ((v * inverse).round_ties_even() as i32 + zero).clamp(0, 255) as u8;
    }
    (scale, zero)
}

/// `(min(x, 0), max(x, 0))`, non-finite values ignored, on the path `isa` picks (the same
/// result on both).
fn min_max_on(isa: Isa, x: &[f32]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        // SAFETY: `isa.avx512()` holds only where AVX-512 was detected.
        return unsafe { crate::x86_64::int8::min_max(x) };
    }
    let _ = isa;
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
/// rayon's threads share the output. [`matmul_on`] with [`Isa::detected`].
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
    matmul_on(Isa::detected(), dst, stride, x, w, epilogue, parallel);
}

/// [`matmul`] on the path `isa` picks ([`matmul_sum_on`] of one product).
///
/// # Panics
/// As [`matmul`].
pub fn matmul_on(
    isa: Isa,
    dst: &mut [f32],
    stride: usize,
    x: &QuantizedRows,
    w: &QuantizedMatrix,
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    matmul_sum_on(isa, dst, stride, &[(x, w)], epilogue, parallel);
}

/// `dst = alpha·Σₛ xₛ·wₛ + bias` (or `+=` with `accumulate`): several products of the same
/// output shape, each with its own scales, summed in one pass over `dst` (each output tile
/// takes every product while it is in cache). A sketched layer's output is two such products.
/// [`matmul_sum_on`] with [`Isa::detected`].
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
    matmul_sum_on(Isa::detected(), dst, stride, products, epilogue, parallel);
}

/// [`matmul_sum`] on the path `isa` picks: the `vpdpbusd` kernel where [`Isa::avx512_vnni`]
/// holds, the same integer sums one at a time elsewhere. Either way the activation is
/// [`Activation::apply_to_on`]'s on the same `isa` (GELU fused where [`Isa::avx512`] holds),
/// so that a fused epilogue and a separate activation give the same bits.
///
/// # Panics
/// As [`matmul_sum`].
pub fn matmul_sum_on(
    isa: Isa,
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
    if isa.avx512_vnni() {
        // SAFETY: `isa.avx512_vnni()` holds only where AVX512-VNNI with AVX-512 (F, BW, VL,
        // DQ) and FMA was detected; the shapes were checked.
        unsafe { crate::x86_64::int8::matmul(dst, stride, products, epilogue, parallel) };
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
                    *slot = if epilogue.accumulate {
                        *slot + value
                    } else {
                        value
                    };
                }
            }
            // SAFETY: the block's columns of row `i`, written above and by no other block.
            let row =
                unsafe { std::slice::from_raw_parts_mut(out.get().add(i * stride + j0), cols) };
            epilogue.activation.apply_to_on(isa, row);
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

#[cfg(test)]
mod tests;
