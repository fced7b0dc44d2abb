//! How the `bf16` and `int8` products cut their output among rayon's threads
//! ([`for_each_block`], [`Split`]) and into register tiles ([`tile_shape`]), and the pointer
//! their threads write through ([`SendPtr`], which the `f32` product uses too).
//!
//! Why one module: both kernels keep a tile of the output in registers for the whole depth
//! and pack their right operand in panels as wide as the tile (the `int8` one when a weight
//! is quantized, ahead of any product), so the tile shape, the panels and the threads' cut
//! must agree; here they are decided once for both.

/// `(MR, NR)`: the output tile of both kernels for a product `n` columns wide, rows by
/// columns. Why these: `MR × NR/16` accumulators (16 or 24) plus a panel row of `NR/16`
/// registers and a broadcast fit AVX-512's 32 registers, and a narrow product (`n ≤ 32`)
/// takes the narrowest panel that covers it, so that it multiplies little padding.
pub(crate) fn tile_shape(n: usize) -> (usize, usize) {
    match n {
        0..=16 => (16, 16),
        17..=32 => (12, 32),
        _ => (6, 64),
    }
}

/// How a product's output is shared among rayon's threads: the side with more tiles is cut
/// into one contiguous chunk of whole tiles per thread, each packed and multiplied on its
/// own. Why that side: it has the tiles to keep every thread busy (a tall product has few
/// column tiles, a wide one few row tiles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Split {
    /// Chunks of this many rows (a multiple of the row tile), every column each.
    Rows(usize),
    /// Chunks of this many columns (a multiple of the column tile), every row each.
    Cols(usize),
}

impl Split {
    /// The split of an `m × n` output in tiles of `row_tile × col_tile` among `threads`.
    pub(crate) fn of(m: usize, n: usize, row_tile: usize, col_tile: usize, threads: usize) -> Self {
        let (row_tiles, col_tiles) = (m.div_ceil(row_tile), n.div_ceil(col_tile));
        if row_tiles >= col_tiles {
            Self::Rows(row_tiles.div_ceil(threads.max(1)) * row_tile)
        } else {
            Self::Cols(col_tiles.div_ceil(threads.max(1)) * col_tile)
        }
    }
}

/// A raw pointer to a product's output that crosses rayon's threads, each writing a disjoint
/// part: the threads' blocks are not slices that `split_at_mut` could hand out (a block of
/// columns is strided), so they share the pointer and the kernels promise disjointness.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub(crate) *mut T);

impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the wrapper, not its field).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: the products hand each thread a disjoint block of rows or columns of the output.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

/// Runs `block(row_start, rows, col_start, cols)` on every chunk of an `m × n` output (as
/// [`Split::of`] cuts it, one chunk per thread), in parallel when `parallel`; nothing for an
/// empty output.
pub(crate) fn for_each_block(
    [m, n]: [usize; 2],
    [row_tile, col_tile]: [usize; 2],
    parallel: bool,
    block: impl Fn(usize, usize, usize, usize) + Sync,
) {
    use rayon::prelude::*;
    if m == 0 || n == 0 {
        return;
    }
    let threads = if parallel {
        rayon::current_num_threads()
    } else {
        1
    };
    match Split::of(m, n, row_tile, col_tile, threads) {
        Split::Rows(rows) => (0..m.div_ceil(rows)).into_par_iter().for_each(|i| {
            let start = i * rows;
            block(start, rows.min(m - start), 0, n)
        }),
        Split::Cols(cols) => (0..n.div_ceil(cols)).into_par_iter().for_each(|j| {
            let start = j * cols;
            block(0, m, start, cols.min(n - start))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_cuts_the_side_with_more_tiles() {
        assert_eq!(Split::of(256, 32, 8, 32, 2), Split::Rows(128));
        assert_eq!(Split::of(16, 8192, 8, 64, 2), Split::Cols(4096));
        assert_eq!(Split::of(3, 5, 8, 64, 4), Split::Rows(8));
    }
}
