//! `FastFlex`'s `linear` and its three backward products, each one 2-D product whatever the
//! input's rank.
//!
//! Burn's default `linear` broadcasts the weight to `[1, …, d_in, d_out]` and runs a
//! *batched* product: one small product (and one packing of the weight) per sequence of a
//! batch. Here the leading dimensions of `x` are flattened into the rows of one product, the
//! bias is the product's starting value, and the weight gradient is one product of depth
//! `batch · seq` rather than a product per sequence summed afterwards.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use half::{bf16, f16};

use burn_cpu_kernels::StoredFloat;
use burn_cpu_kernels::{MatRef, sgemm};

use super::convert;

/// `x · weight + bias` for `x: [..., d_in]`, `weight: [d_in, d_out]`, `bias: [d_out]`; the
/// output is `[..., d_out]`, contiguous, in `x`'s type. `f16` runs as `f32` and rounds once.
pub(super) fn forward(x: FlexTensor, weight: FlexTensor, bias: Option<FlexTensor>) -> FlexTensor {
    let dtype = x.dtype();
    let dims = x.layout().shape().to_vec();
    let k = *dims.last().expect("linear of a rank-0 tensor");
    let [k_w, n] = matrix_dims(&weight);
    assert_eq!(k, k_w, "linear: input width {k}, weight rows {k_w}");
    let m = leading(&dims);
    let mut out_dims = dims.clone();
    *out_dims.last_mut().expect("rank ≥ 1") = n;
    match dtype {
        DType::F32 => {
            let mut dst = vec![0.0f32; m * n];
            let bias = bias.map(|b| super::f32_values(&b));
            product_f32(
                &mut dst,
                n,
                &rows(&x, m, k),
                &plain(&weight),
                bias.as_deref(),
            );
            tensor(dst, out_dims, DType::F32)
        }
        DType::BF16 => {
            // The bias is the product's starting value; the sum rounds once, as it stores.
            let mut dst = start_value::<bf16>(bias.as_ref(), m, n);
            let accumulate = bias.is_some();
            product_bf16(&mut dst, n, &rows(&x, m, k), &plain(&weight), accumulate);
            half_tensor(dst, out_dims)
        }
        DType::F16 => {
            let out = forward(
                super::to_f32(x),
                super::to_f32(weight),
                bias.map(super::to_f32),
            );
            super::from_f32(out, burn_backend::FloatDType::F16)
        }
        other => panic!("FastFlex's linear: unsupported float type {other:?}"),
    }
}

/// `output_grad · weightᵀ`: `[..., d_out] → [..., d_in]`.
pub(super) fn x_backward(weight: FlexTensor, output_grad: FlexTensor) -> FlexTensor {
    let dims = output_grad.layout().shape().to_vec();
    let n = *dims.last().expect("linear gradient of rank 0");
    let [k, n_w] = matrix_dims(&weight);
    assert_eq!(
        n, n_w,
        "linear_x_backward: gradient width {n}, weight columns {n_w}"
    );
    let m = leading(&dims);
    let mut out_dims = dims.clone();
    *out_dims.last_mut().expect("rank ≥ 1") = k;
    let transposed = |w: &Operand| Operand {
        tensor: w.tensor.clone(),
        view: View {
            offset: w.view.offset,
            shape: [w.view.shape[1], w.view.shape[0]],
            strides: [w.view.strides[1], w.view.strides[0]],
        },
    };
    match output_grad.dtype() {
        DType::F32 => {
            let mut dst = vec![0.0f32; m * k];
            let g = rows(&output_grad, m, n);
            product_f32(&mut dst, k, &g, &transposed(&plain(&weight)), None);
            tensor(dst, out_dims, DType::F32)
        }
        DType::BF16 => {
            let mut dst = vec![bf16::ZERO; m * k];
            let g = rows(&output_grad, m, n);
            product_bf16(&mut dst, k, &g, &transposed(&plain(&weight)), false);
            half_tensor(dst, out_dims)
        }
        DType::F16 => super::from_f32(
            x_backward(super::to_f32(weight), super::to_f32(output_grad)),
            burn_backend::FloatDType::F16,
        ),
        other => panic!("FastFlex's linear: unsupported float type {other:?}"),
    }
}

