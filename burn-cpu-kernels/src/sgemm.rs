//! `f32` matrix products with a fused epilogue (bias, activation, accumulation), for dense
//! layers: `y = f(x·W + bias)` and their backward products `xᵀ·g` and `g·Wᵀ`.
//!
//! Why not only `gemm` (which Flex multiplies with): on large products its AVX-512 kernel
//! is already within a few percent of this CPU's peak (on Zen 5, 2 threads: 455 to 505
//! GFLOP/s of 525), and so is this one; what `gemm` lacks is what a dense layer needs
//! around the product. Here the bias and the activation are applied in the store of each
//! output tile (no second pass over the output: a BERT feed-forward layer with GELU runs 5%
//! faster at 4096 rows, 20% at 16), a weight is packed once and reused ([`PackedRhs`]),
//! products of few rows (batch-1 inference) are shared out by columns and read the weight in
//! place (+5% to +40% at 16 rows), and both operands may be transposed views (the
//! gradients `xᵀ·g` and `g·Wᵀ`). Where `gemm` measured faster (a transposed left operand
//! of more than [`SMALL_M`] rows; a plain product of depth ≤ 512 and ≤ 1152 columns; fewer
//! than 8 rows with an unpacked weight), [`matmul`] hands it the product.
//!
//! The kernel follows MLAS's layout rather than BLIS's: the right operand is packed into
//! panels of [`NR`] columns, the left one is read in place whenever its rows are contiguous
//! (a broadcast per row and step of depth needs no packing) and packed into row tiles
//! otherwise. Each call of the micro-kernel keeps an `MR × 32` tile of the output in 28 of
//! the 32 `zmm` registers for a whole block of depth: two loads of the panel and `MR`
//! broadcasts feed 28 independent multiply-adds a step, enough chains for Zen 5's two
//! 512-bit pipes (latency 4: at least 8 in flight). The tile's lines of the output are
//! prefetched before the loop, so that the store does not wait for memory.
//!
//! Blocking: the depth is cut into equal blocks of at most [`KC`]; rayon's threads take
//! blocks of at most [`MC`] rows (as many blocks as a multiple of the threads), or, for at
//! most [`SMALL_M`] rows, groups of panels, so that each thread writes a disjoint part of
//! the output. A block's rows stay in L2 while every panel passes over them; a panel's block
//! of depth stays in L1 or L2 while the block's row tiles pass over it. Every output element
//! sums its products in the same order whatever the split: parallel and serial results are
//! identical, bit for bit.
//!
//! The portable path is `gemm` followed by the epilogue; it is taken where AVX-512 is
//! absent, under `BURN_SKETCH_PORTABLE=1`, and with [`Path::Portable`].
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
use crate::blocking::SendPtr;
use crate::view::MatRef;

/// The width of a panel of the right operand and of the micro-kernel's tile: two `zmm`
/// registers of 16 lanes.
pub const NR: usize = 32;
/// The rows of the micro-kernel's tile: `2·MR = 28` accumulators, the two panel registers
/// and one broadcast use 31 of the 32 `zmm` registers. 14 measured 2 to 4% faster than 12
/// on one Zen 5 core (within the noise on two).
pub const MR: usize = 14;
/// The largest block of depth. Each block of depth after the first reloads the output
/// tiles, so fewer, deeper blocks are faster as long as a panel's block (`KC × NR`, 128 KiB
/// at 1024) and a row tile's (`MR × KC`, 56 KiB) are served by L2: measured on Zen 5,
/// 256 to 4096 differ by a few percent at depth 384 and 1536, and by 15% at 4096 (256
/// slowest).
pub const KC: usize = 1024;
/// The rows of a thread's block: every panel of the right operand passes over them, so the
/// right operand is read from L3 or memory `M / MC` times. 192 rows (`MC × KC`: 768 KiB,
/// in the 1 MiB L2) measured 20% faster than 48 on the weight gradient `384 × 4096 × 1536`,
/// and no slower on the forward shapes.
pub const MC: usize = 192;
/// At most this many rows: the product is parallel over columns (the rows would give too
/// few blocks) and the left operand is never packed.
pub const SMALL_M: usize = 64;

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

