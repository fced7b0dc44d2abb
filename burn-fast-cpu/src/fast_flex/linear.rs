//! `FastFlex`'s `linear` and its three backward products, each one 2-D product whatever the
//! input's rank.
//!
//! Burn's default `linear` broadcasts the weight to `[1, …, d_in, d_out]` and runs a
//! *batched* product: one small product (and one packing of the weight) per sequence of a
//! batch. Here the leading dimensions of `x` are flattened into the rows of one product, the
//! bias is the product's starting value, and the weight gradient is one product of depth
//! `batch · seq` rather than a product per sequence summed afterwards.
//!
//! A weight that outlives the call (a model's parameter) is read in a form kept between
//! calls ([`weights`]): its packed panels for the `f32` product of 8 to 64 rows, and a
//! contiguous copy where its rows are strided (a transposed `Param`), so that a port of
//! PyTorch's `[d_out, d_in]` layout runs as fast as Burn's own.
//!
//! Each function computes operands of one float type, `f32`, `bf16` or `f16` (`f16` as `f32`,
//! rounded once); other operands come back as their [`FastPath`]'s `Err`.

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use half::bf16;

use burn_cpu_kernels::{MatRef, StoredFloat, sgemm};

use super::weights::{self, Form};
use super::{FastPath, convert, f32_values, via_f32};
use crate::flex_view::{self, Flattened};

/// Whether `FastFlex`'s own `linear` computes these operands: one float type of ours for all
/// (`f64`, and mixed types, take the composition on Flex's operations).
fn computes(tensors: &[&FlexTensor]) -> bool {
    let dtype = tensors[0].dtype();
    matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
        && tensors.iter().all(|t| t.dtype() == dtype)
}

/// `x · weight + bias` for `x: [..., d_in]`, `weight: [d_in, d_out]`, `bias: [d_out]`; the
/// output is `[..., d_out]`, contiguous, in `x`'s type.
pub(super) fn forward(
    x: FlexTensor,
    weight: FlexTensor,
    bias: Option<FlexTensor>,
) -> FastPath<(FlexTensor, FlexTensor, Option<FlexTensor>)> {
    let mut operands = vec![&x, &weight];
    operands.extend(bias.as_ref());
    if !computes(&operands) {
        return Err((x, weight, bias));
    }
    Ok(match x.dtype() {
        DType::BF16 => forward_bf16(&x, &weight, bias.as_ref()),
        DType::F16 => via_f32([x, weight], |[x, weight]| {
            forward_f32(&x, &weight, bias.map(super::to_f32).as_ref())
        }),
        _ => forward_f32(&x, &weight, bias.as_ref()),
    })
}

/// The `[m, d_in]` rows of `x`, `d_out` and the output's dimensions.
fn forward_dims(x: &FlexTensor, weight: &FlexTensor) -> (Flattened, usize, Vec<usize>) {
    let dims = x.layout().shape().to_vec();
    let k = *dims.last().expect("linear of a rank-0 tensor");
    let [k_w, n] = matrix_dims(weight);
    assert_eq!(k, k_w, "linear: input width {k}, weight rows {k_w}");
    let mut out_dims = dims;
    *out_dims.last_mut().expect("rank ≥ 1") = n;
    (Flattened::new(x), n, out_dims)
}

fn forward_f32(x: &FlexTensor, weight: &FlexTensor, bias: Option<&FlexTensor>) -> FlexTensor {
    let (rows, n, out_dims) = forward_dims(x, weight);
    let m = rows.shape()[0];
    let mut dst = vec![0.0f32; m * n];
    let bias = bias.map(f32_values);
    if (MIN_PACKED_ROWS..=STREAMED_WEIGHT_ROWS).contains(&m) && kept(weight) {
        // Few rows stream the weight: its panels, packed once, are read in order.
        let packed = weights::prepared(weight, Form::PackedF32, || {
            sgemm::PackedRhs::pack(flex_view::matrix::<f32>(weight))
        });
        let epilogue = sgemm::Epilogue {
            bias: bias.as_deref(),
            ..Default::default()
        };
        sgemm::matmul_packed(&mut dst, n, rows.view(), &packed, epilogue, true);
    } else {
        in_rows_order::<f32, _>(weight, |w| {
            product_f32(&mut dst, n, rows.view(), w, bias.as_deref())
        });
    }
    flex_view::tensor(dst, out_dims)
}

fn forward_bf16(x: &FlexTensor, weight: &FlexTensor, bias: Option<&FlexTensor>) -> FlexTensor {
    let (rows, n, out_dims) = forward_dims(x, weight);
    // The bias is the product's starting value; the sum rounds once, as it stores.
    let mut dst = start_value::<bf16>(bias, rows.shape()[0], n);
    in_rows_order::<bf16, _>(weight, |w| {
        product_bf16(&mut dst, n, rows.view(), w, bias.is_some())
    });
    flex_view::tensor(dst, out_dims)
}

