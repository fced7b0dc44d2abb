//! `f32` matrix products with a fused epilogue (bias, activation, accumulation), for dense
//! layers: `y = f(x·W + bias)` and their backward products `xᵀ·g` and `g·Wᵀ`.
//!
//! Why not only `gemm` (which Flex multiplies with): on large products its AVX-512 kernel
//! and this one are both close to the CPU's peak; what `gemm` lacks is what a dense layer
//! needs around the product. Here the bias and the activation are applied in the store of
//! each output tile (no second pass over the output), a weight is packed once and reused
//! ([`PackedRhs`]), products of few rows (batch-1 inference) are shared out by columns and
//! read the weight in place, and both operands may be transposed views (the gradients
//! `xᵀ·g` and `g·Wᵀ`). Where `gemm` measured faster (a transposed left operand of more than
//! 64 rows; a plain product of depth ≤ 512 and ≤ 1152 columns; fewer than 8 rows with an
//! unpacked weight), [`matmul`] hands it the product.
//!
//! The kernel follows MLAS's layout rather than BLIS's: the right operand is packed into
//! panels of 32 columns, the left one is read in place whenever its rows are contiguous
//! (a broadcast per row and step of depth needs no packing) and packed into row tiles
//! otherwise. Each call of the micro-kernel keeps a `14 × 32` tile of the output in 28 of
//! the 32 `zmm` registers for a whole block of depth: two loads of the panel and 14
//! broadcasts feed 28 independent multiply-adds a step, enough chains for a core with two
//! 512-bit FMA pipes of latency 4 (which needs at least 8 in flight). The tile's lines of
//! the output are prefetched before the loop, so that the store does not wait for memory.
//!
//! Blocking: the depth is cut into equal blocks of at most 1024; rayon's threads take
//! blocks of at most 192 rows (as many blocks as a multiple of the threads), or, for at
//! most 64 rows, groups of panels, so that each thread writes a disjoint part of the
//! output. A block's rows stay in L2 while every panel passes over them; a panel's block of
//! depth stays in L1 or L2 while the block's row tiles pass over it. Every output element
//! sums its products in the same order whatever the split: parallel and serial results are
//! identical, bit for bit.
//!
//! The kernel runs on an [`Isa`] with [`Isa::avx512`] ([`matmul_on`], [`matmul_packed_on`];
//! the default forms use [`Isa::detected`]). Elsewhere, [`Isa::PORTABLE`] included, and for
//! the products `gemm` measured faster, the product is `gemm`'s (which has its own run-time
//! dispatch: it uses the CPU's AVX-512 whatever the `Isa`) followed by the epilogue as a
//! second pass over the output, its activation [`Activation::apply_to_on`] on the same `Isa`.
//!
//! ```
//! use burn_cpu_kernels::{Activation, MatRef, sgemm};
//!
//! let x = [1.0f32, 2.0, 3.0, 4.0]; // [[1, 2], [3, 4]]
//! let w = [1.0f32, 0.0, 0.0, 1.0]; // identity
//! let bias = [0.5f32, -10.0];
//! let mut y = vec![0.0f32; 4];
//! let epilogue = sgemm::Epilogue { bias: Some(&bias), activation: Activation::Relu, accumulate: false };
//! sgemm::matmul(&mut y, 2, MatRef::row_major(&x, 2, 2), MatRef::row_major(&w, 2, 2), epilogue, true);
//! assert_eq!(y, [1.5, 0.0, 3.5, 0.0]);
//! ```

use crate::Isa;
use crate::activation::Activation;
use crate::view::MatRef;
#[cfg(target_arch = "x86_64")]
use crate::x86_64::sgemm as avx512;

#[cfg(test)]
mod tests;

/// The width of a panel of the right operand and of the micro-kernel's tile: two `zmm`
/// registers of 16 lanes.
pub(crate) const NR: usize = 32;
/// The rows of the micro-kernel's tile: `2·MR = 28` accumulators, the two panel registers
/// and one broadcast use 31 of the 32 `zmm` registers (the most rows that fit: the more
/// rows share each load of the panel, the fewer loads per multiply-add).
pub(crate) const MR: usize = 14;
/// The largest block of depth. Each block of depth after the first reloads the output
/// tiles, so fewer, deeper blocks are faster as long as a panel's block (`KC × NR`, 128 KiB
/// at 1024) and a row tile's (`MR × KC`, 56 KiB) are served by L2.
pub(crate) const KC: usize = 1024;
/// The rows of a thread's block: every panel of the right operand passes over them, so the
/// right operand is read from L3 or memory `M / MC` times; the fewer, the better, as long as
/// the block (`MC × KC`: 768 KiB at 192) stays in a 1 MiB L2.
pub(crate) const MC: usize = 192;
/// At most this many rows, the product is split by columns (the rows would give too few
/// blocks to share out) and the left operand is never packed.
pub(crate) const COLUMN_SPLIT_ROWS: usize = 64;

