//! Conversions between `f32` and the types kernels store: [`StoredFloat`], the element of the
//! kernels that compute in `f32` and store in `f32` or `bf16`.

use ::half::bf16;

use crate::view::MatRef;

/// A float type a kernel reads and stores while it computes in `f32`: `f32` itself, or `bf16`
/// (widened exactly as it is read, rounded once to nearest even as it is stored). The `bf16`
/// product's output and attention's every operand are of such a type.
pub trait StoredFloat: Copy + Send + Sync + 'static + sealed::Sealed {
    /// `bf16` outputs round to nearest even as they store; `f32` ones store as they are.
    const BF16: bool;
    /// The value as `f32` (exact).
    fn to_f32(self) -> f32;
    /// `value`, rounded to this type.
    fn from_f32(value: f32) -> Self;
    /// The view as `f32`: itself for `f32`, a row-major copy in `buffer` otherwise.
    fn widen<'a>(view: MatRef<'a, Self>, buffer: &'a mut Vec<f32>) -> MatRef<'a, f32>;
}

impl StoredFloat for f32 {
    const BF16: bool = false;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(value: f32) -> Self {
        value
    }
    fn widen<'a>(view: MatRef<'a, Self>, _: &'a mut Vec<f32>) -> MatRef<'a, f32> {
        view
    }
}

impl StoredFloat for bf16 {
    const BF16: bool = true;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(value: f32) -> Self {
        bf16::from_f32(value)
    }
    fn widen<'a>(view: MatRef<'a, Self>, buffer: &'a mut Vec<f32>) -> MatRef<'a, f32> {
        let [rows, cols] = view.shape();
        buffer.clear();
        buffer.extend((0..rows).flat_map(|i| (0..cols).map(move |j| view.at(i, j).to_f32())));
        MatRef::row_major(buffer, rows, cols)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for super::bf16 {}
}
