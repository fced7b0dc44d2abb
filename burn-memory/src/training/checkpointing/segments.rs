//! Segment checkpointing (PyTorch's `checkpoint_sequential`): keep only the inputs of a few
//! segments of a layer sequence during the forward pass, and recompute each segment's
//! activations during the backward pass.
//!
//! Burn 0.21's autodiff has whole-graph strategies only ([`Checkpointing`](crate::Checkpointing)):
//! `BalancedCheckpointing` drops memory-bound activations but keeps every matmul output. Here a
//! step has two phases:
//!
//! 1. **A first pass without a graph.** The layers run on the training backend, in training
//!    mode (dropout draws its masks, batch norm normalises with the batch's statistics and
//!    updates its running ones), on a copy of the model whose parameters track no gradient
//!    ([`Module::no_grad`](burn::module::Module::no_grad)) and from an untracked input. Burn's autodiff records nothing for
//!    operations on untracked tensors, so nothing is kept but each segment's input. It cannot
//!    run on the inner backend ([`AutodiffModule::valid`]): there dropout is off and batch norm
//!    uses its running statistics, so the saved inputs would not be the training forward's.
//! 2. **The backward pass, last segment first.** Each segment runs again on the autodiff
//!    backend from its saved input, and `backward` is called on its output against the
//!    gradient that flowed into it (the last segment's output goes through the loss, and that
//!    segment runs only once). Its parameters' gradients are collected, its input's gradient is
//!    the next segment's upstream gradient, and its graph is freed before the next segment
//!    runs. Graphs are never nested, so nothing in Burn's autodiff has to change.
//!
//! **Random draws.** A recomputed segment must draw the masks its first pass drew. The step
//! draws its seeds from the backend's own generator ([`SegmentSeeds`]: two integers read to the
//! host, one device sync per step), seeds the backend with segment `i`'s seed before that
//! segment's first pass and again before its recompute, and seeds it once more when the step
//! ends, so that the generator's stream after the step depends on its state before the step,
//! not on the recomputes. A step is therefore reproducible from a seeded backend. The CPU
//! backends and CubeCL seed one generator for the whole process: another thread drawing from
//! the same backend during a step would shift one pass's draws and the masks would differ, so
//! run one step at a time per process and backend. On fusion backends (`Wgpu`, `Cuda` with
//! Burn's `fusion` feature) seeding waits for the queued operations: one sync per segment pass.
//!
//! **Running statistics** (batch norm's mean and variance, any Burn `RunningState`) are updated
//! once per step, as by a plain training forward: the first pass's update is kept (with the
//! last segment's, which runs once), the recompute's is undone. Burn keeps running-state
//! updates pending per thread until something syncs them, so the step syncs them as
//! [`AutodiffModule::valid`] does, after the last segment and again after the recomputes, and
//! then puts back every float entry of the model that takes no gradient as it was after the
//! first sync. On return the updated statistics are the model's values rather than pending
//! (a plain forward leaves them pending until `valid()` or a record syncs them). State that a
//! layer keeps by other means than a float tensor of the module is not restored.
//!
//! **The trade-off.** For `L` layers in `S` segments, memory held for backward is the `S`
//! segment inputs plus one segment's activations (about `L/S` layers' worth) instead of all
//! `L` layers' activations: with `S = √L`, `O(√L)` instead of `O(L)`. The price is that every
//! segment but the last runs twice: the first pass is a training-mode forward that only skips
//! the graph's bookkeeping, so a step costs about `(S − 1)/S` of a training forward more than a
//! plain step. Gradients are the plain backward's with the same random draws, up to float
//! rounding (the products are the same, the order of additions may differ).
//!
//! **State beside the activation.** What flows from layer to layer is any [`SegmentState`]: a
//! tensor (the usual case, `Layers<B>` for `Tensor<B, 2>`), a tuple (a transformer block's
//! activation, residual stream and padding mask), or a struct of the model's own.
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::module::Module;
//! use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig};
//! use burn::tensor::activation::relu;
//! use burn::tensor::backend::Backend;
//! use burn::tensor::{Distribution, Tensor};
//! use burn_memory::{Layers, Segments, segmented_backward};
//!
//! #[derive(Module, Debug)]
//! struct Deep<B: Backend> {
//!     layers: Vec<Linear<B>>,
//!     dropout: Dropout,
//! }
//!
//! // Written once for every backend, as Burn's `TrainStep` is: `Layers<B>` passes a
//! // `Tensor<B, 2>` from layer to layer.
//! impl<B: Backend> Layers<B> for Deep<B> {
//!     fn num_layers(&self) -> usize {
//!         self.layers.len()
//!     }
//!     fn forward_layer(&self, index: usize, x: Tensor<B, 2>) -> Tensor<B, 2> {
//!         self.dropout.forward(relu(self.layers[index].forward(x)))
//!     }
//! }
//!
//! type A = Autodiff<NdArray>;
//! let device = Default::default();
//! let model = Deep::<A> {
//!     layers: (0..9).map(|_| LinearConfig::new(16, 16).init(&device)).collect(),
//!     dropout: DropoutConfig::new(0.1).init(),
//! };
//! let x = Tensor::<A, 2>::random([8, 16], Distribution::Default, &device);
//! let step = segmented_backward(&model, x, &Segments::Sqrt, |out| out.mean())?;
//! assert_eq!(step.grads.len(), 18); // 9 weights and 9 biases
//! # Ok::<(), burn_memory::MemoryError>(())
//! ```

