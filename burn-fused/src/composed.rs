//! The fused operations as compositions of Burn's tensor operations: [`FusedBackend`]'s
//! provided methods, correct on every backend, and the decomposed computation the tests
//! compare the kernels against (under `Autodiff`, the forwards differentiate as Burn's own
//! operations would).
//!
//! They compute in the tensors' own float type and keep the whole `[b, h, sq, sk]` score
//! tensor of attention: a backend that has better overrides the trait's methods.
//!
//! [`FusedBackend`]: crate::FusedBackend

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};

use crate::attention::{AttentionOptions, dropout_mask};
use crate::backend::{AttentionForward, CrossEntropyForward, LayerNormForward, LayerNormGradients};
use crate::optim::AdamStep;
use crate::softmax::SoftmaxKind;

/// The scaled scores `q·kᵀ·scale` with masked ones at `−∞`, `[b, h, sq, sk]`.
pub fn attention_scores<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    options: AttentionOptions,
) -> Tensor<B, 4> {
    let [b, h, sq, d] = q.dims();
    let sk = k.dims()[2];
    let device = q.device();
    let mut scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(options.scale_for(d));
    if options.causal {
        scores = scores.mask_fill(
            causal_mask::<B>(sq, sk, &device).expand([b, h, sq, sk]),
            f32::NEG_INFINITY,
        );
    }
    if let Some(mask) = mask {
        scores = scores.mask_fill(mask.expand([b, h, sq, sk]), f32::NEG_INFINITY);
    }
    scores
}

/// `[1, 1, sq, sk]`, `true` where key `j > i + sk − sq` (the diagonal at the bottom-right
/// corner, as burn-backend's `attention_fallback`).
fn causal_mask<B: Backend>(sq: usize, sk: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
    let offset = sk as isize - sq as isize;
    let values: Vec<bool> = (0..sq * sk)
        .map(|at| (at % sk) as isize > (at / sk) as isize + offset)
        .collect();
    Tensor::from_data(TensorData::new(values, [1, 1, sq, sk]), device)
}

/// The dropout factors `[b, h, sq, sk]` (`1/(1 − p)` kept, `0` dropped) in the scores'
/// type, from the keep decisions the kernels make.
fn dropout_factors<B: Backend>(
    like: &Tensor<B, 4>,
    options: AttentionOptions,
) -> Option<Tensor<B, 4>> {
    let dropout = options.dropout?;
    let shape = like.dims();
    let kept = 1.0 / (1.0 - dropout.prob);
    let values: Vec<f32> = dropout_mask(dropout, shape)
        .into_iter()
        .map(|keep| if keep { kept } else { 0.0 })
        .collect();
    Some(Tensor::from_data(
        TensorData::new(values, shape),
        (&like.device(), like.dtype()),
    ))
}

/// The attention forward by tensor operations, with Burn's semantics for a query that sees
/// no key (an output of zeros; its log-sum-exp is `+∞`).
pub fn attention_forward<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    options: AttentionOptions,
) -> AttentionForward<B> {
    let [b, h, sq, _] = q.dims();
    let scores = attention_scores(q, k, mask, options);
    let max = scores.clone().max_dim(3).clamp_min(f32::MIN);
    let weights = (scores - max.clone()).exp();
    let sum = weights.clone().sum_dim(3);
    let probabilities = weights / sum.clone().clamp_min(f32::MIN_POSITIVE);
    let lse = (max + sum.clone().log()).mask_fill(sum.equal_elem(0.0), f32::INFINITY);
    let probabilities = match dropout_factors(&probabilities, options) {
        Some(factors) => probabilities * factors,
        None => probabilities,
    };
    AttentionForward {
        output: probabilities.matmul(v),
        lse: lse.reshape([b, h, sq]),
    }
}

/// The attention backward by tensor operations: the probabilities recomputed from the
/// log-sum-exp, `dS = P∘(dP − rowsum(dO∘O))`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    output: Tensor<B, 4>,
    lse: Tensor<B, 3>,
    grad_output: Tensor<B, 4>,
    options: AttentionOptions,
) -> [Tensor<B, 4>; 3] {
    let [b, h, sq, d] = q.dims();
    let scale = options.scale_for(d);
    let scores = attention_scores(q.clone(), k.clone(), mask, options);
    let probabilities = (scores - lse.reshape([b, h, sq, 1])).exp();
    let factors = dropout_factors(&probabilities, options);
    let dropped = match &factors {
        Some(factors) => probabilities.clone() * factors.clone(),
        None => probabilities.clone(),
    };
    let grad_v = dropped.swap_dims(2, 3).matmul(grad_output.clone());
    let grad_dropped = grad_output.clone().matmul(v.swap_dims(2, 3));
    let grad_probabilities = match factors {
        Some(factors) => grad_dropped * factors,
        None => grad_dropped,
    };
    let row = (grad_output * output).sum_dim(3);
    let grad_scores = probabilities * (grad_probabilities - row);
    let grad_q = grad_scores.clone().matmul(k).mul_scalar(scale);
    let grad_k = grad_scores.swap_dims(2, 3).matmul(q).mul_scalar(scale);
    [grad_q, grad_k, grad_v]
}

