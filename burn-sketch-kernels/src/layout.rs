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

/// How a kernel reads a logical 2-D matrix out of a tensor: which tensor axis each logical
/// axis walks. A compile-time argument of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// A 2-D tensor read as stored: `(row, col) → [row, col]`.
    RowMajor,
    /// A 2-D tensor read transposed: `(row, col) → [col, row]`.
    Transposed,
    /// `[T, d, k]` as a `d × Tk` matrix (`S1`, `U2` on the input side):
    /// `(i, j) → [j/k, i, j%k]`.
    InputFactor,
    /// `[T, d, k]` as a `Tk × d` matrix (their transposes): `(j, i) → [j/k, i, j%k]`.
    InputFactorT,
    /// `[T, k, d]` as a `Tk × d` matrix (`U1`, `S2` on the output side):
    /// `(j, o) → [j/k, j%k, o]`.
    OutputFactor,
    /// `[T, k, d]` as a `d × Tk` matrix (their transposes): `(o, j) → [j/k, j%k, o]`.
    OutputFactorT,
}

/// The storage offset of the logical element `(row, col)` of `tensor` read with `layout`;
/// `low_rank` is the sketch size `k` that splits a rank index into term and column.
#[cube]
pub fn offset<F: Float>(
    tensor: &Tensor<F>,
    row: usize,
    col: usize,
    low_rank: usize,
    #[comptime] layout: Layout,
) -> usize {
    let k = low_rank;
    match layout {
        Layout::RowMajor => row * tensor.stride(0) + col * tensor.stride(1),
        Layout::Transposed => row * tensor.stride(1) + col * tensor.stride(0),
        Layout::InputFactor => {
            (col / k) * tensor.stride(0) + row * tensor.stride(1) + (col % k) * tensor.stride(2)
        }
        Layout::InputFactorT => {
            (row / k) * tensor.stride(0) + col * tensor.stride(1) + (row % k) * tensor.stride(2)
        }
        Layout::OutputFactor => {
            (row / k) * tensor.stride(0) + (row % k) * tensor.stride(1) + col * tensor.stride(2)
        }
        Layout::OutputFactorT => {
            (col / k) * tensor.stride(0) + (col % k) * tensor.stride(1) + row * tensor.stride(2)
        }
    }
}