/// Whether `weight` outlives this call (a model's parameter, a tensor a graph keeps): a
/// tensor nothing else holds (a weight widened for this call) is not worth keeping a form of.
fn kept(weight: &FlexTensor) -> bool {
    !weight.is_unique()
}

/// `product` on `weight` read row by row: the weight itself where its rows are contiguous,
/// else its contiguous copy, kept between calls for a weight that outlives the call
/// (a transposed `Param`, as a port of PyTorch's `nn.Linear` holds it).
fn in_rows_order<E: flex_view::FlexFloat, R>(
    weight: &FlexTensor,
    product: impl FnOnce(MatRef<'_, E>) -> R,
) -> R {
    let (rows, cols, _, col_stride) = weight.layout().as_2d_strides().expect("a rank-2 weight");
    // (A contiguous layout with a stride on a dimension of one is read in place too: its
    // `contiguous` form would be the weight's own buffer, which an entry must not hold.)
    if col_stride == 1 || weight.layout().is_contiguous() || rows * cols == 0 || !kept(weight) {
        return product(flex_view::matrix::<E>(weight));
    }
    let copy = weights::prepared(weight, Form::Contiguous, || flex_view::contiguous(weight));
    product(flex_view::matrix::<E>(&copy))
}

/// `output_grad · weightᵀ`: `[..., d_out] → [..., d_in]`.
pub(super) fn x_backward(
    weight: FlexTensor,
    output_grad: FlexTensor,
) -> FastPath<(FlexTensor, FlexTensor)> {
    if !computes(&[&weight, &output_grad]) {
        return Err((weight, output_grad));
    }
    Ok(match output_grad.dtype() {
        DType::BF16 => x_backward_in::<bf16>(&weight, &output_grad),
        DType::F16 => via_f32([weight, output_grad], |[weight, output_grad]| {
            x_backward_in::<f32>(&weight, &output_grad)
        }),
        _ => x_backward_in::<f32>(&weight, &output_grad),
    })
}

fn x_backward_in<E: Product>(weight: &FlexTensor, output_grad: &FlexTensor) -> FlexTensor {
    let dims = output_grad.layout().shape().to_vec();
    let n = *dims.last().expect("linear gradient of rank 0");
    let [k, n_w] = matrix_dims(weight);
    assert_eq!(
        n, n_w,
        "linear_x_backward: gradient width {n}, weight columns {n_w}"
    );
    let g = Flattened::new(output_grad);
    let mut out_dims = dims;
    *out_dims.last_mut().expect("rank ≥ 1") = k;
    let mut dst = vec![E::default(); g.shape()[0] * k];
    E::product(&mut dst, k, g.view(), flex_view::matrix(weight).t());
    flex_view::tensor(dst, out_dims)
}

/// `xᵀ · output_grad` over every leading position at once: `[d_in, d_out]`.
pub(super) fn weight_backward(
    x: FlexTensor,
    output_grad: FlexTensor,
) -> FastPath<(FlexTensor, FlexTensor)> {
    if !computes(&[&x, &output_grad]) {
        return Err((x, output_grad));
    }
    Ok(match output_grad.dtype() {
        DType::BF16 => weight_backward_in::<bf16>(&x, &output_grad),
        DType::F16 => via_f32([x, output_grad], |[x, output_grad]| {
            weight_backward_in::<f32>(&x, &output_grad)
        }),
        _ => weight_backward_in::<f32>(&x, &output_grad),
    })
}

fn weight_backward_in<E: Product>(x: &FlexTensor, output_grad: &FlexTensor) -> FlexTensor {
    let x_dims = x.layout().shape().to_vec();
    let g_dims = output_grad.layout().shape().to_vec();
    let k = *x_dims.last().expect("linear input of rank 0");
    let n = *g_dims.last().expect("linear gradient of rank 0");
    assert_eq!(
        leading(&x_dims),
        leading(&g_dims),
        "linear_weight_backward: {x_dims:?} and {g_dims:?}"
    );
    let (x, g) = (Flattened::new(x), Flattened::new(output_grad));
    let mut dst = vec![E::default(); k * n];
    E::product(&mut dst, n, x.view().t(), g.view());
    flex_view::tensor(dst, vec![k, n])
}

/// The sum of `output_grad` over every leading position: `[d_out]`, accumulated in `f32`
/// as Flex's sums are.
pub(super) fn bias_backward(output_grad: FlexTensor) -> FastPath<FlexTensor> {
    let dtype = output_grad.dtype();
    if !computes(&[&output_grad]) {
        return Err(output_grad);
    }
    let dims = output_grad.layout().shape().to_vec();
    let n = *dims.last().expect("linear gradient of rank 0");
    let g = Flattened::new(&super::to_f32(output_grad));
    let view = g.view::<f32>();
    let mut sums = vec![0.0f32; n];
    for i in 0..g.shape()[0] {
        match g.row::<f32>(i) {
            Some(row) => {
                for (sum, value) in sums.iter_mut().zip(row) {
                    *sum += value;
                }
            }
            None => {
                for (j, sum) in sums.iter_mut().enumerate() {
                    *sum += view.at(i, j);
                }
            }
        }
    }
    Ok(match dtype {
        DType::BF16 => convert::narrow::<bf16>(&flex_view::tensor(sums, [n])),
        DType::F16 => {
            let values: Vec<half::f16> = sums.iter().map(|&v| half::f16::from_f32(v)).collect();
            flex_view::tensor(values, [n])
        }
        _ => flex_view::tensor(sums, [n]),
    })
}

/// The product of all but the last dimension.
fn leading(dims: &[usize]) -> usize {
    dims[..dims.len() - 1].iter().product()
}

fn matrix_dims(weight: &FlexTensor) -> [usize; 2] {
    let shape = weight.layout().shape();
    assert_eq!(
        shape.num_dims(),
        2,
        "linear's weight must be 2-D, got {shape:?}"
    );
    [shape[0], shape[1]]
}

/// The product's starting value: the bias in every row, or zeros.
fn start_value<O: StoredFloat>(bias: Option<&FlexTensor>, m: usize, n: usize) -> Vec<O> {
    let Some(bias) = bias else {
        return vec![O::from_f32(0.0); m * n];
    };
    let b: Vec<O> = f32_values(bias).into_iter().map(O::from_f32).collect();
    let mut dst = Vec::with_capacity(m * n);
    for _ in 0..m {
        dst.extend_from_slice(&b);
    }
    dst
}

/// An element type of the backward products: `f32` on [`product_f32`], `bf16` on
/// [`product_bf16`].
trait Product: flex_view::FlexFloat {
    /// `dst = lhs · rhs`, rows of `stride`.
    fn product(dst: &mut [Self], stride: usize, lhs: MatRef<'_, Self>, rhs: MatRef<'_, Self>);
}

impl Product for f32 {
    fn product(dst: &mut [Self], stride: usize, lhs: MatRef<'_, Self>, rhs: MatRef<'_, Self>) {
        product_f32(dst, stride, lhs, rhs, None);
    }
}

impl Product for bf16 {
    fn product(dst: &mut [Self], stride: usize, lhs: MatRef<'_, Self>, rhs: MatRef<'_, Self>) {
        product_bf16(dst, stride, lhs, rhs, false);
    }
}

/// `dst = lhs · rhs (+ bias)` in `f32`, rows of `stride`, on
/// [`sgemm`](burn_cpu_kernels::sgemm) (the bias added in the product's store), or on its
/// `gemm` path (the bias a second pass) for up to [`STREAMED_WEIGHT_ROWS`] rows.
fn product_f32(
    dst: &mut [f32],
    stride: usize,
    a: MatRef<'_, f32>,
    b: MatRef<'_, f32>,
    bias: Option<&[f32]>,
) {
    if a.shape()[0] == 0 || b.shape()[1] == 0 {
        return;
    }
    let epilogue = sgemm::Epilogue {
        bias,
        ..Default::default()
    };
    // `sgemm`'s portable path is `gemm` (with its own AVX-512 kernels) and a bias pass.
    let isa = if a.shape()[0] <= STREAMED_WEIGHT_ROWS {
        burn_cpu_kernels::Isa::PORTABLE
    } else {
        burn_cpu_kernels::Isa::detected()
    };
    sgemm::matmul_on(isa, dst, stride, a, b, epilogue, true);
}

/// Rows up to which a model's forward streams its weights from memory (a stack of layers'
/// weights does not fit in the last-level cache). There `linear`'s `f32` product reads a
/// weight that outlives the call as its panels, packed once ([`weights`]), in order; a
/// weight packed at each call took `sgemm`'s `gemm` path instead, whose order of reading a
/// weight in place beat the micro-kernel's column panels.
const STREAMED_WEIGHT_ROWS: usize = 64;

/// The fewest rows `linear`'s `f32` product reads a weight's kept panels for: below, `gemm`
/// reading the weight in place is faster (a product of one row is a matrix-vector product,
/// for which the micro-kernel's 14-row tile is mostly empty).
const MIN_PACKED_ROWS: usize = 8;

/// `dst (+)= lhs · rhs` of `bf16` operands, accumulated in `f32` and rounded once to `O`.
fn product_bf16<O: StoredFloat>(
    dst: &mut [O],
    stride: usize,
    a: MatRef<'_, bf16>,
    b: MatRef<'_, bf16>,
    accumulate: bool,
) {
    if a.shape()[0] == 0 || b.shape()[1] == 0 || a.shape()[1] == 0 {
        return;
    }
    burn_cpu_kernels::bf16::matmul(dst, stride, a, b, 1.0, accumulate, true);
}