/// Layer norm by tensor operations (biased variance, as Burn's and PyTorch's).
pub fn layer_norm_forward<B: Backend>(
    x: Tensor<B, 2>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    epsilon: f64,
) -> LayerNormForward<B> {
    let [rows, _] = x.dims();
    let mean = x.clone().mean_dim(1);
    let centered = x - mean.clone();
    let std = (centered.clone().powi_scalar(2).mean_dim(1) + epsilon).sqrt();
    // A division, not `recip`: NdArray's `recip` is an approximate reciprocal (about 1e-4
    // relative), which layer norm would pass on to every output.
    let rstd = std.ones_like() / std;
    let normalized = centered * rstd.clone();
    let scaled = normalized * gamma.unsqueeze_dim(0);
    let output = match beta {
        Some(beta) => scaled + beta.unsqueeze_dim(0),
        None => scaled,
    };
    LayerNormForward {
        output,
        mean: mean.reshape([rows]),
        rstd: rstd.reshape([rows]),
    }
}

/// Layer norm's gradients by tensor operations:
/// `dx = rstd·(dx̂ − mean(dx̂) − x̂·mean(dx̂∘x̂))` with `dx̂ = dy∘γ`.
pub fn layer_norm_backward<B: Backend>(
    x: Tensor<B, 2>,
    gamma: Tensor<B, 1>,
    mean: Tensor<B, 1>,
    rstd: Tensor<B, 1>,
    grad_output: Tensor<B, 2>,
    [want_gamma, want_beta]: [bool; 2],
) -> LayerNormGradients<B> {
    let [rows, _] = x.dims();
    let rstd = rstd.reshape([rows, 1]);
    let normalized = (x - mean.reshape([rows, 1])) * rstd.clone();
    let grad_normalized = grad_output.clone() * gamma.unsqueeze_dim(0);
    let mean_grad = grad_normalized.clone().mean_dim(1);
    let mean_dot = (grad_normalized.clone() * normalized.clone()).mean_dim(1);
    let grad_x = (grad_normalized - mean_grad - normalized.clone() * mean_dot) * rstd;
    let column_sum = |t: Tensor<B, 2>| t.sum_dim(0).squeeze_dim::<1>(0);
    LayerNormGradients {
        x: grad_x,
        gamma: want_gamma.then(|| column_sum(grad_output.clone() * normalized)),
        beta: want_beta.then(|| column_sum(grad_output)),
    }
}

/// Softmax or log-softmax over rows, stabilised by the row maximum.
pub fn softmax_forward<B: Backend>(x: Tensor<B, 2>, kind: SoftmaxKind) -> Tensor<B, 2> {
    match kind {
        SoftmaxKind::Softmax => burn::tensor::activation::softmax(x, 1),
        SoftmaxKind::LogSoftmax => burn::tensor::activation::log_softmax(x, 1),
    }
}

/// `y∘(dy − Σ dy∘y)` for softmax, `dy − exp(y)·Σ dy` for log-softmax.
pub fn softmax_backward<B: Backend>(
    output: Tensor<B, 2>,
    grad_output: Tensor<B, 2>,
    kind: SoftmaxKind,
) -> Tensor<B, 2> {
    match kind {
        SoftmaxKind::Softmax => {
            let dot = (grad_output.clone() * output.clone()).sum_dim(1);
            output * (grad_output - dot)
        }
        SoftmaxKind::LogSoftmax => {
            let sum = grad_output.clone().sum_dim(1);
            grad_output - output.exp() * sum
        }
    }
}

/// Each row's log-sum-exp `[rows, 1]`.
fn log_sum_exp<B: Backend>(logits: Tensor<B, 2>) -> Tensor<B, 2> {
    let max = logits.clone().max_dim(1);
    max.clone() + (logits - max).exp().sum_dim(1).log()
}

/// `[rows, 1]`: 1 where the row's target counts, 0 where it is `ignore_index`; and the count.
fn counted<B: Backend>(
    targets: &Tensor<B, 1, Int>,
    ignore_index: Option<usize>,
    like: &Tensor<B, 2>,
) -> (Option<Tensor<B, 2>>, Tensor<B, 1>) {
    let rows = targets.dims()[0];
    match ignore_index {
        Some(ignored) => {
            let weights = targets
                .clone()
                .not_equal_elem(ignored as i64)
                .float()
                .cast(like.dtype())
                .reshape([rows, 1]);
            let count = weights.clone().sum().reshape([1]);
            (Some(weights), count)
        }
        None => (
            None,
            Tensor::from_data(
                TensorData::new(vec![rows as f32], [1]),
                (&like.device(), like.dtype()),
            ),
        ),
    }
}

