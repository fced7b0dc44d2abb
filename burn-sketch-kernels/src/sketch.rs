//! The sketched layer's forward and backward on CubeCL tensors: which kernels run, in which
//! order, on which buffers.
//!
//! With `A = [S1 | U2]`, `B = [U1; S2]`, `α = 1/(2T)` and `P = x·A = [P₁ | P₂]`:
//!
//! | output | computed as | kernel |
//! |---|---|---|
//! | `y` | `α·P·B + bias` | fused (one launch), or `P` then `y` ([`gemm_concat`], two) |
//! | `∂P_h` | `α·∂y·B_hᵀ` | [`gemm`] |
//! | `∂x` | `∂P₁·S1ᵀ + ∂P₂·U2ᵀ` | one [`gemm`] with two products |
//! | `∂S1`, `∂U2` | `xᵀ·∂P₁`, `xᵀ·∂P₂` | [`gemm`], written in `[T, d_in, k]` |
//! | `∂S2`, `∂U1` | `α·P₂ᵀ·∂y`, `α·P₁ᵀ·∂y` | [`gemm`], written in `[T, k, d_out]` |
//!
//! Every [`gemm`] whose output is too small to fill the device splits its depth across cubes
//! and adds the slices in a second, small launch (see [`crate::gemm`]); in this layer that is
//! the projections `x·A`, `∂y·B_hᵀ` and `x·U2` for modest batches.
//!
//! The backward needs only `x` and the factors: `P₁`/`P₂` are recomputed (two skinny
//! products) instead of being kept from the forward, which is what lets the layer store
//! nothing but its input for training. `∂x` goes through the materialised `∂P` rather than a
//! fused kernel because `∂S1` needs `∂P₁` anyway. The bias gradient, a column sum, is left to
//! the backend's own reduction.

use burn_backend::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use crate::fused::{MAX_FUSED_RANK, fused_forward};
use crate::gemm::{CONCAT_COLS, CONCAT_DEPTH, GemmProblem, TILE, gemm, gemm_concat, split_count};
use crate::layout::{
    INPUT_FACTOR, INPUT_FACTOR_T, OUTPUT_FACTOR, OUTPUT_FACTOR_T, ROW_MAJOR, TRANSPOSED,
};

/// The four factors of a sketched layer, in Panther's layouts (see `burn_sketch::SketchWeights`).
#[derive(Debug, Clone)]
pub struct SketchFactors<R: CubeRuntime> {
    /// `[T, d_in, k]`, trainable.
    pub s1s: CubeTensor<R>,
    /// `[T, k, d_out]`, trainable.
    pub s2s: CubeTensor<R>,
    /// `[T, k, d_out]`, fixed.
    pub u1s: CubeTensor<R>,
    /// `[T, d_in, k]`, fixed.
    pub u2s: CubeTensor<R>,
}

