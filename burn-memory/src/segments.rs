//! Segment checkpointing (PyTorch's `checkpoint_sequential`): keep only the inputs of a few
//! segments of a layer sequence during the forward pass, and recompute each segment's
//! activations during the backward pass.
//!
//! Burn 0.21's autodiff has whole-graph strategies only ([`Checkpointing`](crate::Checkpointing)):
//! `BalancedCheckpointing` drops memory-bound activations but keeps every matmul output. Here the
//! forward pass runs on the inner backend ([`AutodiffModule::valid`]), so no graph is built and
//! nothing is kept but each segment's input. The backward pass then goes through the segments
//! last to first: each is run again on the autodiff backend from its saved input, and
//! `backward` is called on its output against the gradient that flowed into it (the last
//! segment's output goes through the loss). Its parameters' gradients are collected, its input's
//! gradient is the next segment's upstream gradient, and its graph is freed before the next
//! segment runs. Graphs are never nested, so nothing in Burn's autodiff has to change.
//!
//! **The trade-off.** For `L` layers in `S` segments, memory held for backward is the `S`
//! segment inputs plus one segment's activations (about `L/S` layers' worth) instead of all
//! `L` layers' activations: with `S = √L`, `O(√L)` instead of `O(L)`. The price is one more
//! forward pass over every segment but the last (the first forward builds no graph, so it is
//! also cheaper than a training forward): a step costs about 1 + (S − 1)/S forward passes more.
//! Gradients are the plain backward's, up to float rounding (the products are the same, the
//! order of additions may differ).
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::module::Module;
//! use burn::nn::{Linear, LinearConfig};
//! use burn::tensor::activation::relu;
//! use burn::tensor::backend::Backend;
//! use burn::tensor::{Distribution, Tensor};
//! use burn_memory::{Layers, Segments, segmented_backward};
//!
//! #[derive(Module, Debug)]
//! struct Deep<B: Backend> {
//!     layers: Vec<Linear<B>>,
//! }
//!
//! // Written once for every backend, as Burn's `TrainStep` is.
//! impl<B: Backend> Layers<B, 2> for Deep<B> {
//!     fn num_layers(&self) -> usize {
//!         self.layers.len()
//!     }
//!     fn forward_layer(&self, index: usize, x: Tensor<B, 2>) -> Tensor<B, 2> {
//!         relu(self.layers[index].forward(x))
//!     }
//! }
//!
//! type A = Autodiff<NdArray>;
//! let device = Default::default();
//! let model = Deep::<A> {
//!     layers: (0..9).map(|_| LinearConfig::new(16, 16).init(&device)).collect(),
//! };
//! let x = Tensor::<A, 2>::random([8, 16], Distribution::Default, &device);
//! let step = segmented_backward(&model, x, &Segments::Sqrt, |out| out.mean()).unwrap();
//! assert_eq!(step.grads.len(), 18); // 9 weights and 9 biases
//! ```

use std::ops::Range;

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::{Deserialize, Serialize};

use crate::{MemoryError, MixedPrecision};

/// A sequence of layers that segment checkpointing can split: its layers' forward, one at a
/// time, for any backend (the training backend and its inner backend run the same code).
///
/// Layers share the forward signature `Tensor<B, D> -> Tensor<B, D>` (widths may change from
/// one layer to the next). A "layer" is whatever the model treats as one step: a linear layer
/// and its activation, a residual block, a normalisation.
pub trait Layers<B: Backend, const D: usize> {
    /// How many layers the sequence has.
    fn num_layers(&self) -> usize;
    /// Runs layer `index` (from 0) on `input`.
    fn forward_layer(&self, index: usize, input: Tensor<B, D>) -> Tensor<B, D>;
}

/// How a sequence of `L` layers is split into segments.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Segments {
    /// `√L` segments (rounded, at least one): the split that minimises memory when layers are
    /// alike.
    #[default]
    Sqrt,
    /// This many segments, as even as the layer count allows (sizes differ by at most one,
    /// the larger ones first).
    Count(usize),
    /// Segments starting at these layer indices, after the first (which starts at 0): `[8, 16]`
    /// on 24 layers is `0..8`, `8..16`, `16..24`. Strictly increasing, each in `1..L`.
    Boundaries(Vec<usize>),
}

