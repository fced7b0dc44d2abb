//! `bf16` matrix products with `f32` accumulation.
//!
//! `vdpbf16ps` multiplies the 32 `bf16` pairs of two registers and adds each pair's two
//! products into one of 16 `f32` lanes. The kernel broadcasts a pair `(a[i][2p], a[i][2p+1])`
//! of the left operand and multiplies it with a panel row holding the pairs
//! `(b[2p][j], b[2p+1][j])` of 16 columns, so each instruction advances 16 outputs by two
//! steps of depth. A row-major left operand of even depth already stores its pairs that way
//! and is read in place; other layouts, and the right operand, are packed into pairs first.
//!
//! That kernel runs where [`Isa::avx512_bf16`] holds ([`matmul_on`] takes the [`Isa`]); the
//! portable path multiplies `f32` copies of the operands with `gemm`, the same products
//! rounded the same way within `f32`'s accumulation. [`reference()`] is the product in `f64`,
//! for tests.
//!
//! ```
//! use burn_cpu_kernels::{MatRef, bf16};
//! use half::bf16 as Bf16;
//!
//! let a: Vec<Bf16> = [1.0, 2.0, 3.0, 4.0].map(Bf16::from_f32).to_vec(); // [[1, 2], [3, 4]]
//! let b: Vec<Bf16> = [1.0, 0.0, 0.0, 1.0].map(Bf16::from_f32).to_vec(); // identity
//! let mut y = vec![0.0f32; 4];
//! // y = 2·a·b, into all 2 columns of rows 2 long; not accumulated, in parallel.
//! bf16::matmul(&mut y, 2, MatRef::row_major(&a, 2, 2), MatRef::row_major(&b, 2, 2), 2.0, false, true);
//! assert_eq!(y, [2.0, 4.0, 6.0, 8.0]);
//! ```

use ::half::bf16;

use crate::Isa;
use crate::convert::StoredFloat;
use crate::view::{MatRef, gemm};

/// `dst = alpha·lhs·rhs`, or `dst += alpha·lhs·rhs` with `accumulate`, into the first
/// `rhs.cols` columns of a row-major `dst` whose rows are `stride` long; products accumulate
/// in `f32`. With `parallel`, rayon's threads share the output (each a block of rows or of
/// columns). [`matmul_on`] with [`Isa::detected`]; the [module docs](self) have an example.
///
/// # Panics
/// If the inner dimensions differ or `dst` is not `lhs.rows × stride` with
/// `stride ≥ rhs.cols`.
pub fn matmul<O: StoredFloat>(
    dst: &mut [O],
    stride: usize,
    lhs: MatRef<'_, bf16>,
    rhs: MatRef<'_, bf16>,
    alpha: f32,
    accumulate: bool,
    parallel: bool,
) {
    matmul_on(
        Isa::detected(),
        dst,
        stride,
        lhs,
        rhs,
        alpha,
        accumulate,
        parallel,
    );
}

/// [`matmul`] on the path `isa` picks: the `vdpbf16ps` kernel where [`Isa::avx512_bf16`]
/// holds, `f32` copies multiplied by `gemm` elsewhere.
///
/// ```
/// use burn_cpu_kernels::{Isa, MatRef, bf16};
/// use half::bf16 as Bf16;
///
/// let a: Vec<Bf16> = [1.0, 2.0, 3.0, 4.0].map(Bf16::from_f32).to_vec();
/// let mut y = vec![0.0f32; 4];
/// let a = MatRef::row_major(&a, 2, 2);
/// bf16::matmul_on(Isa::PORTABLE, &mut y, 2, a, a, 1.0, false, false);
/// assert_eq!(y, [7.0, 10.0, 15.0, 22.0]);
/// ```
///
/// # Panics
/// As [`matmul`].
#[allow(clippy::too_many_arguments)]
pub fn matmul_on<O: StoredFloat>(
    isa: Isa,
    dst: &mut [O],
    stride: usize,
    lhs: MatRef<'_, bf16>,
    rhs: MatRef<'_, bf16>,
    alpha: f32,
    accumulate: bool,
    parallel: bool,
) {
    let ([m, k], [k2, n]) = (lhs.shape(), rhs.shape());
    assert_eq!(k, k2, "inner dimensions: {m}×{k} by {k2}×{n}");
    assert!(
        n <= stride && dst.len() == m * stride,
        "a {m}×{stride} destination (stride ≥ {n}) has {} elements",
        dst.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx512_bf16() {
        // SAFETY: `isa.avx512_bf16()` holds only where AVX512-BF16 (with F, BW, VL, DQ) was
        // detected; `dst` holds `m` rows of `stride ≥ n` elements and both views were
        // bounds-checked when made.
        unsafe { crate::x86_64::bf16::matmul(dst, stride, lhs, rhs, alpha, accumulate, parallel) };
        return;
    }
    let _ = isa;
    portable(dst, stride, lhs, rhs, alpha, accumulate, parallel);
}

/// The product on `f32` copies of both operands, multiplied by `gemm`.
fn portable<O: StoredFloat>(
    dst: &mut [O],
    stride: usize,
    lhs: MatRef<'_, bf16>,
    rhs: MatRef<'_, bf16>,
    alpha: f32,
    accumulate: bool,
    parallel: bool,
) {
    let (m, n) = (lhs.shape()[0], rhs.shape()[1]);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let (a, b) = (bf16::widen(lhs, &mut a), bf16::widen(rhs, &mut b));
    let mut product = vec![0.0f32; m * n];
    let parallelism = if parallel {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    gemm(&mut product, n, a, b, 1.0, false, parallelism);
    for (row, values) in dst.chunks_exact_mut(stride).zip(product.chunks_exact(n)) {
        for (out, &value) in row.iter_mut().zip(values) {
            let base = if accumulate { out.to_f32() } else { 0.0 };
            *out = O::from_f32(base + alpha * value);
        }
    }
}

/// `alpha·lhs·rhs` in `f64` on the `bf16` values, row-major: the tests' reference.
pub fn reference(lhs: MatRef<'_, bf16>, rhs: MatRef<'_, bf16>, alpha: f32) -> Vec<f64> {
    let ([m, k], n) = (lhs.shape(), rhs.shape()[1]);
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let sum: f64 = (0..k)
                .map(|p| lhs.at(i, p).to_f64() * rhs.at(p, j).to_f64())
                .sum();
            out[i * n + j] = alpha as f64 * sum;
        }
    }
    out
}

#[cfg(test)]
mod tests;
