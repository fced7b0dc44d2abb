//! Strided, read-only views of the operands a kernel reads, and one `gemm` call on them.
//!
//! Why views and not slices: a kernel reads transposed weights, sliced heads and permuted
//! activations through their strides, without a copy; the bounds are checked once, when a
//! view is made, so that the kernels may read through raw pointers.

/// A strided, read-only matrix of `T`, in elements: row `i`, column `j` is at
/// `offset + i·row_stride + j·col_stride` of `data`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a, T> {
    pub(crate) data: &'a [T],
    pub(crate) offset: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_stride: isize,
    pub(crate) col_stride: isize,
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
}
