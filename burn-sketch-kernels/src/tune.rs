//! Which forward kernels run for a shape on a device: the choice burn-cubecl's `tune.rs` makes
//! for its own kernels, here from the device's properties rather than by timing.

use burn_cubecl::CubeRuntime;

use crate::fused::MAX_FUSED_RANK;
use crate::gemm::{TILE, split_count};

/// Which forward kernels [`forward`] uses for a shape on a device.
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

/// Chooses the forward kernels.
///
/// The fused kernel computes each row tile's block of `P` in one cube, walking all of `d_in`
/// in sequence. That is the right shape of work when there are rows enough for the tiles of
/// `P` to fill the device by themselves. When they do not (a batch of 256 rows and
/// `2Tk = 32` is 32 tiles, for a GPU with over a hundred multiprocessors), the projection is
/// split in depth across cubes (see [`split_count`]) and the fused kernel adds the slices:
/// [`ForwardPath::Split`]. Either needs the `P` block in shared memory
/// (`2Tk ≤ MAX_FUSED_RANK`); wider ranks take [`ForwardPath::Tiled`].
///
/// The column groups: where the row tiles alone are fewer than about two cubes per
/// multiprocessor (64 cubes where the device does not report its count), `d_out` is split
/// into groups; each extra group makes its rows' block of `P` again, so groups stop at one
/// per 16 output columns.
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

