//! How a kernel reads a logical matrix out of a sketch tensor, without copying it.
//!
//! Every product in the sketched layer multiplies a plain `[n, ·]` matrix (`x`, `∂y`, `P`)
//! with a factor stored in Panther's layout: `S1s`/`U2s` are `[T, d_in, k]` and
//! `U1s`/`S2s` are `[T, k, d_out]`. Read with the terms concatenated along the rank axis,
//! each is a 2-D matrix whose rank index `j` splits into a term `j / k` and a column
//! `j % k`. A layout names which tensor axis each logical axis walks; the offsets come from
//! the tensor's own strides, so transposed or otherwise strided inputs need no copy either.
//!
//! Layouts are compile-time constants of a kernel, so each combination is specialised and the
//! branches below vanish from the generated code.

use cubecl::prelude::*;

/// A 2-D tensor read as stored: `(row, col) → [row, col]`.
pub const ROW_MAJOR: u32 = 0;
/// A 2-D tensor read transposed: `(row, col) → [col, row]`.
pub const TRANSPOSED: u32 = 1;
/// `[T, d, k]` as a `d × Tk` matrix (`S1`, `U2` on the input side): `(i, j) → [j/k, i, j%k]`.
pub const INPUT_FACTOR: u32 = 2;
/// `[T, d, k]` as a `Tk × d` matrix (their transposes): `(j, i) → [j/k, i, j%k]`.
pub const INPUT_FACTOR_T: u32 = 3;
/// `[T, k, d]` as a `Tk × d` matrix (`U1`, `S2` on the output side): `(j, o) → [j/k, j%k, o]`.
pub const OUTPUT_FACTOR: u32 = 4;
/// `[T, k, d]` as a `d × Tk` matrix (their transposes): `(o, j) → [j/k, j%k, o]`.
pub const OUTPUT_FACTOR_T: u32 = 5;

/// The storage offset of the logical element `(row, col)` of `tensor` read with `layout`;
/// `rank` is the sketch size `k` that splits a rank index into term and column.
#[cube]
pub fn offset<F: Float>(
    tensor: &Tensor<F>,
    row: usize,
    col: usize,
    rank: usize,
    #[comptime] layout: u32,
) -> usize {
    if comptime!(layout == ROW_MAJOR) {
        row * tensor.stride(0) + col * tensor.stride(1)
    } else if comptime!(layout == TRANSPOSED) {
        row * tensor.stride(1) + col * tensor.stride(0)
    } else if comptime!(layout == INPUT_FACTOR) {
        (col / rank) * tensor.stride(0) + row * tensor.stride(1) + (col % rank) * tensor.stride(2)
    } else if comptime!(layout == INPUT_FACTOR_T) {
        (row / rank) * tensor.stride(0) + col * tensor.stride(1) + (row % rank) * tensor.stride(2)
    } else if comptime!(layout == OUTPUT_FACTOR) {
        (row / rank) * tensor.stride(0) + (row % rank) * tensor.stride(1) + col * tensor.stride(2)
    } else {
        (col / rank) * tensor.stride(0) + (col % rank) * tensor.stride(1) + row * tensor.stride(2)
    }
}

/// Host-side twin of [`offset`], for the reference implementation and the tests: the same
/// mapping over explicit strides.
pub fn host_offset(strides: &[usize], row: usize, col: usize, rank: usize, layout: u32) -> usize {
    match layout {
        ROW_MAJOR => row * strides[0] + col * strides[1],
        TRANSPOSED => row * strides[1] + col * strides[0],
        INPUT_FACTOR => (col / rank) * strides[0] + row * strides[1] + (col % rank) * strides[2],
        INPUT_FACTOR_T => (row / rank) * strides[0] + col * strides[1] + (row % rank) * strides[2],
        OUTPUT_FACTOR => (row / rank) * strides[0] + (row % rank) * strides[1] + col * strides[2],
        OUTPUT_FACTOR_T => (col / rank) * strides[0] + (col % rank) * strides[1] + row * strides[2],
        other => panic!("unknown layout {other}"),
    }
}
