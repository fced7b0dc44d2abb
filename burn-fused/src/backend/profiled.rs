//! `FusedBackend` for burn-profiler's `Profiled<B>`: each fused operation runs `B`'s own
//! (FastFlex's kernels) and is recorded as one operation, rather than as the compositions'
//! tensor operations, so that a profiled step computes what the unprofiled one does.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorPrimitive};
use burn_profiler::record::Call;
use burn_profiler::{Profiled, TensorDesc};

use super::{
    AttentionForward, CrossEntropyForward, FusedBackend, LayerNormForward, LayerNormGradients,
};
use crate::attention::AttentionOptions;
use crate::optim::AdamStep;
use crate::softmax::SoftmaxKind;

/// The same tensor as `B`'s (the primitives are shared).
fn inner<B: Backend, const D: usize>(tensor: Tensor<Profiled<B>, D>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(tensor.into_primitive().tensor()))
}

fn outer<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Tensor<Profiled<B>, D> {
    Tensor::from_primitive(TensorPrimitive::Float(tensor.into_primitive().tensor()))
}

fn inner_mask<B: Backend, const D: usize>(
    mask: Tensor<Profiled<B>, D, Bool>,
) -> Tensor<B, D, Bool> {
    Tensor::from_primitive(mask.into_primitive())
}

fn inner_int<B: Backend, const D: usize>(tensor: Tensor<Profiled<B>, D, Int>) -> Tensor<B, D, Int> {
    Tensor::from_primitive(tensor.into_primitive())
}

fn describe<B: Backend, const D: usize>(tensor: &Tensor<B, D>) -> TensorDesc {
    TensorDesc {
        shape: tensor.dims().to_vec(),
        dtype: tensor.dtype(),
    }
}

/// `run` recorded as the operation `name` with these inputs and the outputs it describes.
fn recorded<B: Backend, T>(
    name: &'static str,
    inputs: impl FnOnce() -> Vec<TensorDesc>,
    device: &B::Device,
    run: impl FnOnce() -> T,
    outputs: impl FnOnce(&T) -> Vec<TensorDesc>,
) -> T {
    let call = Call::start(name, inputs);
    let result = run();
    if let Some(call) = call {
        call.finish(|| outputs(&result), || B::sync(device));
    }
    result
}

impl<B: FusedBackend> FusedBackend for Profiled<B> {
    fn fused_adam_step(
        param: Tensor<Self, 1>,
        grad: Tensor<Self, 1>,
        moment_1: Tensor<Self, 1>,
        moment_2: Tensor<Self, 1>,
        step: AdamStep,
    ) -> [Tensor<Self, 1>; 3] {
        let device = param.device();
        // Described up front: a clone kept for the closure would share the buffers and keep
        // the step from updating them in place.
        let inputs = [&param, &grad, &moment_1, &moment_2].map(describe).to_vec();
        let outputs = recorded::<B, _>(
            "fused_adam_step",
            move || inputs,
            &device,
            || {
                B::fused_adam_step(
                    inner(param),
                    inner(grad),
                    inner(moment_1),
                    inner(moment_2),
                    step,
                )
            },
            |outputs| outputs.iter().map(describe).collect(),
        );
        outputs.map(outer)
    }

