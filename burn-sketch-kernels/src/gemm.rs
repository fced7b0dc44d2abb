//! The tiled product kernel: `out = α·(L₀·R₀ [+ L₁·R₁]) [+ bias]` over strided layouts.
//!
//! One kernel serves every product of the sketched layer that is not fused: the two-launch
//! forward (`P = x·A`, then `y = P·B`), and all of the backward (`∂P`, `∂x`, `∂S1`, `∂S2`).
//! The operands are read through [`layout`](crate::layout)s, so the Panther-layout factors
//! and their transposes are used in place. The optional second product lets a sum such as
//! `P₁·U1 + P₂·S2` accumulate in registers and write its output once.
//!
//! Each cube computes a `TILE × TILE` block of the output, one element per unit, staging
//! `TILE × TILE` tiles of both operands through shared memory in `f32` whatever the element
//! type, so half-precision inputs accumulate in single precision. Edges are handled by
//! zero-filled loads and guarded stores, so any shape works.

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::layout::offset;

/// The side of an output tile, and of the cube (`TILE × TILE` units).
pub const TILE: u32 = 16;

/// Returns `acc` plus this unit's output element of `lhs·rhs`, walking the shared depth in
/// tiles. Every unit of the cube must call it (it synchronises the cube).
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate_product<F: Float>(
    lhs: &Tensor<F>,
    rhs: &Tensor<F>,
    lhs_tile: &mut SharedMemory<f32>,
    rhs_tile: &mut SharedMemory<f32>,
    acc: f32,
    rows: usize,
    cols: usize,
    depth: usize,
    rank: usize,
    #[comptime] lhs_layout: u32,
    #[comptime] rhs_layout: u32,
) -> f32 {
    let tile = comptime!(TILE as usize);
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let row = CUBE_POS_Y as usize * tile + ty;
    let col = CUBE_POS_X as usize * tile + tx;
    let num_chunks = depth.div_ceil(tile);
    let mut sum = acc;

    for chunk in 0..num_chunks {
        let base = chunk * tile;
        let mut l = 0.0f32;
        if row < rows && base + tx < depth {
            l = f32::cast_from(lhs[offset::<F>(lhs, row, base + tx, rank, lhs_layout)]);
        }
        lhs_tile[ty * tile + tx] = l;
        let mut r = 0.0f32;
        if base + ty < depth && col < cols {
            r = f32::cast_from(rhs[offset::<F>(rhs, base + ty, col, rank, rhs_layout)]);
        }
        rhs_tile[ty * tile + tx] = r;
        sync_cube();

        #[unroll]
        for kk in 0..tile {
            sum += lhs_tile[ty * tile + kk] * rhs_tile[kk * tile + tx];
        }
        sync_cube();
    }
    sum
}

/// The kernel body; see the module documentation. Launched by [`gemm`].
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn gemm_kernel<F: Float>(
    lhs0: &Tensor<F>,
    rhs0: &Tensor<F>,
    lhs1: &Tensor<F>,
    rhs1: &Tensor<F>,
    bias: &Tensor<F>,
    out: &mut Tensor<F>,
    rows: u32,
    cols: u32,
    depth: u32,
    rank: u32,
    alpha: f32,
    #[comptime] lhs_layout: u32,
    #[comptime] rhs_layout: u32,
    #[comptime] out_layout: u32,
    #[comptime] two_products: bool,
    #[comptime] has_bias: bool,
    #[define(F)] _dtype: StorageType,
) {
    let tile = comptime!(TILE as usize);
    let rows = rows as usize;
    let cols = cols as usize;
    let depth = depth as usize;
    let rank = rank as usize;
    let mut lhs_tile = SharedMemory::<f32>::new(tile * tile);
    let mut rhs_tile = SharedMemory::<f32>::new(tile * tile);

    let mut acc = accumulate_product::<F>(
        lhs0,
        rhs0,
        &mut lhs_tile,
        &mut rhs_tile,
        0.0f32,
        rows,
        cols,
        depth,
        rank,
        lhs_layout,
        rhs_layout,
    );
    if comptime!(two_products) {
        acc = accumulate_product::<F>(
            lhs1,
            rhs1,
            &mut lhs_tile,
            &mut rhs_tile,
            acc,
            rows,
            cols,
            depth,
            rank,
            lhs_layout,
            rhs_layout,
        );
    }

    let row = CUBE_POS_Y as usize * tile + UNIT_POS_Y as usize;
    let col = CUBE_POS_X as usize * tile + UNIT_POS_X as usize;
    if row < rows && col < cols {
        let mut value = alpha * acc;
        if comptime!(has_bias) {
            value += f32::cast_from(bias[col * bias.stride(0)]);
        }
        out[offset::<F>(out, row, col, rank, out_layout)] = F::cast_from(value);
    }
}

/// The shape and layouts of one [`gemm`] launch.
#[derive(Debug, Clone, Copy)]
pub struct GemmProblem {
    /// Rows of the logical output (and of each left operand).
    pub rows: usize,
    /// Columns of the logical output (and of each right operand).
    pub cols: usize,
    /// The shared (summed) dimension.
    pub depth: usize,
    /// The sketch size `k` that the factor layouts split rank indices by.
    pub rank: usize,
    /// Scale applied to the sum of products, before the bias.
    pub alpha: f32,
    /// [Layout](crate::layout) of the left operands.
    pub lhs_layout: u32,
    /// [Layout](crate::layout) of the right operands.
    pub rhs_layout: u32,
    /// [Layout](crate::layout) the output is written in.
    pub out_layout: u32,
}

/// Launches [`gemm_kernel`]: writes `α·(first.0·first.1 [+ second.0·second.1]) [+ bias]`
/// into `out`, which the caller allocates with a shape matching `problem.out_layout`.
///
/// All tensors must share a client and element type; the caller (this crate's
/// [`sketch`](crate::sketch) module) guarantees both.
pub fn gemm<R: CubeRuntime>(
    problem: &GemmProblem,
    first: (&CubeTensor<R>, &CubeTensor<R>),
    second: Option<(&CubeTensor<R>, &CubeTensor<R>)>,
    bias: Option<&CubeTensor<R>>,
    out: &CubeTensor<R>,
) {
    let tiles = |size: usize| size.div_ceil(TILE as usize).max(1) as u32;
    let cube_count = CubeCount::Static(tiles(problem.cols), tiles(problem.rows), 1);
    let cube_dim = CubeDim {
        x: TILE,
        y: TILE,
        z: 1,
    };
    // Absent operands are bound to a tensor that is already an argument: the kernel never
    // reads them (their use is compiled out), and no placeholder buffer is allocated.
    let (lhs1, rhs1) = second.unwrap_or(first);
    let bias_arg = bias.unwrap_or(first.0);

    gemm_kernel::launch::<R>(
        &out.client,
        cube_count,
        cube_dim,
        first.0.clone().into_tensor_arg(),
        first.1.clone().into_tensor_arg(),
        lhs1.clone().into_tensor_arg(),
        rhs1.clone().into_tensor_arg(),
        bias_arg.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        problem.rows as u32,
        problem.cols as u32,
        problem.depth as u32,
        problem.rank as u32,
        problem.alpha,
        problem.lhs_layout,
        problem.rhs_layout,
        problem.out_layout,
        second.is_some(),
        bias.is_some(),
        out.dtype.into(),
    );
}
