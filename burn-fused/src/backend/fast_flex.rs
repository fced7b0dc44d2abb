//! `FusedBackend` for [`FastFlex`]: burn-cpu-kernels' row kernels (layer norm, softmax,
//! cross-entropy) and flash-style attention, both ways. Tensors are computed in `f32`:
//! `bf16` and `f16` ones are widened once by FastFlex's vectorised cast and the results
//! rounded once; `f64` tensors take the compositions. The Adam step runs on `f32` tensors
//! in one pass, in place where it can; other float types take the composition.

use burn::backend::flex::FlexTensor;
use burn::tensor::{Bool, DType, Int, Tensor, TensorPrimitive};
use burn_cpu_kernels::attention::{self, Options};
use burn_cpu_kernels::{StoredFloat, View4, cross_entropy, layer_norm, softmax};
use burn_fast_cpu::flex_view::FlexFloat;
use burn_fast_cpu::{FastFlex, flex_view};
use half::bf16;

use super::{
    AttentionForward, CrossEntropyForward, FusedBackend, LayerNormForward, LayerNormGradients,
};
use crate::attention::AttentionOptions;
use crate::composed;
use crate::optim::AdamStep;
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
fn tensor_of<const D: usize>(
    values: Vec<f32>,
    shape: [usize; D],
    dtype: DType,
) -> Tensor<FastFlex, D> {
    let tensor: Tensor<FastFlex, D> =
        Tensor::from_primitive(TensorPrimitive::Float(flex_view::tensor(values, shape)));
    if dtype == DType::F32 {
        tensor
    } else {
        tensor.cast(dtype)
    }
}

/// The kernels' options for `options` (no softcap: the fused operation has none).
fn kernel_options(options: AttentionOptions) -> Options {
    Options {
        scale: options.scale.map(|s| s as f32),
        softcap: None,
        causal: options.causal,
        dropout: options.dropout,
    }
}

/// Attention's operands in the type the kernels store (`f32` or `bf16`; `f16` through
/// `f32`), or `None` for `f64` or mixed types and masks not stored as bytes.
fn attention_dtype(tensors: &[&Tensor<FastFlex, 4>], mask: Option<&FlexTensor>) -> Option<DType> {
    let dtype = tensors[0].dtype();
    let same = tensors.iter().all(|t| t.dtype() == dtype);
    let mask_bytes = mask.is_none_or(flex_view::is_byte_mask);
    match dtype {
        DType::F32 | DType::BF16 | DType::F16 if same && mask_bytes => Some(dtype),
        _ => None,
    }
}

/// The tensor as the kernels' stored type for `dtype` (`f16` widened to `f32`).
fn stored(tensor: Tensor<FastFlex, 4>, dtype: DType) -> FlexTensor {
    match dtype {
        DType::F16 => tensor.cast(DType::F32),
        _ => tensor,
    }
    .into_primitive()
    .tensor()
}

/// A kernel output in `E` as a tensor of `dtype` (rounding `f32` to `f16` where asked).
fn from_stored<E: FlexFloat, const D: usize>(
    values: Vec<E>,
    shape: [usize; D],
    dtype: DType,
) -> Tensor<FastFlex, D> {
    let tensor: Tensor<FastFlex, D> =
        Tensor::from_primitive(TensorPrimitive::Float(flex_view::tensor(values, shape)));
    if tensor.dtype() == dtype {
        tensor
    } else {
        tensor.cast(dtype)
    }
}

