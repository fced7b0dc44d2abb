//! `FusedBackend` for `Autodiff<B>`: each fused operation one node of the graph, whose
//! backward calls `B`'s fused backward.
//!
//! Why not let autodiff differentiate the compositions: Burn records every intermediate of
//! a composition (a dozen nodes for a layer norm, the `[b, h, sq, sk]` probabilities for
//! attention) and keeps them alive until the backward pass, and it never calls the inner
//! backend's kernels. One node keeps the inputs (which exist anyway) and the few statistics
//! the backward needs, and runs `B`'s kernels in both directions.
//!
//! The nodes are compute bound: under a checkpointing strategy they keep their inputs
//! rather than being recomputed (their backward recomputes what it needs anyway).

use burn::tensor::backend::Backend;
use burn::tensor::ops::{BoolTensor, FloatTensor, IntTensor};
use burn::tensor::{Bool, Int, Tensor, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::{Autodiff, NodeId};

use super::{AttentionForward, CrossEntropyForward, FusedBackend, LayerNormForward};
use crate::attention::AttentionOptions;
use crate::softmax::SoftmaxKind;

/// A tensor of `B` from its primitive.
fn float<B: Backend, const D: usize>(primitive: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(primitive))
}

/// The autodiff primitive of a tensor.
fn tracked<B: Backend, C: CheckpointStrategy, const D: usize>(
    tensor: Tensor<Autodiff<B, C>, D>,
) -> FloatTensor<Autodiff<B, C>> {
    tensor.into_primitive().tensor()
}

/// `B`'s tensor as an autodiff tensor outside the graph (a statistic no gradient flows to).
fn untracked<B: Backend, C: CheckpointStrategy, const D: usize>(
    tensor: Tensor<B, D>,
) -> Tensor<Autodiff<B, C>, D> {
    Tensor::from_inner(tensor)
}

/// An autodiff tensor whose primitive is the node's output.
fn output<B: Backend, C: CheckpointStrategy, const D: usize>(
    tensor: FloatTensor<Autodiff<B, C>>,
) -> Tensor<Autodiff<B, C>, D> {
    Tensor::from_primitive(TensorPrimitive::Float(tensor))
}

fn bool_mask<B: Backend, C: CheckpointStrategy, const D: usize>(
    mask: Tensor<Autodiff<B, C>, D, Bool>,
) -> Tensor<B, D, Bool> {
    Tensor::from_primitive(mask.into_primitive())
}

fn int<B: Backend, C: CheckpointStrategy, const D: usize>(
    tensor: Tensor<Autodiff<B, C>, D, Int>,
) -> Tensor<B, D, Int> {
    Tensor::from_primitive(tensor.into_primitive())
}

/// Registers `grad` for `parent` when the parent wants one.
fn register<B: Backend, const D: usize>(
    grads: &mut Gradients,
    parent: Option<NodeId>,
    grad: Option<Tensor<B, D>>,
) {
    if let (Some(id), Some(grad)) = (parent, grad) {
        grads.register::<B>(id, grad.into_primitive().tensor());
    }
}

