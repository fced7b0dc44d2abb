//! `FastFlex`'s products of Burn's batched `matmul` (leading dimensions broadcast): `bf16` on
//! [`cpu::bf16::matmul`](burn_cpu_kernels::bf16::matmul), many small `f32` products (attention's
//! heads) on [`sgemm`](burn_cpu_kernels::sgemm), read through the operands' strides.

use burn::backend::flex::FlexTensor;
use half::bf16;
use rayon::prelude::*;

use burn_cpu_kernels::MatRef;

use crate::flex_view::{self, FlexFloat, Matrices};

/// `lhs · rhs` of two `bf16` tensors of rank ≥ 2 (`[…, m, k] · […, k, n]`, the leading
/// dimensions broadcast as Burn's `matmul` does), accumulated in `f32` and rounded once.
///
/// # Panics
/// If the ranks or inner dimensions differ or the leading dimensions do not broadcast (Burn's
/// `Tensor::matmul` checks these before a backend sees the call).
pub(super) fn bf16(lhs: &FlexTensor, rhs: &FlexTensor) -> FlexTensor {
    batched::<bf16>(lhs, rhs, |dst, n, x, y, parallel| {
        burn_cpu_kernels::bf16::matmul(dst, n, x, y, 1.0, false, parallel);
    })
}

/// `lhs · rhs` of two `f32` tensors of rank ≥ 3 with several products (attention's heads):
/// each product on [`sgemm`](burn_cpu_kernels::sgemm)'s kernel with its right-hand side
/// packed (a few KiB for a head), one product per thread. Flex runs these through `gemm`,
/// whose set-up costs more than such a small product.
pub(super) fn f32_batched(lhs: &FlexTensor, rhs: &FlexTensor) -> FlexTensor {
    use burn_cpu_kernels::sgemm;
    batched::<f32>(lhs, rhs, |dst, n, x, y, parallel| {
        if parallel {
            sgemm::matmul(dst, n, x, y, sgemm::Epilogue::default(), true);
        } else {
            let packed = sgemm::PackedRhs::pack(y);
            sgemm::matmul_packed(dst, n, x, &packed, sgemm::Epilogue::default(), false);
        }
    })
}

/// `lhs · rhs` with the leading dimensions broadcast, `product(dst, n, x, y, parallel)` per
/// pair of matrices.
fn batched<E: FlexFloat>(
    lhs: &FlexTensor,
    rhs: &FlexTensor,
    product: impl Fn(&mut [E], usize, MatRef<'_, E>, MatRef<'_, E>, bool) + Sync,
) -> FlexTensor {
    let (a, b) = (lhs.layout(), rhs.layout());
    let rank = a.num_dims();
    assert!(
        rank >= 2 && b.num_dims() == rank,
        "matmul of ranks {rank} and {}",
        b.num_dims()
    );
    let (m, k, n) = (
        a.shape()[rank - 2],
        a.shape()[rank - 1],
        b.shape()[rank - 1],
    );
    assert_eq!(
        b.shape()[rank - 2],
        k,
        "inner dimensions {k} and {}",
        b.shape()[rank - 2]
    );
    let batch: Vec<usize> = (0..rank - 2)
        .map(|d| {
            let (x, y) = (a.shape()[d], b.shape()[d]);
            assert!(
                x == y || x == 1 || y == 1,
                "dimension {d}: {x} and {y} do not broadcast"
            );
            x.max(y)
        })
        .collect();
    let batches: usize = batch.iter().product();
    let mut dims = batch.clone();
    dims.extend([m, n]);
    let mut values = vec![E::default(); batches * m * n];
    if m * n > 0 && k > 0 {
        let (x, y) = (Matrices::<E>::new(lhs), Matrices::<E>::new(rhs));
        let one = |index: usize, dst: &mut [E], parallel: bool| {
            product(dst, n, x.get(&batch, index), y.get(&batch, index), parallel);
        };
        // Many small products (attention's heads): one per thread; few large ones: each on
        // all threads.
        if batches >= 2 * rayon::current_num_threads() {
            values
                .par_chunks_mut(m * n)
                .enumerate()
                .for_each(|(index, dst)| one(index, dst, false));
        } else {
            for (index, dst) in values.chunks_mut(m * n).enumerate() {
                one(index, dst, true);
            }
        }
    }
    flex_view::tensor(values, dims)
}
