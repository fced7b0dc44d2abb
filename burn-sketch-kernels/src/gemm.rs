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
//!
//! **Split depth.** Most products of the sketched layer are skinny: `x·S1` is `n × Tk` with a
//! depth of `d_in`, so for `n = 256`, `k = 16` it has 16 output tiles, far too few cubes for a
//! GPU, each walking thousands of depth steps in sequence. When the output has fewer tiles
//! than the device has room for, [`split_count`] cuts the depth into slices: cube `z` sums
//! slice `z` into an `f32` workspace `[splits, rows, cols]`, and [`reduce_splits_kernel()`] adds
//! the slices, scales, adds the bias and writes the output in its layout. The extra traffic
//! is `2 · splits · rows · cols` floats, small next to the operands for such shapes.

use burn_backend::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::layout::{Layout, offset};

/// The side of an output tile, and of the cube (`TILE × TILE` units).
pub const TILE: u32 = 16;

/// How the right operand of a product is made of tensors. A compile-time argument of
/// [`gemm_kernel()`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Concat {
    /// One tensor.
    None,
    /// Two tensors side by side: columns from `concat_at` on come from the second
    /// (`[S1 | U2]`, the input-side factors of both halves).
    Cols,
    /// Two tensors one above the other: depth rows from `concat_at` on come from the second
    /// (`[U1; S2]`, the output-side factors of both halves).
    Depth,
}