impl<B: FusedBackend, C: CheckpointStrategy> FusedBackend for Autodiff<B, C> {
    fn fused_attention_forward(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        mask: Option<Tensor<Self, 4, Bool>>,
        options: AttentionOptions,
    ) -> AttentionForward<Self> {
        let inputs = [q, k, v].map(tracked);
        let mask = mask.map(bool_mask);
        let inner = |inputs: &[FloatTensor<Self>; 3], mask: Option<Tensor<B, 4, Bool>>| {
            let [q, k, v] = inputs
                .each_ref()
                .map(|t| float::<B, 4>(t.primitive.clone()));
            B::fused_attention_forward(q, k, v, mask, options)
        };
        let nodes = inputs.each_ref().map(|t| t.node.clone());
        match (AttentionBackward { options })
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let ids = inputs.each_ref().map(|t| prep.checkpoint(t));
                let forward = inner(&inputs, mask.clone());
                let state = (
                    ids,
                    mask.map(|m| m.into_primitive()),
                    forward.output.clone().into_primitive().tensor(),
                    forward.lse.clone().into_primitive().tensor(),
                );
                let out = prep.finish(state, forward.output.into_primitive().tensor());
                AttentionForward {
                    output: output(out),
                    lse: untracked(forward.lse),
                }
            }
            OpsKind::UnTracked(prep) => {
                let forward = inner(&inputs, mask);
                AttentionForward {
                    output: output(prep.finish(forward.output.into_primitive().tensor())),
                    lse: untracked(forward.lse),
                }
            }
        }
    }

    fn fused_layer_norm_forward(
        x: Tensor<Self, 2>,
        gamma: Tensor<Self, 1>,
        beta: Option<Tensor<Self, 1>>,
        epsilon: f64,
    ) -> LayerNormForward<Self> {
        match beta {
            Some(beta) => {
                layer_norm::<B, C, 3>([tracked(x), tracked(gamma), tracked(beta)], epsilon)
            }
            None => layer_norm::<B, C, 2>([tracked(x), tracked(gamma)], epsilon),
        }
    }

    fn fused_softmax_forward(x: Tensor<Self, 2>, kind: SoftmaxKind) -> Tensor<Self, 2> {
        let x = tracked(x);
        let forward = || B::fused_softmax_forward(float(x.primitive.clone()), kind);
        match (SoftmaxBackward { kind })
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let y = forward().into_primitive().tensor();
                output(prep.finish(y.clone(), y))
            }
            OpsKind::UnTracked(prep) => output(prep.finish(forward().into_primitive().tensor())),
        }
    }

    fn fused_cross_entropy_forward(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        ignore_index: Option<usize>,
    ) -> CrossEntropyForward<Self> {
        let logits = tracked(logits);
        let targets = int(targets);
        let forward = || {
            B::fused_cross_entropy_forward(
                float(logits.primitive.clone()),
                targets.clone(),
                ignore_index,
            )
        };
        match (CrossEntropyBackward { ignore_index })
            .prepare::<C>([logits.node.clone()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(mut prep) => {
                let id = prep.checkpoint(&logits);
                let forward = forward();
                let state = (
                    id,
                    forward.lse.clone().into_primitive().tensor(),
                    targets.clone().into_primitive(),
                );
                let loss = prep.finish(state, forward.loss.into_primitive().tensor());
                CrossEntropyForward {
                    loss: output(loss),
                    lse: untracked(forward.lse),
                }
            }
            OpsKind::UnTracked(prep) => {
                let forward = forward();
                CrossEntropyForward {
                    loss: output(prep.finish(forward.loss.into_primitive().tensor())),
                    lse: untracked(forward.lse),
                }
            }
        }
    }
}

/// The attention node: parents `q`, `k`, `v`.
#[derive(Debug)]
struct AttentionBackward {
    options: AttentionOptions,
}

/// The checkpointed `q`, `k`, `v`, the mask, the output and the log-sum-exp.
type AttentionState<B> = (
    [NodeId; 3],
    Option<BoolTensor<B>>,
    FloatTensor<B>,
    FloatTensor<B>,
);

impl<B: FusedBackend> Backward<B, 3> for AttentionBackward {
    type State = AttentionState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let grad_output = grads.consume::<B>(&ops.node);
        let (ids, mask, out, lse) = ops.state;
        let [q, k, v] =
            ids.map(|id| float(checkpointer.retrieve_node_output::<FloatTensor<B>>(id)));
        let result = B::fused_attention_backward(
            q,
            k,
            v,
            mask.map(Tensor::from_primitive),
            float(out),
            float(lse),
            float(grad_output),
            self.options,
        );
        for (parent, grad) in ops.parents.iter().zip(result) {
            register(grads, parent.as_ref().map(|p| p.id), Some(grad));
        }
    }
}

/// The layer-norm node: parents `x`, `gamma`, and `beta` when `N = 3`.
#[derive(Debug)]
struct LayerNormBackward<const N: usize>;