use std::collections::HashMap;
use std::ops::Range;

use burn::module::{AutodiffModule, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Distribution, FloatDType, Int, Tensor, TensorPrimitive};
use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::{Layers, MemoryError, MixedPrecision, Precision, draw_params};

/// What flows from one layer to the next in a [`Layers`] sequence, as segment checkpointing
/// saves it at segment boundaries and sends gradients back through it.
///
/// Float tensors carry gradients; bool and int tensors (masks, positions) pass through and get
/// none. Implemented for `Tensor<B, D>`, `Tensor<B, D, Bool>`, `Tensor<B, D, Int>` and tuples of
/// two to four states. A struct of the model's own implements it by delegating each method to
/// its fields' implementations, called as `SegmentState::<B>::cast(self.x, dtype)` (the
/// tensors' inherent methods of the same names do not all mean the same): the book's chapter
/// on checkpointing shows one.
pub trait SegmentState<B: AutodiffBackend>: Clone + Sized {
    /// The gradient of the float parts, on the inner backend: a tensor for a float tensor,
    /// `()` for a bool or int tensor, a tuple of the parts' gradients for a tuple.
    type Grad;

    /// Cuts the float parts from any graph, each keeping whether it requires a gradient (what
    /// Burn's `Tensor::detach` does): the step's input, whose requirement says whether the
    /// caller wants its gradient.
    fn detach(self) -> Self;

    /// Cuts the float parts from any graph and makes them leaves that collect a gradient
    /// (`true`: a recomputed segment's input) or that track nothing (`false`: the first pass,
    /// which must record no graph).
    fn set_require_grad(self, require_grad: bool) -> Self;

    /// Whether any float part requires a gradient (is a leaf marked `require_grad`; Burn
    /// cannot tell a tensor computed from such a leaf apart from an untracked one).
    fn is_require_grad(&self) -> bool;

    /// The device the state is on: where the step draws its seeds.
    fn device(&self) -> B::Device;

    /// Casts the float parts to `dtype` for mixed precision, as leaves that keep each part's
    /// gradient requirement (the gradient is then the cast state's); bool and int parts are
    /// unchanged.
    fn cast(self, dtype: FloatDType) -> Self;

    /// Takes the float parts' gradients out of `grads`, zeros for a part that got none (it did
    /// not reach the output, or required no gradient).
    fn take_grad(&self, grads: &mut B::Gradients) -> Self::Grad;

    /// `Σ sum(part ⊙ grad)` over the float parts, `None` when there are none: the scalar whose
    /// backward is the vector-Jacobian product `(∂state/∂θ)ᵀ·grad` that carries `grad` back
    /// through the layers that computed this state.
    fn dot_grad(self, grad: Self::Grad) -> Option<Tensor<B, 1>>;
}

impl<B: AutodiffBackend, const D: usize> SegmentState<B> for Tensor<B, D> {
    type Grad = Tensor<B::InnerBackend, D>;

    fn detach(self) -> Self {
        Tensor::detach(self)
    }

    fn set_require_grad(self, require_grad: bool) -> Self {
        // Untracking first makes a computed tensor a new leaf, which Burn's `require_grad`
        // refuses to do in place.
        let untracked = Tensor::set_require_grad(self, false);
        if require_grad {
            untracked.require_grad()
        } else {
            untracked
        }
    }

    fn is_require_grad(&self) -> bool {
        Tensor::is_require_grad(self)
    }

    fn device(&self) -> B::Device {
        Tensor::device(self)
    }

