//! `FusedBackend` for [`FastFlex`]: burn-cpu-kernels' row kernels (layer norm, softmax,
//! cross-entropy) and flash-style attention, both ways. Tensors are computed in `f32`:
//! `bf16` and `f16` ones are widened once by FastFlex's vectorised cast and the results
//! rounded once; `f64` tensors take the compositions.

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use burn_cpu_kernels::{layer_norm, softmax};
use burn_fast_cpu::{FastFlex, flex_view};

use super::{FusedBackend, LayerNormForward, LayerNormGradients};
use crate::composed;
use crate::softmax::SoftmaxKind;

/// Whether the kernels compute this tensor (through `f32`).
fn ours<const D: usize>(tensor: &Tensor<FastFlex, D>) -> bool {
    matches!(tensor.dtype(), DType::F32 | DType::BF16 | DType::F16)
}

/// The tensor as a contiguous `f32` Flex tensor (a shared buffer where it is one already).
fn f32_tensor<const D: usize>(tensor: Tensor<FastFlex, D>) -> FlexTensor {
    let tensor = if tensor.dtype() == DType::F32 {
        tensor
    } else {
        tensor.cast(DType::F32)
    };
    flex_view::contiguous(&tensor.into_primitive().tensor())
}

/// The values of a tensor made by [`f32_tensor`].
fn values(tensor: &FlexTensor) -> &[f32] {
    flex_view::values::<f32>(tensor).expect("contiguous")
}

/// `f32` values as a tensor of `shape` in `dtype`.
fn tensor_of<const D: usize>(values: Vec<f32>, shape: [usize; D], dtype: DType) -> Tensor<FastFlex, D> {
    let tensor: Tensor<FastFlex, D> =
        Tensor::from_primitive(TensorPrimitive::Float(flex_view::tensor(values, shape)));
    if dtype == DType::F32 {
        tensor
    } else {
        tensor.cast(dtype)
    }
}

impl FusedBackend for FastFlex {
    fn fused_layer_norm_forward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        beta: Option<Tensor<Self, 1>>,
        epsilon: f64,
    ) -> LayerNormForward<Self> {
        if !ours(&x) || !ours(&gamma) || beta.as_ref().is_some_and(|b| !ours(b)) {
            return composed::layer_norm_forward(x, gamma, beta, epsilon);
        }
        let ([rows, n], dtype) = (x.dims(), x.dtype());
        let (x, gamma) = (f32_tensor(x), f32_tensor(gamma));
        let beta = beta.map(f32_tensor);
        let mut y = vec![0.0f32; rows * n];
        let (mut mean, mut rstd) = (vec![0.0f32; rows], vec![0.0f32; rows]);
        let stats = layer_norm::RowStats {
            mean: &mut mean,
            rstd: &mut rstd,
        };
        layer_norm::layer_norm_rows(
            values(&x),
            values(&gamma),
            beta.as_ref().map(values),
            epsilon as f32,
            &mut y,
            n,
            Some(stats),
        );
        LayerNormForward {
            output: tensor_of(y, [rows, n], dtype),
            mean: tensor_of(mean, [rows], DType::F32),
            rstd: tensor_of(rstd, [rows], DType::F32),
        }
    }

    fn fused_layer_norm_backward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        mean: Tensor<Self, 1>,
        rstd: Tensor<Self, 1>,
        grad_output: Tensor<Self, 2>,
        [want_gamma, want_beta]: [bool; 2],
    ) -> LayerNormGradients<Self> {
        if !ours(&x) || !ours(&gamma) || !ours(&grad_output) || mean.dtype() == DType::F64 {
            return composed::layer_norm_backward(
                x,
                gamma,
                mean,
                rstd,
                grad_output,
                [want_gamma, want_beta],
            );
        }
        let ([rows, n], dtype, gamma_dtype) = (x.dims(), x.dtype(), gamma.dtype());
        let [x, gamma, mean, rstd] = [f32_tensor(x), f32_tensor(gamma), f32_tensor(mean), f32_tensor(rstd)];
        let grad_output = f32_tensor(grad_output);
        let mut dx = vec![0.0f32; rows * n];
        let mut dgamma = want_gamma.then(|| vec![0.0f32; n]);
        let mut dbeta = want_beta.then(|| vec![0.0f32; n]);
        layer_norm::layer_norm_backward_rows(
            values(&x),
            values(&grad_output),
            values(&gamma),
            values(&mean),
            values(&rstd),
            &mut dx,
            dgamma.as_deref_mut(),
            dbeta.as_deref_mut(),
            n,
        );
        LayerNormGradients {
            x: tensor_of(dx, [rows, n], dtype),
            gamma: dgamma.map(|g| tensor_of(g, [n], gamma_dtype)),
            beta: dbeta.map(|b| tensor_of(b, [n], gamma_dtype)),
        }
    }

    fn fused_softmax_forward(x: Tensor<Self, 2>, kind: SoftmaxKind) -> Tensor<Self, 2> {
        let [rows, n] = x.dims();
        if !ours(&x) || rows * n == 0 {
            return composed::softmax_forward(x, kind);
        }
        let dtype = x.dtype();
        let x = f32_tensor(x);
        let mut y = vec![0.0f32; rows * n];
        let log = kind == SoftmaxKind::LogSoftmax;
        softmax::forward_rows_on(burn_cpu_kernels::Isa::detected(), log, Some(values(&x)), &mut y, n, None);
        tensor_of(y, [rows, n], dtype)
    }

    fn fused_softmax_backward(
        output: Tensor<Self, 2>,
        grad_output: Tensor<Self, 2>,
        kind: SoftmaxKind,
    ) -> Tensor<Self, 2> {
        let [rows, n] = output.dims();
        if !ours(&output) || !ours(&grad_output) || rows * n == 0 {
            return composed::softmax_backward(output, grad_output, kind);
        }
        let dtype = grad_output.dtype();
        let (y, dy) = (f32_tensor(output), f32_tensor(grad_output));
        let mut dx = vec![0.0f32; rows * n];
        let log = kind == SoftmaxKind::LogSoftmax;
        softmax::backward_rows_on(burn_cpu_kernels::Isa::detected(), log, values(&y), Some(values(&dy)), &mut dx, n);
        tensor_of(dx, [rows, n], dtype)
    }
}