fn attention_forward<E: StoredFloat + FlexFloat>(
    [q, k, v]: [&FlexTensor; 3],
    mask: Option<View4<'_, u8>>,
    options: AttentionOptions,
    dtype: DType,
) -> AttentionForward<FastFlex> {
    let (q, k, v) = (
        flex_view::view4::<E>(q),
        flex_view::view4::<E>(k),
        flex_view::view4::<E>(v),
    );
    let ([b, h, sq, _], dv) = (q.shape(), v.shape()[3]);
    let mut out = vec![E::default(); b * h * sq * dv];
    let mut lse = vec![f32::INFINITY; b * h * sq];
    attention::forward_train(
        &mut out,
        &mut lse,
        q,
        k,
        v,
        mask,
        None,
        kernel_options(options),
        true,
    );
    AttentionForward {
        output: from_stored(out, [b, h, sq, dv], dtype),
        lse: from_stored(lse, [b, h, sq], DType::F32),
    }
}

#[allow(clippy::too_many_arguments)]
fn attention_backward<E: StoredFloat + FlexFloat>(
    [q, k, v, out, grad_out]: [&FlexTensor; 5],
    mask: Option<View4<'_, u8>>,
    lse: &[f32],
    options: AttentionOptions,
    dtype: DType,
) -> [Tensor<FastFlex, 4>; 3] {
    let [q, k, v, out, grad_out] = [q, k, v, out, grad_out].map(flex_view::view4::<E>);
    let ([b, h, sq, d], [.., sk, dv]) = (q.shape(), v.shape());
    let mut dq = vec![E::default(); b * h * sq * d];
    let mut dk = vec![E::default(); b * h * sk * d];
    let mut dvv = vec![E::default(); b * h * sk * dv];
    attention::backward(
        q,
        k,
        v,
        mask,
        None,
        out,
        lse,
        grad_out,
        kernel_options(options),
        &mut dq,
        &mut dk,
        &mut dvv,
        true,
    );
    [
        from_stored(dq, [b, h, sq, d], dtype),
        from_stored(dk, [b, h, sk, d], dtype),
        from_stored(dvv, [b, h, sk, dv], dtype),
    ]
}

/// Targets as the kernels' `i64` values.
fn target_values(targets: Tensor<FastFlex, 1, Int>) -> Vec<i64> {
    targets
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .expect("i64 targets")
}

/// The `f32` tensor as a contiguous one whose buffer no other tensor holds: itself where it
/// is one, else a copy.
fn held_alone(tensor: Tensor<FastFlex, 1>) -> FlexTensor {
    let mut tensor = tensor.into_primitive().tensor();
    if flex_view::values_mut::<f32>(&mut tensor).is_some() {
        return tensor;
    }
    let copy = values(&flex_view::contiguous(&tensor)).to_vec();
    let len = copy.len();
    flex_view::tensor(copy, [len])
}

/// Elements per task of the parallel Adam step, and the fewest it splits.
const ADAM_CHUNK: usize = 1 << 14;
const ADAM_PARALLEL_MIN: usize = 1 << 16;

/// `update(param, m, v, grad) -> [param, m, v]` over every element, in place, in parallel
/// chunks for large tensors.
fn adam_pass(
    [param, m, v]: [&mut [f32]; 3],
    grad: &[f32],
    update: impl Fn(f32, f32, f32, f32) -> [f32; 3] + Sync,
) {
    let serial = |param: &mut [f32], m: &mut [f32], v: &mut [f32], grad: &[f32]| {
        for (((p, m), v), &g) in param.iter_mut().zip(m).zip(v).zip(grad) {
            [*p, *m, *v] = update(*p, *m, *v, g);
        }
    };
    if param.len() < ADAM_PARALLEL_MIN {
        serial(param, m, v, grad);
        return;
    }
    use rayon::prelude::*;
    param
        .par_chunks_mut(ADAM_CHUNK)
        .zip(m.par_chunks_mut(ADAM_CHUNK))
        .zip(v.par_chunks_mut(ADAM_CHUNK))
        .zip(grad.par_chunks(ADAM_CHUNK))
        .for_each(|(((p, m), v), g)| serial(p, m, v, g));
}

