//! The sketched layer's forward and backward on CubeCL tensors: which kernels run, in which
//! order, on which buffers.
//!
//! With `A = [S1 | U2]`, `B = [U1; S2]`, `α = 1/(2T)` and `P = x·A = [P₁ | P₂]`:
//!
//! | launch | computes | kernel |
//! |---|---|---|
//! | forward | `y = f(α·P·B + bias)` | fused, `P` on chip (one launch); or `P`'s depth split, then fused from the slices (two); or, for ranks too wide for shared memory, `P` then `y` ([`gemm`](crate::gemm::gemm_concat), two or three) |
//! | backward 1 | `∂P = α·∂y·Bᵀ` and `P = x·A` (recomputed), the halves the wanted gradients read | one grouped [`gemm_kernel()`](crate::gemm::gemm_kernel()) |
//! | backward 2 | the slices of both, when either product's depth is split | one [`reduce_splits_kernel()`](crate::gemm::reduce_splits_kernel()) |
//! | backward 3 | `∂x = ∂P·Aᵀ`, `∂S1 = xᵀ·∂P₁`, `∂U2 = xᵀ·∂P₂`, `∂S2 = α·P₂ᵀ·∂y`, `∂U1 = α·P₁ᵀ·∂y`, as wanted | grouped [`gemm_kernel()`](crate::gemm::gemm_kernel()), [`GROUP`] products per launch |
//!
//! So a training step of `SkLinear` (`∂x`, `∂S1`, `∂S2`; the sketches are fixed) is two
//! launches forward and at most three backward, whatever its shape up to the fused kernel's
//! rank limit; the bias gradient, a column sum, is the backend's own reduction.
//!
//! The third backward launch does not split its depth (the batch): its products run
//! together, and together they have tiles enough to fill the device for the shapes this
//! layer is for. The first does, where its products are skinny (`n × Tk` over `d`), and its
//! slices are added once, by the second launch, because the third reads `∂P` and `P` from
//! many cubes.
//!
//! `A` and `B` are in the packed order `burn_sketch::CubeWeights` documents (blocks:
//! `A = [S1_1 … S1_T | U2_1 … U2_T]`), read in place through [`Layout`]s, never packed.
//!
//! The backward needs only `x` and the factors: `P` is recomputed (a skinny product) instead
//! of being kept from the forward, which is what lets the layer store nothing but its input
//! for training.

use burn_backend::{DType, Shape};
use burn_cubecl::CubeRuntime;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use crate::fused::{MAX_FUSED_RANK, fused_forward};
use crate::gemm::{
    Concat, GROUP, GemmProblem, Product, TILE, Tail, gemm_concat, launch_group, reduce_splits,
    workspace,
};
use crate::layout::Layout;
use crate::tune::{ForwardPath, choose_forward_path};
use crate::weights::{CubeWeights, Operands};
use crate::{Activation, KernelError};

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

impl<R: CubeRuntime> CubeWeights<R> {
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

fn empty<R: CubeRuntime>(like: &CubeTensor<R>, shape: Shape, dtype: DType) -> CubeTensor<R> {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, dtype)
}

/// `y = f(x·(S1·U1 + U2·S2)/(2T) + bias)` for `x` of shape `[n, d_in]`, with `f` the
/// [`Activation`] applied in the output pass; returns `[n, d_out]`.
///
/// Uses the kernels [`choose_forward_path`] chooses.
///
/// # Errors
/// [`KernelError`] if the operands' shapes do not fit together (`x` `[n, d_in]`, the weights
/// as [`CubeWeights`] states, `bias` `[d_out]`) or their element types differ.
pub fn forward<R: CubeRuntime>(
    x: CubeTensor<R>,
    weights: &CubeWeights<R>,
    bias: Option<CubeTensor<R>>,
    activation: Activation,
) -> Result<CubeTensor<R>, KernelError> {
    let checked = check_forward(&x, weights, bias.as_ref())?;
    let (dims, rows) = (checked.dims, checked.rows);
    let path = choose_forward_path(&x.client, rows, dims.d_in, 2 * dims.half(), dims.d_out);
    launch_forward(x, weights, (bias, activation), path, checked)
}