/// Returns `acc` plus this unit's output element of `lhs·rhs`, walking the shared depth in
/// tiles. Every unit of the cube must call it (it synchronises the cube).
///
/// With `concat` set, the right operand is `rhs` and `rhs_tail` joined at `concat_at`, side
/// by side ([`Concat::Cols`]) or one above the other ([`Concat::Depth`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate_product<F: Float>(
    lhs: &Tensor<F>,
    rhs: &Tensor<F>,
    rhs_tail: &Tensor<F>,
    concat_at: usize,
    lhs_tile: &mut SharedMemory<f32>,
    rhs_tile: &mut SharedMemory<f32>,
    acc: f32,
    rows: usize,
    cols: usize,
    depth: usize,
    low_rank: usize,
    first_chunk: usize,
    end_chunk: usize,
    #[comptime] lhs_layout: Layout,
    #[comptime] rhs_layout: Layout,
    #[comptime] concat: Concat,
) -> f32 {
    let tile = comptime!(TILE as usize);
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let row = CUBE_POS_Y as usize * tile + ty;
    let col = CUBE_POS_X as usize * tile + tx;
    let mut sum = acc;

    for chunk in first_chunk..end_chunk {
        let base = chunk * tile;
        let mut l = 0.0f32;
        if row < rows && base + tx < depth {
            l = f32::cast_from(lhs[offset::<F>(lhs, row, base + tx, low_rank, lhs_layout)]);
        }
        lhs_tile[ty * tile + tx] = l;
        let mut r = 0.0f32;
        let d = base + ty;
        if d < depth && col < cols {
            match concat {
                Concat::None => {
                    r = f32::cast_from(rhs[offset::<F>(rhs, d, col, low_rank, rhs_layout)]);
                }
                Concat::Cols => {
                    if col < concat_at {
                        r = f32::cast_from(rhs[offset::<F>(rhs, d, col, low_rank, rhs_layout)]);
                    } else {
                        let c = col - concat_at;
                        r = f32::cast_from(
                            rhs_tail[offset::<F>(rhs_tail, d, c, low_rank, rhs_layout)],
                        );
                    }
                }
                Concat::Depth => {
                    if d < concat_at {
                        r = f32::cast_from(rhs[offset::<F>(rhs, d, col, low_rank, rhs_layout)]);
                    } else {
                        let e = d - concat_at;
                        r = f32::cast_from(
                            rhs_tail[offset::<F>(rhs_tail, e, col, low_rank, rhs_layout)],
                        );
                    }
                }
            }
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

/// `α·acc + bias[col]`: the last step of an output element, whether its sum was made in one
/// cube ([`gemm_kernel()`]) or gathered from slices ([`reduce_splits_kernel()`]).
#[cube]
fn scale_and_bias<F: Float>(
    acc: f32,
    alpha: f32,
    bias: &Tensor<F>,
    col: usize,
    #[comptime] has_bias: bool,
) -> f32 {
    let mut value = alpha * acc;
    if comptime!(has_bias) {
        value += f32::cast_from(bias[col * bias.stride(0)]);
    }
    value
}

/// The kernel body; see the module documentation. Launched by [`gemm`].
///
/// Cube `(x, y, z)` computes output tile `(y, x)` over depth chunks
/// `[z·chunks_per_split, (z+1)·chunks_per_split)`. Without `split` there is one slice and
/// the cube writes `α·acc + bias` in `out_layout` (`O` is the element type); with `split` it
/// writes its raw partial sum to slice `z` of a row-major `f32` workspace (`O` is `f32`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn gemm_kernel<F: Float, O: Float>(
    lhs0: &Tensor<F>,
    rhs0: &Tensor<F>,
    lhs1: &Tensor<F>,
    rhs1: &Tensor<F>,
    bias: &Tensor<F>,
    out: &mut Tensor<O>,
    rows: u32,
    cols: u32,
    depth: u32,
    low_rank: u32,
    alpha: f32,
    chunks_per_split: u32,
    concat_at: u32,
    #[comptime] lhs_layout: Layout,
    #[comptime] rhs_layout: Layout,
    #[comptime] out_layout: Layout,
    #[comptime] concat: Concat,
    #[comptime] two_products: bool,
    #[comptime] has_bias: bool,
    #[comptime] split: bool,
    #[define(F, O)] _dtypes: [StorageType; 2],
) {
    let tile = comptime!(TILE as usize);
    let rows = rows as usize;
    let cols = cols as usize;
    let depth = depth as usize;
    let low_rank = low_rank as usize;
    let mut lhs_tile = SharedMemory::<f32>::new(tile * tile);
    let mut rhs_tile = SharedMemory::<f32>::new(tile * tile);

    let first_chunk = CUBE_POS_Z as usize * chunks_per_split as usize;
    let mut end_chunk = first_chunk + chunks_per_split as usize;
    if end_chunk > depth.div_ceil(tile) {
        end_chunk = depth.div_ceil(tile);
    }

    let mut acc = accumulate_product::<F>(
        lhs0,
        rhs0,
        rhs1,
        concat_at as usize,
        &mut lhs_tile,
        &mut rhs_tile,
        0.0f32,
        rows,
        cols,
        depth,
        low_rank,
        first_chunk,
        end_chunk,
        lhs_layout,
        rhs_layout,
        concat,
    );
    if comptime!(two_products) {
        let single = comptime!(Concat::None);
        acc = accumulate_product::<F>(
            lhs1,
            rhs1,
            rhs1,
            0usize,
            &mut lhs_tile,
            &mut rhs_tile,
            acc,
            rows,
            cols,
            depth,
            low_rank,
            first_chunk,
            end_chunk,
            lhs_layout,
            rhs_layout,
            single,
        );
    }

    let row = CUBE_POS_Y as usize * tile + UNIT_POS_Y as usize;
    let col = CUBE_POS_X as usize * tile + UNIT_POS_X as usize;
    if row < rows && col < cols {
        if comptime!(split) {
            out[(CUBE_POS_Z as usize * rows + row) * cols + col] = O::cast_from(acc);
        } else {
            let value = scale_and_bias::<F>(acc, alpha, bias, col, has_bias);
            out[offset::<O>(out, row, col, low_rank, out_layout)] = O::cast_from(value);
        }
    }
}

/// Sums the `splits` slices of a [`gemm_kernel()`] workspace (`[splits, rows, cols]`, `f32`),
/// scales by `α`, adds the bias and writes the output in `out_layout`: one unit per output
/// element.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn reduce_splits_kernel<F: Float>(
    partials: &Tensor<f32>,
    bias: &Tensor<F>,
    out: &mut Tensor<F>,
    rows: u32,
    cols: u32,
    splits: u32,
    low_rank: u32,
    alpha: f32,
    #[comptime] out_layout: Layout,
    #[comptime] has_bias: bool,
    #[define(F)] _dtype: StorageType,
) {
    let rows = rows as usize;
    let cols = cols as usize;
    let index = ABSOLUTE_POS;
    if index < rows * cols {
        let row = index / cols;
        let col = index % cols;
        let mut sum = 0.0f32;
        for s in 0..splits as usize {
            sum += partials[s * rows * cols + index];
        }
        let value = scale_and_bias::<F>(sum, alpha, bias, col, has_bias);
        out[offset::<F>(out, row, col, low_rank as usize, out_layout)] = F::cast_from(value);
    }
}

/// The smallest slice of the depth worth a cube of its own: below it, a cube's fixed costs
/// (staging, the partial's write and read back) outweigh its share of the sum.
pub const MIN_SPLIT_DEPTH: usize = 256;

/// How many slices to cut a product's depth into: enough that the output's tiles times the
/// slices make about four cubes per multiprocessor (64 cubes where the device does not report
/// its count), with slices of at least [`MIN_SPLIT_DEPTH`]. Outputs that fill the device
/// alone get 1 (no split).
///
/// Four cubes of 256 units, not one, because these cubes are bound by the latency of their
/// loads, not by arithmetic: a multiprocessor hides it only with several cubes in flight.
pub fn split_count<R: CubeRuntime>(
    client: &ComputeClient<R>,
    rows: usize,
    cols: usize,
    depth: usize,
) -> usize {
    let tile = TILE as usize;
    let tiles = rows.div_ceil(tile).max(1) * cols.div_ceil(tile).max(1);
    let target = client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .map_or(64, |sms| 4 * sms as usize);
    if tiles >= target {
        return 1;
    }
    target.div_ceil(tiles).min(depth / MIN_SPLIT_DEPTH).max(1)
}

/// The shape and layouts of one [`gemm`] launch; build it with [`GemmProblem::new`] and the
/// `with_*` methods.
#[derive(Debug, Clone, Copy)]
pub struct GemmProblem {
    /// Rows of the logical output (and of each left operand).
    pub rows: usize,
    /// Columns of the logical output (and of each right operand).
    pub cols: usize,
    /// The shared (summed) dimension.
    pub depth: usize,
    /// The sketch size `k` that the factor layouts split rank indices by.
    pub low_rank: usize,
    /// Scale applied to the sum of products, before the bias.
    pub alpha: f32,
    /// Layout of the left operands.
    pub lhs_layout: Layout,
    /// Layout of the right operands.
    pub rhs_layout: Layout,
    /// Layout the output is written in.
    pub out_layout: Layout,
    /// Slices the depth is cut into (see the module documentation): `None` lets
    /// [`split_count`] choose for the device, `Some(1)` is no split.
    pub splits: Option<usize>,
}

impl GemmProblem {
    /// An unscaled `rows × cols` product over `depth`, every operand row-major, the split
    /// chosen for the device.
    pub fn new(rows: usize, cols: usize, depth: usize) -> Self {
        Self {
            rows,
            cols,
            depth,
            low_rank: 1,
            alpha: 1.0,
            lhs_layout: Layout::RowMajor,
            rhs_layout: Layout::RowMajor,
            out_layout: Layout::RowMajor,
            splits: None,
        }
    }

    /// Reads and writes through `(lhs, rhs, out)` layouts, whose factor layouts split rank
    /// indices by `low_rank`.
    pub fn with_layouts(
        mut self,
        (lhs, rhs, out): (Layout, Layout, Layout),
        low_rank: usize,
    ) -> Self {
        self.lhs_layout = lhs;
        self.rhs_layout = rhs;
        self.out_layout = out;
        self.low_rank = low_rank;
        self
    }

    /// Scales the sum of products by `alpha`.
    pub fn with_alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }

    /// Cuts the depth into `splits` slices (`1`: no split) instead of the device's choice.
    pub fn with_splits(mut self, splits: usize) -> Self {
        self.splits = Some(splits);
        self
    }
}

