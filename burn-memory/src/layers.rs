//! [`Layers`]: a model as a sequence of layers, which segment checkpointing, offloading and
//! placement all work on.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// A sequence of layers that segment checkpointing can split, offloading runs one layer at a
/// time and placement spreads over devices: its layers' forward, one at a time, for any
/// backend (the training backend and its inner backend run the same code).
///
/// Every layer maps the state `X` to the next state `X`. By default `X` is `Tensor<B, 2>`
/// (widths may change from one layer to the next); a model whose layers pass more than one
/// tensor implements `Layers<B, X>` for a tuple or a struct of its own: `(activation,
/// residual, mask)` for a transformer block, see [`SegmentState`](crate::SegmentState) for
/// what segment checkpointing needs of it. A "layer" is whatever the model treats as one step:
/// a linear layer and its activation, a residual block, a normalisation.
pub trait Layers<B: Backend, X = Tensor<B, 2>> {
    /// How many layers the sequence has.
    fn num_layers(&self) -> usize;
    /// Runs layer `index` (from 0) on `input`.
    fn forward_layer(&self, index: usize, input: X) -> X;
}
