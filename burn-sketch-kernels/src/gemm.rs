//! The tiled product kernel: `out = f(α·L·R [+ bias])` over strided layouts, up to three
//! independent products in one launch.
//!
//! One kernel serves every product of the sketched layer that is not fused: the projection
//! `P = x·A` of the forward, and all of the backward (`∂P` with `P` recomputed, then `∂x`,
//! `∂S1`, `∂S2`). The operands are read through [`layout`](crate::layout)s, so the
//! Panther-layout factors and their transposes are used in place, and at element offsets, so
//! one half of a `[n, 2Tk]` matrix is read without a copy.
//!
//! Each cube computes a `TILE × TILE` block of one product's output, one element per unit,
//! staging `TILE × TILE` tiles of both operands through shared memory in `f32` whatever the
//! element type, so half-precision inputs accumulate in single precision. Edges are handled by
//! zero-filled loads and guarded stores, so any shape works.
//!
//! **Grouped launches.** The backward's products do not depend on each other once `∂P` and
//! `P` exist, and each alone is too small to fill a GPU (`xᵀ·∂P₁` is `d_in × Tk`). One launch
//! of [`gemm_kernel()`] runs up to [`GROUP`] of them: the cubes are numbered in one sequence,
//! the first product's tiles first, and each cube finds its product and tile from its number.
//! A launch costs the device a fixed time whatever its size, so three products in one launch
//! cost one launch, and the small products fill the device together.
//!
//! **Split depth.** Most products of the sketched layer are skinny: `x·S1` is `n × Tk` with a
//! depth of `d_in`, so for `n = 256`, `k = 16` it has 16 output tiles, far too few cubes for a
//! GPU, each walking thousands of depth steps in sequence. When the output has fewer tiles
//! than the device has room for, [`split_count`] cuts the depth into slices: cube `z` writes
//! the raw sum over slice `z` into an `f32` workspace `[splits, rows, cols]`. Someone must add
//! the slices: [`reduce_splits_kernel()`] (a second, small launch), or the consumer of the
//! product itself, as the sketched forward's second launch does (see [`crate::fused`]).

use burn_backend::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::activation::{Activation, activate};
use crate::layout::{Layout, offset};

/// The side of an output tile, and of the cube (`TILE × TILE` units).
pub const TILE: u32 = 16;

/// The most products one launch of [`gemm_kernel()`] runs.
pub const GROUP: usize = 3;

/// How the right operand of a product is made of tensors. A compile-time argument of
/// [`gemm_kernel()`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Concat {
    /// One tensor.
    #[default]
    None,
    /// Two tensors side by side: columns from `concat_at` on come from the second
    /// (`[S1 | U2]`, the input-side factors of both halves).
    Cols,
    /// Two tensors one above the other: depth rows from `concat_at` on come from the second
    /// (`[U1; S2]`, the output-side factors of both halves).
    Depth,
}

/// The compile-time shape of one product in a launch of [`gemm_kernel()`]: its layouts, how
/// its right operand is joined, and what it writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProductKind {
    /// Layout of the left operand.
    pub lhs: Layout,
    /// Layout of the right operand (both tensors of a joined one).
    pub rhs: Layout,
    /// Layout the output is written in (ignored for partial sums, which are row-major).
    pub out: Layout,
    /// How the right operand is made of tensors.
    pub concat: Concat,
    /// Writes raw partial sums into an `f32` workspace `[splits, rows, cols]` rather than
    /// `α·sum [+ bias]` into the output.
    pub partial: bool,
    /// Adds the launch's bias to each output row.
    pub bias: bool,
    /// Applied to each output element last (after the scale and bias).
    pub activation: Activation,
}

impl Default for ProductKind {
    fn default() -> Self {
        Self {
            lhs: Layout::RowMajor,
            rhs: Layout::RowMajor,
            out: Layout::RowMajor,
            concat: Concat::None,
            partial: false,
            bias: false,
            activation: Activation::Identity,
        }
    }
}