impl Segments {
    /// The layer ranges of each segment, in order, for a sequence of `layers` layers; an error
    /// for an empty sequence, zero segments, more segments than layers, or boundaries out of
    /// order or range.
    pub fn ranges(&self, layers: usize) -> Result<Vec<Range<usize>>, MemoryError> {
        if layers == 0 {
            return Err(MemoryError::invalid("layers", "the sequence has no layers"));
        }
        let starts: Vec<usize> = match self {
            Self::Sqrt => even_starts(layers, ((layers as f64).sqrt().round() as usize).max(1)),
            Self::Count(0) => return Err(MemoryError::invalid("segments", "0 segments")),
            &Self::Count(count) if count > layers => {
                return Err(MemoryError::invalid(
                    "segments",
                    format!("{count} segments for {layers} layers"),
                ));
            }
            &Self::Count(count) => even_starts(layers, count),
            Self::Boundaries(bounds) => {
                let ordered = bounds.windows(2).all(|w| w[0] < w[1]);
                let inside = bounds.iter().all(|&b| (1..layers).contains(&b));
                if !(ordered && inside) {
                    return Err(MemoryError::invalid(
                        "segment boundaries",
                        format!(
                            "{bounds:?}: must be strictly increasing layer indices in 1..{layers}"
                        ),
                    ));
                }
                std::iter::once(0).chain(bounds.iter().copied()).collect()
            }
        };
        let ends = starts
            .iter()
            .skip(1)
            .copied()
            .chain(std::iter::once(layers));
        Ok(starts.iter().zip(ends).map(|(&s, e)| s..e).collect())
    }
}

/// Starts of `count` segments over `layers` layers, the first `layers % count` one longer.
fn even_starts(layers: usize, count: usize) -> Vec<usize> {
    let (size, longer) = (layers / count, layers % count);
    (0..count).map(|i| i * size + i.min(longer)).collect()
}

/// What [`segmented_backward`] computed.
#[derive(Debug)]
pub struct SegmentedGrads<B: AutodiffBackend, const D: usize> {
    /// The loss, as `loss` returned it (scaled, if the caller scaled it).
    pub loss: Tensor<B::InnerBackend, 1>,
    /// The gradients of every parameter the layers and the loss use, merged over the segments:
    /// hand them to an optimizer, a `GradientsAccumulator`, or `MixedPrecision::unscale`.
    pub grads: GradientsParams,
    /// The gradient of the input, when the input required one (it came from layers outside
    /// the sequence): continue their backward with `(input · input_grad).sum().backward()`.
    pub input_grad: Option<Tensor<B::InnerBackend, D>>,
}

/// One training step's forward and backward pass over `model`'s layers with segment
/// checkpointing: `loss` maps the last layer's output to the (scalar) loss. Returns the loss and
/// the merged gradients, equal to `loss(model(input)).backward()`'s.
///
/// `loss` runs inside the last segment's graph: parameters it uses (a head outside the
/// sequence, captured by the closure) get their gradients too, as long as they belong to
/// `model`. Fails with [`MemoryError::Invalid`] when `segments` does not fit the model's layer
/// count (see [`Segments::ranges`]).
pub fn segmented_backward<B, M, const D: usize>(
    model: &M,
    input: Tensor<B, D>,
    segments: &Segments,
    loss: impl FnOnce(Tensor<B, D>) -> Tensor<B, 1>,
) -> Result<SegmentedGrads<B, D>, MemoryError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Layers<B, D>,
    M::InnerModule: Layers<B::InnerBackend, D>,
{
    run_segments(model, model, input, segments, loss)
}

