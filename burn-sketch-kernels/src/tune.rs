//! Which forward kernels run for a shape on a device: the choice burn-cubecl's `tune.rs` makes
//! for its own kernels, here from the device's properties rather than by timing.

use burn_cubecl::CubeRuntime;

use crate::fused::MAX_FUSED_RANK;
use crate::gemm::{TILE, split_count};

/// Which forward kernels [`forward`](crate::forward) uses for a shape on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardPath {
    /// One launch, `P` in shared memory; `column_groups` cubes share each row tile.
    Fused {
        /// How many cubes split `d_out` for each tile of rows.
        column_groups: usize,
    },
    /// Two launches: `P = x·[S1 | U2]` with its depth split across cubes into partial sums
    /// (see [`split_count`]), then the fused kernel making `P` from those sums.
    Split {
        /// As for [`ForwardPath::Fused`].
        column_groups: usize,
    },
    /// For ranks too wide for the fused kernel's shared memory: `P` to global memory (its
    /// slices added by a second launch when its depth is split), then `y = P·[U1; S2]`.
    Tiled,
}

/// Chooses the forward kernels from the device's properties: [`ForwardPath::Fused`] when the
/// row tiles of `P` fill the device by themselves, [`ForwardPath::Split`] (the projection split
/// in depth across cubes, see [`split_count`]) when they are too few, and
/// [`ForwardPath::Tiled`] when `2Tk > MAX_FUSED_RANK`, too wide for the `P` block in shared
/// memory. With too few row tiles, `d_out` is also split into column groups, at most one per
/// 16 output columns. Why these thresholds: the book's "Backends and kernels".
pub fn choose_forward_path<R: CubeRuntime>(
    client: &cubecl::prelude::ComputeClient<R>,
    rows: usize,
    d_in: usize,
    rank: usize,
    d_out: usize,
) -> ForwardPath {
    let tile = TILE as usize;
    let padded = rank.div_ceil(tile) * tile;
    let hardware = &client.properties().hardware;
    let shared_bytes = (tile * padded + 2 * tile * tile) * size_of::<f32>();
    if padded > MAX_FUSED_RANK || shared_bytes > hardware.max_shared_memory_size {
        return ForwardPath::Tiled;
    }
    let target_cubes = hardware
        .num_streaming_multiprocessors
        .map_or(64, |sms| 2 * sms as usize);
    let row_tiles = rows.div_ceil(tile).max(1);
    let column_groups = target_cubes
        .div_ceil(row_tiles)
        .clamp(1, d_out.div_ceil(tile).max(1));
    if split_count(client, rows, rank, d_in) > 1 {
        ForwardPath::Split { column_groups }
    } else {
        ForwardPath::Fused { column_groups }
    }
}
