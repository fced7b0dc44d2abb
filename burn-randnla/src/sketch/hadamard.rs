//! The Walsh–Hadamard transform of a matrix's rows, in `O(n·log n)` per column as a few
//! small products.
//!
//! The Sylvester matrix of size `n = r₁·r₂·…·r_s` (powers of two) is the Kronecker product
//! `H_{r₁} ⊗ … ⊗ H_{r_s}`, so the transform is one product by an `r × r` matrix per factor,
//! `2·n·m·r` flops a stage. With `r ≤ 64` a 4096-row input takes two stages, each a batched
//! GEMM the backend already runs well (no kernel of our own), instead of the radix-2
//! butterfly's twelve passes over the data.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// The largest factor, `2⁶`: more bits per stage means fewer passes over the data but more
/// flops. On Flex, 64 was 4× faster than 16 at 4096 × 256; 128 was no faster at 16384 × 256.
const RADIX_BITS: u32 = 6;

/// The transform of size `size` (a power of two), unnormalised (entries `±1`).
#[derive(Clone, Debug)]
pub(crate) struct Hadamard<B: Backend> {
    size: usize,
    /// `H_r` of each stage, outermost factor first.
    stages: Vec<Tensor<B, 2>>,
}

impl<B: Backend> Hadamard<B> {
    pub(crate) fn new(size: usize, device: &B::Device) -> Self {
        debug_assert!(size.is_power_of_two());
        let bits = size.trailing_zeros();
        let count = bits.div_ceil(RADIX_BITS);
        // Bits spread evenly over the stages (13 bits: 5, 4, 4).
        let stages = (0..count)
            .map(|stage| {
                let r = 1usize << (bits / count + u32::from(stage < bits % count));
                sylvester::<B>(r, device)
            })
            .collect();
        Self { size, stages }
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// `H·x`.
    ///
    /// # Shapes
    /// - x: `[size, m]`
    /// - output: `[size, m]`
    pub(crate) fn transform_rows(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [n, m] = x.dims();
        // Row `i` is the multi-index (i₁, …, i_s), i₁ outermost. Stage `t` multiplies by
        // `H_{r_t}` along i_t: a product batched over the `outer` indices before it, with
        // `H` broadcast, so that no stage permutes the data.
        let mut outer = 1;
        for h in &self.stages {
            let r = h.dims()[0];
            let inner = n / (outer * r) * m;
            x = h
                .clone()
                .unsqueeze::<3>()
                .matmul(x.reshape([outer, r, inner]))
                .reshape([n, m]);
            outer *= r;
        }
        x
    }
}

/// `H_r[i][j] = (−1)^popcount(i & j)`.
fn sylvester<B: Backend>(r: usize, device: &B::Device) -> Tensor<B, 2> {
    let entries: Vec<f32> = (0..r * r)
        .map(|e| {
            if ((e / r) & (e % r)).count_ones().is_multiple_of(2) {
                1.0
            } else {
                -1.0
            }
        })
        .collect();
    Tensor::from_data(TensorData::new(entries, [r, r]), device)
}
