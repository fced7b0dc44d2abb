//! The AVX-512 micro-kernel of [`sgemm`](crate::sgemm): row and column blocking over
//! rayon's threads, the left operand's packing into row tiles, the `MR × 32` tile of
//! multiply-adds held in `zmm` registers for a block of depth, and the store that applies
//! the epilogue (bias, accumulation, activation) under a mask. The routing, the right
//! operand's packing and the portable path are in [`crate::sgemm`].

use std::arch::x86_64::*;

use crate::activation::Activation;
use crate::blocking::SendPtr;
use crate::math::gelu_f;
use crate::sgemm::{COLUMN_SPLIT_ROWS, Epilogue, KC, MC, MR, NR, Rhs, pack_panel};
use crate::view::MatRef;

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

/// The product of [`sgemm::matmul_on`](crate::sgemm::matmul_on) on the kernel: the
/// blocks of rows (or, for at most `COLUMN_SPLIT_ROWS` rows, the groups of panels) shared
/// out over rayon's threads, each written by one.
///
/// # Safety
/// Callable only where the CPU has AVX-512 F, BW, VL, DQ and FMA (the store's GELU fuses
/// its multiply-adds), which is where [`Isa::avx512`](crate::Isa::avx512) holds. The
/// caller checked the shapes: `dst` holds `lhs.rows` rows of `stride ≥ n` values, `rhs`
/// has `lhs.cols` rows and `n` columns, and a bias has `n` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq")]
pub(crate) fn matmul(
    dst: &mut [f32],
    stride: usize,
    lhs: MatRef<'_, f32>,
    rhs: Rhs<'_>,
    epilogue: Epilogue<'_>,
    parallel: bool,
) {
    use rayon::prelude::*;
    let ([m, k], n) = (lhs.shape(), rhs.cols());
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
    if m <= COLUMN_SPLIT_ROWS {
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
/// The CPU has AVX-512 F, BW, VL, DQ and FMA; `out` is the checked destination of
/// [`matmul`]'s shapes, rows `i0..i1` and panels `p0..p1` lie in it, and no other thread
/// writes these rows and columns while the call runs.
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
    let n = rhs.cols();
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
                    let from =
                        a_base.wrapping_offset(i as isize * a_row + (p_start + p) as isize * a_col);
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
                    pack_panel(&mut edge, view.rows(p_start, depth).cols(j, cols));
                    (edge.as_ptr(), NR as isize)
                }
            };
            let bias = store.bias.map(|b| &b[j..j + cols]);
            let store = Store { bias, ..store };
            for t in 0..tiles {
                let (i, rows) = tile_rows(t);
                let a = if in_place {
                    Lhs {
                        a: a_base.wrapping_offset(i as isize * a_row + p_start as isize * a_col),
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
///
/// # Safety
/// The CPU has AVX-512 F, BW, VL, DQ and FMA; `1 ≤ rows ≤ MR` and `1 ≤ cols ≤ NR`; `a` reads
/// `depth` steps of `rows` rows, `b` `depth` rows of `NR` values `b_step` apart, and `c`
/// addresses `rows` rows of `stride` values with `cols` columns writable, as [`tile`].
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
/// added, accumulated, activated, stored under a mask. GELU is [`gelu_f`] with fused
/// multiply-adds, bit for bit [`Activation::apply_to_on`] on an `Isa` with AVX-512.
///
/// # Safety
/// The CPU has AVX-512 F, BW, VL, DQ and FMA; `cols ≤ 32`; `c` addresses `tile.len()` rows
/// of `stride` values whose first `cols` are writable (and readable, with `accumulate`), and
/// the bias, if any, holds `cols` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
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
                            *l = gelu_f::<true>(*l);
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
///
/// # Safety
/// The CPU has AVX-512 F, BW, VL, DQ and FMA; `a` holds `depth` steps of `R` rows (row `r`,
/// step `p` at `a.a + r·a.row + p·a.step`), `b` `depth` rows of `16·NV` readable values
/// `b_step` apart, and `c` `R` rows of `stride` values with `cols.min(16·NV)` writable.
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