/// [`forward`] on a given path, for tests and benchmarks that compare them.
///
/// # Errors
/// As [`forward`]; and [`KernelError::FusedRankTooWide`] for a fused or split path with
/// `2Tk > MAX_FUSED_RANK`.
pub fn forward_with<R: CubeRuntime>(
    x: CubeTensor<R>,
    weights: &CubeWeights<R>,
    bias: Option<CubeTensor<R>>,
    activation: Activation,
    path: ForwardPath,
) -> Result<CubeTensor<R>, KernelError> {
    let checked = check_forward(&x, weights, bias.as_ref())?;
    launch_forward(x, weights, (bias, activation), path, checked)
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
    weights: &CubeWeights<R>,
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
    weights: &CubeWeights<R>,
    (bias, activation): (Option<CubeTensor<R>>, Activation),
    path: ForwardPath,
    Checked { dims, rows, dtype }: Checked,
) -> Result<CubeTensor<R>, KernelError> {
    let out = empty(&x, Shape::new([rows, dims.d_out]), dtype);

    let width = 2 * dims.half();
    let projection = GemmProblem::new(rows, width, dims.d_in).with_layouts(
        (Layout::RowMajor, Layout::InputFactor, Layout::RowMajor),
        dims.low_rank,
    );
    let input_side = (
        &weights.s1s,
        Some((&weights.u2s, Concat::Cols, dims.half())),
    );
    match path {
        ForwardPath::Fused { column_groups } => fused_forward(
            &x,
            weights,
            bias.as_ref(),
            activation,
            None,
            &out,
            column_groups,
        )?,
        ForwardPath::Split { column_groups } => {
            // The rank limit is checked before anything is launched.
            if width.div_ceil(TILE as usize) * TILE as usize > MAX_FUSED_RANK {
                return Err(KernelError::FusedRankTooWide {
                    rank: width,
                    max: MAX_FUSED_RANK,
                });
            }
            let partials = workspace(&x, &projection);
            let (head, tail) = input_side;
            let product = Product {
                problem: projection,
                lhs: &x,
                rhs: head,
                tail,
                out: &partials,
            };
            launch_group(&[product], None, true);
            fused_forward(
                &x,
                weights,
                bias.as_ref(),
                activation,
                Some(&partials),
                &out,
                column_groups,
            )?
        }
        ForwardPath::Tiled => {
            // P = x·[S1 | U2], `[n, 2Tk]`, then y = f(α·P·[U1; S2] + bias): two products,
            // each reading both factors of its side in place.
            let p = empty(&x, Shape::new([rows, width]), dtype);
            gemm_concat(&projection, &x, input_side, None, &p);
            let problem = GemmProblem::new(rows, dims.d_out, width)
                .with_layouts(
                    (Layout::RowMajor, Layout::OutputFactor, Layout::RowMajor),
                    dims.low_rank,
                )
                .with_alpha(dims.alpha())
                .with_activation(activation);
            let output_side = (
                &weights.u1s,
                Some((&weights.s2s, Concat::Depth, dims.half())),
            );
            gemm_concat(&problem, &p, output_side, bias.as_ref(), &out);
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
    weights: &CubeWeights<R>,
    grad_output: CubeTensor<R>,
    wanted: Operands<bool>,
) -> Result<Operands<Option<CubeTensor<R>>>, KernelError> {
    let dims = weights.dims()?;
    let rows = check_input(&x, dims)?;
    check_shape("grad_output", &grad_output, &[rows, dims.d_out])?;
    let mut operands = weights.named().to_vec();
    operands.push(("grad_output", &grad_output));
    let dtype = check_dtypes(&x, &operands)?;
    let step = BackwardStep {
        x: &x,
        weights,
        grad_output: &grad_output,
        dims,
        rows,
        dtype,
        // The halves of ∂P = α·∂y·Bᵀ and P = x·A that the wanted gradients read.
        grad_halves: Halves {
            first: wanted.x || wanted.s1s,
            second: wanted.x || wanted.u2s,
        },
        p_halves: Halves {
            first: wanted.u1s,
            second: wanted.s2s,
        },
    };
    let (grad_p, p) = step.projections();
    Ok(step.gradients(wanted, grad_p.as_ref(), p.as_ref()))
}

/// The operands and shapes of one backward call, shared by its steps.
struct BackwardStep<'a, R: CubeRuntime> {
    x: &'a CubeTensor<R>,
    weights: &'a CubeWeights<R>,
    grad_output: &'a CubeTensor<R>,
    dims: Dims,
    rows: usize,
    dtype: DType,
    grad_halves: Halves,
    p_halves: Halves,
}

impl<R: CubeRuntime> BackwardStep<'_, R> {
    /// Backward 1 and 2: the halves of `∂P` and `P` the wanted gradients read, in one grouped
    /// launch, and one more that adds the depth slices when either product is split.
    fn projections(&self) -> (Option<CubeTensor<R>>, Option<CubeTensor<R>>) {
        let (dims, rows, half) = (self.dims, self.rows, self.dims.half());
        let k = dims.low_rank;
        let weights = self.weights;
        let mut projections = Vec::new();
        if self.grad_halves.any() {
            let problem = GemmProblem::new(rows, self.grad_halves.width(half), dims.d_out)
                .with_layouts(
                    (Layout::RowMajor, Layout::OutputFactorT, Layout::RowMajor),
                    k,
                )
                .with_alpha(dims.alpha());
            let factors = self
                .grad_halves
                .operands((&weights.u1s, &weights.s2s), half);
            projections.push((problem, self.grad_output, factors));
        }
        if self.p_halves.any() {
            let problem = GemmProblem::new(rows, self.p_halves.width(half), dims.d_in)
                .with_layouts((Layout::RowMajor, Layout::InputFactor, Layout::RowMajor), k);
            let factors = self.p_halves.operands((&weights.s1s, &weights.u2s), half);
            projections.push((problem, self.x, factors));
        }
        let outputs: Vec<_> = projections
            .iter()
            .map(|(problem, _, _)| empty(self.x, Shape::new([rows, problem.cols]), self.dtype))
            .collect();
        let partial = projections
            .iter()
            .any(|(problem, _, _)| problem.slices(&self.x.client).1 > 1);
        let targets: Vec<_> = if partial {
            projections
                .iter()
                .map(|(problem, _, _)| workspace(self.x, problem))
                .collect()
        } else {
            outputs.clone()
        };
        let products: Vec<_> = projections
            .iter()
            .zip(&targets)
            .map(|((problem, lhs, (rhs, tail)), out)| Product {
                problem: *problem,
                lhs,
                rhs,
                tail: *tail,
                out,
            })
            .collect();
        if !products.is_empty() {
            launch_group(&products, None, partial);
        }
        if partial {
            let slab = |index: usize| (&projections[index].0, &targets[index], &outputs[index]);
            reduce_splits(slab(0), (projections.len() > 1).then(|| slab(1)), None);
        }
        let mut outputs = outputs.into_iter();
        let grad_p = self.grad_halves.any().then(|| outputs.next()).flatten();
        let p = self.p_halves.any().then(|| outputs.next()).flatten();
        (grad_p, p)
    }

    /// Backward 3: every wanted gradient from `∂P` and `P`, in grouped launches.
    fn gradients(
        &self,
        wanted: Operands<bool>,
        grad_p: Option<&CubeTensor<R>>,
        p: Option<&CubeTensor<R>>,
    ) -> Operands<Option<CubeTensor<R>>> {
        let (dims, rows, half) = (self.dims, self.rows, self.dims.half());
        let (x, weights, k) = (self.x, self.weights, dims.low_rank);
        let empty_like = |shape: [usize; 3]| empty(x, Shape::new(shape), self.dtype);
        let input_side = [dims.terms, dims.d_in, k];
        let output_side = [dims.terms, k, dims.d_out];
        let mut gradients: [Option<CubeTensor<R>>; 5] = Default::default();
        let wanted_list = [wanted.x, wanted.s1s, wanted.s2s, wanted.u1s, wanted.u2s];
        for (slot, &is_wanted) in wanted_list.iter().enumerate() {
            if is_wanted {
                gradients[slot] = Some(match slot {
                    0 => empty(x, Shape::new([rows, dims.d_in]), self.dtype),
                    1 | 4 => empty_like(input_side),
                    _ => empty_like(output_side),
                });
            }
        }
        let mut products = Vec::new();
        if let (Some(out), Some(grad_p)) = (&gradients[0], grad_p) {
            // ∂x = ∂P·Aᵀ = [∂P₁ | ∂P₂]·[S1ᵀ; U2ᵀ].
            let problem = GemmProblem::new(rows, dims.d_in, 2 * half).with_layouts(
                (Layout::RowMajor, Layout::InputFactorT, Layout::RowMajor),
                k,
            );
            products.push(Product {
                problem,
                lhs: grad_p,
                rhs: &weights.s1s,
                tail: Some((&weights.u2s, Concat::Depth, half)),
                out,
            });
        }
        // Input-side factor gradients: xᵀ·∂P_h, written as `[T, d_in, k]`.
        for (slot, second) in [(1, false), (4, true)] {
            if let (Some(out), Some(grad_p)) = (&gradients[slot], grad_p) {
                let problem = GemmProblem::new(dims.d_in, half, rows)
                    .with_layouts(
                        (Layout::Transposed, Layout::RowMajor, Layout::InputFactor),
                        k,
                    )
                    .with_offsets(0, self.grad_halves.offset(second, half));
                products.push(Product {
                    problem,
                    lhs: x,
                    rhs: grad_p,
                    tail: None,
                    out,
                });
            }
        }
        // Output-side factor gradients: α·P_hᵀ·∂y, written as `[T, k, d_out]`.
        for (slot, second) in [(2, true), (3, false)] {
            if let (Some(out), Some(p)) = (&gradients[slot], p) {
                let problem = GemmProblem::new(half, dims.d_out, rows)
                    .with_layouts(
                        (Layout::Transposed, Layout::RowMajor, Layout::OutputFactor),
                        k,
                    )
                    .with_alpha(dims.alpha())
                    .with_offsets(self.p_halves.offset(second, half), 0);
                products.push(Product {
                    problem,
                    lhs: p,
                    rhs: self.grad_output,
                    tail: None,
                    out,
                });
            }
        }
        for group in products.chunks(group_size(&x.client)) {
            let unsplit: Vec<_> = group
                .iter()
                .map(|product| Product {
                    problem: product.problem.with_splits(1),
                    ..*product
                })
                .collect();
            launch_group(&unsplit, None, false);
        }

        let [x, s1s, s2s, u1s, u2s] = gradients;
        Operands {
            x,
            s1s,
            s2s,
            u1s,
            u2s,
        }
    }
}

