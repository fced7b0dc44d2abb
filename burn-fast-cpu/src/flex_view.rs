//! Flex tensors as the kernels' views: the one way from a [`FlexTensor`] (a buffer, a shape,
//! strides and a start offset) to what burn-cpu-kernels reads and writes: strided matrices
//! ([`MatRef`]), 4-D views ([`View4`]), the values of a contiguous tensor as a slice, in
//! place where no other tensor holds the buffer, and contiguous copies. [`FastFlex`]'s
//! operations and burn-sketch's Flex path both go through it.
//!
//! Views borrow the tensor's buffer and read it through its strides, so a transposed,
//! sliced, permuted or broadcast tensor reaches a kernel without a copy; only
//! [`Flattened`] and [`contiguous`] copy, where strides cannot describe the layout.
//!
//! ```
//! use burn::backend::flex::{FlexTensor, Layout};
//! use burn::tensor::{Bytes, DType, Shape};
//! use burn_fast_cpu::flex_view;
//!
//! // A 2 × 3 matrix and its transpose, a view of the same buffer.
//! let t = flex_view::tensor(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
//! let transposed = t.clone().with_layout(t.layout().transpose(0, 1));
//! let m = flex_view::matrix::<f32>(&transposed);
//! assert_eq!((m.shape(), m.at(2, 1)), ([3, 2], 6.0));
//! // Contiguous values are a slice; a transposed view has none until it is copied.
//! assert_eq!(flex_view::values::<f32>(&t), Some(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0][..]));
//! assert_eq!(flex_view::values::<f32>(&transposed), None);
//! let copy = flex_view::contiguous(&transposed);
//! assert_eq!(flex_view::values::<f32>(&copy), Some(&[1.0, 4.0, 2.0, 5.0, 3.0, 6.0][..]));
//! ```
//!
//! [`FastFlex`]: crate::FastFlex

use std::ops::Range;

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use burn_cpu_kernels::MatRef;
use burn_cpu_kernels::View4;
use half::{bf16, f16};
use rayon::prelude::*;

/// A float type Flex stores and the kernels read: `f32`, `f64`, `bf16` or `f16`.
pub trait FlexFloat: burn::tensor::Element + bytemuck::Pod + Default + Send + Sync {
    /// The tensor dtype of this type.
    const DTYPE: DType;
}

impl FlexFloat for f32 {
    const DTYPE: DType = DType::F32;
}
impl FlexFloat for f64 {
    const DTYPE: DType = DType::F64;
}
impl FlexFloat for bf16 {
    const DTYPE: DType = DType::BF16;
}
impl FlexFloat for f16 {
    const DTYPE: DType = DType::F16;
}

/// A contiguous tensor of `shape` over `values` (no copy).
///
/// # Panics
/// If `values` does not hold `shape`'s number of elements.
pub fn tensor<E: FlexFloat>(values: Vec<E>, shape: impl Into<Shape>) -> FlexTensor {
    let layout = Layout::contiguous(shape.into());
    assert_eq!(values.len(), layout.num_elements(), "one value per element");
    FlexTensor::new(Bytes::from_elems(values), layout, E::DTYPE)
}

/// The values of a contiguous tensor of element type `E`, row-major; `None` for a strided one.
///
/// # Panics
/// If the tensor's dtype is not `E`'s.
pub fn values<E: FlexFloat>(tensor: &FlexTensor) -> Option<&[E]> {
    let layout = tensor.layout();
    let (start, end) = layout.contiguous_offsets()?;
    Some(&tensor.storage::<E>()[start..end])
}

/// [`values`], writable: `None` where the tensor is strided or another tensor shares its
/// buffer (then the caller writes a new one).
///
/// # Panics
/// If the tensor's dtype is not `E`'s.
pub fn values_mut<E: FlexFloat>(tensor: &mut FlexTensor) -> Option<&mut [E]> {
    let (start, end) = tensor.layout().contiguous_offsets()?;
    Some(&mut tensor.try_storage_mut::<E>()?[start..end])
}