/// `xᵀ · output_grad` over every leading position at once: `[d_in, d_out]`.
pub(super) fn weight_backward(x: FlexTensor, output_grad: FlexTensor) -> FlexTensor {
    let x_dims = x.layout().shape().to_vec();
    let g_dims = output_grad.layout().shape().to_vec();
    let k = *x_dims.last().expect("linear input of rank 0");
    let n = *g_dims.last().expect("linear gradient of rank 0");
    let m = leading(&x_dims);
    assert_eq!(
        m,
        leading(&g_dims),
        "linear_weight_backward: {x_dims:?} and {g_dims:?}"
    );
    let transposed = |o: Operand| Operand {
        tensor: o.tensor,
        view: View {
            offset: o.view.offset,
            shape: [o.view.shape[1], o.view.shape[0]],
            strides: [o.view.strides[1], o.view.strides[0]],
        },
    };
    match output_grad.dtype() {
        DType::F32 => {
            let mut dst = vec![0.0f32; k * n];
            let (xt, g) = (transposed(rows(&x, m, k)), rows(&output_grad, m, n));
            product_f32(&mut dst, n, &xt, &g, None);
            tensor(dst, vec![k, n], DType::F32)
        }
        DType::BF16 => {
            let mut dst = vec![bf16::ZERO; k * n];
            let (xt, g) = (transposed(rows(&x, m, k)), rows(&output_grad, m, n));
            product_bf16(&mut dst, n, &xt, &g, false);
            half_tensor(dst, vec![k, n])
        }
        DType::F16 => super::from_f32(
            weight_backward(super::to_f32(x), super::to_f32(output_grad)),
            burn_backend::FloatDType::F16,
        ),
        other => panic!("FastFlex's linear: unsupported float type {other:?}"),
    }
}

/// The sum of `output_grad` over every leading position: `[d_out]`, accumulated in `f32`
/// (`f64` for `f64`) as Flex's sums are.
pub(super) fn bias_backward(output_grad: FlexTensor) -> FlexTensor {
    let dims = output_grad.layout().shape().to_vec();
    let n = *dims.last().expect("linear gradient of rank 0");
    let m = leading(&dims);
    let dtype = output_grad.dtype();
    let g = match dtype {
        DType::BF16 | DType::F16 => super::to_f32(output_grad),
        DType::F32 => output_grad,
        other => panic!("FastFlex's linear: unsupported float type {other:?}"),
    };
    let g = rows(&g, m, n);
    let values = g.tensor.storage::<f32>();
    let mut sums = vec![0.0f32; n];
    let v = g.view;
    for i in 0..m {
        let row = (v.offset as isize + i as isize * v.strides[0]) as usize;
        if v.strides[1] == 1 {
            for (sum, value) in sums.iter_mut().zip(&values[row..row + n]) {
                *sum += value;
            }
        } else {
            for (j, sum) in sums.iter_mut().enumerate() {
                *sum += values[(row as isize + j as isize * v.strides[1]) as usize];
            }
        }
    }
    match dtype {
        DType::BF16 => narrow_bf16(sums, vec![n]),
        DType::F16 => {
            let values: Vec<f16> = sums.iter().map(|&v| f16::from_f32(v)).collect();
            FlexTensor::new(
                Bytes::from_elems(values),
                Layout::contiguous(Shape::from(vec![n])),
                DType::F16,
            )
        }
        _ => tensor(sums, vec![n], DType::F32),
    }
}

/// A 2-D strided view of a tensor's buffer, in elements.
#[derive(Clone, Copy, Debug)]
struct View {
    offset: usize,
    shape: [usize; 2],
    strides: [isize; 2],
}

/// A tensor (kept alive for its buffer) and a 2-D view of it.
struct Operand {
    tensor: FlexTensor,
    view: View,
}

impl Operand {
    fn mat<E: burn::tensor::Element + bytemuck::Pod>(&self) -> MatRef<'_, E> {
        MatRef::strided(
            self.tensor.storage::<E>(),
            self.view.offset,
            self.view.shape,
            self.view.strides,
        )
    }
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

/// A 2-D tensor as it is (any strides).
fn plain(tensor: &FlexTensor) -> Operand {
    let layout = tensor.layout();
    let s = layout.strides();
    Operand {
        tensor: tensor.clone(),
        view: View {
            offset: layout.start_offset(),
            shape: [layout.shape()[0], layout.shape()[1]],
            strides: [s[0], s[1]],
        },
    }
}