/// Burn's Adam and AdamW step (the composition's roundings, element by element) over
/// `f32` buffers.
fn adam_kernel(buffers: [&mut [f32]; 3], grad: &[f32], step: AdamStep) {
    let AdamStep {
        lr,
        beta_1,
        beta_2,
        epsilon,
        weight_decay,
        decoupled_weight_decay,
        time,
    } = step;
    let (keep_1, keep_2) = (1.0 - beta_1, 1.0 - beta_2);
    let time = time as i32;
    let lr32 = lr as f32;
    let moments =
        move |m: f32, v: f32, g: f32| (m * beta_1 + g * keep_1, v * beta_2 + (g * g) * keep_2);
    if decoupled_weight_decay {
        let (correction_1, correction_2) = (1f32 - beta_1.powi(time), 1f32 - beta_2.powi(time));
        let decay_rate = lr * weight_decay.unwrap_or(0.0) as f64;
        let delta =
            move |m: f32, v: f32| (m / correction_1) / ((v / correction_2).sqrt() + epsilon);
        if decay_rate == 0.0 {
            adam_pass(buffers, grad, move |p, m, v, g| {
                let (m, v) = moments(m, v, g);
                [p - delta(m, v) * lr32, m, v]
            });
        } else {
            let decay = (1.0 - decay_rate) as f32;
            adam_pass(buffers, grad, move |p, m, v, g| {
                let (m, v) = moments(m, v, g);
                [p * decay - delta(m, v) * lr32, m, v]
            });
        }
        return;
    }
    let correction_2 = (1.0 - beta_2.powi(time)).sqrt();
    let factor = correction_2 / (1.0 - beta_1.powi(time));
    let shift = epsilon * correction_2;
    let update = move |p: f32, m: f32, v: f32, g: f32| {
        let (m, v) = moments(m, v, g);
        let delta = (m * factor) / (v.sqrt() + shift);
        [p - delta * lr32, m, v]
    };
    match weight_decay {
        Some(penalty) => adam_pass(buffers, grad, move |p, m, v, g| {
            update(p, m, v, p * penalty + g)
        }),
        None => adam_pass(buffers, grad, update),
    }
}

impl FusedBackend for FastFlex {
    fn fused_adam_step(
        param: Tensor<Self, 1>,
        grad: Tensor<Self, 1>,
        moment_1: Tensor<Self, 1>,
        moment_2: Tensor<Self, 1>,
        step: AdamStep,
    ) -> [Tensor<Self, 1>; 3] {
        let tensors = [&param, &grad, &moment_1, &moment_2];
        if param.dims()[0] == 0 || tensors.iter().any(|t| t.dtype() != DType::F32) {
            return composed::adam_step(param, grad, moment_1, moment_2, step);
        }
        let grad = f32_tensor(grad);
        let mut outputs = [param, moment_1, moment_2].map(held_alone);
        let [p, m, v] = &mut outputs;
        let buffers = [p, m, v].map(|t| flex_view::values_mut::<f32>(t).expect("held alone"));
        adam_kernel(buffers, values(&grad), step);
        outputs.map(|t| Tensor::from_primitive(TensorPrimitive::Float(t)))
    }

    fn fused_attention_forward(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        mask: Option<Tensor<Self, 4, Bool>>,
        options: AttentionOptions,
    ) -> AttentionForward<Self> {
        let mask_primitive = mask.clone().map(|m| m.into_primitive());
        let Some(dtype) = attention_dtype(&[&q, &k, &v], mask_primitive.as_ref()) else {
            return composed::attention_forward(q, k, v, mask, options);
        };
        let [q, k, v] = [q, k, v].map(|t| stored(t, dtype));
        let mask = mask_primitive.as_ref().map(flex_view::mask4);
        match dtype {
            DType::BF16 => attention_forward::<bf16>([&q, &k, &v], mask, options, dtype),
            _ => attention_forward::<f32>([&q, &k, &v], mask, options, dtype),
        }
    }

