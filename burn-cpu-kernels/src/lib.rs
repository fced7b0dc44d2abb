//! CPU kernels on the instructions this CPU has, chosen at run time: matrix products in `f32`,
//! `bf16` (with `f32` accumulation) and `int8` (with `i32` accumulation), fused attention and
//! the element-wise and row operations a transformer spends the rest of its time in.
//!
//! `gemm` (behind Flex's `matmul` and burn-sketch's Flex path) has no `bf16` or `int8` kernels
//! and no fused epilogue: Flex multiplies `bf16` through `f32` copies, and Burn 0.21's
//! quantized tensors are dequantized before a product. This crate supplies what they lack:
//!
//! | product | AVX-512 path (detected at run time) | portable path |
//! |---|---|---|
//! | [`bf16::matmul`] | `vdpbf16ps` (AVX512-BF16): two `bf16` products summed into `f32` per lane | `f32` copies multiplied by `gemm` |
//! | [`int8::matmul`] | `vpdpbusd` (AVX512-VNNI): four `u8 × i8` products summed into `i32` per lane | the same integer sums, one at a time |
//! | [`sgemm::matmul`] | `vfmadd231ps` on a 14 × 32 tile (the bias and activation in its store) | `gemm`, then the epilogue |
//!
//! The kernels pack their operands into panels, keep a tile of the output in registers for
//! the whole depth, and write it once (`int8` applies its scales and bias in that write).
//! AMX is reported by [`Features`] but not used: no machine this project runs on has it, and
//! code we cannot run is a claim we cannot test.
//!
//! Setting `BURN_SKETCH_PORTABLE=1` in the environment forces the portable paths (read once,
//! at the first product): the same results within each precision's tolerance, for checking
//! and for comparing speeds.
//!
//! - [`bf16`]: the `bf16` product ([`bf16::matmul`]) and its `f64` reference;
//! - [`int8`]: quantized matrices and the `int8` product ([`int8::matmul`]);
//! - [`mod@activation`]: the [`Activation`] a product applies as it stores its output;
//! - [`attention`]: fused scaled-dot-product attention ([`attention::forward`]), Burn's semantics;
//! - [`sgemm`]: the `f32` product with a fused bias and activation ([`sgemm::matmul`]);
//! - [`math`]: `exp`, `erf`, `tanh` and the exact GELU over slices, vectorised (within an ulp);
//! - [`softmax`]: softmax, log-softmax (masked as Burn's `mask_fill(−∞)`) and their backward
//!   over rows;
//! - [`layer_norm`]: layer normalisation over rows and its backward;
//! - [`math::Isa`]: forces the portable path of those three for tests and benchmarks;
//! - [`peak`]: this CPU's measured peak per kind of product, for benchmarks;
//! - [`Features`], [`features`]: which instructions this CPU has, detected once;
//! - [`MatRef`], [`gemm()`]: strided matrix views, and one `gemm` call on them.

pub mod activation;
pub mod attention;
pub mod bf16;
mod detect;
pub mod int8;
pub mod layer_norm;
pub mod math;
pub mod peak;
pub mod sgemm;
pub mod softmax;

pub use activation::Activation;
pub use detect::{Features, features};

/// A strided, read-only matrix of `T`, in elements: row `i`, column `j` is at
/// `offset + i·row_stride + j·col_stride` of `data`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    data: &'a [T],
    offset: usize,
    rows: usize,
    cols: usize,
    row_stride: isize,
    col_stride: isize,
}

impl<'a, T: Copy> MatRef<'a, T> {
    /// A row-major `rows × cols` matrix.
    ///
    /// # Panics
    /// If `data` does not hold exactly `rows · cols` elements.
    pub fn row_major(data: &'a [T], rows: usize, cols: usize) -> Self {
        assert_eq!(
            data.len(),
            rows * cols,
            "a {rows}×{cols} row-major matrix needs {} elements, got {}",
            rows * cols,
            data.len()
        );
        Self::strided(data, 0, [rows, cols], [cols as isize, 1])
    }

    /// A matrix through strides (transposed or sliced views of a buffer).
    ///
    /// # Panics
    /// If an element of the view lies outside `data`.
    pub fn strided(
        data: &'a [T],
        offset: usize,
        [rows, cols]: [usize; 2],
        [row_stride, col_stride]: [isize; 2],
    ) -> Self {
        let view = Self {
            data,
            offset,
            rows,
            cols,
            row_stride,
            col_stride,
        };
        if rows > 0 && cols > 0 {
            let reach = |size: usize, stride: isize| (size as isize - 1) * stride;
            let (r, c) = (reach(rows, row_stride), reach(cols, col_stride));
            let low = offset as isize + r.min(0) + c.min(0);
            let high = offset as isize + r.max(0) + c.max(0);
            assert!(
                low >= 0 && (high as usize) < data.len(),
                "a {rows}×{cols} view with strides ({row_stride}, {col_stride}) at {offset} \
                 reaches outside its buffer of {}",
                data.len()
            );
        }
        view
    }