/// What the store applies to each output tile: the product plus `bias`, added to what `dst`
/// holds with `accumulate`, then the `activation` (the same order as
/// [`int8::Epilogue`](crate::int8::Epilogue)).
#[derive(Clone, Copy, Debug, Default)]
pub struct Epilogue<'a> {
    /// Added to each row, one value per output column.
    pub bias: Option<&'a [f32]>,
    /// Applied to each output last, after the bias (and the sum, with `accumulate`).
    pub activation: Activation,
    /// Add to what `dst` holds instead of overwriting it (gradient accumulation).
    pub accumulate: bool,
}

/// A right-hand side `K × N` packed once into panels of 32 columns (each `K × 32`,
/// row-major, zero-padded past `N`), the layout the kernel reads. A backend keeps one per
/// inference weight, so that only the activations move at each call.
#[derive(Clone, Debug, PartialEq)]
pub struct PackedRhs {
    k: usize,
    n: usize,
    panels: Vec<f32>,
}

impl PackedRhs {
    /// Packs any strided view (a transposed weight `Wᵀ` included).
    /// Large operands are packed on rayon's threads.
    pub fn pack(rhs: MatRef<'_, f32>) -> Self {
        Self::pack_into(rhs, Vec::new(), true)
    }

    /// [`pack`](Self::pack) into `buffer`'s allocation: every value is written, so a
    /// reused buffer needs no clearing (only its growth is zeroed).
    fn pack_into(rhs: MatRef<'_, f32>, mut panels: Vec<f32>, parallel: bool) -> Self {
        let [k, n] = rhs.shape();
        let len = n.div_ceil(NR) * k * NR;
        if panels.len() < len {
            panels.resize(len, 0.0);
        } else {
            panels.truncate(len);
        }
        if k > 0 {
            use rayon::prelude::*;
            // A task packs a group of panels, 16 steps of depth at a time across the group:
            // the reads stay within a few rows of the operand (a panel at a time would read
            // 128 bytes from each of `k` rows, a page apart) and the writes are a few streams.
            const GROUP: usize = 8;
            const STEPS: usize = 16;
            let pack = |(g, group): (usize, &mut [f32])| {
                for p0 in (0..k).step_by(STEPS) {
                    let steps = STEPS.min(k - p0);
                    for (q, panel) in group.chunks_mut(k * NR).enumerate() {
                        let j = (g * GROUP + q) * NR;
                        let view = rhs.rows(p0, steps).cols(j, NR.min(n - j));
                        pack_panel(&mut panel[p0 * NR..(p0 + steps) * NR], view);
                    }
                }
            };
            // Parallel only when there is enough to copy to pay for the threads.
            if parallel && k * n >= 1 << 16 {
                panels
                    .par_chunks_mut(GROUP * k * NR)
                    .enumerate()
                    .for_each(pack);
            } else {
                panels.chunks_mut(GROUP * k * NR).enumerate().for_each(pack);
            }
        }
        Self { k, n, panels }
    }

    /// `[k, n]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.k, self.n]
    }

    /// The bytes its panels hold (the columns padded to whole panels).
    pub fn bytes(&self) -> usize {
        self.panels.len() * size_of::<f32>()
    }

    /// Panel `p`: `k × NR` values.
    pub(crate) fn panel(&self, p: usize) -> &[f32] {
        &self.panels[p * self.k * NR..(p + 1) * self.k * NR]
    }
}

/// Copies the `k × cols` view (`cols ≤ NR`) into `out`, `k` rows of `NR` (the rest zero).
pub(crate) fn pack_panel(out: &mut [f32], view: MatRef<'_, f32>) {
    let [k, cols] = view.shape();
    debug_assert!(cols <= NR && out.len() >= k * NR);
    if view.col_stride == 1 {
        for (p, row) in out.chunks_exact_mut(NR).take(k).enumerate() {
            let start = (view.offset as isize + p as isize * view.row_stride) as usize;
            row[..cols].copy_from_slice(&view.data[start..start + cols]);
            row[cols..].fill(0.0);
        }
    } else {
        // Column by column: a transposed weight's columns are contiguous.
        for row in out.chunks_exact_mut(NR).take(k) {
            row[cols..].fill(0.0);
        }
        let (base, row_stride, col_stride) = view.raw_parts();
        for j in 0..cols {
            let column = base.wrapping_offset(j as isize * col_stride);
            for p in 0..k {
                // SAFETY: `(p, j)` is an element of the view, bounds-checked when it was made.
                out[p * NR + j] = unsafe { *column.offset(p as isize * row_stride) };
            }
        }
    }
}