/// Launches [`gemm_kernel()`] (and, when `problem.splits > 1`, [`reduce_splits_kernel()`]):
/// writes `α·(first.0·first.1 [+ second.0·second.1]) [+ bias]` into `out`, which the caller
/// allocates with a shape matching `problem.out_layout`.
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
    // Absent operands are bound to a tensor that is already an argument: the kernel never
    // reads them (their use is compiled out), and no placeholder buffer is allocated.
    let (lhs1, rhs1) = second.unwrap_or(first);
    launch(
        problem,
        [first.0, first.1, lhs1, rhs1],
        second.is_some(),
        (Concat::None, 0),
        bias,
        out,
    );
}

/// Like [`gemm`] with one product whose right operand is two tensors joined at `at`:
/// `concat` is [`Concat::Cols`] (`[head | tail]`, `at` columns of `head`) or
/// [`Concat::Depth`] (`[head; tail]`, `at` depth rows of `head`). Both are read in
/// `problem.rhs_layout`, in place: this is how `x·[S1 | U2]` and `P·[U1; S2]` run as one
/// launch each without copying the factors into a packed matrix. [`Concat::None`] reads
/// `head` alone, as [`gemm`] does.
pub fn gemm_concat<R: CubeRuntime>(
    problem: &GemmProblem,
    lhs: &CubeTensor<R>,
    (head, tail): (&CubeTensor<R>, &CubeTensor<R>),
    (concat, at): (Concat, usize),
    bias: Option<&CubeTensor<R>>,
    out: &CubeTensor<R>,
) {
    launch(
        problem,
        [lhs, head, lhs, tail],
        false,
        (concat, at),
        bias,
        out,
    );
}

