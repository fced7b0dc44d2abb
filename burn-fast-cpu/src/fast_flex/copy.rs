//! Contiguous copies of permuted tensors whose last dimension is contiguous (attention's
//! heads merged back, `[b, h, s, d] → [b, s, h, d]`): one `copy_from_slice` per row, rows
//! shared among rayon's threads. Flex copies such a layout one element at a time through an
//! index iterator (it merges only layouts that collapse to two dimensions).

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType};
use half::{bf16, f16};
use rayon::prelude::*;

/// Rows per rayon task.
const ROWS: usize = 512;

/// `tensor` with a contiguous layout: itself where it has one, a copy otherwise (row by row
/// where its last dimension is contiguous, else Flex's copy).
pub(super) fn contiguous(tensor: &FlexTensor) -> FlexTensor {
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

fn by_rows<T: burn::tensor::Element + bytemuck::Pod + Send + Sync + Default>(
    tensor: &FlexTensor,
) -> FlexTensor {
    let layout = tensor.layout();
    let dims = layout.shape().to_vec();
    let strides = layout.strides();
    let rank = dims.len();
    let n = dims[rank - 1];
    let src = tensor.storage::<T>();
    let row_start = |r: usize| {
        offset(
            &dims[..rank - 1],
            &strides[..rank - 1],
            layout.start_offset(),
            r,
        )
    };
    let mut out = vec![T::default(); layout.num_elements()];
    out.par_chunks_mut(n * ROWS)
        .enumerate()
        .for_each(|(chunk, rows)| {
            for (i, row) in rows.chunks_mut(n).enumerate() {
                let from = row_start(chunk * ROWS + i);
                row.copy_from_slice(&src[from..from + n]);
            }
        });
    FlexTensor::new(
        Bytes::from_elems(out),
        Layout::contiguous(layout.shape().clone()),
        tensor.dtype(),
    )
}

/// The buffer offset of element `index` (row-major over `dims`) in a layout that starts at
/// `start` and steps by `strides`, one per dimension of `dims` (0 on a broadcast dimension,
/// [`broadcast_strides`]).
pub(super) fn offset(dims: &[usize], strides: &[isize], start: usize, mut index: usize) -> usize {
    let mut offset = start as isize;
    for d in (0..dims.len()).rev() {
        offset += (index % dims[d]) as isize * strides[d];
        index /= dims[d];
    }
    offset as usize
}

/// `layout`'s strides, 0 on its dimensions of size 1: read through [`offset`] over a larger
/// shape, they broadcast it.
pub(super) fn broadcast_strides(layout: &Layout) -> Vec<isize> {
    layout
        .strides()
        .iter()
        .zip(layout.shape().iter())
        .map(|(&stride, &size)| if size == 1 { 0 } else { stride })
        .collect()
}