impl<R: CubeRuntime> SketchFactors<R> {
    fn dims(&self) -> Dims {
        let [terms, d_in, rank] = self.s1s.meta.shape().dims::<3>();
        let d_out = self.s2s.meta.shape().dims::<3>()[2];
        Dims {
            terms,
            d_in,
            rank,
            d_out,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Dims {
    terms: usize,
    d_in: usize,
    rank: usize,
    d_out: usize,
}

impl Dims {
    /// `Tk`, the width of each half of `P`.
    fn half(&self) -> usize {
        self.terms * self.rank
    }

    fn alpha(&self) -> f32 {
        1.0 / (2.0 * self.terms as f32)
    }
}

/// Which gradients [`backward`] should compute; the others are skipped entirely.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GradientsWanted {
    /// `∂x`.
    pub x: bool,
    /// `∂S1s`.
    pub s1s: bool,
    /// `∂S2s`.
    pub s2s: bool,
    /// `∂U1s` (the sketches are fixed in `SkLinear`, but a caller may track them).
    pub u1s: bool,
    /// `∂U2s`.
    pub u2s: bool,
}

/// The gradients [`backward`] computed, in the shapes of their inputs.
#[derive(Debug)]
pub struct SketchGradients<R: CubeRuntime> {
    /// `∂x`, `[n, d_in]`.
    pub x: Option<CubeTensor<R>>,
    /// `∂S1s`, `[T, d_in, k]`.
    pub s1s: Option<CubeTensor<R>>,
    /// `∂S2s`, `[T, k, d_out]`.
    pub s2s: Option<CubeTensor<R>>,
    /// `∂U1s`, `[T, k, d_out]`.
    pub u1s: Option<CubeTensor<R>>,
    /// `∂U2s`, `[T, d_in, k]`.
    pub u2s: Option<CubeTensor<R>>,
}

/// Which forward kernel [`forward`] uses for a shape on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardPath {
    /// One launch, `P` in shared memory; `column_groups` cubes share each row tile.
    Fused {
        /// How many cubes split `d_out` for each tile of rows.
        column_groups: usize,
    },
    /// Two products through a global `P = x·[S1 | U2]` (each with its depth split where the
    /// output is small; see [`split_count`]).
    Tiled,
}

/// Chooses the forward kernel.
///
/// The fused kernel computes each row tile's block of `P` in one cube, walking all of `d_in`
/// in sequence. That is the right shape of work when there are rows enough for the tiles of
/// `P` to fill the device by themselves; then it saves `P`'s round trip and two launches.
/// When they do not (a batch of 256 rows and `2Tk = 32` is 32 tiles, for a GPU with over a
/// hundred multiprocessors), the tiled path wins: its projections split `d_in` across cubes
/// (see [`split_count`]). So the fused kernel is used when the projection would not be split
/// and its `P` block fits in shared memory (`2Tk ≤ MAX_FUSED_RANK`); otherwise the tiled path.
///
/// The fused kernel's column groups: where the row tiles alone are fewer than about two
/// cubes per multiprocessor (64 cubes where the device does not report its count), `d_out`
/// is split into groups; each extra group recomputes its rows' block of `P`, so groups stop
/// at one per 16 output columns.
pub fn choose_forward_path<R: CubeRuntime>(
    client: &cubecl::prelude::ComputeClient<R>,
    rows: usize,
    d_in: usize,
    rank_width: usize,
    d_out: usize,
) -> ForwardPath {
    let tile = TILE as usize;
    let padded = rank_width.div_ceil(tile) * tile;
    let hardware = &client.properties().hardware;
    let shared_bytes = (tile * padded + 2 * tile * tile) * size_of::<f32>();
    if padded > MAX_FUSED_RANK
        || shared_bytes > hardware.max_shared_memory_size
        || split_count(client, rows, rank_width, d_in) > 1
    {
        return ForwardPath::Tiled;
    }
    let target_cubes = hardware
        .num_streaming_multiprocessors
        .map_or(64, |sms| 2 * sms as usize);
    let row_tiles = rows.div_ceil(tile).max(1);
    let column_groups = target_cubes
        .div_ceil(row_tiles)
        .clamp(1, d_out.div_ceil(tile).max(1));
    ForwardPath::Fused { column_groups }
}

fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape, dtype: DType) -> CubeTensor<R> {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, dtype)
}

fn check_dtypes<R: CubeRuntime>(tensors: &[&CubeTensor<R>]) -> DType {
    let dtype = tensors[0].dtype;
    for tensor in tensors {
        assert_eq!(
            tensor.dtype, dtype,
            "sketched linear: all inputs must share one float type, got {:?} and {:?}",
            dtype, tensor.dtype
        );
    }
    dtype
}