/// The range of `layout`'s buffer its elements lie in, where that range holds no element
/// outside the view (a contiguous, permuted or broadcast layout, no negative stride): a pass
/// over that range is a pass over the view, and the layout moved to offset 0 still describes
/// the result. `None` otherwise (sliced views, flips, empty tensors).
pub fn dense_span(layout: &Layout) -> Option<Range<usize>> {
    let (shape, strides) = (layout.shape(), layout.strides());
    if shape.num_elements() == 0 || strides.iter().any(|&s| s < 0) {
        return None;
    }
    let reach: usize = (0..shape.num_dims())
        .map(|d| (shape[d] - 1) * strides[d] as usize)
        .sum();
    let start = layout.start_offset();
    (reach < shape.num_elements()).then_some(start..start + reach + 1)
}

/// The rank-2 `tensor` through its strides (any strides: a transposed weight is read as it
/// lies).
///
/// # Panics
/// If the tensor is not rank 2 or its dtype is not `E`'s.
pub fn matrix<E: FlexFloat>(tensor: &FlexTensor) -> MatRef<'_, E> {
    let layout = tensor.layout();
    let (rows, cols, row_stride, col_stride) = layout.as_2d_strides().expect("a rank-2 tensor");
    MatRef::strided(
        tensor.storage::<E>(),
        layout.start_offset(),
        [rows, cols],
        [row_stride, col_stride],
    )
}

/// A tensor `[..., cols]` as an `m × cols` matrix, `m` the product of its leading
/// dimensions: a view of its buffer where those dimensions collapse into one row stride
/// (contiguous, sliced rows, a transposed last pair), else of a contiguous copy
/// ([`contiguous`]), which it keeps alive.
#[derive(Clone, Debug)]
pub struct Flattened {
    tensor: FlexTensor,
    offset: usize,
    shape: [usize; 2],
    strides: [isize; 2],
}

impl Flattened {
    /// `tensor` (rank ≥ 1) flattened to its rows.
    ///
    /// # Panics
    /// If the tensor is rank 0.
    pub fn new(tensor: &FlexTensor) -> Self {
        let layout = tensor.layout();
        let dims = layout.shape().to_vec();
        let strides = layout.strides();
        let rank = dims.len();
        assert!(rank >= 1, "a rank-0 tensor has no rows");
        let cols = dims[rank - 1];
        let m = dims[..rank - 1].iter().product::<usize>();
        // The leading dimensions collapse into one row stride when each (of size > 1) steps
        // by the next one's stride times its size.
        let outer: Vec<usize> = (0..rank - 1).filter(|&d| dims[d] != 1).collect();
        let collapses = outer
            .windows(2)
            .all(|pair| strides[pair[0]] == strides[pair[1]] * dims[pair[1]] as isize);
        let mut row_stride = match outer.last() {
            Some(&d) if collapses => Some(strides[d]),
            Some(_) => None,
            None => Some(cols as isize),
        };
        // A single row has no row stride to honour.
        if m <= 1 {
            row_stride = Some(cols as isize);
        }
        let col_stride = strides[rank - 1];
        if let Some(row) = row_stride.filter(|&r| r >= 0 && col_stride >= 0) {
            return Self {
                tensor: tensor.clone(),
                offset: layout.start_offset(),
                shape: [m, cols],
                strides: [row, col_stride],
            };
        }
        let copy = contiguous(tensor);
        let offset = copy.layout().start_offset();
        Self {
            tensor: copy,
            offset,
            shape: [m, cols],
            strides: [cols as isize, 1],
        }
    }

    /// `[m, cols]`.
    pub fn shape(&self) -> [usize; 2] {
        self.shape
    }

    /// Row `i` as a slice where the columns are contiguous (column stride 1), else `None`
    /// (read it through [`view`](Self::view)).
    ///
    /// # Panics
    /// If `i` is not a row or the tensor's dtype is not `E`'s.
    pub fn row<E: FlexFloat>(&self, i: usize) -> Option<&[E]> {
        assert!(i < self.shape[0], "row {i} of {}", self.shape[0]);
        if self.strides[1] != 1 {
            return None;
        }
        let start = (self.offset as isize + i as isize * self.strides[0]) as usize;
        Some(&self.tensor.storage::<E>()[start..start + self.shape[1]])
    }

