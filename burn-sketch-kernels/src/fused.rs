//! The fused forward kernel: `y = (x·A)·B·α + bias` in one launch, `P = x·A` kept on chip.
//!
//! `A = [S1 | U2]` (`d_in × 2Tk`) and `B = [U1; S2]` (`2Tk × d_out`) are read in place from
//! the four Panther-layout factors. A cube owns `TILE` rows of `x`:
//!
//! 1. it computes their `TILE × 2Tk` block of `P` into shared memory, walking `d_in` in
//!    tiles (each unit accumulates the `P` entries it owns, so no reduction is needed);
//! 2. it multiplies that block by `B`, one `TILE`-wide column tile of `y` at a time, scales,
//!    adds the bias and writes each element of `y` once.
//!
//! `P` never goes to global memory, and `x` and `y` cross it exactly once per column group.
//! To keep a large GPU busy when `n` is small, the host may split `d_out` into several column
//! groups (grid `x`); each group recomputes its rows' `P`, which costs `2·TILE·d_in·2Tk`
//! FLOPs per extra group and is why the split is bounded (see [`crate::sketch`]).
//!
//! Shared memory holds `TILE × padded_rank` `f32` values for `P`, so the fused path is only
//! used up to [`MAX_FUSED_RANK`]; wider layers take the two-launch path of [`crate::gemm`].

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::gemm::TILE;
use crate::layout::{INPUT_FACTOR, OUTPUT_FACTOR, offset};

/// The widest rank `2Tk` the fused kernel takes: `16 × 256` `f32` of `P` (16 KiB) plus two
/// 1 KiB staging tiles stays within the 32 KiB of shared memory every CUDA GPU and common
/// Vulkan drivers provide.
pub const MAX_FUSED_RANK: usize = 256;

/// Element `(i, j)` of `A = [S1 | U2]`, or zero outside it.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_a<F: Float>(
    s1s: &Tensor<F>,
    u2s: &Tensor<F>,
    i: usize,
    j: usize,
    d_in: usize,
    half: usize,
    rank: usize,
) -> f32 {
    let mut value = 0.0f32;
    if i < d_in {
        if j < half {
            value = f32::cast_from(s1s[offset::<F>(s1s, i, j, rank, INPUT_FACTOR)]);
        } else if j < 2 * half {
            value = f32::cast_from(u2s[offset::<F>(u2s, i, j - half, rank, INPUT_FACTOR)]);
        }
    }
    value
}

/// Element `(j, o)` of `B = [U1; S2]`, or zero outside it.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_b<F: Float>(
    u1s: &Tensor<F>,
    s2s: &Tensor<F>,
    j: usize,
    o: usize,
    d_out: usize,
    half: usize,
    rank: usize,
) -> f32 {
    let mut value = 0.0f32;
    if o < d_out {
        if j < half {
            value = f32::cast_from(u1s[offset::<F>(u1s, j, o, rank, OUTPUT_FACTOR)]);
        } else if j < 2 * half {
            value = f32::cast_from(s2s[offset::<F>(s2s, j - half, o, rank, OUTPUT_FACTOR)]);
        }
    }
    value
}