/// Which implementation [`matmul_with`] runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Path {
    /// The AVX-512 kernel where [`Isa::detected`] has AVX-512
    /// and `gemm` did not measure faster (see [`matmul`]), `gemm` elsewhere.
    #[default]
    Auto,
    /// `gemm` and a separate epilogue pass, whatever the CPU: for tests and comparisons, and
    /// for a caller that measured `gemm` faster on its products (FastFlex's `linear` on a few
    /// rows, whose weights stream from memory).
    Portable,
}

/// A right-hand side `K × N` packed once into panels of [`NR`] columns (each `K × NR`,
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

    /// Panel `p`: `k × NR` values.
    fn panel(&self, p: usize) -> &[f32] {
        &self.panels[p * self.k * NR..(p + 1) * self.k * NR]
    }
}

/// Copies the `k × cols` view (`cols ≤ NR`) into `out`, `k` rows of `NR` (the rest zero).
fn pack_panel(out: &mut [f32], view: MatRef<'_, f32>) {
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
/// are `stride` long. Both operands may be any strided views. With `parallel`, rayon's
/// threads share the output; the result is the same either way. The [module docs](self) have
/// an example.
///
/// For more than [`SMALL_M`] rows the right operand is packed at each call, into a buffer
/// the calling thread keeps for the next call (it holds the largest operand that thread has
/// packed); a weight used many times is better packed once, [`matmul_packed`]. The products
/// `gemm` measured faster on go to `gemm`, the epilogue then applied as a second pass.
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
    matmul_with(Path::Auto, dst, stride, lhs, rhs, epilogue, parallel);
}

/// [`matmul`] on the implementation `path` names.
///
/// # Panics
/// As [`matmul`].
pub fn matmul_with(
    path: Path,
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
    if path == Path::Auto && Isa::detected().avx512() && !gemm_is_faster(lhs, [m, k, n], &epilogue)
    {
        // Few rows: the right operand is read once, in place when its rows are contiguous.
        let direct = m <= SMALL_M && rhs.col_stride == 1;
        if direct {
            // SAFETY: AVX-512 was detected; shapes and `dst` were checked above.
            unsafe { avx512::matmul(dst, stride, lhs, Rhs::Direct(rhs), epilogue, parallel) };
            return;
        }
        // The calling thread's packing buffer, kept between calls: a fresh allocation of a
        // gradient-sized operand (4096 × 1536: 24 MiB) costs its page faults at every call,
        // 10% of the product. It holds the largest right operand this thread has packed.
        thread_local! {
            static BUFFER: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
        }
        let packed = PackedRhs::pack_into(rhs, BUFFER.take(), parallel);
        // SAFETY: AVX-512 was detected; shapes and `dst` were checked above.
        unsafe { avx512::matmul(dst, stride, lhs, Rhs::Packed(&packed), epilogue, parallel) };
        BUFFER.set(packed.panels);
        return;
    }
    portable(dst, stride, lhs, &[(0, n, rhs)], epilogue, parallel);
}

/// [`matmul`] with a right-hand side packed beforehand.
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
    matmul_packed_with(Path::Auto, dst, stride, lhs, rhs, epilogue, parallel);
}