/// `dst = f(lhs·rhs + bias)`, or `dst = f(dst + lhs·rhs + bias)` with
/// `epilogue.accumulate`, into the first `rhs.cols` columns of a row-major `dst` whose rows
/// are `stride` long, on this CPU's path: [`matmul_on`] with [`Isa::detected`]. Both
/// operands may be any strided views. With `parallel`, rayon's threads share the output;
/// the result is the same either way. The [module docs](self) have an example.
///
/// For more than 64 rows the right operand is packed at each call, into a buffer the
/// calling thread keeps for the next call (it holds the largest operand that thread has
/// packed); a weight used many times is better packed once, [`matmul_packed`]. The products
/// `gemm` measured faster go to `gemm`, the epilogue then applied as a second pass.
///
/// # Panics
/// If the inner dimensions differ, `dst` is not `lhs.rows × stride` with
/// `stride ≥ rhs.cols`, or the bias is not `rhs.cols` long.
pub fn matmul(
    dst: &mut [f32],
    stride: usize,
    lhs: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    matmul_on(Isa::detected(), dst, stride, lhs, rhs, epilogue, parallel);
}

/// [`matmul`] on the path `isa` picks: the kernel where [`Isa::avx512`] holds and `gemm` did
/// not measure faster on the product; elsewhere ([`Isa::PORTABLE`] included) `gemm`, which
/// has its own run-time dispatch, then the epilogue as a second pass.
///
/// # Panics
/// As [`matmul`].
pub fn matmul_on(
    isa: Isa,
    dst: &mut [f32],
    stride: usize,
    lhs: MatRef<'_, f32>,
    rhs: MatRef<'_, f32>,
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    let ([m, k], [k2, n]) = (lhs.shape(), rhs.shape());
    assert_eq!(k, k2, "inner dimensions: {m}×{k} by {k2}×{n}");
    check(dst, stride, m, n, &epilogue);
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() && !gemm_is_faster(lhs, [m, k, n], &epilogue) {
        // Few rows: the right operand is read once, in place when its rows are contiguous.
        let direct = m <= COLUMN_SPLIT_ROWS && rhs.col_stride == 1;
        if direct {
            // SAFETY: `isa.avx512()` holds only where AVX-512 and FMA were detected; shapes
            // and `dst` were checked above.
            unsafe { avx512::matmul(dst, stride, lhs, Rhs::Direct(rhs), epilogue, parallel) };
            return;
        }
        // The calling thread's packing buffer, kept between calls: a fresh allocation of a
        // gradient-sized operand (4096 × 1536: 24 MiB) would cost its page faults at every
        // call. It holds the largest right operand this thread has packed.
        thread_local! {
            static BUFFER: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
        }
        let packed = PackedRhs::pack_into(rhs, BUFFER.take(), parallel);
        // SAFETY: `isa.avx512()` holds only where AVX-512 and FMA were detected; shapes and
        // `dst` were checked above.
        unsafe { avx512::matmul(dst, stride, lhs, Rhs::Packed(&packed), epilogue, parallel) };
        BUFFER.set(packed.panels);
        return;
    }
    portable(isa, dst, stride, lhs, &[(0, n, rhs)], epilogue, parallel);
}

/// [`matmul`] with a right-hand side packed beforehand, on this CPU's path:
/// [`matmul_packed_on`] with [`Isa::detected`].
///
/// # Panics
/// As [`matmul`].
pub fn matmul_packed(
    dst: &mut [f32],
    stride: usize,
    lhs: MatRef<'_, f32>,
    rhs: &PackedRhs,
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    matmul_packed_on(Isa::detected(), dst, stride, lhs, rhs, epilogue, parallel);
}

/// [`matmul_packed`] on the path `isa` picks: the kernel wherever [`Isa::avx512`] holds (the
/// right operand exists only as panels, the kernel's layout); elsewhere `gemm` on each
/// panel, then the epilogue as a second pass, as [`matmul_on`].
///
/// # Panics
/// As [`matmul`].
pub fn matmul_packed_on(
    isa: Isa,
    dst: &mut [f32],
    stride: usize,
    lhs: MatRef<'_, f32>,
    rhs: &PackedRhs,
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    let ([m, k], [k2, n]) = (lhs.shape(), rhs.shape());
    assert_eq!(k, k2, "inner dimensions: {m}×{k} by {k2}×{n}");
    check(dst, stride, m, n, &epilogue);
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() {
        // SAFETY: `isa.avx512()` holds only where AVX-512 and FMA were detected; shapes and
        // `dst` were checked above.
        unsafe { avx512::matmul(dst, stride, lhs, Rhs::Packed(rhs), epilogue, parallel) };
        return;
    }
    // `gemm` on each panel: a `k × NR` row-major matrix.
    let panels: Vec<_> = (0..n.div_ceil(NR))
        .map(|p| {
            let cols = NR.min(n - p * NR);
            let view = MatRef::strided(rhs.panel(p), 0, [k, cols], [NR as isize, 1]);
            (p * NR, cols, view)
        })
        .collect();
    portable(isa, dst, stride, lhs, &panels, epilogue, parallel);
}