    fn cast(self, dtype: FloatDType) -> Self {
        let require_grad = Tensor::is_require_grad(&self);
        SegmentState::<B>::set_require_grad(Tensor::<B, D>::cast(self, dtype), require_grad)
    }

    fn take_grad(&self, grads: &mut B::Gradients) -> Self::Grad {
        Tensor::grad_remove(self, grads).unwrap_or_else(|| self.clone().inner().zeros_like())
    }

    fn dot_grad(self, grad: Self::Grad) -> Option<Tensor<B, 1>> {
        Some((self * Tensor::from_inner(grad)).sum())
    }
}

/// Bool and int tensors (masks, positions, token ids) pass through: no gradient.
macro_rules! pass_through_state {
    ($kind:ty) => {
        impl<B: AutodiffBackend, const D: usize> SegmentState<B> for Tensor<B, D, $kind> {
            type Grad = ();

            fn detach(self) -> Self {
                self
            }

            fn set_require_grad(self, _require_grad: bool) -> Self {
                self
            }

            fn is_require_grad(&self) -> bool {
                false
            }

            fn device(&self) -> B::Device {
                Tensor::device(self)
            }

            fn cast(self, _dtype: FloatDType) -> Self {
                self
            }

            fn take_grad(&self, _grads: &mut B::Gradients) -> Self::Grad {}

            fn dot_grad(self, _grad: Self::Grad) -> Option<Tensor<B, 1>> {
                None
            }
        }
    };
}

pass_through_state!(Bool);
pass_through_state!(Int);

/// Tuples: each method part by part; the device is the first part's.
macro_rules! tuple_state {
    ($($part:ident $index:tt),+) => {
        impl<B: AutodiffBackend, $($part: SegmentState<B>),+> SegmentState<B> for ($($part,)+) {
            type Grad = ($($part::Grad,)+);

            fn detach(self) -> Self {
                ($(self.$index.detach(),)+)
            }

            fn set_require_grad(self, require_grad: bool) -> Self {
                ($(self.$index.set_require_grad(require_grad),)+)
            }

            fn is_require_grad(&self) -> bool {
                false $(|| self.$index.is_require_grad())+
            }

            fn device(&self) -> B::Device {
                self.0.device()
            }

            fn cast(self, dtype: FloatDType) -> Self {
                ($(self.$index.cast(dtype),)+)
            }

            fn take_grad(&self, grads: &mut B::Gradients) -> Self::Grad {
                ($(self.$index.take_grad(grads),)+)
            }

            fn dot_grad(self, grad: Self::Grad) -> Option<Tensor<B, 1>> {
                [$(self.$index.dot_grad(grad.$index)),+]
                    .into_iter()
                    .flatten()
                    .reduce(|total, term| total + term)
            }
        }
    };
}

tuple_state!(S0 0, S1 1);
tuple_state!(S0 0, S1 1, S2 2);
tuple_state!(S0 0, S1 1, S2 2, S3 3);

/// The seeds a segmented step gives the backend's random generator, derived from one draw of
/// that generator: segment `i` draws from [`segment(i)`](Self::segment) in its first pass and
/// again in its recompute, and the generator continues from [`after`](Self::after) when the
/// step ends.
///
/// Public so that a step's random draws can be reproduced outside it: seed the backend, call
/// [`draw`](Self::draw) as the step's first draw would, and seed each segment of a plain
/// forward with its seed (a reference for the segmented gradients, a replay while debugging).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentSeeds {
    base: u64,
}

impl SegmentSeeds {
    /// Draws the seeds from `B`'s generator on `device`: two integers below 2²⁴ (the range
    /// every backend's integer `Uniform` draws exactly, CubeCL's through `f32`), read to the
    /// host, which waits for the device. Fails with [`MemoryError::Backend`] when the read does.
    pub fn draw<B: Backend>(device: &B::Device) -> Result<Self, MemoryError> {
        const RANGE: f64 = (1u64 << 24) as f64;
        let data = Tensor::<B, 1, Int>::random([2], Distribution::Uniform(0.0, RANGE), device)
            .try_into_data()
            .map_err(|e| MemoryError::Backend(format!("reading the step's seeds: {e}")))?;
        let base = data
            .iter::<i64>()
            .fold(0u64, |base, part| (base << 24) | (part as u64 & 0xFF_FFFF));
        Ok(Self { base })
    }

    /// The seed of segment `index` (from 0).
    pub fn segment(&self, index: usize) -> u64 {
        mix(self.base, index as u64)
    }