/// `tensor` (`[..., cols]`) as an `m × cols` matrix: a view of its buffer where its leading
/// dimensions collapse into one stride (contiguous, sliced rows, a transposed last pair
/// excepted), else a contiguous copy.
fn rows(tensor: &FlexTensor, m: usize, cols: usize) -> Operand {
    let layout = tensor.layout();
    let dims = layout.shape().to_vec();
    let strides = layout.strides();
    let rank = dims.len();
    // The leading dimensions collapse into one row stride when each (of size > 1) steps
    // by the next one's stride times its size.
    let outer: Vec<usize> = (0..rank.saturating_sub(1))
        .filter(|&d| dims[d] != 1)
        .collect();
    let collapses = outer
        .windows(2)
        .all(|pair| strides[pair[0]] == strides[pair[1]] * dims[pair[1]] as isize);
    let mut row_stride = match outer.last() {
        Some(&d) if collapses => Some(strides[d]),
        Some(_) => None,
        None => Some(cols as isize),
    };
    // A single row has no row stride to honour.
    if m <= 1 {
        row_stride = Some(cols as isize);
    }
    let col_stride = if rank >= 1 { strides[rank - 1] } else { 1 };
    let usable = row_stride.is_some_and(|r| r >= 0) && col_stride >= 0;
    if usable {
        let row = row_stride.expect("checked");
        return Operand {
            tensor: tensor.clone(),
            view: View {
                offset: layout.start_offset(),
                shape: [m, cols],
                strides: [row, col_stride],
            },
        };
    }
    let contiguous = super::copy::contiguous(tensor);
    let offset = contiguous.layout().start_offset();
    Operand {
        tensor: contiguous,
        view: View {
            offset,
            shape: [m, cols],
            strides: [cols as isize, 1],
        },
    }
}

/// The product's starting value: the bias in every row, or zeros.
fn start_value<O: StoredFloat>(bias: Option<&FlexTensor>, m: usize, n: usize) -> Vec<O> {
    let Some(bias) = bias else {
        return vec![O::from_f32(0.0); m * n];
    };
    let b: Vec<O> = super::f32_values(bias)
        .into_iter()
        .map(O::from_f32)
        .collect();
    let mut dst = Vec::with_capacity(m * n);
    for _ in 0..m {
        dst.extend_from_slice(&b);
    }
    dst
}

/// `dst = lhs · rhs (+ bias)` in `f32`, rows of `stride`, on
/// [`sgemm`](burn_cpu_kernels::sgemm) (the bias added in the product's store), or on its
/// `gemm` path (the bias a second pass) for up to [`SMALL_M`] rows.
fn product_f32(dst: &mut [f32], stride: usize, lhs: &Operand, rhs: &Operand, bias: Option<&[f32]>) {
    let (a, b) = (lhs.mat::<f32>(), rhs.mat::<f32>());
    if a.shape()[0] == 0 || b.shape()[1] == 0 {
        return;
    }
    let epilogue = sgemm::Epilogue {
        bias,
        ..Default::default()
    };
    let isa = if a.shape()[0] <= SMALL_M {
        burn_cpu_kernels::Isa::PORTABLE
    } else {
        burn_cpu_kernels::Isa::detected()
    };
    sgemm::matmul_on(isa, dst, stride, a, b, epilogue, true);
}

/// Rows up to which `linear`'s `f32` product takes `sgemm`'s `gemm` path: with a few
/// rows a forward streams its weights from memory (a 6-layer encoder's are 42 MB, more than
/// the L3), and `gemm`'s order of reading them beat `sgemm`'s column panels in the model
/// (`encoder_bench`, 1 × 16: 4.7 against 5.9 ms) though not on a weight already in cache.
const SMALL_M: usize = 64;

/// `dst (+)= lhs · rhs` of `bf16` operands, accumulated in `f32` and rounded once to `O`.
fn product_bf16<O: StoredFloat>(
    dst: &mut [O],
    stride: usize,
    lhs: &Operand,
    rhs: &Operand,
    accumulate: bool,
) {
    let (a, b) = (lhs.mat::<bf16>(), rhs.mat::<bf16>());
    if a.shape()[0] == 0 || b.shape()[1] == 0 || a.shape()[1] == 0 {
        return;
    }
    burn_cpu_kernels::bf16::matmul(dst, stride, a, b, 1.0, accumulate, true);
}

fn tensor(values: Vec<f32>, dims: Vec<usize>, dtype: DType) -> FlexTensor {
    FlexTensor::new(
        Bytes::from_elems(values),
        Layout::contiguous(Shape::from(dims)),
        dtype,
    )
}

fn half_tensor(values: Vec<bf16>, dims: Vec<usize>) -> FlexTensor {
    FlexTensor::new(
        Bytes::from_elems(values),
        Layout::contiguous(Shape::from(dims)),
        DType::BF16,
    )
}

fn narrow_bf16(values: Vec<f32>, dims: Vec<usize>) -> FlexTensor {
    convert::narrow::<bf16>(&tensor(values, dims, DType::F32))
}