    /// The matrix, its element type the tensor's.
    ///
    /// # Panics
    /// If the tensor's dtype is not `E`'s.
    pub fn view<E: FlexFloat>(&self) -> MatRef<'_, E> {
        MatRef::strided(
            self.tensor.storage::<E>(),
            self.offset,
            self.shape,
            self.strides,
        )
    }
}

/// The matrices of a tensor `[…, rows, cols]` (rank ≥ 2) whose leading dimensions broadcast
/// to a batch shape: each matrix through the tensor's strides, dimensions of size 1 read with
/// stride 0 ([`broadcast_strides`]), for a batched product.
#[derive(Clone, Debug)]
pub struct Matrices<'a, E> {
    data: &'a [E],
    start: usize,
    shape: [usize; 2],
    strides: Vec<isize>,
}

impl<'a, E: FlexFloat> Matrices<'a, E> {
    /// The matrices of `tensor`.
    ///
    /// # Panics
    /// If the tensor's rank is below 2 or its dtype is not `E`'s.
    pub fn new(tensor: &'a FlexTensor) -> Self {
        let layout = tensor.layout();
        let rank = layout.num_dims();
        assert!(rank >= 2, "matrices of a rank-{rank} tensor");
        Self {
            data: tensor.storage::<E>(),
            start: layout.start_offset(),
            shape: [layout.shape()[rank - 2], layout.shape()[rank - 1]],
            strides: broadcast_strides(layout),
        }
    }

    /// Matrix `index`, row-major over `batch` (one size per leading dimension, each the
    /// tensor's or a size its dimension of 1 broadcasts to).
    ///
    /// # Panics
    /// If `batch` has not one size per leading dimension or the matrix lies outside the
    /// buffer.
    pub fn get(&self, batch: &[usize], index: usize) -> MatRef<'a, E> {
        let rank = self.strides.len();
        assert_eq!(
            batch.len(),
            rank - 2,
            "one batch size per leading dimension"
        );
        MatRef::strided(
            self.data,
            offset(batch, &self.strides[..rank - 2], self.start, index),
            self.shape,
            [self.strides[rank - 2], self.strides[rank - 1]],
        )
    }
}

/// A rank-4 tensor through its layout.
///
/// # Panics
/// If the tensor is not rank 4 or its dtype is not `E`'s.
pub fn view4<E: FlexFloat>(tensor: &FlexTensor) -> View4<'_, E> {
    strided4(tensor, tensor.storage::<E>())
}

/// Whether a bool tensor is stored one byte per value (Flex's `Native` and `U8` stores), the
/// only masks the kernels read ([`mask4`]).
pub fn is_byte_mask(tensor: &FlexTensor) -> bool {
    matches!(
        tensor.dtype(),
        DType::Bool(burn_backend::BoolStore::Native | burn_backend::BoolStore::U8)
    )
}

/// A rank-4 bool tensor stored as bytes ([`is_byte_mask`]) through its layout, `0` false.
///
/// # Panics
/// If the tensor is not rank 4.
pub fn mask4(tensor: &FlexTensor) -> View4<'_, u8> {
    strided4(tensor, tensor.bytes())
}

fn strided4<'a, T: Copy>(tensor: &FlexTensor, data: &'a [T]) -> View4<'a, T> {
    let layout = tensor.layout();
    let (shape, s) = (layout.shape(), layout.strides());
    assert_eq!(shape.num_dims(), 4, "a rank-4 tensor");
    View4::strided(
        data,
        layout.start_offset(),
        [shape[0], shape[1], shape[2], shape[3]],
        [s[0], s[1], s[2], s[3]],
    )
}

/// The buffer offset of element `index` (row-major over `dims`) of a layout that starts at
/// `start` and steps by `strides`, one per dimension of `dims`: with [`broadcast_strides`], a
/// smaller tensor read over a larger shape. Over a tensor's leading dimensions, the start of
/// row `index`.
///
/// ```
/// // Row 4 of a [2, 3, n] layout with strides [3n, n, 1] (n = 8), starting at 5.
/// assert_eq!(burn_fast_cpu::flex_view::offset(&[2, 3], &[24, 8], 5, 4), 5 + 24 + 8);
/// ```
pub fn offset(dims: &[usize], strides: &[isize], start: usize, mut index: usize) -> usize {
    let mut offset = start as isize;
    for d in (0..dims.len()).rev() {
        offset += (index % dims[d]) as isize * strides[d];
        index /= dims[d];
    }
    offset as usize
}