    /// The transpose: the same buffer, strides swapped.
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Rows `start..start + count`.
    ///
    /// # Panics
    /// If the range is outside the matrix.
    pub fn rows(self, start: usize, count: usize) -> Self {
        assert!(start + count <= self.rows, "rows out of range");
        Self {
            offset: (self.offset as isize + start as isize * self.row_stride) as usize,
            rows: count,
            ..self
        }
    }

    /// Columns `start..start + count`.
    ///
    /// # Panics
    /// If the range is outside the matrix.
    pub fn cols(self, start: usize, count: usize) -> Self {
        self.t().rows(start, count).t()
    }

    /// `[rows, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// The first element's address and the `(row, column)` strides, for engines that read
    /// through raw pointers (every element of the view lies in the buffer).
    pub(crate) fn raw_parts(&self) -> (*const T, isize, isize) {
        (
            self.data.as_ptr().wrapping_add(self.offset),
            self.row_stride,
            self.col_stride,
        )
    }

    /// Element `(i, j)`.
    #[inline]
    pub fn at(&self, i: usize, j: usize) -> T {
        self.data[(self.offset as isize
            + i as isize * self.row_stride
            + j as isize * self.col_stride) as usize]
    }
}

/// An element type `gemm` multiplies natively.
pub trait GemmElement: Copy + Send + Sync + 'static {
    const ONE: Self;
}

impl GemmElement for f32 {
    const ONE: Self = 1.0;
}
impl GemmElement for f64 {
    const ONE: Self = 1.0;
}
impl GemmElement for ::half::f16 {
    const ONE: Self = ::half::f16::ONE;
}

/// One `gemm` call on strided views: `dst = beta·lhs·rhs`, or `+=` with `accumulate`, into
/// the first columns of `dst`'s rows of `stride` elements.
pub fn gemm<T: GemmElement>(
    dst: &mut [T],
    stride: usize,
    lhs: MatRef<'_, T>,
    rhs: MatRef<'_, T>,
    beta: T,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    let ([m, k], [k2, n]) = (lhs.shape(), rhs.shape());
    assert!(k2 == k && n <= stride && dst.len() == m * stride);
    let (lhs_ptr, lhs_row, lhs_col) = lhs.raw_parts();
    let (rhs_ptr, rhs_row, rhs_col) = rhs.raw_parts();
    // SAFETY: `dst` holds m rows of `stride ≥ n` elements and `MatRef::strided` checked that
    // every element of both views lies inside its buffer; `gemm` dispatches on `T` (f32, f64,
    // f16).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            stride as isize,
            accumulate,
            lhs_ptr,
            lhs_col,
            lhs_row,
            rhs_ptr,
            rhs_col,
            rhs_row,
            T::ONE,
            beta,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `(MR, NR)`: the output tile of both kernels for a product `n` columns wide, rows by
/// columns; 16 or 24 accumulators, the panel no wider than the product.
fn tile_shape(n: usize) -> (usize, usize) {
    match n {
        0..=16 => (16, 16),
        17..=32 => (12, 32),
        _ => (6, 64),
    }
}

/// How a product's output is shared among rayon's threads: the side with more tiles is cut
/// into one contiguous chunk per thread, each packed and multiplied on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    Rows(usize),
    Cols(usize),
}

impl Split {
    fn of(m: usize, n: usize, row_tile: usize, col_tile: usize, threads: usize) -> Self {
        let (row_tiles, col_tiles) = (m.div_ceil(row_tile), n.div_ceil(col_tile));
        if row_tiles >= col_tiles {
            Self::Rows(row_tiles.div_ceil(threads.max(1)) * row_tile)
        } else {
            Self::Cols(col_tiles.div_ceil(threads.max(1)) * col_tile)
        }
    }
}

/// A raw pointer that crosses rayon's threads; each thread writes a disjoint part.
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);

impl<T> SendPtr<T> {
    /// The pointer (a method, so that closures capture the wrapper, not its field).
    fn get(self) -> *mut T {
        self.0
    }
}
// SAFETY: the products hand each thread a disjoint block of rows or columns of the output.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}

/// Runs `block(row_start, rows, col_start, cols)` on every chunk of an `m × n` output, in
/// parallel when `parallel`.
fn for_each_block(
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
    fn views_read_through_their_strides() {
        let data: Vec<i32> = (0..12).collect();
        let m = MatRef::row_major(&data, 3, 4);
        assert_eq!(m.at(2, 1), 9);
        assert_eq!(m.t().at(1, 2), 9);
        assert_eq!(m.rows(1, 2).cols(2, 2).at(1, 1), 11);
        assert_eq!(m.t().shape(), [4, 3]);
    }

    #[test]
    #[should_panic(expected = "outside its buffer")]
    fn a_view_past_its_buffer_is_refused() {
        let data = [0.0f32; 6];
        MatRef::strided(&data, 1, [2, 3], [3, 1]);
    }

    #[test]
    fn the_split_cuts_the_side_with_more_tiles() {
        assert_eq!(Split::of(256, 32, 8, 32, 2), Split::Rows(128));
        assert_eq!(Split::of(16, 8192, 8, 64, 2), Split::Cols(4096));
        assert_eq!(Split::of(3, 5, 8, 64, 4), Split::Rows(8));
    }
}