    fn fused_attention_backward(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        mask: Option<Tensor<Self, 4, Bool>>,
        output: Tensor<Self, 4>,
        lse: Tensor<Self, 3>,
        grad_output: Tensor<Self, 4>,
        options: AttentionOptions,
    ) -> [Tensor<Self, 4>; 3] {
        let mask_primitive = mask.clone().map(|m| m.into_primitive());
        let dtype = attention_dtype(
            &[&q, &k, &v, &output, &grad_output],
            mask_primitive.as_ref(),
        );
        let Some(dtype) = dtype.filter(|_| lse.dtype() == DType::F32) else {
            return composed::attention_backward(q, k, v, mask, output, lse, grad_output, options);
        };
        let lse = f32_tensor(lse);
        let [q, k, v, output, grad_output] =
            [q, k, v, output, grad_output].map(|t| stored(t, dtype));
        let mask = mask_primitive.as_ref().map(flex_view::mask4);
        let operands = [&q, &k, &v, &output, &grad_output];
        match dtype {
            DType::BF16 => attention_backward::<bf16>(operands, mask, values(&lse), options, dtype),
            _ => attention_backward::<f32>(operands, mask, values(&lse), options, dtype),
        }
    }

    fn fused_cross_entropy_forward(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        ignore_index: Option<usize>,
    ) -> CrossEntropyForward<Self> {
        if !ours(&logits) {
            return composed::cross_entropy_forward(logits, targets, ignore_index);
        }
        let ([rows, n], dtype) = (logits.dims(), logits.dtype());
        let logits = f32_tensor(logits);
        let targets = target_values(targets);
        let (mut lse, mut losses) = (vec![0.0f32; rows], vec![0.0f32; rows]);
        let ignore = ignore_index.map(|i| i as i64);
        cross_entropy::forward_rows(values(&logits), n, &targets, ignore, &mut lse, &mut losses);
        let count = targets
            .iter()
            .filter(|&&t| Some(t) != ignore)
            .count()
            .max(1);
        let loss = losses.iter().map(|&l| l as f64).sum::<f64>() / count as f64;
        CrossEntropyForward {
            loss: tensor_of(vec![loss as f32], [1], dtype),
            lse: tensor_of(lse, [rows], DType::F32),
        }
    }

    fn fused_cross_entropy_backward(
        logits: Tensor<Self, 2>,
        lse: Tensor<Self, 1>,
        targets: Tensor<Self, 1, Int>,
        ignore_index: Option<usize>,
        grad_loss: Tensor<Self, 1>,
    ) -> Tensor<Self, 2> {
        if !ours(&logits) || lse.dtype() != DType::F32 {
            return composed::cross_entropy_backward(logits, lse, targets, ignore_index, grad_loss);
        }
        let ([rows, n], dtype) = (logits.dims(), logits.dtype());
        let (logits, lse) = (f32_tensor(logits), f32_tensor(lse));
        let targets = target_values(targets);
        let ignore = ignore_index.map(|i| i as i64);
        let count = targets
            .iter()
            .filter(|&&t| Some(t) != ignore)
            .count()
            .max(1);
        let grad: f32 = grad_loss.cast(DType::F32).into_scalar();
        let mut out = vec![0.0f32; rows * n];
        cross_entropy::backward_rows(
            values(&logits),
            n,
            values(&lse),
            &targets,
            ignore,
            grad / count as f32,
            &mut out,
        );
        tensor_of(out, [rows, n], dtype)
    }

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
        let [x, gamma, mean, rstd] = [
            f32_tensor(x),
            f32_tensor(gamma),
            f32_tensor(mean),
            f32_tensor(rstd),
        ];
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
        softmax::forward_rows_on(
            burn_cpu_kernels::Isa::detected(),
            log,
            Some(values(&x)),
            &mut y,
            n,
            None,
        );
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
        softmax::backward_rows_on(
            burn_cpu_kernels::Isa::detected(),
            log,
            values(&y),
            Some(values(&dy)),
            &mut dx,
            n,
        );
        tensor_of(dx, [rows, n], dtype)
    }
}
