//! Strided, read-only views of the operands a kernel reads ([`MatRef`], a matrix, and
//! [`View4`], a 4-D tensor), and one `gemm` call on them.
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

/// A strided, read-only 4-D tensor of `T`, in elements: index `[i0, i1, i2, i3]` is at
/// `offset + Σ iₙ·stridesₙ` of `data`. Burn tensors arrive permuted (after `swap_dims` of a
/// `[b, s, h, d]` projection, say); a view reads them in place, without a copy.
#[derive(Clone, Copy, Debug)]
pub struct View4<'a, T> {
    pub(crate) data: &'a [T],
    pub(crate) offset: usize,
    pub(crate) shape: [usize; 4],
    pub(crate) strides: [isize; 4],
}

impl<'a, T: Copy> View4<'a, T> {
    /// A contiguous (row-major) tensor of `shape`.
    ///
    /// # Panics
    /// If `data` does not hold exactly the product of `shape` elements.
    pub fn contiguous(data: &'a [T], shape: [usize; 4]) -> Self {
        let count: usize = shape.iter().product();
        assert_eq!(
            data.len(),
            count,
            "a contiguous {shape:?} tensor needs {count} elements, got {}",
            data.len()
        );
        let [_, s1, s2, s3] = shape;
        let strides = [s1 * s2 * s3, s2 * s3, s3, 1].map(|s| s as isize);
        Self::strided(data, 0, shape, strides)
    }

    /// A tensor through strides (permuted, sliced, broadcast with stride 0, or flipped with
    /// negative strides).
    ///
    /// # Panics
    /// If an element of the view lies outside `data`.
    pub fn strided(data: &'a [T], offset: usize, shape: [usize; 4], strides: [isize; 4]) -> Self {
        if shape.iter().all(|&s| s > 0) {
            let (mut low, mut high) = (offset as isize, offset as isize);
            for (&size, &stride) in shape.iter().zip(&strides) {
                let reach = (size as isize - 1) * stride;
                low += reach.min(0);
                high += reach.max(0);
            }
            assert!(
                low >= 0 && (high as usize) < data.len(),
                "a {shape:?} view with strides {strides:?} at {offset} reaches outside its \
                 buffer of {}",
                data.len()
            );
        }
        Self {
            data,
            offset,
            shape,
            strides,
        }
    }

    /// The same elements with their dimensions reordered: dimension `n` of the result is
    /// dimension `axes[n]` of `self` (`[0, 2, 1, 3]` turns `[b, s, h, d]` into `[b, h, s, d]`).
    ///
    /// # Panics
    /// If `axes` is not a permutation of `0..4`.
    pub fn permute(self, axes: [usize; 4]) -> Self {
        let mut seen = [false; 4];
        for &a in &axes {
            assert!(a < 4 && !seen[a], "{axes:?} is not a permutation of 0..4");
            seen[a] = true;
        }
        Self {
            shape: axes.map(|a| self.shape[a]),
            strides: axes.map(|a| self.strides[a]),
            ..self
        }
    }

    /// `[d0, d1, d2, d3]`.
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    /// The element at `index`.
    ///
    /// # Panics
    /// If `index` is outside the shape.
    pub fn at(&self, index: [usize; 4]) -> T {
        assert!(
            index.iter().zip(&self.shape).all(|(i, s)| i < s),
            "{index:?} is outside {:?}",
            self.shape
        );
        self.data[self.position(index) as usize]
    }

    /// The position of `index` in `data` (not checked).
    pub(crate) fn position(&self, index: [usize; 4]) -> isize {
        let mut at = self.offset as isize;
        for (&i, &stride) in index.iter().zip(&self.strides) {
            at += i as isize * stride;
        }
        at
    }