    /// The seed the generator continues from after the step.
    pub fn after(&self) -> u64 {
        mix(self.base, u64::MAX)
    }
}

/// Seed `stream` of `base`: output `stream + 1` of SplitMix64 seeded with `base`, taken in one
/// step (its state after `n` outputs is `base + n·γ`). Its output function is a bijection, so
/// distinct streams of one base get distinct, uncorrelated seeds.
fn mix(base: u64, stream: u64) -> u64 {
    /// SplitMix64's increment, the golden ratio's fraction in 64 bits.
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    SplitMix64::seed_from_u64(base.wrapping_add(stream.wrapping_mul(GAMMA))).next_u64()
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
pub struct SegmentedGrads<B: AutodiffBackend, X: SegmentState<B> = Tensor<B, 2>> {
    /// The loss, as `loss` returned it (scaled, if the caller scaled it).
    pub loss: Tensor<B::InnerBackend, 1>,
    /// The gradients of every parameter the layers and the loss use, merged over the segments:
    /// hand them to an optimizer, a `GradientsAccumulator`, or `MixedPrecision::unscale`.
    pub grads: GradientsParams,
    /// The gradient of the input's float parts, when one of them required a gradient: zeros
    /// for parts that did not. Burn tells only a leaf marked `require_grad` from an untracked
    /// tensor, so to continue the backward into layers outside the sequence, pass their output
    /// `h` as `h.clone().detach().require_grad()` and then call
    /// `(h · Tensor::from_inner(input_grad)).sum().backward()` on the original `h`.
    pub input_grad: Option<X::Grad>,
}

/// One training step's forward and backward pass over `model`'s layers with segment
/// checkpointing: `loss` maps the last layer's output to the (scalar) loss. Returns the merged
/// gradients, equal to `loss(model(input)).backward()`'s with the same random draws, while only
/// each segment's input is kept instead of every layer's activations.
///
/// Each segment but the last runs twice, from the same seed ([`SegmentSeeds`]), so dropout
/// masks match; running statistics are updated once. Parameters that `loss` uses (a head
/// captured by the closure) get gradients too, if they belong to `model`. Fails before any
/// layer runs, with [`MemoryError::Invalid`] when `segments` does not fit the layer count (see
/// [`Segments::ranges`]) or [`MemoryError::Backend`] when the seeds cannot be read.
pub fn segmented_backward<B, M, X>(
    model: &M,
    input: X,
    segments: &Segments,
    loss: impl FnOnce(X) -> Tensor<B, 1>,
) -> Result<SegmentedGrads<B, X>, MemoryError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Layers<B, X>,
    X: SegmentState<B>,
{
    run_segments(model, model, input, None, segments, loss)
}

impl MixedPrecision {
    /// [`segmented_backward`] under mixed precision: the layers run in the compute type (the
    /// saved segment inputs too, which halves their memory in f16), `loss` receives the output
    /// in the compute type and returns the loss, which is scaled before the backward pass.
    /// The returned gradients are the *scaled* gradients of `model`'s f32 parameters: pass
    /// them to [`unscale`](Self::unscale) or [`step`](Self::step), as with a plain backward.
    /// The input's gradient, if any, is the cast input's, in the compute type.
    pub fn segmented_backward<B, M, X>(
        &self,
        model: &M,
        input: X,
        segments: &Segments,
        loss: impl FnOnce(X) -> Tensor<B, 1>,
    ) -> Result<SegmentedGrads<B, X>, MemoryError>
    where
        B: AutodiffBackend,
        M: AutodiffModule<B> + Layers<B, X>,
        X: SegmentState<B>,
    {
        let cast = self.cast_module(model);
        let dtype = match self.precision() {
            Precision::F32 => None,
            half => Some(half.dtype().into()),
        };
        run_segments(&cast, model, input, dtype, segments, |out| {
            self.scale_loss(loss(out))
        })
    }
}

/// Runs the layers of `forward` segment by segment and collects the gradients of `params`'
/// parameters: the same model, or the f32 model whose cast copy `forward` is (then `cast` is
/// the compute type the input is cast to).
fn run_segments<B, M, X>(
    forward: &M,
    params: &M,
    input: X,
    cast: Option<FloatDType>,
    segments: &Segments,
    loss: impl FnOnce(X) -> Tensor<B, 1>,
) -> Result<SegmentedGrads<B, X>, MemoryError>
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Layers<B, X>,
    X: SegmentState<B>,
{
    let ranges = segments.ranges(forward.num_layers())?;
    let last = ranges.len() - 1;
    // Cut from the caller's graph: the step's gradients stop at its input.
    let input = match cast {
        Some(dtype) => input.cast(dtype),
        None => input.detach(),
    };
    let input_wants_grad = input.is_require_grad();
    let device = input.device();
    // Before any layer runs, so that the step's first draw is the seeds' (and lazy parameters
    // are initialised once, in `forward`: a clone would initialise its own values).
    let seeds = SegmentSeeds::draw::<B>(&device)?;
    draw_params(forward);
    tracing::trace!(segments = ranges.len(), ?seeds, "segmented step");

    // The first pass: training mode, no graph; keeps the inputs of segments 1..=last.
    let mut saved = Vec::with_capacity(last);
    if last > 0 {
        let untracked = forward.clone().no_grad();
        let mut x = input.clone().set_require_grad(false);
        for (segment, range) in ranges[..last].iter().enumerate() {
            B::seed(&device, seeds.segment(segment));
            for index in range.clone() {
                x = untracked.forward_layer(index, x);
            }
            saved.push(x.clone());
        }
    }

    // Weights shared between segments get the sum of their segments' gradients.
    let mut grads = GradientsAccumulator::<M>::new();
    let mut upstream: Option<X::Grad> = None;
    let mut loss = Some(loss);
    let mut loss_value = None;
    let mut running = None;
    for (segment, range) in ranges.iter().enumerate().rev() {
        let (x, wants_grad) = match saved.pop() {
            Some(saved) => (saved.set_require_grad(true), true),
            None => (input.clone(), input_wants_grad),
        };
        B::seed(&device, seeds.segment(segment));
        let mut out = x.clone();
        for index in range.clone() {
            out = forward.forward_layer(index, out);
        }
        let mut graph = match upstream.take() {
            Some(g) => {
                // The vector-Jacobian product: d(sum(out ⊙ g))/dθ = (∂out/∂θ)ᵀ·g. The zero
                // leaf keeps the root tracked when nothing in this segment is (no parameters
                // and an input without a gradient): Burn's backward needs a graph to start.
                let term = out.dot_grad(g);
                let anchor = match &term {
                    Some(term) => term.zeros_like(),
                    None => Tensor::zeros([1], &device),
                }
                .require_grad();
                term.map_or(anchor.clone(), |term| term + anchor).backward()
            }
            None => {
                let value = (loss.take().expect("the last segment runs first"))(out);
                loss_value = Some(value.clone().inner());
                if last > 0 {
                    // Every update that runs once (the first pass and the last segment) is in.
                    running = Some(RunningStates::after_sync(forward));
                }
                value.backward()
            }
        };
        if wants_grad {
            upstream = Some(x.take_grad(&mut graph));
        }
        grads.accumulate(params, GradientsParams::from_grads(graph, params));
    }
    B::seed(&device, seeds.after());
    if let Some(running) = running {
        running.restore(forward);
    }
    Ok(SegmentedGrads {
        loss: loss_value.expect("the loss ran"),
        grads: grads.grads(),
        input_grad: upstream.filter(|_| input_wants_grad),
    })
}

/// The model's float entries that take no gradient (running statistics, frozen parameters) as
/// they were once the step's single updates were synced, to undo the recompute's.
struct RunningStates<B: Backend> {
    values: HashMap<ParamId, TensorPrimitive<B>>,
}

impl<B: AutodiffBackend> RunningStates<B> {
    /// Syncs the pending running-state updates (`valid` is Burn's public way to, and is cheap:
    /// it copies tensor handles) and keeps the values.
    fn after_sync<M: AutodiffModule<B>>(model: &M) -> Self {
        drop(model.valid());
        let mut states = Self {
            values: HashMap::new(),
        };
        model.visit(&mut states);
        states
    }

    /// Syncs the recompute's updates, then writes the kept values back. Running states share
    /// their values between a module and its clones, so mapping a clone writes the model's.
    fn restore<M: AutodiffModule<B>>(mut self, model: &M) {
        drop(model.valid());
        drop(model.clone().map(&mut self));
    }
}

impl<B: AutodiffBackend> ModuleVisitor<B> for RunningStates<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if !value.is_require_grad() {
            self.values.insert(param.id, value.into_primitive());
        }
    }
}

impl<B: AutodiffBackend> ModuleMapper<B> for RunningStates<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        match self.values.get(&param.id) {
            Some(value) => {
                let (id, _, mapper) = param.consume();
                Param::from_mapped_value(id, Tensor::from_primitive(value.clone()), mapper)
            }
            None => param,
        }
    }
}