/// The kernel body; see the module documentation. Launched by [`fused_forward`].
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn fused_forward_kernel<F: Float>(
    x: &Tensor<F>,
    s1s: &Tensor<F>,
    u2s: &Tensor<F>,
    u1s: &Tensor<F>,
    s2s: &Tensor<F>,
    bias: &Tensor<F>,
    out: &mut Tensor<F>,
    rows: u32,
    d_in: u32,
    d_out: u32,
    rank: u32,
    alpha: f32,
    tiles_per_group: u32,
    #[comptime] padded_rank: u32,
    #[comptime] has_bias: bool,
    #[define(F)] _dtype: StorageType,
) {
    let tile = comptime!(TILE as usize);
    let width = comptime!(padded_rank as usize);
    let rank_tiles = comptime!((padded_rank / TILE) as usize);
    let rows = rows as usize;
    let d_in = d_in as usize;
    let d_out = d_out as usize;
    let rank = rank as usize;
    // `Tk`: where `U2` starts in `A` and `S2` in `B`.
    let half = rank * (u32::cast_from(s1s.shape(0)) as usize);
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let row = CUBE_POS_Y as usize * tile + ty;

    let mut p = SharedMemory::<f32>::new(tile * width);
    let mut x_tile = SharedMemory::<f32>::new(tile * tile);
    let mut w_tile = SharedMemory::<f32>::new(tile * tile);

    // Phase 1: this unit owns P[ty, jt·TILE + tx] for every rank tile jt.
    #[unroll]
    for jt in 0..rank_tiles {
        p[ty * width + jt * tile + tx] = 0.0f32;
    }
    let depth_tiles = d_in.div_ceil(tile);
    for chunk in 0..depth_tiles {
        let base = chunk * tile;
        let mut xv = 0.0f32;
        if row < rows && base + tx < d_in {
            xv = f32::cast_from(x[row * x.stride(0) + (base + tx) * x.stride(1)]);
        }
        x_tile[ty * tile + tx] = xv;
        #[unroll]
        for jt in 0..rank_tiles {
            w_tile[ty * tile + tx] =
                load_a::<F>(s1s, u2s, base + ty, jt * tile + tx, d_in, half, rank);
            sync_cube();
            let mut sum = p[ty * width + jt * tile + tx];
            #[unroll]
            for kk in 0..tile {
                sum += x_tile[ty * tile + kk] * w_tile[kk * tile + tx];
            }
            p[ty * width + jt * tile + tx] = sum;
            sync_cube();
        }
    }

    // Phase 2: this cube's column tiles of y = α·P·B + bias.
    let first_tile = CUBE_POS_X as usize * tiles_per_group as usize;
    let mut end_tile = first_tile + tiles_per_group as usize;
    if end_tile > d_out.div_ceil(tile) {
        end_tile = d_out.div_ceil(tile);
    }
    for ot in first_tile..end_tile {
        let col = ot * tile + tx;
        let mut acc = 0.0f32;
        #[unroll]
        for jt in 0..rank_tiles {
            w_tile[ty * tile + tx] = load_b::<F>(u1s, s2s, jt * tile + ty, col, d_out, half, rank);
            sync_cube();
            #[unroll]
            for kk in 0..tile {
                acc += p[ty * width + jt * tile + kk] * w_tile[kk * tile + tx];
            }
            sync_cube();
        }
        if row < rows && col < d_out {
            let mut value = alpha * acc;
            if comptime!(has_bias) {
                value += f32::cast_from(bias[col * bias.stride(0)]);
            }
            out[row * out.stride(0) + col * out.stride(1)] = F::cast_from(value);
        }
    }
}

/// Launches [`fused_forward_kernel`] over `x` (`[n, d_in]`), writing `out` (`[n, d_out]`,
/// allocated by the caller). `column_groups` splits `d_out` across that many cubes per row
/// tile; `rank` is `k` and the factors are `[T, d_in, k]` / `[T, k, d_out]`.
#[allow(clippy::too_many_arguments)]
pub fn fused_forward<R: CubeRuntime>(
    x: &CubeTensor<R>,
    s1s: &CubeTensor<R>,
    u2s: &CubeTensor<R>,
    u1s: &CubeTensor<R>,
    s2s: &CubeTensor<R>,
    bias: Option<&CubeTensor<R>>,
    out: &CubeTensor<R>,
    alpha: f32,
    column_groups: usize,
) {
    let [rows, d_in] = x.meta.shape().dims::<2>();
    let [terms, _, rank] = s1s.meta.shape().dims::<3>();
    let d_out = s2s.meta.shape().dims::<3>()[2];
    let tile = TILE as usize;
    let padded_rank = (2 * terms * rank).div_ceil(tile) * tile;
    assert!(
        padded_rank <= MAX_FUSED_RANK,
        "fused_forward: rank 2Tk = {} exceeds MAX_FUSED_RANK = {MAX_FUSED_RANK}",
        2 * terms * rank
    );
    let column_tiles = d_out.div_ceil(tile);
    let groups = column_groups.clamp(1, column_tiles);
    let tiles_per_group = column_tiles.div_ceil(groups);
    let groups = column_tiles.div_ceil(tiles_per_group);

    let cube_count = CubeCount::Static(groups as u32, rows.div_ceil(tile) as u32, 1);
    let cube_dim = CubeDim {
        x: TILE,
        y: TILE,
        z: 1,
    };
    // As in `gemm`: an absent bias is bound to an existing argument and never read.
    let bias_arg = bias.unwrap_or(x);
    fused_forward_kernel::launch::<R>(
        &out.client,
        cube_count,
        cube_dim,
        x.clone().into_tensor_arg(),
        s1s.clone().into_tensor_arg(),
        u2s.clone().into_tensor_arg(),
        u1s.clone().into_tensor_arg(),
        s2s.clone().into_tensor_arg(),
        bias_arg.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows as u32,
        d_in as u32,
        d_out as u32,
        rank as u32,
        alpha,
        tiles_per_group as u32,
        padded_rank as u32,
        bias.is_some(),
        out.dtype.into(),
    );
}
