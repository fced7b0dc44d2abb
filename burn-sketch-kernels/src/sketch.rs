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
//! `A` and `B` are in the packed order `burn_sketch::SketchWeights` documents (blocks:
//! `A = [S1_1 … S1_T | U2_1 … U2_T]`), read in place through [`Layout`]s, never packed.
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

use crate::KernelError;
use crate::fused::{MAX_FUSED_RANK, fused_forward};
use crate::gemm::{Concat, GemmProblem, TILE, gemm, gemm_concat, split_count};
use crate::layout::Layout;

/// The four factors of a sketched layer on a CubeCL device, in Panther's layouts: the
/// kernels' form of `burn_sketch::SketchWeights`.
#[derive(Debug, Clone)]
pub struct SketchWeights<R: CubeRuntime> {
    /// `[T, d_in, k]`, trainable.
    pub s1s: CubeTensor<R>,
    /// `[T, k, d_out]`, trainable.
    pub s2s: CubeTensor<R>,
    /// `[T, k, d_out]`, fixed.
    pub u1s: CubeTensor<R>,
    /// `[T, d_in, k]`, fixed.
    pub u2s: CubeTensor<R>,
}

/// A sketched layer's sizes, read off its weights.
#[derive(Debug, Clone, Copy)]
struct Dims {
    terms: usize,
    d_in: usize,
    low_rank: usize,
    d_out: usize,
}

impl Dims {
    /// `Tk`, the width of each half of `P`.
    fn half(&self) -> usize {
        self.terms * self.low_rank
    }

    fn alpha(&self) -> f32 {
        1.0 / (2.0 * self.terms as f32)
    }
}