/// The checkpointed `x` and `gamma`, each row's mean and inverse deviation.
type LayerNormState<B> = ([NodeId; 2], FloatTensor<B>, FloatTensor<B>);

fn layer_norm<B: FusedBackend, C: CheckpointStrategy, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    epsilon: f64,
) -> LayerNormForward<Autodiff<B, C>> {
    let forward = |inputs: &[FloatTensor<Autodiff<B, C>>; N]| {
        let beta = (N == 3).then(|| float::<B, 1>(inputs[2].primitive.clone()));
        B::fused_layer_norm_forward(
            float(inputs[0].primitive.clone()),
            float(inputs[1].primitive.clone()),
            beta,
            epsilon,
        )
    };
    let nodes = inputs.each_ref().map(|t| t.node.clone());
    match LayerNormBackward::<N>
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let ids = [prep.checkpoint(&inputs[0]), prep.checkpoint(&inputs[1])];
            let forward = forward(&inputs);
            let state = (
                ids,
                forward.mean.clone().into_primitive().tensor(),
                forward.rstd.clone().into_primitive().tensor(),
            );
            let y = prep.finish(state, forward.output.into_primitive().tensor());
            LayerNormForward {
                output: output(y),
                mean: untracked(forward.mean),
                rstd: untracked(forward.rstd),
            }
        }
        OpsKind::UnTracked(prep) => {
            let forward = forward(&inputs);
            LayerNormForward {
                output: output(prep.finish(forward.output.into_primitive().tensor())),
                mean: untracked(forward.mean),
                rstd: untracked(forward.rstd),
            }
        }
    }
}

impl<B: FusedBackend, const N: usize> Backward<B, N> for LayerNormBackward<N> {
    type State = LayerNormState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let grad_output = grads.consume::<B>(&ops.node);
        let ([x, gamma], mean, rstd) = ops.state;
        let [x, gamma] =
            [x, gamma].map(|id| checkpointer.retrieve_node_output::<FloatTensor<B>>(id));
        let parents = &ops.parents;
        let wanted = [parents[1].is_some(), N == 3 && parents[2].is_some()];
        let result = B::fused_layer_norm_backward(
            float(x),
            float(gamma),
            float(mean),
            float(rstd),
            float(grad_output),
            wanted,
        );
        let id = |i: usize| parents[i].as_ref().map(|p| p.id);
        register(grads, id(0), Some(result.x));
        register(grads, id(1), result.gamma);
        if N == 3 {
            register(grads, id(2), result.beta);
        }
    }
}

/// The softmax node: parent `x`; it keeps its output.
#[derive(Debug)]
struct SoftmaxBackward {
    kind: SoftmaxKind,
}

impl<B: FusedBackend> Backward<B, 1> for SoftmaxBackward {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad_output = grads.consume::<B>(&ops.node);
        let grad = B::fused_softmax_backward(float(ops.state), float(grad_output), self.kind);
        register(grads, ops.parents[0].as_ref().map(|p| p.id), Some(grad));
    }
}

/// The cross-entropy node: parent the logits.
#[derive(Debug)]
struct CrossEntropyBackward {
    ignore_index: Option<usize>,
}

/// The checkpointed logits, each row's log-sum-exp and the targets.
type CrossEntropyState<B> = (NodeId, FloatTensor<B>, IntTensor<B>);

impl<B: FusedBackend> Backward<B, 1> for CrossEntropyBackward {
    type State = CrossEntropyState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let grad_loss = grads.consume::<B>(&ops.node);
        let (id, lse, targets) = ops.state;
        let logits = checkpointer.retrieve_node_output::<FloatTensor<B>>(id);
        let grad = B::fused_cross_entropy_backward(
            float(logits),
            float(lse),
            Tensor::from_primitive(targets),
            self.ignore_index,
            float(grad_loss),
        );
        register(grads, ops.parents[0].as_ref().map(|p| p.id), Some(grad));
    }
}
