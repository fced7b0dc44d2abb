//! The fused forward kernel: `y = (x·A)·B·α + bias` with `P = x·A` kept on chip.
//!
//! `A = [S1 | U2]` (`d_in × 2Tk`) and `B = [U1; S2]` (`2Tk × d_out`) are read in place from
//! the four Panther-layout factors. A cube owns `TILE` rows of `x`:
//!
//! 1. it makes their `TILE × 2Tk` block of `P` in shared memory, either by walking `d_in` in
//!    tiles (each unit accumulates the `P` entries it owns, so no reduction is needed), or,
//!    when a first launch has already computed `P` with its depth split across cubes (see
//!    [`crate::gemm`]), by adding that launch's partial sums;
//! 2. it multiplies that block by `B`, one `TILE`-wide column tile of `y` at a time, scales,
//!    adds the bias, applies the [`Activation`] and writes each element of `y` once.
//!
//! From `x`, the forward is one launch and `P` never goes to global memory. From partial
//! sums it is two launches, the least a split depth allows on devices without cross-cube
//! synchronisation (wgpu has none): the first launch has the parallelism of the split, and
//! this one adds the slices as it reads them instead of a third launch doing it.
//!
//! To keep a large GPU busy when `n` is small, the host may split `d_out` into several column
//! groups (grid `x`); each group makes its rows' `P` again, which costs `2·TILE·d_in·2Tk`
//! FLOPs per extra group from `x` (or reads `splits·TILE·2Tk` partial sums), and is why the
//! groups are bounded (see [`crate::sketch`]).
//!
//! Shared memory holds `TILE × padded_rank` `f32` values for `P`, so the fused kernel is only
//! used up to [`MAX_FUSED_RANK`]; wider layers take
//! [`ForwardPath::Tiled`](crate::ForwardPath::Tiled).

use burn_cubecl::CubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::KernelError;
use crate::activation::{Activation, activate};
use crate::gemm::TILE;
use crate::layout::{Layout, offset};
use crate::weights::CubeWeights;

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
    low_rank: usize,
) -> f32 {
    let layout = comptime!(Layout::InputFactor);
    let mut value = 0.0f32;
    if i < d_in {
        if j < half {
            value = f32::cast_from(s1s[offset::<F>(s1s, i, j, low_rank, layout)]);
        } else if j < 2 * half {
            value = f32::cast_from(u2s[offset::<F>(u2s, i, j - half, low_rank, layout)]);
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
    low_rank: usize,
) -> f32 {
    let layout = comptime!(Layout::OutputFactor);
    let mut value = 0.0f32;
    if o < d_out {
        if j < half {
            value = f32::cast_from(u1s[offset::<F>(u1s, j, o, low_rank, layout)]);
        } else if j < 2 * half {
            value = f32::cast_from(s2s[offset::<F>(s2s, j - half, o, low_rank, layout)]);
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
    partials: &ComptimeOption<Tensor<f32>>,
    out: &mut Tensor<F>,
    rows: u32,
    d_in: u32,
    d_out: u32,
    low_rank: u32,
    alpha: f32,
    tiles_per_group: u32,
    splits: u32,
    #[comptime] padded_rank: u32,
    #[comptime] has_bias: bool,
    #[comptime] activation: Activation,
    #[define(F)] _dtype: StorageType,
) {
    let tile = comptime!(TILE as usize);
    let width = comptime!(padded_rank as usize);
    let rank_tiles = comptime!((padded_rank / TILE) as usize);
    let rows = rows as usize;
    let d_in = d_in as usize;
    let d_out = d_out as usize;
    let low_rank = low_rank as usize;
    // `Tk`: where `U2` starts in `A` and `S2` in `B`.
    let half = low_rank * (u32::cast_from(s1s.shape(0)) as usize);
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let row = CUBE_POS_Y as usize * tile + ty;

    let mut p = SharedMemory::<f32>::new(tile * width);
    let mut x_tile = SharedMemory::<f32>::new(tile * tile);
    let mut w_tile = SharedMemory::<f32>::new(tile * tile);

    // Phase 1: this unit owns P[ty, jt·TILE + tx] for every rank tile jt.
    #[comptime]
    match partials {
        ComptimeOption::Some(partials) => {
            // Slice `s` of the split projection is `[rows, 2Tk]` at `s·rows·2Tk`.
            let rank = 2 * half;
            #[unroll]
            for jt in 0..rank_tiles {
                let col = jt * tile + tx;
                let mut sum = 0.0f32;
                if row < rows && col < rank {
                    for s in 0..splits as usize {
                        sum += partials[(s * rows + row) * rank + col];
                    }
                }
                p[ty * width + col] = sum;
            }
            sync_cube();
        }
        ComptimeOption::None => {
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
                        load_a::<F>(s1s, u2s, base + ty, jt * tile + tx, d_in, half, low_rank);
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
            w_tile[ty * tile + tx] =
                load_b::<F>(u1s, s2s, jt * tile + ty, col, d_out, half, low_rank);
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
            out[row * out.stride(0) + col * out.stride(1)] =
                F::cast_from(activate(value, activation));
        }
    }
}

/// Launches [`fused_forward_kernel()`] over `x` (`[n, d_in]`), writing
/// `activation(α·P·B + bias)` into `out` (`[n, d_out]`, allocated by the caller). `column_groups` splits `d_out` across that many cubes per row
/// tile. With `partials`, an `f32` workspace `[splits, n, 2Tk]` of the projection `x·A`'s
/// partial sums (see [`crate::gemm`]), `P` is their sum rather than computed from `x`. Shapes and element types are the caller's to check ([`crate::forward_with`] does);
/// this checks only what is particular to the kernel, its rank limit.
pub fn fused_forward<R: CubeRuntime>(
    x: &CubeTensor<R>,
    weights: &CubeWeights<R>,
    bias: Option<&CubeTensor<R>>,
    activation: Activation,
    partials: Option<&CubeTensor<R>>,
    out: &CubeTensor<R>,
    column_groups: usize,
) -> Result<(), KernelError> {
    let [rows, d_in] = x.meta.shape().dims::<2>();
    let [terms, _, low_rank] = weights.s1s.meta.shape().dims::<3>();
    let d_out = weights.s2s.meta.shape().dims::<3>()[2];
    let tile = TILE as usize;
    let padded_rank = (2 * terms * low_rank).div_ceil(tile) * tile;
    if padded_rank > MAX_FUSED_RANK {
        return Err(KernelError::FusedRankTooWide {
            rank: 2 * terms * low_rank,
            max: MAX_FUSED_RANK,
        });
    }
    let alpha = 1.0 / (2.0 * terms as f32);
    let column_tiles = d_out.div_ceil(tile);
    let groups = column_groups.clamp(1, column_tiles.max(1));
    let tiles_per_group = column_tiles.div_ceil(groups);
    let groups = column_tiles.div_ceil(tiles_per_group.max(1));

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
        weights.s1s.clone().into_tensor_arg(),
        weights.u2s.clone().into_tensor_arg(),
        weights.u1s.clone().into_tensor_arg(),
        weights.s2s.clone().into_tensor_arg(),
        bias_arg.clone().into_tensor_arg(),
        partials
            .map(|partials| partials.clone().into_tensor_arg())
            .into(),
        out.clone().into_tensor_arg(),
        rows as u32,
        d_in as u32,
        d_out as u32,
        low_rank as u32,
        alpha,
        tiles_per_group as u32,
        partials.map_or(1, |partials| partials.meta.shape()[0]) as u32,
        padded_rank as u32,
        bias.is_some(),
        activation,
        out.dtype.into(),
    );
    Ok(())
}