    /// The view read as `target`: each dimension equal to the target's, or 1 (read with
    /// stride 0).
    ///
    /// # Panics
    /// If a dimension is neither, with a message that begins with `what` (say
    /// `"attention: the mask"`).
    pub(crate) fn broadcast(self, target: [usize; 4], what: &str) -> Self {
        let mut strides = self.strides;
        for n in 0..4 {
            if self.shape[n] != target[n] {
                assert!(
                    self.shape[n] == 1,
                    "{what} of shape {:?} does not broadcast to {target:?}",
                    self.shape
                );
                strides[n] = 0;
            }
        }
        Self {
            shape: target,
            strides,
            ..self
        }
    }

    /// The matrix of the last two dimensions at `[i0, i1]`.
    pub(crate) fn matrix(&self, i0: usize, i1: usize) -> MatRef<'a, T> {
        MatRef::strided(
            self.data,
            self.position([i0, i1, 0, 0]) as usize,
            [self.shape[2], self.shape[3]],
            [self.strides[2], self.strides[3]],
        )
    }

    /// Elements `start..start + len` of the last dimension at `[i0, i1, i2]`, in the form
    /// the fastest loop over them can take.
    pub(crate) fn line(&self, [i0, i1, i2]: [usize; 3], start: usize, len: usize) -> Line<'a, T> {
        let first = self.position([i0, i1, i2, start]);
        match self.strides[3] {
            0 => Line::Splat(self.data[first as usize]),
            1 => Line::Slice(&self.data[first as usize..first as usize + len]),
            stride => Line::Strided {
                data: self.data,
                first,
                stride,
            },
        }
    }
}

/// A run of a view's last dimension, as [`View4`]'s `line` reads it: contiguous, one
/// broadcast element, or strided, so that a loop over it takes the fastest form.
pub(crate) enum Line<'a, T> {
    /// Contiguous elements.
    Slice(&'a [T]),
    /// One element, broadcast.
    Splat(T),
    /// Element `n` at `first + n·stride`.
    Strided {
        data: &'a [T],
        first: isize,
        stride: isize,
    },
}

impl<T: Copy> Line<'_, T> {
    /// `f(&mut values[n], element n)` for every `n`.
    #[inline(always)]
    pub(crate) fn zip_with(&self, values: &mut [f32], mut f: impl FnMut(&mut f32, T)) {
        match *self {
            Line::Slice(s) => values.iter_mut().zip(s).for_each(|(v, &e)| f(v, e)),
            Line::Splat(e) => values.iter_mut().for_each(|v| f(v, e)),
            Line::Strided {
                data,
                first,
                stride,
            } => {
                for (n, v) in values.iter_mut().enumerate() {
                    f(v, data[(first + n as isize * stride) as usize]);
                }
            }
        }
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
/// the first columns of `dst`'s rows of `stride` elements. The last row may end where its
/// `rhs.cols` columns do, so that `&mut dst[j..]` writes columns `j..` of a wider output.
///
/// # Panics
/// If the inner dimensions differ, `stride < rhs.cols`, or `dst` is shorter than its rows
/// (`(lhs.rows − 1)·stride + rhs.cols`) or longer than `lhs.rows · stride`.
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
    let needed = if m == 0 { 0 } else { (m - 1) * stride + n };
    assert!(
        k2 == k && n <= stride && (needed..=m * stride).contains(&dst.len()),
        "gemm of {m}×{k} by {k2}×{n} into {} elements with rows of {stride}",
        dst.len()
    );
    let (lhs_ptr, lhs_row, lhs_col) = lhs.raw_parts();
    let (rhs_ptr, rhs_row, rhs_col) = rhs.raw_parts();
    // SAFETY: `dst` holds m rows of `stride ≥ n` elements (the last one at least `n`) and `MatRef::strided` checked that
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

    #[test]
    #[should_panic(expected = "outside its buffer")]
    fn a_4d_view_past_its_buffer_is_refused() {
        let data = [0.0f32; 8];
        View4::strided(&data, 1, [1, 2, 2, 2], [8, 4, 2, 1]);
    }
}