impl<R: CubeRuntime> SketchWeights<R> {
    /// `[s1s, s2s, u1s, u2s]` with their names, the order of the fields.
    fn named(&self) -> [(&'static str, &CubeTensor<R>); 4] {
        [
            ("s1s", &self.s1s),
            ("s2s", &self.s2s),
            ("u1s", &self.u1s),
            ("u2s", &self.u2s),
        ]
    }

    /// The layer's sizes, once every factor's shape is checked against `s1s` and `s2s`.
    fn dims(&self) -> Result<Dims, KernelError> {
        let s1s = self.s1s.meta.shape().to_vec();
        let s2s = self.s2s.meta.shape().to_vec();
        let (&[terms, d_in, low_rank], &[_, _, d_out]) = (s1s.as_slice(), s2s.as_slice()) else {
            let (operand, found) = if s1s.len() != 3 {
                ("s1s", s1s)
            } else {
                ("s2s", s2s)
            };
            return Err(KernelError::Shape {
                operand,
                found,
                expected: "rank 3".into(),
            });
        };
        if terms == 0 || low_rank == 0 {
            return Err(KernelError::Shape {
                operand: "s1s",
                found: s1s,
                expected: "[T, d_in, k] with T, k ≥ 1".into(),
            });
        }
        let input = [terms, d_in, low_rank];
        let output = [terms, low_rank, d_out];
        for (operand, tensor) in self.named() {
            let expected = if matches!(operand, "s1s" | "u2s") {
                &input
            } else {
                &output
            };
            check_shape(operand, tensor, expected)?;
        }
        Ok(Dims {
            terms,
            d_in,
            low_rank,
            d_out,
        })
    }
}

fn check_shape<R: CubeRuntime>(
    operand: &'static str,
    tensor: &CubeTensor<R>,
    expected: &[usize],
) -> Result<(), KernelError> {
    let found = tensor.meta.shape().as_slice();
    if found == expected {
        Ok(())
    } else {
        Err(KernelError::Shape {
            operand,
            found: found.to_vec(),
            expected: format!("{expected:?}"),
        })
    }
}

/// Every operand's element type is `x`'s, a float type; returns it.
fn check_dtypes<R: CubeRuntime>(
    x: &CubeTensor<R>,
    others: &[(&'static str, &CubeTensor<R>)],
) -> Result<DType, KernelError> {
    let expected = x.dtype;
    if !expected.is_float() {
        return Err(KernelError::DType {
            operand: "x",
            found: expected,
            expected: DType::F32,
        });
    }
    match others.iter().find(|(_, tensor)| tensor.dtype != expected) {
        Some(&(operand, tensor)) => Err(KernelError::DType {
            operand,
            found: tensor.dtype,
            expected,
        }),
        None => Ok(expected),
    }
}

/// The rows of `x`, once it is checked to be `[n, d_in]`.
fn check_input<R: CubeRuntime>(x: &CubeTensor<R>, dims: Dims) -> Result<usize, KernelError> {
    let shape = x.meta.shape().as_slice();
    match shape {
        &[rows, d_in] if d_in == dims.d_in => Ok(rows),
        _ => Err(KernelError::Shape {
            operand: "x",
            found: shape.to_vec(),
            expected: format!("[n, {}]", dims.d_in),
        }),
    }
}

/// Which gradients [`backward`] should compute; the others are skipped entirely (the
/// kernels' form of `burn_sketch::backend::WantedGradients`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WantedGradients {
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

impl WantedGradients {
    /// Every gradient.
    pub const ALL: Self = Self {
        x: true,
        s1s: true,
        s2s: true,
        u1s: true,
        u2s: true,
    };
}

/// The gradients [`backward`] computed, in the shapes of their inputs (the kernels' form of
/// `burn_sketch::backend::SketchGradients`).
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
    rank: usize,
    d_out: usize,
) -> ForwardPath {
    let tile = TILE as usize;
    let padded = rank.div_ceil(tile) * tile;
    let hardware = &client.properties().hardware;
    let shared_bytes = (tile * padded + 2 * tile * tile) * size_of::<f32>();
    if padded > MAX_FUSED_RANK
        || shared_bytes > hardware.max_shared_memory_size
        || split_count(client, rows, rank, d_in) > 1
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

/// `x·F` for an input-side factor `F` (`[T, d_in, k]`): `[n, Tk]`.
fn project<R: CubeRuntime>(x: &CubeTensor<R>, factor: &CubeTensor<R>, dims: Dims) -> CubeTensor<R> {
    let rows = x.meta.shape().dims::<2>()[0];
    let out = empty(x, Shape::new([rows, dims.half()]), x.dtype);
    let problem = GemmProblem::new(rows, dims.half(), dims.d_in).with_layouts(
        (Layout::RowMajor, Layout::InputFactor, Layout::RowMajor),
        dims.low_rank,
    );
    gemm(&problem, (x, factor), None, None, &out);
    out
}

/// `y = x·(S1·U1 + U2·S2)/(2T) + bias` for `x` of shape `[n, d_in]`; returns `[n, d_out]`.
///
/// Uses the fused kernel or the tiled path as [`choose_forward_path`] decides.
///
/// # Errors
/// [`KernelError`] if the operands' shapes do not fit together (`x` `[n, d_in]`, the weights
/// as [`SketchWeights`] states, `bias` `[d_out]`) or their element types differ.
pub fn forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    weights: &SketchWeights<R>,
    bias: Option<CubeTensor<R>>,
) -> Result<CubeTensor<R>, KernelError> {
    let checked = check_forward(&x, weights, bias.as_ref())?;
    let (dims, rows) = (checked.dims, checked.rows);
    let path = choose_forward_path(&x.client, rows, dims.d_in, 2 * dims.half(), dims.d_out);
    launch_forward(x, weights, bias, path, checked)
}

/// [`forward`] on a given path, for tests and benchmarks that compare the two.
///
/// # Errors
/// As [`forward`]; and [`KernelError::FusedRankTooWide`] for a fused path with
/// `2Tk > MAX_FUSED_RANK`.
pub fn forward_with<R: CubeRuntime>(
    x: CubeTensor<R>,
    weights: &SketchWeights<R>,
    bias: Option<CubeTensor<R>>,
    path: ForwardPath,
) -> Result<CubeTensor<R>, KernelError> {
    let checked = check_forward(&x, weights, bias.as_ref())?;
    launch_forward(x, weights, bias, path, checked)
}

/// What [`check_forward`] found the operands to be.
#[derive(Debug, Clone, Copy)]
struct Checked {
    dims: Dims,
    rows: usize,
    dtype: DType,
}

/// Every forward operand's shape and element type, checked once per call.
fn check_forward<R: CubeRuntime>(
    x: &CubeTensor<R>,
    weights: &SketchWeights<R>,
    bias: Option<&CubeTensor<R>>,
) -> Result<Checked, KernelError> {
    let dims = weights.dims()?;
    let rows = check_input(x, dims)?;
    if let Some(bias) = bias {
        check_shape("bias", bias, &[dims.d_out])?;
    }
    let mut operands = weights.named().to_vec();
    operands.extend(bias.map(|bias| ("bias", bias)));
    let dtype = check_dtypes(x, &operands)?;
    Ok(Checked { dims, rows, dtype })
}

/// The forward's launches on checked operands.
fn launch_forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    weights: &SketchWeights<R>,
    bias: Option<CubeTensor<R>>,
    path: ForwardPath,
    Checked { dims, rows, dtype }: Checked,
) -> Result<CubeTensor<R>, KernelError> {
    let out = empty(&x, Shape::new([rows, dims.d_out]), dtype);

    match path {
        ForwardPath::Fused { column_groups } => {
            fused_forward(&x, weights, bias.as_ref(), &out, column_groups)?
        }
        ForwardPath::Tiled => {
            // P = x·[S1 | U2], `[n, 2Tk]`, then y = α·P·[U1; S2] + bias: two products, each
            // reading both factors of its side in place.
            let width = 2 * dims.half();
            let p = empty(&x, Shape::new([rows, width]), dtype);
            let problem = GemmProblem::new(rows, width, dims.d_in).with_layouts(
                (Layout::RowMajor, Layout::InputFactor, Layout::RowMajor),
                dims.low_rank,
            );
            let input_side = (&weights.s1s, &weights.u2s);
            gemm_concat(
                &problem,
                &x,
                input_side,
                (Concat::Cols, dims.half()),
                None,
                &p,
            );
            let problem = GemmProblem::new(rows, dims.d_out, width)
                .with_layouts(
                    (Layout::RowMajor, Layout::OutputFactor, Layout::RowMajor),
                    dims.low_rank,
                )
                .with_alpha(dims.alpha());
            let output_side = (&weights.u1s, &weights.s2s);
            let concat = (Concat::Depth, dims.half());
            gemm_concat(&problem, &p, output_side, concat, bias.as_ref(), &out);
        }
    }
    Ok(out)
}

/// The gradients of [`forward`] with respect to `x` and the factors, given `∂y`
/// (`[n, d_out]`). Only the gradients in `wanted` are computed.
///
/// # Errors
/// As [`forward`], with `grad_output` `[n, d_out]` in place of the bias.
pub fn backward<R: CubeRuntime>(
    x: CubeTensor<R>,
    weights: &SketchWeights<R>,
    grad_output: CubeTensor<R>,
    wanted: WantedGradients,
) -> Result<SketchGradients<R>, KernelError> {
    let dims = weights.dims()?;
    let rows = check_input(&x, dims)?;
    check_shape("grad_output", &grad_output, &[rows, dims.d_out])?;
    let mut operands = weights.named().to_vec();
    operands.push(("grad_output", &grad_output));
    let dtype = check_dtypes(&x, &operands)?;
    let alpha = dims.alpha();
    let half = dims.half();
    let k = dims.low_rank;

    // ∂P_h = α·∂y·B_hᵀ, `[n, Tk]`.
    let grad_p = |factor: &CubeTensor<R>| {
        let out = empty(&x, Shape::new([rows, half]), dtype);
        let problem = GemmProblem::new(rows, half, dims.d_out)
            .with_layouts(
                (Layout::RowMajor, Layout::OutputFactorT, Layout::RowMajor),
                k,
            )
            .with_alpha(alpha);
        gemm(&problem, (&grad_output, factor), None, None, &out);
        out
    };
    let grad_p1 = (wanted.x || wanted.s1s).then(|| grad_p(&weights.u1s));
    let grad_p2 = (wanted.x || wanted.u2s).then(|| grad_p(&weights.s2s));

    // ∂x = ∂P₁·S1ᵀ + ∂P₂·U2ᵀ, `[n, d_in]`.
    let grad_x = match (wanted.x, &grad_p1, &grad_p2) {
        (true, Some(grad_p1), Some(grad_p2)) => {
            let out = empty(&x, Shape::new([rows, dims.d_in]), dtype);
            let problem = GemmProblem::new(rows, dims.d_in, half).with_layouts(
                (Layout::RowMajor, Layout::InputFactorT, Layout::RowMajor),
                k,
            );
            let second = Some((grad_p2, &weights.u2s));
            gemm(&problem, (grad_p1, &weights.s1s), second, None, &out);
            Some(out)
        }
        _ => None,
    };

    // Input-side factor gradients: xᵀ·∂P_h, written as `[T, d_in, k]`.
    let input_factor_grad = |grad_p: &CubeTensor<R>| {
        let out = empty(&x, Shape::new([dims.terms, dims.d_in, k]), dtype);
        let problem = GemmProblem::new(dims.d_in, half, rows).with_layouts(
            (Layout::Transposed, Layout::RowMajor, Layout::InputFactor),
            k,
        );
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
        let out = empty(&x, Shape::new([dims.terms, k, dims.d_out]), dtype);
        let problem = GemmProblem::new(half, dims.d_out, rows)
            .with_layouts(
                (Layout::Transposed, Layout::RowMajor, Layout::OutputFactor),
                k,
            )
            .with_alpha(alpha);
        gemm(&problem, (&p, &grad_output), None, None, &out);
        out
    };
    let grad_s2s = wanted.s2s.then(|| output_factor_grad(&weights.u2s));
    let grad_u1s = wanted.u1s.then(|| output_factor_grad(&weights.s1s));

    Ok(SketchGradients {
        x: grad_x,
        s1s: grad_s1s,
        s2s: grad_s2s,
        u1s: grad_u1s,
        u2s: grad_u2s,
    })
}
