//! `mask_fill` reading a broadcast mask through its strides. Flex expands the mask to the
//! tensor's shape and copies it first (an attention padding mask `[b, 1, 1, s]` becomes
//! `[b, h, s, s]` bytes, copied one index at a time); here each row of the output finds its
//! mask row by the mask's strides (0 on a broadcast dimension), and a tensor no one else
//! holds is filled in place.

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use half::{bf16, f16};
use rayon::prelude::*;

use super::FastPath;
use crate::flex_view::{self, FlexFloat, broadcast_strides, offset};

/// Rows per rayon task.
const ROWS: usize = 256;

/// `tensor` with `value` wherever `mask` (broadcast to its shape) is true; where this path
/// does not apply (the mask's rank or shape does not broadcast onto the tensor's, a mask
/// stored as `u32`, an empty tensor, `f64`) the tensor comes back as the `Err`.
pub(super) fn mask_fill(tensor: FlexTensor, mask: &FlexTensor, value: f64) -> FastPath<FlexTensor> {
    let dims = tensor.layout().shape().to_vec();
    let mask_dims = mask.layout().shape().to_vec();
    let broadcasts = mask_dims.len() == dims.len()
        && mask_dims.iter().zip(&dims).all(|(&m, &t)| m == t || m == 1);
    if !flex_view::is_byte_mask(mask)
        || !broadcasts
        || dims.is_empty()
        || dims.iter().product::<usize>() == 0
    {
        return Err(tensor);
    }
    match tensor.dtype() {
        DType::F32 => Ok(fill::<f32>(tensor, mask, value as f32)),
        DType::BF16 => Ok(fill::<bf16>(tensor, mask, bf16::from_f64(value))),
        DType::F16 => Ok(fill::<f16>(tensor, mask, f16::from_f64(value))),
        _ => Err(tensor),
    }
}

fn fill<T: FlexFloat>(tensor: FlexTensor, mask: &FlexTensor, value: T) -> FlexTensor {
    let dims = tensor.layout().shape().to_vec();
    let rank = dims.len();
    let n = dims[rank - 1];
    let strides = broadcast_strides(mask.layout());
    let mask_start = mask.layout().start_offset();
    let mask_bytes = mask.bytes();
    let inner = strides[rank - 1];
    // The mask row of output row `r` (row-major over the leading dimensions).
    let row_offset =
        |r: usize| offset(&dims[..rank - 1], &strides[..rank - 1], mask_start, r) as isize;
    let fill_row = |row: usize, out: &mut [T]| {
        let base = row_offset(row);
        if inner == 0 {
            if mask_bytes[base as usize] != 0 {
                out.fill(value);
            }
        } else if inner == 1 {
            let m = &mask_bytes[base as usize..base as usize + n];
            for (o, &flag) in out.iter_mut().zip(m) {
                if flag != 0 {
                    *o = value;
                }
            }
        } else {
            for (j, o) in out.iter_mut().enumerate() {
                if mask_bytes[(base + j as isize * inner) as usize] != 0 {
                    *o = value;
                }
            }
        }
    };
    let mut out = if tensor.is_unique() && tensor.layout().is_contiguous() {
        tensor
    } else {
        flex_view::contiguous(&tensor)
    };
    if let Some(values) = flex_view::values_mut::<T>(&mut out) {
        fill_rows(values, n, &fill_row);
        return out;
    }
    let mut values = flex_view::values::<T>(&out).expect("contiguous").to_vec();
    fill_rows(&mut values, n, &fill_row);
    flex_view::tensor(values, out.layout().shape().clone())
}

fn fill_rows<T: Send>(values: &mut [T], n: usize, fill_row: &(impl Fn(usize, &mut [T]) + Sync)) {
    values
        .par_chunks_mut(n * ROWS)
        .enumerate()
        .for_each(|(chunk, rows)| {
            for (i, row) in rows.chunks_mut(n).enumerate() {
                fill_row(chunk * ROWS + i, row);
            }
        });
}