/// Which halves of a `[n, 2Tk]` matrix (`∂P` or `P`) are computed: only those a wanted
/// gradient reads, stored side by side in that order.
#[derive(Debug, Clone, Copy)]
struct Halves {
    first: bool,
    second: bool,
}

impl Halves {
    fn any(&self) -> bool {
        self.first || self.second
    }

    /// Columns of the stored matrix.
    fn width(&self, half: usize) -> usize {
        half * (self.first as usize + self.second as usize)
    }

    /// The element offset of a half in the stored matrix's first row.
    fn offset(&self, second: bool, half: usize) -> usize {
        if second && self.first { half } else { 0 }
    }

    /// The right operand of the product that makes the stored halves: one factor, or both
    /// side by side.
    fn operands<'a, R: CubeRuntime>(
        &self,
        (first, second): (&'a CubeTensor<R>, &'a CubeTensor<R>),
        half: usize,
    ) -> (&'a CubeTensor<R>, Tail<'a, R>) {
        match (self.first, self.second) {
            (true, true) => (first, Some((second, Concat::Cols, half))),
            (true, false) => (first, None),
            _ => (second, None),
        }
    }
}

/// Products per grouped launch: [`GROUP`], or fewer where the device binds fewer buffers to a
/// kernel (each product binds four, and the launch a bias).
fn group_size<R: CubeRuntime>(client: &cubecl::prelude::ComputeClient<R>) -> usize {
    let bindings = client.properties().hardware.max_bindings as usize;
    (bindings.saturating_sub(1) / 4).clamp(1, GROUP)
}