/// [`matmul_packed`] on the implementation `path` names.
///
/// # Panics
/// As [`matmul`].
pub fn matmul_packed_with(
    path: Path,
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
    if path == Path::Auto && Isa::detected().avx512() {
        // SAFETY: AVX-512 was detected; shapes and `dst` were checked above.
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
    portable(dst, stride, lhs, &panels, epilogue, parallel);
}

/// Where `gemm` measured faster than the kernel (Zen 5, one and two threads, interleaved
/// runs), so that [`matmul`] hands it the product (and the epilogue, as a second pass):
///
/// - a left operand whose rows are not contiguous, for more rows than [`SMALL_M`] (the
///   weight gradient `xᵀ·g`, `384 × 4096 × 1536`: `gemm` 227 GFLOP/s on one core, the kernel
///   204 packing both operands);
/// - a plain product (no bias, no activation) of depth at most 512 and at most 1152 columns
///   (`4096 × 384 × 384`: `gemm` 505 GFLOP/s on two cores, the kernel 480 to 488; at
///   `4096 × 384 × 1152`, 471 to 488 against 464 to 476). With a bias or an activation the
///   kernel's fused store wins: `gemm`'s second pass costs more than the gap.
/// - fewer than [`MIN_DIRECT_ROWS`] rows: the kernel reads the right operand in place, a
///   panel's 128 bytes from each row, which only pays with enough rows to share each load
///   (`1 × 384 × 1536` on one core: `gemm` 55 GFLOP/s, the kernel 29 in place and 49 on a
///   packed weight; 4 rows: 165, 110 and 220; 8 rows: 165, 221 and 257).
///
/// [`matmul_packed`] keeps the kernel: its right operand exists only as panels.
fn gemm_is_faster(lhs: MatRef<'_, f32>, [m, k, n]: [usize; 3], epilogue: &Epilogue<'_>) -> bool {
    let strided = lhs.col_stride != 1 && k > 1;
    let plain = epilogue.bias.is_none() && epilogue.activation == Activation::Identity;
    m < MIN_DIRECT_ROWS || (m > SMALL_M && (strided || (plain && k <= 512 && n <= 1152)))
}

/// The fewest rows [`matmul`] multiplies with the kernel (see `gemm_is_faster`).
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
enum Rhs<'a> {
    /// Panels of [`NR`] columns.
    Packed(&'a PackedRhs),
    /// Rows read in place (contiguous columns), for few rows of output.
    Direct(MatRef<'a, f32>),
}

/// `gemm` on each `(first column, columns, view)` part of the right operand, then the
/// epilogue as a second pass.
fn portable(
    dst: &mut [f32],
    stride: usize,
    lhs: MatRef<'_, f32>,
    parts: &[(usize, usize, MatRef<'_, f32>)],
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    let [m, k] = lhs.shape();
    let parallelism = if parallel {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    let (lhs_ptr, lhs_row, lhs_col) = lhs.raw_parts();
    for &(j0, cols, rhs) in parts {
        let (rhs_ptr, rhs_row, rhs_col) = rhs.raw_parts();
        // SAFETY: `dst` holds `m` rows of `stride` elements and columns `j0..j0 + cols` lie in
        // the first `n ≤ stride`; both views were bounds-checked when made.
        unsafe {
            gemm::gemm(
                m,
                cols,
                k,
                dst.as_mut_ptr().add(j0),
                1,
                stride as isize,
                epilogue.accumulate,
                lhs_ptr,
                lhs_col,
                lhs_row,
                rhs_ptr,
                rhs_col,
                rhs_row,
                1.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
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
        epilogue.activation.apply_to(row);
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Activation, Epilogue, KC, MC, MR, MatRef, NR, Rhs, SMALL_M, SendPtr};

    /// How one tile reads the left operand: row `r`, step `p` at `a + r·row + p·step`.
    #[derive(Clone, Copy)]
    struct Lhs {
        a: *const f32,
        row: isize,
        step: isize,
    }

    /// How a tile stores: the epilogue's parts for this block of depth.
    #[derive(Clone, Copy)]
    struct Store<'a> {
        /// Add to `dst` (the caller's accumulate, or a later block of depth).
        accumulate: bool,
        /// The bias of the tile's columns (applied with the last block of depth only).
        bias: Option<&'a [f32]>,
        /// Applied with the last block of depth only.
        activation: Activation,
    }

    /// See [`super::matmul`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) fn matmul(
        dst: &mut [f32],
        stride: usize,
        lhs: MatRef<'_, f32>,
        rhs: Rhs<'_>,
        epilogue: Epilogue<'_>,
        parallel: bool,
    ) {
        use rayon::prelude::*;
        let ([m, k], n) = (
            lhs.shape(),
            match rhs {
                Rhs::Packed(p) => p.n,
                Rhs::Direct(v) => v.shape()[1],
            },
        );
        let out = SendPtr(dst.as_mut_ptr());
        // Equal blocks of depth, each at most KC.
        let blocks = k.div_ceil(KC).max(1);
        let kc = k.div_ceil(blocks);
        let panels = n.div_ceil(NR);
        let threads = if parallel {
            rayon::current_num_threads()
        } else {
            1
        };
        if m <= SMALL_M {
            // Groups of panels, a few per thread so that a busy core can be helped.
            let groups = (threads * 4).min(panels).max(1);
            let per = panels.div_ceil(groups);
            let run = |g: usize| {
                let (p0, p1) = (g * per, ((g + 1) * per).min(panels));
                // SAFETY: each group writes only its own columns of `dst`.
                unsafe { block(out, stride, lhs, rhs, epilogue, [0, m], [p0, p1], k, kc) };
            };
            if threads > 1 && m * n * k >= 1 << 18 {
                (0..panels.div_ceil(per)).into_par_iter().for_each(run);
            } else {
                (0..panels.div_ceil(per)).for_each(run);
            }
        } else {
            // Blocks of at most MC rows, as many as a multiple of the threads (400 rows on
            // two threads: four blocks of 100, not three of up to 192, one thread doing two).
            let blocks = m.div_ceil(MC).div_ceil(threads) * threads;
            let mc = m.div_ceil(blocks);
            let run = |b: usize| {
                let (i0, i1) = ((b * mc).min(m), ((b + 1) * mc).min(m));
                // SAFETY: each block writes only its own rows of `dst`.
                unsafe {
                    block(
                        out,
                        stride,
                        lhs,
                        rhs,
                        epilogue,
                        [i0, i1],
                        [0, panels],
                        k,
                        kc,
                    )
                };
            };
            if threads > 1 {
                (0..blocks).into_par_iter().for_each(run);
            } else {
                (0..blocks).for_each(run);
            }
        }
    }

    /// Rows `i0..i1` by panels `p0..p1` of the output, block of depth by block of depth.
    ///
    /// # Safety
    /// `out` is the checked destination; no other thread writes these rows and columns.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block(
        out: SendPtr<f32>,
        stride: usize,
        lhs: MatRef<'_, f32>,
        rhs: Rhs<'_>,
        epilogue: Epilogue<'_>,
        [i0, i1]: [usize; 2],
        [p0, p1]: [usize; 2],
        k: usize,
        kc: usize,
    ) {
        let n = match rhs {
            Rhs::Packed(p) => p.n,
            Rhs::Direct(v) => v.shape()[1],
        };
        let (a_base, a_row, a_col) = lhs.raw_parts();
        // Rows contiguous in depth are read in place; other layouts are packed, a row tile
        // at a time, as `kc` steps of `MR` values.
        let in_place = a_col == 1 || k <= 1;
        let mut packed_a: Vec<f32> = Vec::new();
        let mut edge: Vec<f32> = Vec::new();
        // Tiles of nearly equal heights (16 rows: two of 8, not 14 and 2): a short tile has
        // too few accumulators to keep both pipes busy.
        let tiles = (i1 - i0).div_ceil(MR);
        let (base, extra) = ((i1 - i0) / tiles.max(1), (i1 - i0) % tiles.max(1));
        let tile_rows = |t: usize| -> (usize, usize) {
            (i0 + t * base + t.min(extra), base + usize::from(t < extra))
        };
        let mut p_start = 0;
        while p_start < k || (k == 0 && p_start == 0) {
            let depth = kc.min(k - p_start);
            let last = p_start + depth >= k;
            let store = Store {
                accumulate: epilogue.accumulate || p_start > 0,
                bias: epilogue.bias.filter(|_| last),
                activation: if last {
                    epilogue.activation
                } else {
                    Activation::Identity
                },
            };
            if !in_place {
                packed_a.clear();
                packed_a.resize(tiles * depth * MR, 0.0);
                for t in 0..tiles {
                    let (i, rows) = tile_rows(t);
                    let tile = &mut packed_a[t * depth * MR..(t + 1) * depth * MR];
                    for (p, step) in tile.chunks_exact_mut(MR).enumerate() {
                        // SAFETY: rows `i..i + rows` and this step of depth lie in the view,
                        // whose elements were bounds-checked when it was made.
                        let from = a_base
                            .wrapping_offset(i as isize * a_row + (p_start + p) as isize * a_col);
                        for (r, slot) in step[..rows].iter_mut().enumerate() {
                            *slot = unsafe { *from.offset(r as isize * a_row) };
                        }
                    }
                }
            }
            for p in p0..p1 {
                let (j, cols) = (p * NR, NR.min(n - p * NR));
                // The panel's block of depth: `depth` rows `b_step` apart.
                let (b, b_step): (*const f32, isize) = match rhs {
                    Rhs::Packed(packed) => (packed.panel(p)[p_start * NR..].as_ptr(), NR as isize),
                    Rhs::Direct(view) if cols == NR => {
                        let (base, row, _) = view.cols(j, cols).raw_parts();
                        (base.wrapping_offset(p_start as isize * row), row)
                    }
                    Rhs::Direct(view) => {
                        // The last, narrow panel: packed, so that full loads stay inside.
                        edge.resize(depth * NR, 0.0);
                        super::pack_panel(&mut edge, view.rows(p_start, depth).cols(j, cols));
                        (edge.as_ptr(), NR as isize)
                    }
                };
                let bias = store.bias.map(|b| &b[j..j + cols]);
                let store = Store { bias, ..store };
                for t in 0..tiles {
                    let (i, rows) = tile_rows(t);
                    let a = if in_place {
                        Lhs {
                            a: a_base
                                .wrapping_offset(i as isize * a_row + p_start as isize * a_col),
                            row: a_row,
                            step: 1,
                        }
                    } else {
                        Lhs {
                            a: packed_a[t * depth * MR..].as_ptr(),
                            row: 1,
                            step: MR as isize,
                        }
                    };
                    // SAFETY: the tile's rows and columns lie in `dst` and in the operands.
                    unsafe {
                        let c = out.get().add(i * stride + j);
                        tile_dispatch(rows, cols, depth, a, b, b_step, c, stride, store);
                    }
                }
            }
            p_start += depth;
            if k == 0 {
                break;
            }
        }
    }

    /// The kernel for a tile of `rows ≤ MR` rows and `cols ≤ NR` columns.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_dispatch(
        rows: usize,
        cols: usize,
        depth: usize,
        a: Lhs,
        b: *const f32,
        b_step: isize,
        c: *mut f32,
        stride: usize,
        store: Store<'_>,
    ) {
        macro_rules! go {
            ($($r:literal)*) => {
                match (rows, cols > 16) {
                    $(
                        ($r, true) => tile::<$r, 2>(depth, a, b, b_step, c, stride, cols, store),
                        ($r, false) => tile::<$r, 1>(depth, a, b, b_step, c, stride, cols, store),
                    )*
                    _ => unreachable!(),
                }
            };
        }
        // SAFETY: forwarded from the caller.
        unsafe { go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14) }
    }

    /// The epilogue of a tile whose sums are in `tile`: `cols` columns of each row, bias
    /// added, accumulated, activated, stored under a mask.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    #[inline(never)]
    unsafe fn store_tile(
        tile: &[[f32; 32]],
        c: *mut f32,
        stride: usize,
        cols: usize,
        store: Store<'_>,
    ) {
        for col in (0..cols).step_by(16) {
            let mask: __mmask16 = if cols - col >= 16 {
                0xFFFF
            } else {
                (1 << (cols - col)) - 1
            };
            // SAFETY: the caller's tile lies in `dst` (the masked lanes) and its bias slice
            // holds `cols` values.
            unsafe {
                let bias = match store.bias {
                    Some(bias) => _mm512_maskz_loadu_ps(mask, bias.as_ptr().add(col)),
                    None => _mm512_setzero_ps(),
                };
                for (r, row) in tile.iter().enumerate() {
                    let out = c.add(r * stride + col);
                    let mut value = _mm512_add_ps(_mm512_loadu_ps(row.as_ptr().add(col)), bias);
                    if store.accumulate {
                        value = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), value);
                    }
                    match store.activation {
                        Activation::Identity => {}
                        Activation::Relu => value = _mm512_max_ps(value, _mm512_setzero_ps()),
                        Activation::Gelu => {
                            let mut lanes = [0.0f32; 16];
                            _mm512_storeu_ps(lanes.as_mut_ptr(), value);
                            for l in &mut lanes {
                                *l = Activation::Gelu.apply_f32(*l);
                            }
                            value = _mm512_loadu_ps(lanes.as_ptr());
                        }
                    }
                    _mm512_mask_storeu_ps(out, mask, value);
                }
            }
        }
    }

    /// `R × 16·NV` outputs over `depth` steps in registers, then stored once.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
    #[allow(clippy::too_many_arguments)]
    #[inline]
    unsafe fn tile<const R: usize, const NV: usize>(
        depth: usize,
        a: Lhs,
        b: *const f32,
        b_step: isize,
        c: *mut f32,
        stride: usize,
        cols: usize,
        store: Store<'_>,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        let mut b = b;
        // SAFETY: the caller's operands hold `depth` steps of `R` rows and `16·NV` columns.
        unsafe {
            // The tile's lines of `dst`, fetched while the sums are computed: its stores
            // (and loads, when accumulating) would otherwise wait for memory.
            for r in 0..R {
                let row = c.add(r * stride);
                _mm_prefetch::<_MM_HINT_T0>(row.cast());
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(16 * NV - 1).cast());
            }
            if a.step == 1 {
                let rows: [*const f32; R] = std::array::from_fn(|r| a.a.offset(r as isize * a.row));
                for p in 0..depth {
                    let bv: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(b.add(16 * v)));
                    for (acc, row) in acc.iter_mut().zip(&rows) {
                        let av = _mm512_set1_ps(*row.add(p));
                        for (acc, &bv) in acc.iter_mut().zip(&bv) {
                            *acc = _mm512_fmadd_ps(av, bv, *acc);
                        }
                    }
                    b = b.offset(b_step);
                }
            } else {
                let mut ap = a.a;
                for _ in 0..depth {
                    let bv: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(b.add(16 * v)));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let av = _mm512_set1_ps(*ap.add(r));
                        for (acc, &bv) in acc.iter_mut().zip(&bv) {
                            *acc = _mm512_fmadd_ps(av, bv, *acc);
                        }
                    }
                    ap = ap.offset(a.step);
                    b = b.offset(b_step);
                }
            }
            // The accumulators leave their registers through a buffer, in loops of constant
            // trip counts: a store that indexed them at run time (masks, activations) would
            // make the compiler keep them in memory, written back at every step above.
            let mut tile = [[0.0f32; 32]; R];
            for (row, acc) in tile.iter_mut().zip(&acc) {
                for (v, &acc) in acc.iter().enumerate() {
                    _mm512_storeu_ps(row.as_mut_ptr().add(16 * v), acc);
                }
            }
            store_tile(&tile, c, stride, cols.min(16 * NV), store);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1) (xorshift), so that failures reproduce.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// `f(reference + bias)`, or `f(before + reference + bias)` with `accumulate`.
    fn expected(
        want: &[f64],
        n: usize,
        before: Option<(&[f32], usize)>,
        epilogue: &Epilogue<'_>,
    ) -> Vec<f64> {
        want.iter()
            .enumerate()
            .map(|(q, &v)| {
                let (i, j) = (q / n, q % n);
                let base = before.map_or(0.0, |(b, stride)| b[i * stride + j] as f64);
                let bias = epilogue.bias.map_or(0.0, |b| b[j] as f64);
                epilogue.activation.apply_f64(base + v + bias)
            })
            .collect()
    }

    /// Every output within `tolerance·(√k + 1)` of the `f64` value (operands in [-1, 1)),
    /// and the padding columns past `n` untouched.
    fn check(got: &[f32], stride: usize, want: &[f64], n: usize, k: usize, what: &str) {
        let tolerance = 2e-6 * ((k as f64).sqrt() + 1.0);
        for (i, row) in want.chunks(n).enumerate() {
            for (j, &w) in row.iter().enumerate() {
                let g = got[i * stride + j] as f64;
                assert!(
                    (g - w).abs() <= tolerance * w.abs().max(1.0),
                    "{what} ({i}, {j}): {g} against {w}"
                );
            }
            for j in n..stride {
                assert_eq!(
                    got[i * stride + j].to_bits(),
                    7.0f32.to_bits(),
                    "{what}: padding"
                );
            }
        }
    }

    /// `lhs` and `rhs` as views: row-major, transposed (the transposed buffer read through
    /// swapped strides) or strided (every other element of a buffer twice as wide).
    fn view(data: &[f32], rows: usize, cols: usize, layout: u8, buffer: &mut Vec<f32>) {
        buffer.clear();
        match layout {
            0 => buffer.extend_from_slice(data),
            1 => buffer.extend((0..rows * cols).map(|q| data[(q % rows) * cols + q / rows])),
            _ => buffer.extend(data.iter().flat_map(|&v| [v, -99.0])),
        }
    }

    fn make(buffer: &[f32], rows: usize, cols: usize, layout: u8) -> MatRef<'_, f32> {
        match layout {
            0 => MatRef::row_major(buffer, rows, cols),
            1 => MatRef::row_major(buffer, cols, rows).t(),
            _ => MatRef::strided(buffer, 0, [rows, cols], [2 * cols as isize, 2]),
        }
    }

    fn case(m: usize, k: usize, n: usize, layouts: (u8, u8), epilogue: Epilogue<'_>) {
        let (a, b) = (
            values(m * k, (m * 31 + k) as u64),
            values(k * n, (n * 17 + k) as u64),
        );
        let (mut ab, mut bb) = (Vec::new(), Vec::new());
        view(&a, m, k, layouts.0, &mut ab);
        view(&b, k, n, layouts.1, &mut bb);
        let (lhs, rhs) = (make(&ab, m, k, layouts.0), make(&bb, k, n, layouts.1));
        let product = reference(lhs, rhs);
        let stride = n + 2;
        let start: Vec<f32> = values(m * stride, 5)
            .into_iter()
            .enumerate()
            .map(|(q, v)| if q % stride >= n { 7.0 } else { v })
            .collect();
        let before = epilogue.accumulate.then_some((&start[..], stride));
        let want = expected(&product, n, before, &epilogue);
        let what = format!("{m}×{k}×{n} {layouts:?} {epilogue:?}");
        let packed = PackedRhs::pack(rhs);
        assert_eq!(packed.shape(), [k, n]);
        // The kernel sums in the same order whatever the split and the packing: its results
        // are compared bit for bit (where `matmul` routes to `gemm`, only the packed ones).
        let kernel = Isa::detected().avx512() && !gemm_is_faster(lhs, [m, k, n], &epilogue);
        let (mut first, mut first_packed): (Option<Vec<f32>>, Option<Vec<f32>>) = (None, None);
        for path in [Path::Auto, Path::Portable] {
            for parallel in [false, true] {
                let mut y = start.clone();
                matmul_with(path, &mut y, stride, lhs, rhs, epilogue, parallel);
                check(
                    &y,
                    stride,
                    &want,
                    n,
                    k,
                    &format!("{what} {path:?} {parallel}"),
                );
                let mut z = start.clone();
                matmul_packed_with(path, &mut z, stride, lhs, &packed, epilogue, parallel);
                check(&z, stride, &want, n, k, &format!("{what} packed {path:?}"));
                if path == Path::Auto && Isa::detected().avx512() {
                    let same = |a: &[f32], b: &[f32]| {
                        a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
                    };
                    let first_packed = first_packed.get_or_insert_with(|| z.clone());
                    assert!(
                        same(first_packed, &z),
                        "{what}: packed, parallel {parallel}"
                    );
                    if kernel {
                        let first = first.get_or_insert_with(|| y.clone());
                        assert!(same(first, &y), "{what}: parallel {parallel}");
                        assert!(same(first, &z), "{what}: packed and not");
                    }
                }
            }
        }
    }

    const SHAPES: &[(usize, usize, usize)] = &[
        (1, 1, 1),
        (7, 13, 5),
        (33, 65, 17),
        (100, 1, 300),
        (5, 0, 9),
        (0, 4, 3),
        (12, 300, 32),
        (13, 257, 33),
        (64, 40, 100),
        (65, 520, 47),
        (300, 70, 64),
    ];

    #[test]
    fn products_match_the_reference_on_odd_shapes() {
        for &(m, k, n) in SHAPES {
            case(m, k, n, (0, 0), Epilogue::default());
        }
    }

    #[test]
    fn transposed_and_strided_views_are_read_through_their_strides() {
        for &(m, k, n) in SHAPES {
            for layouts in [(1, 0), (0, 1), (1, 1), (2, 2), (2, 1)] {
                case(m, k, n, layouts, Epilogue::default());
            }
        }
    }

    #[test]
    fn the_epilogue_adds_the_bias_accumulates_and_activates() {
        for &(m, k, n) in SHAPES {
            let bias = values(n, 11);
            for activation in [Activation::Identity, Activation::Relu, Activation::Gelu] {
                for accumulate in [false, true] {
                    for bias in [None, Some(&bias[..])] {
                        let e = Epilogue {
                            bias,
                            activation,
                            accumulate,
                        };
                        case(m, k, n, (0, 0), e);
                    }
                }
            }
        }
    }

    /// Deep enough for two blocks of depth (the second accumulates onto the first), tall
    /// enough for several blocks of rows on both threads.
    #[test]
    fn blocked_products_match() {
        let k = KC + 77;
        let bias = values(70, 3);
        let e = Epilogue {
            bias: Some(&bias),
            activation: Activation::Gelu,
            accumulate: true,
        };
        case(2 * MC + 5, k, 70, (0, 0), e);
        case(2 * MC + 5, k, 70, (1, 0), Epilogue::default());
        case(40, k, 70, (0, 1), e);
        case(40, k, 70, (1, 1), Epilogue::default());
    }

    /// The portable path and the kernel agree (the reference checks both; here they are
    /// compared directly, within the `f32` rounding of a depth of 384).
    #[test]
    fn the_portable_path_matches_the_kernel() {
        let (m, k, n) = (97, 384, 130);
        let (a, b) = (values(m * k, 1), values(k * n, 2));
        let (lhs, rhs) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n));
        let (mut fast, mut slow) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
        matmul_with(
            Path::Auto,
            &mut fast,
            n,
            lhs,
            rhs,
            Epilogue::default(),
            true,
        );
        matmul_with(
            Path::Portable,
            &mut slow,
            n,
            lhs,
            rhs,
            Epilogue::default(),
            true,
        );
        let worst = fast
            .iter()
            .zip(&slow)
            .fold(0.0f32, |w, (a, b)| w.max((a - b).abs()));
        assert!(worst <= 1e-4, "{worst}");
    }

    /// The routing rule itself: a transposed left operand of many rows, a plain shallow and
    /// narrow product of many rows, or fewer than 8 rows go to `gemm`; 8 to 64 rows, or an
    /// epilogue, keep the kernel.
    #[test]
    fn the_products_gemm_wins_are_routed_to_it() {
        let a = vec![0.0f32; 100 * 8];
        let plain = Epilogue::default();
        let bias = [0.0f32; 2000];
        let relu = Epilogue {
            activation: Activation::Relu,
            ..plain
        };
        let biased = Epilogue {
            bias: Some(&bias),
            ..plain
        };
        let x = MatRef::row_major(&a, 100, 8);
        let xt = MatRef::row_major(&a, 8, 100).t();
        assert!(gemm_is_faster(xt, [100, 8, 2000], &biased));
        assert!(!gemm_is_faster(xt.rows(0, 64), [64, 8, 2000], &plain));
        assert!(gemm_is_faster(x, [100, 8, 1152], &plain));
        assert!(!gemm_is_faster(x, [100, 8, 1153], &plain));
        assert!(!gemm_is_faster(x, [100, 8, 1152], &relu));
        assert!(!gemm_is_faster(x, [100, 8, 1152], &biased));
        assert!(!gemm_is_faster(x.rows(0, 64), [64, 8, 1152], &plain));
        assert!(gemm_is_faster(x.rows(0, 7), [7, 8, 1152], &relu));
        assert!(!gemm_is_faster(x.rows(0, 8), [8, 8, 1152], &relu));
    }

    #[test]
    #[should_panic(expected = "inner dimensions")]
    fn mismatched_depths_are_refused() {
        let (a, b) = (vec![0.0f32; 6], vec![0.0f32; 8]);
        let mut y = vec![0.0f32; 8];
        let (lhs, rhs) = (MatRef::row_major(&a, 2, 3), MatRef::row_major(&b, 2, 4));
        matmul(&mut y, 4, lhs, rhs, Epilogue::default(), false);
    }
}
