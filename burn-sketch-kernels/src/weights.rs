//! The operands the kernels share: the factors of a sketched layer, and one value per operand
//! of its product (which gradients are wanted, the gradients computed).

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;

/// The four factors of a sketched layer on a CubeCL device, in Panther's layouts: the
/// kernels' form of `burn_sketch::SketchWeights`.
#[derive(Debug, Clone)]
pub struct CubeWeights<R: CubeRuntime> {
    /// `[T, d_in, k]`, trainable.
    pub s1s: CubeTensor<R>,
    /// `[T, k, d_out]`, trainable.
    pub s2s: CubeTensor<R>,
    /// `[T, k, d_out]`, fixed.
    pub u1s: CubeTensor<R>,
    /// `[T, d_in, k]`, fixed.
    pub u2s: CubeTensor<R>,
}

/// One value per operand of the sketched product, `x` then the factors: which gradients
/// [`backward`](crate::backward) computes (`Operands<bool>`, the others are skipped entirely) and
/// the gradients it returns (`Operands<Option<CubeTensor<R>>>`, in the shapes of their inputs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Operands<T> {
    /// For `x`, `[n, d_in]`.
    pub x: T,
    /// For `S1s`, `[T, d_in, k]`.
    pub s1s: T,
    /// For `S2s`, `[T, k, d_out]`.
    pub s2s: T,
    /// For `U1s`, `[T, k, d_out]` (fixed in `SkLinear`, but a caller may track them).
    pub u1s: T,
    /// For `U2s`, `[T, d_in, k]`.
    pub u2s: T,
}

impl Operands<bool> {
    /// Every gradient wanted.
    pub const ALL: Self = Self {
        x: true,
        s1s: true,
        s2s: true,
        u1s: true,
        u2s: true,
    };
}