impl MixedPrecision {
    /// [`segmented_backward`] under mixed precision: the layers run in the compute type (the
    /// saved segment inputs too, which halves their memory in f16), `loss` receives the output
    /// in the compute type and returns the loss, which is scaled before the backward pass.
    /// The returned gradients are the *scaled* gradients of `model`'s f32 parameters: pass
    /// them to [`unscale`](Self::unscale) or [`step`](Self::step), as with a plain backward.
    pub fn segmented_backward<B, M, const D: usize>(
        &self,
        model: &M,
        input: Tensor<B, D>,
        segments: &Segments,
        loss: impl FnOnce(Tensor<B, D>) -> Tensor<B, 1>,
    ) -> Result<SegmentedGrads<B, D>, MemoryError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B> + Layers<B, D>,
        M::InnerModule: Layers<B::InnerBackend, D>,
    {
        let cast = self.cast_module(model);
        run_segments(&cast, model, self.cast_input(input), segments, |out| {
            self.scale_loss(loss(out))
        })
    }
}

/// Runs the layers of `forward` segment by segment and collects the gradients of `params`'
/// parameters: the same model, or the f32 model whose cast copy `forward` is.
fn run_segments<B, M, const D: usize>(
    forward: &M,
    params: &M,
    input: Tensor<B, D>,
    segments: &Segments,
    loss: impl FnOnce(Tensor<B, D>) -> Tensor<B, 1>,
) -> Result<SegmentedGrads<B, D>, MemoryError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Layers<B, D>,
    M::InnerModule: Layers<B::InnerBackend, D>,
{
    let ranges = segments.ranges(forward.num_layers())?;
    let input_wants_grad = input.is_require_grad();

    // Forward without a graph: keep each segment's input, nothing else.
    let inner = forward.valid();
    let mut saved = Vec::with_capacity(ranges.len());
    let mut x = input.inner();
    for range in &ranges {
        saved.push(x.clone());
        if range.end == forward.num_layers() {
            break;
        }
        for index in range.clone() {
            x = inner.forward_layer(index, x);
        }
    }
    drop((x, inner));

    let mut grads = GradientsParams::new();
    let mut upstream: Option<Tensor<B::InnerBackend, D>> = None;
    let mut loss = Some(loss);
    let mut loss_value = None;
    for (segment, (range, input)) in ranges.iter().zip(saved).enumerate().rev() {
        let wants_grad = segment > 0 || input_wants_grad;
        let x = Tensor::<B, D>::from_inner(input);
        let x = if wants_grad { x.require_grad() } else { x };
        let mut out = x.clone();
        for index in range.clone() {
            out = forward.forward_layer(index, out);
        }
        let mut graph = match upstream.take() {
            // The vector-Jacobian product: d(sum(out ⊙ g))/dθ = (∂out/∂θ)ᵀ·g.
            Some(g) => (out * Tensor::from_inner(g)).sum().backward(),
            None => {
                let value = (loss.take().expect("the last segment runs first"))(out);
                loss_value = Some(value.clone().inner());
                value.backward()
            }
        };
        if wants_grad {
            upstream = Some(
                x.grad_remove(&mut graph)
                    .unwrap_or_else(|| x.clone().inner().zeros_like()),
            );
        }
        let segment_grads = GradientsParams::from_grads(graph, params);
        params.visit(&mut Merge::<B> {
            from: segment_grads,
            into: &mut grads,
            _backend: std::marker::PhantomData,
        });
    }
    Ok(SegmentedGrads {
        loss: loss_value.expect("the loss ran"),
        grads,
        input_grad: upstream.filter(|_| input_wants_grad),
    })
}

/// Moves each parameter's gradient from one segment's set into the step's, adding it to what
/// an earlier segment gave the same parameter (weights shared between segments).
struct Merge<'a, B> {
    from: GradientsParams,
    into: &'a mut GradientsParams,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Merge<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let Some(grad) = self.from.remove::<B::InnerBackend, D>(param.id) else {
            return;
        };
        let total = match self.into.remove::<B::InnerBackend, D>(param.id) {
            Some(earlier) => earlier + grad,
            None => grad,
        };
        self.into.register(param.id, total);
    }
}