fn launch<R: CubeRuntime>(
    problem: &GemmProblem,
    [lhs0, rhs0, lhs1, rhs1]: [&CubeTensor<R>; 4],
    two_products: bool,
    (concat, concat_at): (Concat, usize),
    bias: Option<&CubeTensor<R>>,
    out: &CubeTensor<R>,
) {
    let tile = TILE as usize;
    let tiles = |size: usize| size.div_ceil(tile).max(1) as u32;
    let depth_chunks = problem.depth.div_ceil(tile).max(1);
    // Equal whole-chunk slices; rounding may leave fewer slices than asked for.
    let wanted = problem
        .splits
        .unwrap_or_else(|| split_count(&out.client, problem.rows, problem.cols, problem.depth));
    let chunks_per_split = depth_chunks.div_ceil(wanted.clamp(1, depth_chunks));
    let splits = depth_chunks.div_ceil(chunks_per_split);
    let cube_count = CubeCount::Static(tiles(problem.cols), tiles(problem.rows), splits as u32);
    let cube_dim = CubeDim {
        x: TILE,
        y: TILE,
        z: 1,
    };
    let bias_arg = bias.unwrap_or(lhs0);
    let workspace = (splits > 1).then(|| {
        empty_device_contiguous_dtype(
            out.client.clone(),
            out.device.clone(),
            Shape::new([splits, problem.rows, problem.cols]),
            DType::F32,
        )
    });
    let target = workspace.as_ref().unwrap_or(out);

    gemm_kernel::launch::<R>(
        &out.client,
        cube_count,
        cube_dim,
        lhs0.clone().into_tensor_arg(),
        rhs0.clone().into_tensor_arg(),
        lhs1.clone().into_tensor_arg(),
        rhs1.clone().into_tensor_arg(),
        bias_arg.clone().into_tensor_arg(),
        target.clone().into_tensor_arg(),
        problem.rows as u32,
        problem.cols as u32,
        problem.depth as u32,
        problem.low_rank as u32,
        problem.alpha,
        chunks_per_split as u32,
        concat_at as u32,
        problem.lhs_layout,
        problem.rhs_layout,
        problem.out_layout,
        concat,
        two_products,
        bias.is_some(),
        workspace.is_some(),
        [lhs0.dtype.into(), target.dtype.into()],
    );

    if let Some(workspace) = workspace {
        let elements = problem.rows * problem.cols;
        let cube_dim = CubeDim { x: 256, y: 1, z: 1 };
        reduce_splits_kernel::launch::<R>(
            &out.client,
            CubeCount::Static(elements.div_ceil(256) as u32, 1, 1),
            cube_dim,
            workspace.into_tensor_arg(),
            bias_arg.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            problem.rows as u32,
            problem.cols as u32,
            splits as u32,
            problem.low_rank as u32,
            problem.alpha,
            problem.out_layout,
            bias.is_some(),
            out.dtype.into(),
        );
    }
}