/// Where `gemm` measured faster than the kernel (one and two threads, interleaved runs), so
/// that [`matmul_on`] hands it the product (and the epilogue, as a second pass):
///
/// - a left operand whose rows are not contiguous, for more rows than [`COLUMN_SPLIT_ROWS`]
///   (the weight gradient `xᵀ·g`): the kernel would pack both operands;
/// - a plain product (no bias, no activation) of depth at most 512 and at most 1152
///   columns. With a bias or an activation the kernel's fused store wins: `gemm`'s second
///   pass costs more than the gap;
/// - fewer than [`MIN_DIRECT_ROWS`] rows: the kernel reads the right operand in place, a
///   panel's 128 bytes from each row, which only pays with enough rows to share each load.
///
/// [`matmul_packed_on`] keeps the kernel: its right operand exists only as panels.
fn gemm_is_faster(lhs: MatRef<'_, f32>, [m, k, n]: [usize; 3], epilogue: &Epilogue<'_>) -> bool {
    let strided = lhs.col_stride != 1 && k > 1;
    let plain = epilogue.bias.is_none() && epilogue.activation == Activation::Identity;
    m < MIN_DIRECT_ROWS || (m > COLUMN_SPLIT_ROWS && (strided || (plain && k <= 512 && n <= 1152)))
}

/// The fewest rows [`matmul_on`] multiplies with the kernel (see [`gemm_is_faster`]).
const MIN_DIRECT_ROWS: usize = 8;

fn check(dst: &[f32], stride: usize, m: usize, n: usize, epilogue: &Epilogue<'_>) {
    assert!(
        n <= stride && dst.len() == m * stride,
        "a {m}×{stride} destination (stride ≥ {n}) has {} elements",
        dst.len()
    );
    if let Some(bias) = epilogue.bias {
        assert_eq!(bias.len(), n, "{n} bias values");
    }
}

/// The right operand as the kernel reads it.
#[derive(Clone, Copy)]
pub(crate) enum Rhs<'a> {
    /// Panels of [`NR`] columns.
    Packed(&'a PackedRhs),
    /// Rows read in place (contiguous columns), for few rows of output.
    Direct(MatRef<'a, f32>),
}

impl Rhs<'_> {
    /// The product's columns.
    pub(crate) fn cols(self) -> usize {
        match self {
            Rhs::Packed(p) => p.n,
            Rhs::Direct(v) => v.shape()[1],
        }
    }
}

/// `gemm` on each `(first column, columns, view)` part of the right operand, then the
/// epilogue as a second pass, its activation on `isa`'s path.
fn portable(
    isa: Isa,
    dst: &mut [f32],
    stride: usize,
    lhs: MatRef<'_, f32>,
    parts: &[(usize, usize, MatRef<'_, f32>)],
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    let m = lhs.shape()[0];
    let parallelism = if parallel {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    for &(j0, _, rhs) in parts {
        // Columns `j0..j0 + cols` of every row: the rows from `j0` on.
        crate::gemm(
            &mut dst[j0..],
            stride,
            lhs,
            rhs,
            1.0,
            epilogue.accumulate,
            parallelism,
        );
    }
    let n = parts
        .iter()
        .map(|&(j0, cols, _)| j0 + cols)
        .max()
        .unwrap_or(0);
    if epilogue.bias.is_none() && epilogue.activation == Activation::Identity {
        return;
    }
    let finish = |row: &mut [f32]| {
        let row = &mut row[..n];
        if let Some(bias) = epilogue.bias {
            row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
        }
        epilogue.activation.apply_to_on(isa, row);
    };
    if parallel && m * n >= 1 << 16 {
        use rayon::prelude::*;
        dst.par_chunks_exact_mut(stride).for_each(finish);
    } else {
        dst.chunks_exact_mut(stride).for_each(finish);
    }
}

/// `lhs·rhs` in `f64`, row-major: the tests' reference.
pub fn reference(lhs: MatRef<'_, f32>, rhs: MatRef<'_, f32>) -> Vec<f64> {
    let ([m, k], n) = (lhs.shape(), rhs.shape()[1]);
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k)
                .map(|p| lhs.at(i, p) as f64 * rhs.at(p, j) as f64)
                .sum();
        }
    }
    out
}