/// `layout`'s strides, 0 on its dimensions of size 1: read through [`offset`] over a larger
/// shape, they broadcast it.
pub fn broadcast_strides(layout: &Layout) -> Vec<isize> {
    layout
        .strides()
        .iter()
        .zip(layout.shape().iter())
        .map(|(&stride, &size)| if size == 1 { 0 } else { stride })
        .collect()
}

/// Appends `tensor[leading…, 0..len]` (the first `len` values along the last dimension at
/// `leading`, one index per other dimension, any strides) to `packed`: one slice copy where
/// the last dimension is contiguous.
///
/// # Panics
/// If `leading` does not index every dimension but the last, or the dtype is not `E`'s.
pub fn extend_with_row<E: FlexFloat>(
    packed: &mut Vec<E>,
    tensor: &FlexTensor,
    leading: &[usize],
    len: usize,
) {
    let layout = tensor.layout();
    let strides = layout.strides();
    assert_eq!(
        leading.len() + 1,
        strides.len(),
        "an index per leading dimension"
    );
    let data = tensor.storage::<E>();
    let start = layout.start_offset() as isize
        + leading
            .iter()
            .zip(strides)
            .map(|(&i, &s)| i as isize * s)
            .sum::<isize>();
    let inner = strides[strides.len() - 1];
    if inner == 1 {
        let start = start as usize;
        packed.extend_from_slice(&data[start..start + len]);
    } else {
        packed.extend((0..len as isize).map(|c| data[(start + c * inner) as usize]));
    }
}

/// Rows per rayon task of [`contiguous`]'s copy.
const COPY_ROWS: usize = 512;

/// `tensor` with a contiguous layout: itself where it is contiguous from offset 0, else a
/// copy: one `copy_from_slice` per row, rows shared among rayon's threads, where its last
/// dimension is contiguous (attention's heads merged back, `[b, h, s, d] → [b, s, h, d]`;
/// Flex copies such a layout one element at a time), else Flex's copy.
pub fn contiguous(tensor: &FlexTensor) -> FlexTensor {
    let layout = tensor.layout();
    if layout.is_contiguous() && layout.start_offset() == 0 {
        return tensor.clone();
    }
    let rank = layout.num_dims();
    let rows_apply = rank >= 2
        && layout.strides()[rank - 1] == 1
        && layout.strides().iter().all(|&s| s >= 0)
        && layout.num_elements() > 0;
    if !rows_apply {
        return tensor.to_contiguous();
    }
    match tensor.dtype() {
        DType::F32 => by_rows::<f32>(tensor),
        DType::BF16 => by_rows::<bf16>(tensor),
        DType::F16 => by_rows::<f16>(tensor),
        _ => tensor.to_contiguous(),
    }
}

fn by_rows<E: FlexFloat>(tensor: &FlexTensor) -> FlexTensor {
    let layout = tensor.layout();
    let dims = layout.shape().to_vec();
    let strides = layout.strides();
    let rank = dims.len();
    let n = dims[rank - 1];
    let src = tensor.storage::<E>();
    let row_start = |r: usize| {
        offset(
            &dims[..rank - 1],
            &strides[..rank - 1],
            layout.start_offset(),
            r,
        )
    };
    let mut out = vec![E::default(); layout.num_elements()];
    out.par_chunks_mut(n * COPY_ROWS)
        .enumerate()
        .for_each(|(chunk, rows)| {
            for (i, row) in rows.chunks_mut(n).enumerate() {
                let from = row_start(chunk * COPY_ROWS + i);
                row.copy_from_slice(&src[from..from + n]);
            }
        });
    FlexTensor::new(
        Bytes::from_elems(out),
        Layout::contiguous(layout.shape().clone()),
        tensor.dtype(),
    )
}
