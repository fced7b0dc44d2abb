//! `SketchBackend` for `Autodiff<B>`: the sketched product as one node of the autograd graph,
//! with a hand-written backward that calls the inner backend's
//! [`sketched_linear_backward`](SketchBackend::sketched_linear_backward).
//!
//! Why not let autodiff differentiate the tensor-op composition: that would record every
//! intermediate (`P`, the concatenations) and keep them alive until the backward pass, and it
//! would bypass the inner backend's kernels. As one node, the layer keeps only its input and
//! weights (which exist anyway), recomputes `P` in the backward, and runs fused kernels on
//! CubeCL backends in both directions.
//!
//! With an [`Activation`], the node also keeps what the activation's derivative needs: the
//! output for ReLU (whose derivative is `y > 0`), so the forward stays fused; the
//! pre-activation for GELU (whose output does not determine its input), so a tracked GELU
//! forward is the product, then [`SketchBackend::activate`], as an unfused layer would keep
//! it. Untracked (inference) forwards are fused for both.

use burn::tensor::Tensor;
use burn::tensor::ops::FloatTensor;
use burn_autodiff::Autodiff;
use burn_autodiff::NodeId;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

use super::{Activation, KernelStrategy, SketchBackend, SketchWeights, WantedGradients, float};

impl<B, C> SketchBackend for Autodiff<B, C>
where
    B: SketchBackend,
    C: CheckpointStrategy,
{
    fn sketched_linear(
        x: Tensor<Self, 2>,
        weights: SketchWeights<Self>,
        bias: Option<Tensor<Self, 1>>,
        activation: Activation,
        strategy: KernelStrategy,
    ) -> Tensor<Self, 2> {
        let [s1s, s2s, u1s, u2s] = weights.into_primitives();
        let x = x.into_primitive().tensor();
        let output = match bias {
            None => record::<B, C, 5>([x, s1s, s2s, u1s, u2s], activation, strategy),
            Some(bias) => {
                let bias = bias.into_primitive().tensor();
                record::<B, C, 6>([x, s1s, s2s, u1s, u2s, bias], activation, strategy)
            }
        };
        float(output)
    }
}

/// The graph node of one sketched product. Its `N` parents are the
/// [`OPERANDS`](super::OPERANDS) (5), then the bias when there is one (6). The backward runs
/// with the forward's strategy.
#[derive(Debug)]
struct SketchedLinearBackward<const N: usize> {
    strategy: KernelStrategy,
    activation: Activation,
}

/// The checkpointed [`OPERANDS`](super::OPERANDS), and, with an activation, the tensor its
/// derivative is computed from (the output for ReLU, the pre-activation for GELU).
type State<B> = ([NodeId; 5], Option<FloatTensor<B>>);

/// The inner backend's product on the primitives of the autodiff inputs.
fn inner_forward<B: SketchBackend, C: CheckpointStrategy, const N: usize>(
    inputs: &[FloatTensor<Autodiff<B, C>>; N],
    activation: Activation,
    strategy: KernelStrategy,
) -> FloatTensor<B> {
    let primitive = |index: usize| inputs[index].primitive.clone();
    let weights = SketchWeights::from_primitives(std::array::from_fn(|i| primitive(i + 1)));
    let bias = (N == 6).then(|| float(primitive(5)));
    B::sketched_linear(float(primitive(0)), weights, bias, activation, strategy)
        .into_primitive()
        .tensor()
}

fn record<B: SketchBackend, C: CheckpointStrategy, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    activation: Activation,
    strategy: KernelStrategy,
) -> FloatTensor<Autodiff<B, C>> {
    let nodes = inputs.each_ref().map(|input| input.node.clone());
    let node = SketchedLinearBackward::<N> {
        strategy,
        activation,
    };
    // Compute bound: under a checkpointing strategy the node keeps its inputs rather than
    // being recomputed, and the backward recomputes only the small `P`.
    match node.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(mut prep) => {
            let operands = std::array::from_fn(|i| prep.checkpoint(&inputs[i]));
            let (output, kept) = match activation {
                Activation::Identity => (
                    inner_forward::<B, C, N>(&inputs, activation, strategy),
                    None,
                ),
                Activation::Relu => {
                    let output = inner_forward::<B, C, N>(&inputs, activation, strategy);
                    (output.clone(), Some(output))
                }
                Activation::Gelu => {
                    let z = inner_forward::<B, C, N>(&inputs, Activation::Identity, strategy);
                    let y = B::activate(float(z.clone()), activation);
                    (y.into_primitive().tensor(), Some(z))
                }
            };
            prep.finish((operands, kept), output)
        }
        OpsKind::UnTracked(prep) => {
            prep.finish(inner_forward::<B, C, N>(&inputs, activation, strategy))
        }
    }
}

impl<B: SketchBackend, const N: usize> Backward<B, N> for SketchedLinearBackward<N> {
    type State = State<B>;

    fn backward(
        self,
        ops: Ops<Self::State, N>,
        grads: &mut Gradients,
        checkpointer: &mut Checkpointer,
    ) {
        let grad_output = grads.consume::<B>(&ops.node);
        let (operands, kept) = ops.state;
        // ∂z = f'(z)·∂y, before the product's own backward.
        let grad_output: Tensor<B, 2> = match (self.activation, kept) {
            (Activation::Identity, _) => float(grad_output),
            (activation, Some(kept)) => {
                B::activation_backward(float(kept), float(grad_output), activation)
            }
            (activation, None) => unreachable!("a tracked {activation:?} keeps its tensor"),
        };
        let [x, s1s, s2s, u1s, u2s] =
            operands.map(|id| checkpointer.retrieve_node_output::<FloatTensor<B>>(id));
        let parents = &ops.parents;

        if N == 6
            && let Some(bias) = &parents[5]
        {
            let grad_bias = grad_output.clone().sum_dim(0).squeeze_dim::<1>(0);
            grads.register::<B>(bias.id, grad_bias.into_primitive().tensor());
        }

        let wanted = WantedGradients::from_array(std::array::from_fn(|i| parents[i].is_some()));
        let weights = SketchWeights::from_primitives([s1s, s2s, u1s, u2s]);
        let result =
            B::sketched_linear_backward(float(x), weights, grad_output, wanted, self.strategy);
        for (parent, grad) in parents.iter().zip(result.into_primitives()) {
            if let (Some(node), Some(grad)) = (parent, grad) {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}