/// The run-time sizes of one product in a launch of [`gemm_kernel()`].
#[derive(CubeLaunch, CubeType, Clone, Copy)]
pub struct ProductArgs {
    /// Rows of the logical output.
    pub rows: u32,
    /// Columns of the logical output.
    pub cols: u32,
    /// The shared (summed) dimension.
    pub depth: u32,
    /// The sketch size `k` that factor layouts split rank indices by.
    pub low_rank: u32,
    /// Scale of the sum of products.
    pub alpha: f32,
    /// Depth chunks (`TILE` deep) per slice.
    pub chunks_per_split: u32,
    /// Where the second tensor of a joined right operand starts.
    pub concat_at: u32,
    /// Column tiles of the output.
    pub tiles_x: u32,
    /// Output tiles (`tiles_x` times the row tiles).
    pub tiles: u32,
    /// The number of this product's first cube in the launch.
    pub first_cube: u32,
    /// Element offset where the left operand starts in its buffer.
    pub lhs_base: u32,
    /// Element offset where the right operand's first tensor starts in its buffer.
    pub rhs_base: u32,
}

/// Returns `acc` plus this unit's output element `(row, col)` of `lhs·rhs`, walking the
/// shared depth in tiles. Every unit of the cube must call it (it synchronises the cube).
///
/// With `concat` set, the right operand is `rhs` and `rhs_tail` joined at `concat_at`, side
/// by side ([`Concat::Cols`]) or one above the other ([`Concat::Depth`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate_product<F: Float>(
    lhs: &Tensor<F>,
    rhs: &Tensor<F>,
    rhs_tail: &Tensor<F>,
    args: &ProductArgs,
    lhs_tile: &mut SharedMemory<f32>,
    rhs_tile: &mut SharedMemory<f32>,
    row: usize,
    col: usize,
    first_chunk: usize,
    end_chunk: usize,
    #[comptime] kind: ProductKind,
) -> f32 {
    let tile = comptime!(TILE as usize);
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let rows = args.rows as usize;
    let cols = args.cols as usize;
    let depth = args.depth as usize;
    let low_rank = args.low_rank as usize;
    let concat_at = args.concat_at as usize;
    let lhs_base = args.lhs_base as usize;
    let rhs_base = args.rhs_base as usize;
    let mut sum = 0.0f32;

    for chunk in first_chunk..end_chunk {
        let base = chunk * tile;
        let mut l = 0.0f32;
        if row < rows && base + tx < depth {
            l = f32::cast_from(
                lhs[lhs_base + offset::<F>(lhs, row, base + tx, low_rank, kind.lhs)],
            );
        }
        lhs_tile[ty * tile + tx] = l;
        let mut r = 0.0f32;
        let d = base + ty;
        if d < depth && col < cols {
            match kind.concat {
                Concat::None => {
                    r = f32::cast_from(
                        rhs[rhs_base + offset::<F>(rhs, d, col, low_rank, kind.rhs)],
                    );
                }
                Concat::Cols => {
                    if col < concat_at {
                        r = f32::cast_from(
                            rhs[rhs_base + offset::<F>(rhs, d, col, low_rank, kind.rhs)],
                        );
                    } else {
                        let c = col - concat_at;
                        r = f32::cast_from(
                            rhs_tail[offset::<F>(rhs_tail, d, c, low_rank, kind.rhs)],
                        );
                    }
                }
                Concat::Depth => {
                    if d < concat_at {
                        r = f32::cast_from(
                            rhs[rhs_base + offset::<F>(rhs, d, col, low_rank, kind.rhs)],
                        );
                    } else {
                        let e = d - concat_at;
                        r = f32::cast_from(
                            rhs_tail[offset::<F>(rhs_tail, e, col, low_rank, kind.rhs)],
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

/// One cube's share of one product: output tile and depth slice `local` (counted from the
/// product's first cube), written as the product's kind says.
#[cube]
#[allow(clippy::too_many_arguments)]
fn run_product<F: Float, O: Float>(
    lhs: &Tensor<F>,
    rhs: &Tensor<F>,
    rhs_tail: &Tensor<F>,
    bias: &Tensor<F>,
    out: &mut Tensor<O>,
    args: &ProductArgs,
    local: usize,
    lhs_tile: &mut SharedMemory<f32>,
    rhs_tile: &mut SharedMemory<f32>,
    #[comptime] kind: ProductKind,
) {
    let tile = comptime!(TILE as usize);
    let tiles = args.tiles as usize;
    let tiles_x = args.tiles_x as usize;
    let slice = local / tiles;
    let within = local % tiles;
    let row = (within / tiles_x) * tile + UNIT_POS_Y as usize;
    let col = (within % tiles_x) * tile + UNIT_POS_X as usize;
    let rows = args.rows as usize;
    let cols = args.cols as usize;

    let depth_chunks = (args.depth as usize).div_ceil(tile);
    let first_chunk = slice * args.chunks_per_split as usize;
    let mut end_chunk = first_chunk + args.chunks_per_split as usize;
    if end_chunk > depth_chunks {
        end_chunk = depth_chunks;
    }
    let acc = accumulate_product::<F>(
        lhs,
        rhs,
        rhs_tail,
        args,
        lhs_tile,
        rhs_tile,
        row,
        col,
        first_chunk,
        end_chunk,
        kind,
    );

    if row < rows && col < cols {
        if comptime!(kind.partial) {
            out[(slice * rows + row) * cols + col] = O::cast_from(acc);
        } else {
            let value = epilogue::<F>(acc, args.alpha, bias, col, kind.bias, kind.activation);
            let low_rank = args.low_rank as usize;
            out[offset::<O>(out, row, col, low_rank, kind.out)] = O::cast_from(value);
        }
    }
}

/// `f(α·acc + bias[col])`: the last step of an output element, whether its sum was made in
/// one cube ([`gemm_kernel()`]) or gathered from slices ([`reduce_splits_kernel()`]).
#[cube]
fn epilogue<F: Float>(
    acc: f32,
    alpha: f32,
    bias: &Tensor<F>,
    col: usize,
    #[comptime] has_bias: bool,
    #[comptime] activation: Activation,
) -> f32 {
    let mut value = alpha * acc;
    if comptime!(has_bias) {
        value += f32::cast_from(bias[col * bias.stride(0)]);
    }
    activate(value, activation)
}

/// The kernel body; see the module documentation. Launched by [`launch_group`].
///
/// Product `i` has operands `lhs_i`, `rhs_i` (and `tail_i` when its kind joins two tensors),
/// output `out_i`, sizes `args_i` and compile-time shape `kind_i`. Products 1 and 2 are absent
/// when their outputs are. Cube number `c` belongs to the last product whose first cube is at
/// most `c`; cubes past the last product's tiles do nothing. `O` is the outputs' element type:
/// `f32` when the products write partial sums.
#[cube(launch)]
// The outer `if let`s are resolved when the kernel is compiled (is the product there?), the
// inner `if`s when it runs (is this cube one of its?): they cannot be one condition.
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
pub fn gemm_kernel<F: Float, O: Float>(
    lhs0: &Tensor<F>,
    rhs0: &Tensor<F>,
    tail0: &Tensor<F>,
    out0: &mut Tensor<O>,
    args0: ProductArgs,
    lhs1: &Tensor<F>,
    rhs1: &Tensor<F>,
    tail1: &Tensor<F>,
    out1: &mut ComptimeOption<Tensor<O>>,
    args1: ProductArgs,
    lhs2: &Tensor<F>,
    rhs2: &Tensor<F>,
    tail2: &Tensor<F>,
    out2: &mut ComptimeOption<Tensor<O>>,
    args2: ProductArgs,
    bias: &Tensor<F>,
    #[comptime] kind0: ProductKind,
    #[comptime] kind1: ProductKind,
    #[comptime] kind2: ProductKind,
    #[define(F, O)] _dtypes: [StorageType; 2],
) {
    let tile = comptime!(TILE as usize);
    let mut lhs_tile = SharedMemory::<f32>::new(tile * tile);
    let mut rhs_tile = SharedMemory::<f32>::new(tile * tile);
    let cube = CUBE_POS;

    // A cube runs the product whose cubes it falls in, the last whose first cube it is past:
    // the whole cube takes one branch, so the cube-wide syncs inside stay uniform.
    let mut claimed = false;
    #[comptime]
    if let ComptimeOption::Some(out) = out2 {
        if cube >= args2.first_cube as usize {
            claimed = true;
            run_if_inside::<F, O>(
                lhs2,
                rhs2,
                tail2,
                bias,
                out,
                &args2,
                cube,
                &mut lhs_tile,
                &mut rhs_tile,
                kind2,
            );
        }
    }
    #[comptime]
    if let ComptimeOption::Some(out) = out1 {
        if !claimed && cube >= args1.first_cube as usize {
            claimed = true;
            run_if_inside::<F, O>(
                lhs1,
                rhs1,
                tail1,
                bias,
                out,
                &args1,
                cube,
                &mut lhs_tile,
                &mut rhs_tile,
                kind1,
            );
        }
    }
    if !claimed {
        run_if_inside::<F, O>(
            lhs0,
            rhs0,
            tail0,
            bias,
            out0,
            &args0,
            cube,
            &mut lhs_tile,
            &mut rhs_tile,
            kind0,
        );
    }
}

/// [`run_product`] for cube `cube` of the launch if it is one of this product's cubes (a
/// grid rounded up to whole rows of cubes has a few spare ones at the end).
#[cube]
#[allow(clippy::too_many_arguments)]
fn run_if_inside<F: Float, O: Float>(
    lhs: &Tensor<F>,
    rhs: &Tensor<F>,
    tail: &Tensor<F>,
    bias: &Tensor<F>,
    out: &mut Tensor<O>,
    args: &ProductArgs,
    cube: usize,
    lhs_tile: &mut SharedMemory<f32>,
    rhs_tile: &mut SharedMemory<f32>,
    #[comptime] kind: ProductKind,
) {
    let local = cube - args.first_cube as usize;
    if local < (args.tiles * splits_of(args)) as usize {
        run_product::<F, O>(
            lhs, rhs, tail, bias, out, args, local, lhs_tile, rhs_tile, kind,
        );
    }
}

/// The number of depth slices of a product: its depth chunks over the chunks per slice.
#[cube]
fn splits_of(args: &ProductArgs) -> u32 {
    let chunks = args.depth.div_ceil(TILE).max(1);
    chunks.div_ceil(args.chunks_per_split)
}

/// The run-time sizes of one slab of a [`reduce_splits_kernel()`] launch.
#[derive(CubeLaunch, CubeType, Clone, Copy)]
pub struct SlabArgs {
    /// Rows of the output.
    pub rows: u32,
    /// Columns of the output.
    pub cols: u32,
    /// Slices to add.
    pub splits: u32,
    /// The sketch size `k` that factor layouts split rank indices by.
    pub low_rank: u32,
    /// Scale of the sum.
    pub alpha: f32,
}

/// Adds the slices of one or two [`gemm_kernel()`] workspaces (`[splits, rows, cols]`,
/// `f32`), scales each sum by its `α`, adds the bias and applies `activation` (first slab
/// only) and writes the outputs in `out_layout`: one unit per output element, the first slab's elements first.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn reduce_splits_kernel<F: Float>(
    partials0: &Tensor<f32>,
    out0: &mut Tensor<F>,
    args0: SlabArgs,
    partials1: &ComptimeOption<Tensor<f32>>,
    out1: &mut ComptimeOption<Tensor<F>>,
    args1: SlabArgs,
    bias: &ComptimeOption<Tensor<F>>,
    #[comptime] out_layout: Layout,
    #[comptime] activation: Activation,
    #[define(F)] _dtype: StorageType,
) {
    let index = ABSOLUTE_POS;
    let first = (args0.rows * args0.cols) as usize;
    if index < first {
        let cols = args0.cols as usize;
        let mut sum = 0.0f32;
        for s in 0..args0.splits as usize {
            sum += partials0[s * first + index];
        }
        let col = index % cols;
        let mut value = args0.alpha * sum;
        #[comptime]
        if let ComptimeOption::Some(bias) = bias {
            value += f32::cast_from(bias[col * bias.stride(0)]);
        }
        let at = offset::<F>(out0, index / cols, col, args0.low_rank as usize, out_layout);
        out0[at] = F::cast_from(activate(value, activation));
    } else {
        #[comptime]
        if let ComptimeOption::Some(partials) = partials1 {
            #[comptime]
            if let ComptimeOption::Some(out) = out1 {
                let elements = (args1.rows * args1.cols) as usize;
                let index = index - first;
                if index < elements {
                    let cols = args1.cols as usize;
                    let mut sum = 0.0f32;
                    for s in 0..args1.splits as usize {
                        sum += partials[s * elements + index];
                    }
                    let low_rank = args1.low_rank as usize;
                    let at = offset::<F>(out, index / cols, index % cols, low_rank, out_layout);
                    out[at] = F::cast_from(args1.alpha * sum);
                }
            }
        }
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

/// The shape and layouts of one product; build it with [`GemmProblem::new`] and the `with_*`
/// methods.
#[derive(Debug, Clone, Copy)]
pub struct GemmProblem {
    /// Rows of the logical output (and of the left operand).
    pub rows: usize,
    /// Columns of the logical output (and of the right operand).
    pub cols: usize,
    /// The shared (summed) dimension.
    pub depth: usize,
    /// The sketch size `k` that the factor layouts split rank indices by.
    pub low_rank: usize,
    /// Scale applied to the sum of products, before the bias.
    pub alpha: f32,
    /// Applied to each output element last, after the scale and bias.
    pub activation: Activation,
    /// Layout of the left operand.
    pub lhs_layout: Layout,
    /// Layout of the right operand.
    pub rhs_layout: Layout,
    /// Layout the output is written in.
    pub out_layout: Layout,
    /// Element offsets where the left and right operands start in their buffers (`(0, 0)`:
    /// at the start). An offset into a row-major `[n, 2Tk]` matrix reads one of its halves.
    pub offsets: (usize, usize),
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
            activation: Activation::Identity,
            lhs_layout: Layout::RowMajor,
            rhs_layout: Layout::RowMajor,
            out_layout: Layout::RowMajor,
            offsets: (0, 0),
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

    /// Applies `activation` to each output element, after the scale and bias.
    pub fn with_activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// Reads the left operand from element `lhs` of its buffer and the right from `rhs`.
    pub fn with_offsets(mut self, lhs: usize, rhs: usize) -> Self {
        self.offsets = (lhs, rhs);
        self
    }

    /// Cuts the depth into `splits` slices (`1`: no split) instead of the device's choice.
    pub fn with_splits(mut self, splits: usize) -> Self {
        self.splits = Some(splits);
        self
    }

    /// `(chunks per slice, slices)` on `client`: equal whole-chunk slices, so rounding may
    /// leave fewer slices than asked for.
    pub fn slices<R: CubeRuntime>(&self, client: &ComputeClient<R>) -> (usize, usize) {
        let chunks = self.depth.div_ceil(TILE as usize).max(1);
        let wanted = self
            .splits
            .unwrap_or_else(|| split_count(client, self.rows, self.cols, self.depth));
        let per_split = chunks.div_ceil(wanted.clamp(1, chunks));
        (per_split, chunks.div_ceil(per_split))
    }
}

/// A second right-hand tensor of a product, how it is joined to the first, and where (see
/// [`Concat`]); `None` for a right operand of one tensor.
pub type Tail<'a, R> = Option<(&'a CubeTensor<R>, Concat, usize)>;

/// One product of a grouped launch: the problem, its operands and where it writes.
#[derive(Debug)]
pub struct Product<'a, R: CubeRuntime> {
    /// Sizes, layouts, scale, offsets and split.
    pub problem: GemmProblem,
    /// The left operand.
    pub lhs: &'a CubeTensor<R>,
    /// The right operand, or its first tensor when `tail` joins a second.
    pub rhs: &'a CubeTensor<R>,
    /// A second right-hand tensor, how it is joined, and where (see [`Concat`]).
    pub tail: Tail<'a, R>,
    /// Where it writes: the output in `problem.out_layout`, or, for a product whose depth is
    /// split, an `f32` workspace `[splits, rows, cols]` of raw partial sums.
    pub out: &'a CubeTensor<R>,
}

impl<R: CubeRuntime> Product<'_, R> {
    /// How many depth slices this product has on its device.
    pub fn splits(&self) -> usize {
        self.problem.slices(&self.out.client).1
    }
}

/// Launches [`gemm_kernel()`] for up to [`GROUP`] products at once, with `bias` added to the
/// outputs of those whose `bias` flag is set. With `partial`, every product writes the raw
/// partial sums of its depth slices into its `out`, an `f32` workspace `[splits, rows, cols]`
/// (see [`workspace`]; one slice for a product that is not split); without, every product
/// writes `α·sum [+ bias]` in its output layout and element type, and must not be split.
///
/// All tensors must share a client and the operands an element type; the caller (this crate's
/// [`sketch`](crate::sketch) module) guarantees both.
///
/// # Panics
/// If `products` is empty or longer than [`GROUP`], or a product is split without `partial`.
pub fn launch_group<R: CubeRuntime>(
    products: &[Product<'_, R>],
    bias: Option<(&CubeTensor<R>, [bool; GROUP])>,
    partial: bool,
) {
    assert!(
        (1..=GROUP).contains(&products.len()),
        "a launch runs 1 to {GROUP} products, not {}",
        products.len()
    );
    let client = &products[0].out.client;
    let tile = TILE as usize;
    let mut first_cube = 0usize;
    let mut kinds = [ProductKind::default(); GROUP];
    let mut layout = [(0usize, 0usize); GROUP];
    for (index, product) in products.iter().enumerate() {
        let problem = &product.problem;
        let (_, splits) = problem.slices(client);
        assert!(
            partial || splits == 1,
            "a product whose depth is split writes partial sums"
        );
        kinds[index] = ProductKind {
            lhs: problem.lhs_layout,
            rhs: problem.rhs_layout,
            out: problem.out_layout,
            concat: product.tail.map_or(Concat::None, |(_, concat, _)| concat),
            partial,
            bias: bias.is_some_and(|(_, flags)| flags[index]),
            activation: problem.activation,
        };
        let tiles = problem.cols.div_ceil(tile).max(1) * problem.rows.div_ceil(tile).max(1);
        layout[index] = (first_cube, tiles);
        first_cube += tiles * splits;
    }
    let args = |index: usize| {
        let product = &products[index];
        let problem = &product.problem;
        let (first, tiles) = layout[index];
        ProductArgsLaunch::new(
            problem.rows as u32,
            problem.cols as u32,
            problem.depth as u32,
            problem.low_rank as u32,
            problem.alpha,
            problem.slices(client).0 as u32,
            product.tail.map_or(0, |(_, _, at)| at) as u32,
            problem.cols.div_ceil(tile).max(1) as u32,
            tiles as u32,
            first as u32,
            problem.offsets.0 as u32,
            problem.offsets.1 as u32,
        )
    };
    // An absent product's operands are bound to tensors that are already arguments, and its
    // sizes are the first product's: its output is absent, so the kernel compiles it out.
    let slot = |index: usize| {
        let present = index < products.len();
        let at = if present { index } else { 0 };
        (args(at), &products[at], present)
    };
    let [(args0, p0, _), (args1, p1, has1), (args2, p2, has2)] = [slot(0), slot(1), slot(2)];
    let operand = |tensor: &CubeTensor<R>| tensor.clone().into_tensor_arg();
    let tail = |product: &Product<'_, R>| operand(product.tail.map_or(product.rhs, |(t, _, _)| t));
    let optional = |product: &Product<'_, R>, present: bool| {
        present
            .then(|| product.out.clone().into_tensor_arg())
            .into()
    };
    let bias_arg = bias.map_or(products[0].lhs, |(bias, _)| bias);

    let max_x = client.properties().hardware.max_cube_count.0.max(1) as usize;
    let cube_count = CubeCount::Static(
        first_cube.min(max_x) as u32,
        first_cube.div_ceil(max_x) as u32,
        1,
    );
    let cube_dim = CubeDim {
        x: TILE,
        y: TILE,
        z: 1,
    };
    gemm_kernel::launch::<R>(
        client,
        cube_count,
        cube_dim,
        operand(p0.lhs),
        operand(p0.rhs),
        tail(p0),
        operand(p0.out),
        args0,
        operand(p1.lhs),
        operand(p1.rhs),
        tail(p1),
        optional(p1, has1),
        args1,
        operand(p2.lhs),
        operand(p2.rhs),
        tail(p2),
        optional(p2, has2),
        args2,
        operand(bias_arg),
        kinds[0],
        kinds[1],
        kinds[2],
        [p0.lhs.dtype.into(), p0.out.dtype.into()],
    );
}

/// Launches [`reduce_splits_kernel()`]: adds the slices of `partials.0` (`[splits, rows,
/// cols]`, `f32`, from a product described by `first.0`) into `first.1`, scaled and with
/// `bias` and `first.0`'s activation, and those of the optional second workspace into its
/// output the same way, without either.
pub fn reduce_splits<R: CubeRuntime>(
    first: (&GemmProblem, &CubeTensor<R>, &CubeTensor<R>),
    second: Option<(&GemmProblem, &CubeTensor<R>, &CubeTensor<R>)>,
    bias: Option<&CubeTensor<R>>,
) {
    let (problem, partials, out) = first;
    let client = &out.client;
    let slab = |problem: &GemmProblem| {
        SlabArgsLaunch::new(
            problem.rows as u32,
            problem.cols as u32,
            problem.slices(client).1 as u32,
            problem.low_rank as u32,
            problem.alpha,
        )
    };
    let elements = problem.rows * problem.cols
        + second.map_or(0, |(problem, _, _)| problem.rows * problem.cols);
    let cube_dim = CubeDim { x: 256, y: 1, z: 1 };
    reduce_splits_kernel::launch::<R>(
        client,
        CubeCount::Static(elements.div_ceil(256) as u32, 1, 1),
        cube_dim,
        partials.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        slab(problem),
        second
            .map(|(_, partials, _)| partials.clone().into_tensor_arg())
            .into(),
        second
            .map(|(_, _, out)| out.clone().into_tensor_arg())
            .into(),
        slab(second.map_or(problem, |(problem, _, _)| problem)),
        bias.map(|bias| bias.clone().into_tensor_arg()).into(),
        problem.out_layout,
        problem.activation,
        out.dtype.into(),
    );
}

/// An `f32` workspace for the partial sums of `problem` on `like`'s device.
pub fn workspace<R: CubeRuntime>(like: &CubeTensor<R>, problem: &GemmProblem) -> CubeTensor<R> {
    let splits = problem.slices(&like.client).1;
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::new([splits, problem.rows, problem.cols]),
        DType::F32,
    )
}

/// One product on its own: writes `α·lhs·rhs [+ bias]` into `out` (allocated by the caller
/// in `problem.out_layout`), through a workspace and [`reduce_splits_kernel()`] when its
/// depth is split.
pub fn gemm<R: CubeRuntime>(
    problem: &GemmProblem,
    (lhs, rhs): (&CubeTensor<R>, &CubeTensor<R>),
    bias: Option<&CubeTensor<R>>,
    out: &CubeTensor<R>,
) {
    gemm_concat(problem, lhs, (rhs, None), bias, out);
}

/// Like [`gemm`] with a right operand that may be two tensors joined at `at`: `concat` is
/// [`Concat::Cols`] (`[head | tail]`, `at` columns of `head`) or [`Concat::Depth`]
/// (`[head; tail]`, `at` depth rows of `head`). Both are read in `problem.rhs_layout`, in
/// place: this is how `x·[S1 | U2]` and `P·[U1; S2]` run without copying the factors into a
/// packed matrix.
pub fn gemm_concat<R: CubeRuntime>(
    problem: &GemmProblem,
    lhs: &CubeTensor<R>,
    (head, tail): (&CubeTensor<R>, Tail<'_, R>),
    bias: Option<&CubeTensor<R>>,
    out: &CubeTensor<R>,
) {
    let mut product = Product {
        problem: *problem,
        lhs,
        rhs: head,
        tail,
        out,
    };
    let bias_flags = bias.map(|bias| (bias, [true, false, false]));
    if product.splits() > 1 {
        let partials = workspace(out, problem);
        product.out = &partials;
        launch_group(&[product], None, true);
        reduce_splits((problem, &partials, out), None, bias);
    } else {
        launch_group(&[product], bias_flags, false);
    }
}