    fn fused_attention_forward(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        mask: Option<Tensor<Self, 4, Bool>>,
        options: AttentionOptions,
    ) -> AttentionForward<Self> {
        let device = q.device();
        let inputs = || vec![describe(&q), describe(&k), describe(&v)];
        let forward = recorded::<B, _>(
            "fused_attention",
            inputs,
            &device,
            || {
                B::fused_attention_forward(
                    inner(q.clone()),
                    inner(k.clone()),
                    inner(v.clone()),
                    mask.map(inner_mask),
                    options,
                )
            },
            |f| vec![describe(&f.output)],
        );
        AttentionForward {
            output: outer(forward.output),
            lse: outer(forward.lse),
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
        let device = q.device();
        let inputs = || {
            vec![
                describe(&q),
                describe(&k),
                describe(&v),
                describe(&grad_output),
            ]
        };
        let grads = recorded::<B, _>(
            "fused_attention_backward",
            inputs,
            &device,
            || {
                B::fused_attention_backward(
                    inner(q.clone()),
                    inner(k.clone()),
                    inner(v.clone()),
                    mask.map(inner_mask),
                    inner(output),
                    inner(lse),
                    inner(grad_output.clone()),
                    options,
                )
            },
            |g| g.iter().map(describe).collect(),
        );
        grads.map(outer)
    }

    fn fused_layer_norm_forward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        beta: Option<Tensor<Self, 1>>,
        epsilon: f64,
    ) -> LayerNormForward<Self> {
        let device = x.device();
        let forward = recorded::<B, _>(
            "fused_layer_norm",
            || vec![describe(&x)],
            &device,
            || {
                B::fused_layer_norm_forward(
                    inner(x.clone()),
                    inner(gamma),
                    beta.map(inner),
                    epsilon,
                )
            },
            |f| vec![describe(&f.output)],
        );
        LayerNormForward {
            output: outer(forward.output),
            mean: outer(forward.mean),
            rstd: outer(forward.rstd),
        }
    }

    fn fused_layer_norm_backward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        mean: Tensor<Self, 1>,
        rstd: Tensor<Self, 1>,
        grad_output: Tensor<Self, 2>,
        wanted: [bool; 2],
    ) -> LayerNormGradients<Self> {
        let device = x.device();
        let grads = recorded::<B, _>(
            "fused_layer_norm_backward",
            || vec![describe(&x), describe(&grad_output)],
            &device,
            || {
                B::fused_layer_norm_backward(
                    inner(x.clone()),
                    inner(gamma),
                    inner(mean),
                    inner(rstd),
                    inner(grad_output.clone()),
                    wanted,
                )
            },
            |g| vec![describe(&g.x)],
        );
        LayerNormGradients {
            x: outer(grads.x),
            gamma: grads.gamma.map(outer),
            beta: grads.beta.map(outer),
        }
    }

    fn fused_softmax_forward(x: Tensor<Self, 2>, kind: SoftmaxKind) -> Tensor<Self, 2> {
        let device = x.device();
        outer(recorded::<B, _>(
            "fused_softmax",
            || vec![describe(&x)],
            &device,
            || B::fused_softmax_forward(inner(x.clone()), kind),
            |y| vec![describe(y)],
        ))
    }

    fn fused_softmax_backward(
        output: Tensor<Self, 2>,
        grad_output: Tensor<Self, 2>,
        kind: SoftmaxKind,
    ) -> Tensor<Self, 2> {
        let device = output.device();
        outer(recorded::<B, _>(
            "fused_softmax_backward",
            || vec![describe(&output)],
            &device,
            || B::fused_softmax_backward(inner(output.clone()), inner(grad_output), kind),
            |y| vec![describe(y)],
        ))
    }

    fn fused_cross_entropy_forward(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        ignore_index: Option<usize>,
    ) -> CrossEntropyForward<Self> {
        let device = logits.device();
        let forward = recorded::<B, _>(
            "fused_cross_entropy",
            || vec![describe(&logits)],
            &device,
            || {
                B::fused_cross_entropy_forward(
                    inner(logits.clone()),
                    inner_int(targets),
                    ignore_index,
                )
            },
            |f| vec![describe(&f.loss)],
        );
        CrossEntropyForward {
            loss: outer(forward.loss),
            lse: outer(forward.lse),
        }
    }

    fn fused_cross_entropy_backward(
        logits: Tensor<Self, 2>,
        lse: Tensor<Self, 1>,
        targets: Tensor<Self, 1, Int>,
        ignore_index: Option<usize>,
        grad_loss: Tensor<Self, 1>,
    ) -> Tensor<Self, 2> {
        let device = logits.device();
        outer(recorded::<B, _>(
            "fused_cross_entropy_backward",
            || vec![describe(&logits)],
            &device,
            || {
                B::fused_cross_entropy_backward(
                    inner(logits.clone()),
                    inner(lse),
                    inner_int(targets),
                    ignore_index,
                    inner(grad_loss),
                )
            },
            |y| vec![describe(y)],
        ))
    }
}