/// `x·F` for an input-side factor `F` (`[T, d_in, k]`): `[n, Tk]`.
fn project<R: CubeRuntime>(x: &CubeTensor<R>, factor: &CubeTensor<R>, dims: Dims) -> CubeTensor<R> {
    let rows = x.meta.shape().dims::<2>()[0];
    let out = empty(x, Shape::new([rows, dims.half()]), x.dtype);
    let problem = GemmProblem {
        rows,
        cols: dims.half(),
        depth: dims.d_in,
        rank: dims.rank,
        alpha: 1.0,
        lhs_layout: ROW_MAJOR,
        rhs_layout: INPUT_FACTOR,
        out_layout: ROW_MAJOR,
        splits: None,
    };
    gemm(&problem, (x, factor), None, None, &out);
    out
}

/// `y = x·(S1·U1 + U2·S2)/(2T) + bias` for `x` of shape `[n, d_in]`; returns `[n, d_out]`.
///
/// Uses the fused kernel or the tiled path as [`choose_forward_path`] decides.
pub fn forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    factors: &SketchFactors<R>,
    bias: Option<CubeTensor<R>>,
) -> CubeTensor<R> {
    let path = {
        let dims = factors.dims();
        let rows = x.meta.shape().dims::<2>()[0];
        choose_forward_path(&x.client, rows, dims.d_in, 2 * dims.half(), dims.d_out)
    };
    forward_with(x, factors, bias, path)
}

/// [`forward`] on a given path, for tests and benchmarks that compare the two.
pub fn forward_with<R: CubeRuntime>(
    x: CubeTensor<R>,
    factors: &SketchFactors<R>,
    bias: Option<CubeTensor<R>>,
    path: ForwardPath,
) -> CubeTensor<R> {
    let dims = factors.dims();
    let mut all = vec![&x, &factors.s1s, &factors.s2s, &factors.u1s, &factors.u2s];
    all.extend(bias.as_ref());
    let dtype = check_dtypes(&all);
    let rows = x.meta.shape().dims::<2>()[0];
    let out = empty(&x, Shape::new([rows, dims.d_out]), dtype);

    match path {
        ForwardPath::Fused { column_groups } => fused_forward(
            &x,
            &factors.s1s,
            &factors.u2s,
            &factors.u1s,
            &factors.s2s,
            bias.as_ref(),
            &out,
            dims.alpha(),
            column_groups,
        ),
        ForwardPath::Tiled => {
            // P = x·[S1 | U2], `[n, 2Tk]`, then y = α·P·[U1; S2] + bias: two products, each
            // reading both factors of its side in place.
            let width = 2 * dims.half();
            let p = empty(&x, Shape::new([rows, width]), dtype);
            let problem = GemmProblem {
                rows,
                cols: width,
                depth: dims.d_in,
                rank: dims.rank,
                alpha: 1.0,
                lhs_layout: ROW_MAJOR,
                rhs_layout: INPUT_FACTOR,
                out_layout: ROW_MAJOR,
                splits: None,
            };
            gemm_concat(
                &problem,
                &x,
                (&factors.s1s, &factors.u2s),
                (CONCAT_COLS, dims.half()),
                None,
                &p,
            );
            let problem = GemmProblem {
                rows,
                cols: dims.d_out,
                depth: width,
                rank: dims.rank,
                alpha: dims.alpha(),
                lhs_layout: ROW_MAJOR,
                rhs_layout: OUTPUT_FACTOR,
                out_layout: ROW_MAJOR,
                splits: None,
            };
            gemm_concat(
                &problem,
                &p,
                (&factors.u1s, &factors.s2s),
                (CONCAT_DEPTH, dims.half()),
                bias.as_ref(),
                &out,
            );
        }
    }
    out
}