/// The mean cross-entropy by tensor operations, `mean(lse − logit[target])`.
pub fn cross_entropy_forward<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    ignore_index: Option<usize>,
) -> CrossEntropyForward<B> {
    let [rows, _] = logits.dims();
    let lse = log_sum_exp(logits.clone());
    let picked = logits
        .clone()
        .gather(1, safe_targets(&targets, ignore_index).reshape([rows, 1]));
    let losses = lse.clone() - picked;
    let (weights, count) = counted(&targets, ignore_index, &logits);
    let losses = match weights {
        Some(weights) => losses * weights,
        None => losses,
    };
    CrossEntropyForward {
        loss: losses.sum().reshape([1]) / count.clamp_min(1.0),
        lse: lse.reshape([rows]),
    }
}

/// Targets with ignored ones replaced by class 0, so that `gather` and `one_hot` read a
/// valid class (their rows are weighted by zero).
fn safe_targets<B: Backend>(
    targets: &Tensor<B, 1, Int>,
    ignore_index: Option<usize>,
) -> Tensor<B, 1, Int> {
    match ignore_index {
        Some(ignored) => {
            let mask = targets.clone().equal_elem(ignored as i64);
            targets.clone().mask_fill(mask, 0)
        }
        None => targets.clone(),
    }
}

/// `(softmax(logits) − onehot(targets))·g/count`, ignored rows zero.
pub fn cross_entropy_backward<B: Backend>(
    logits: Tensor<B, 2>,
    lse: Tensor<B, 1>,
    targets: Tensor<B, 1, Int>,
    ignore_index: Option<usize>,
    grad_loss: Tensor<B, 1>,
) -> Tensor<B, 2> {
    let [rows, classes] = logits.dims();
    let probabilities = (logits.clone() - lse.reshape([rows, 1])).exp();
    // `one_hot` refuses a single class; the comparison with each class index does not.
    let classes_row = Tensor::<B, 1, Int>::arange(0..classes as i64, &logits.device())
        .reshape([1, classes])
        .expand([rows, classes]);
    let one_hot = safe_targets(&targets, ignore_index)
        .reshape([rows, 1])
        .expand([rows, classes])
        .equal(classes_row)
        .float()
        .cast(logits.dtype());
    let (weights, count) = counted(&targets, ignore_index, &logits);
    let scale = (grad_loss / count.clamp_min(1.0)).reshape([1, 1]);
    let grad = (probabilities - one_hot) * scale;
    match weights {
        Some(weights) => grad * weights,
        None => grad,
    }
}

/// One Adam or AdamW step as Burn 0.21's `Adam` and `AdamW` compute it, operation by
/// operation (the same roundings): `[param, moment_1, moment_2]` after the step, all `[n]`.
pub fn adam_step<B: Backend>(
    param: Tensor<B, 1>,
    grad: Tensor<B, 1>,
    moment_1: Tensor<B, 1>,
    moment_2: Tensor<B, 1>,
    step: AdamStep,
) -> [Tensor<B, 1>; 3] {
    let AdamStep {
        lr,
        beta_1,
        beta_2,
        epsilon,
        weight_decay,
        decoupled_weight_decay,
        time,
    } = step;
    // Adam's L2 penalty: `param·penalty + grad`.
    let grad = match weight_decay {
        Some(penalty) if !decoupled_weight_decay => param.clone().mul_scalar(penalty).add(grad),
        _ => grad,
    };
    let moment_1 = moment_1
        .mul_scalar(beta_1)
        .add(grad.clone().mul_scalar(1.0 - beta_1));
    let moment_2 = moment_2
        .mul_scalar(beta_2)
        .add(grad.square().mul_scalar(1.0 - beta_2));
    let time = time as i32;
    let param = if decoupled_weight_decay {
        let m_hat = moment_1.clone().div_scalar(1f32 - beta_1.powi(time));
        let v_hat = moment_2.clone().div_scalar(1f32 - beta_2.powi(time));
        let delta = m_hat.div(v_hat.sqrt().add_scalar(epsilon));
        let decay_rate = lr * weight_decay.unwrap_or(0.0) as f64;
        let decayed = if decay_rate == 0.0 {
            param
        } else {
            param.mul_scalar(1.0 - decay_rate)
        };
        decayed - delta.mul_scalar(lr)
    } else {
        let correction_2 = (1.0 - beta_2.powi(time)).sqrt();
        let factor = correction_2 / (1.0 - beta_1.powi(time));
        let delta = moment_1
            .clone()
            .mul_scalar(factor)
            .div(moment_2.clone().sqrt().add_scalar(epsilon * correction_2));
        param - delta.mul_scalar(lr)
    };
    [param, moment_1, moment_2]
}
