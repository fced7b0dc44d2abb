//! `SketchBackend` for `Autodiff<B>`: the sketched product as one node of the autograd graph,
//! with a hand-written backward that calls the inner backend's
//! [`sketched_linear_backward`](SketchBackend::sketched_linear_backward).
//!
//! Why not let autodiff differentiate the tensor-op composition: that would record every
//! intermediate (`P`, the concatenations) and keep them alive until the backward pass, and it
//! would bypass the inner backend's kernels. As one node, the layer keeps only its input and
//! weights (which exist anyway), recomputes `P` in the backward, and runs fused kernels on
//! CubeCL backends in both directions.

use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_autodiff::Autodiff;
use burn_autodiff::NodeId;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

use super::{SketchBackend, SketchWeights, WantedGradients, float};

impl<B, C> SketchBackend for Autodiff<B, C>
where
    B: SketchBackend,
    C: CheckpointStrategy,
{
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
    ) -> Tensor<Self, 2> {
        let factors = [
            x.into_primitive().tensor(),
            weights.s1s.into_primitive().tensor(),
            weights.s2s.into_primitive().tensor(),
            weights.u1s.into_primitive().tensor(),
            weights.u2s.into_primitive().tensor(),
        ];
        let output = match bias {
            None => record::<B, C, 5>(factors),
            Some(bias) => {
                let [x, s1s, s2s, u1s, u2s] = factors;
                record::<B, C, 6>([x, s1s, s2s, u1s, u2s, bias.into_primitive().tensor()])
            }
        };
        Tensor::from_primitive(TensorPrimitive::Float(output))
    }
}

/// The graph node of one sketched product. `N` is 5 (`x` and the four factors) or 6 (and the
/// bias), in that order.
#[derive(Debug)]
struct SketchedLinearBackward<const N: usize>;

/// The checkpointed inputs: `x`, `S1s`, `S2s`, `U1s`, `U2s`.
type State = [NodeId; 5];

/// The inner backend's product on the primitives of the autodiff inputs.
fn inner_forward<B: SketchBackend, C: CheckpointStrategy, const N: usize>(
    inputs: &[FloatTensor<Autodiff<B, C>>; N],
) -> FloatTensor<B> {
    let weights = SketchWeights {
        s1s: float(inputs[1].primitive.clone()),
        s2s: float(inputs[2].primitive.clone()),
        u1s: float(inputs[3].primitive.clone()),
        u2s: float(inputs[4].primitive.clone()),
    };
    let bias = (N == 6).then(|| float(inputs[5].primitive.clone()));
    B::sketched_linear(float(inputs[0].primitive.clone()), weights, bias)
        .into_primitive()
        .tensor()
}

fn record<B: SketchBackend, C: CheckpointStrategy, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
) -> FloatTensor<Autodiff<B, C>> {
    let nodes = inputs.each_ref().map(|input| input.node.clone());
    // Compute bound: under a checkpointing strategy the node keeps its inputs rather than
    // being recomputed, and the backward recomputes only the small `P`.
    match SketchedLinearBackward::<N>
        .prepare::<C>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(mut prep) => {
            let state: State = std::array::from_fn(|i| prep.checkpoint(&inputs[i]));
            let output = inner_forward::<B, C, N>(&inputs);
            prep.finish(state, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(inner_forward::<B, C, N>(&inputs)),
    }
}

impl<B: SketchBackend, const N: usize> Backward<B, N> for SketchedLinearBackward<N> {
    type State = State;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let grad_output: Tensor<B, 2> = float(grads.consume::<B>(&ops.node));
        let [x, s1s, s2s, u1s, u2s] = ops
            .state
            .map(|id| checkpointer.retrieve_node_output::<FloatTensor<B>>(id));
        let parents = &ops.parents;

        if N == 6
            && let Some(bias) = &parents[5]
        {
            grads.register::<B>(
                bias.id,
                grad_output
                    .clone()
                    .sum_dim(0)
                    .squeeze_dim::<1>(0)
                    .into_primitive()
                    .tensor(),
            );
        }

        let wanted = WantedGradients {
            x: parents[0].is_some(),
            s1s: parents[1].is_some(),
            s2s: parents[2].is_some(),
            u1s: parents[3].is_some(),
            u2s: parents[4].is_some(),
        };
        let weights = SketchWeights {
            s1s: float(s1s),
            s2s: float(s2s),
            u1s: float(u1s),
            u2s: float(u2s),
        };
        let result = B::sketched_linear_backward(float(x), weights, grad_output, wanted);

        let mut register = |index: usize, grad: Option<FloatTensor<B>>| {
            if let (Some(node), Some(grad)) = (&parents[index], grad) {
                grads.register::<B>(node.id, grad);
            }
        };
        register(0, result.x.map(|g| g.into_primitive().tensor()));
        register(1, result.s1s.map(|g| g.into_primitive().tensor()));
        register(2, result.s2s.map(|g| g.into_primitive().tensor()));
        register(3, result.u1s.map(|g| g.into_primitive().tensor()));
        register(4, result.u2s.map(|g| g.into_primitive().tensor()));
    }
}