/// The gradients of [`forward`] with respect to `x` and the factors, given `∂y`
/// (`[n, d_out]`). Only the gradients in `wanted` are computed.
pub fn backward<R: CubeRuntime>(
    x: CubeTensor<R>,
    factors: &SketchFactors<R>,
    grad_output: CubeTensor<R>,
    wanted: GradientsWanted,
) -> SketchGradients<R> {
    let dims = factors.dims();
    let dtype = check_dtypes(&[
        &x,
        &factors.s1s,
        &factors.s2s,
        &factors.u1s,
        &factors.u2s,
        &grad_output,
    ]);
    let rows = x.meta.shape().dims::<2>()[0];
    let alpha = dims.alpha();
    let half = dims.half();

    // ∂P_h = α·∂y·B_hᵀ, `[n, Tk]`.
    let grad_p = |factor: &CubeTensor<R>| {
        let out = empty(&x, Shape::new([rows, half]), dtype);
        let problem = GemmProblem {
            rows,
            cols: half,
            depth: dims.d_out,
            rank: dims.rank,
            alpha,
            lhs_layout: ROW_MAJOR,
            rhs_layout: OUTPUT_FACTOR_T,
            out_layout: ROW_MAJOR,
            splits: None,
        };
        gemm(&problem, (&grad_output, factor), None, None, &out);
        out
    };
    let grad_p1 = (wanted.x || wanted.s1s).then(|| grad_p(&factors.u1s));
    let grad_p2 = (wanted.x || wanted.u2s).then(|| grad_p(&factors.s2s));

    // ∂x = ∂P₁·S1ᵀ + ∂P₂·U2ᵀ, `[n, d_in]`.
    let grad_x = match (wanted.x, &grad_p1, &grad_p2) {
        (true, Some(grad_p1), Some(grad_p2)) => {
            let out = empty(&x, Shape::new([rows, dims.d_in]), dtype);
            let problem = GemmProblem {
                rows,
                cols: dims.d_in,
                depth: half,
                rank: dims.rank,
                alpha: 1.0,
                lhs_layout: ROW_MAJOR,
                rhs_layout: INPUT_FACTOR_T,
                out_layout: ROW_MAJOR,
                splits: None,
            };
            gemm(
                &problem,
                (grad_p1, &factors.s1s),
                Some((grad_p2, &factors.u2s)),
                None,
                &out,
            );
            Some(out)
        }
        _ => None,
    };

    // Input-side factor gradients: xᵀ·∂P_h, written as `[T, d_in, k]`.
    let input_factor_grad = |grad_p: &CubeTensor<R>| {
        let out = empty(&x, Shape::new([dims.terms, dims.d_in, dims.rank]), dtype);
        let problem = GemmProblem {
            rows: dims.d_in,
            cols: half,
            depth: rows,
            rank: dims.rank,
            alpha: 1.0,
            lhs_layout: TRANSPOSED,
            rhs_layout: ROW_MAJOR,
            out_layout: INPUT_FACTOR,
            splits: None,
        };
        gemm(&problem, (&x, grad_p), None, None, &out);
        out
    };
    let grad_s1s = grad_p1
        .as_ref()
        .filter(|_| wanted.s1s)
        .map(input_factor_grad);
    let grad_u2s = grad_p2
        .as_ref()
        .filter(|_| wanted.u2s)
        .map(input_factor_grad);

    // Output-side factor gradients: α·P_hᵀ·∂y with P_h recomputed, written as `[T, k, d_out]`.
    let output_factor_grad = |input_factor: &CubeTensor<R>| {
        let p = project(&x, input_factor, dims);
        let out = empty(&x, Shape::new([dims.terms, dims.rank, dims.d_out]), dtype);
        let problem = GemmProblem {
            rows: half,
            cols: dims.d_out,
            depth: rows,
            rank: dims.rank,
            alpha,
            lhs_layout: TRANSPOSED,
            rhs_layout: ROW_MAJOR,
            out_layout: OUTPUT_FACTOR,
            splits: None,
        };
        gemm(&problem, (&p, &grad_output), None, None, &out);
        out
    };
    let grad_s2s = wanted.s2s.then(|| output_factor_grad(&factors.u2s));
    let grad_u1s = wanted.u1s.then(|| output_factor_grad(&factors.s1s));

    SketchGradients {
        x: grad_x,
        s1s: grad_s1s,
        s2s: grad_s2s,
        u1s: grad_u1s,
        u2s: grad_u2s,
    }
}
