//! [`BertEncoder`] as a burn-compress [`Distillable`]: the states a converted encoder is
//! trained to reproduce are its layers' outputs (each layer's, the last as the output), over
//! real tokens only, so that a converted feed-forward block can be distilled back toward the
//! original encoder.

use burn::nn::DropoutConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_compress::{DistilInput, DistilStates, Distillable};
use burn_sketch::SketchBackend;

use crate::{BertEncoder, EncoderInput};

/// The layers' outputs (the embeddings' output is left out: a conversion of linear layers
/// does not change it), the last as [`DistilStates::output`]; padding weighs 0.
impl<B: SketchBackend> Distillable<B> for BertEncoder<B> {
    type Input = EncoderInput<B>;

    fn distil_states(&self, input: &EncoderInput<B>) -> DistilStates<B> {
        let mut layers = self.hidden_states(input);
        layers.remove(0);
        let output = layers.pop().expect("an encoder has at least one layer");
        DistilStates {
            layers,
            output,
            weights: input.mask_pad.clone().map(|pad| pad.bool_not().float()),
        }
    }
}

/// The teacher's copy of a batch: the same ids and mask on the inner backend, no copy through
/// the host.
impl<B: AutodiffBackend> DistilInput<B> for EncoderInput<B> {
    type Inner = EncoderInput<B::InnerBackend>;

    fn to_inner(&self) -> EncoderInput<B::InnerBackend> {
        EncoderInput {
            ids: self.ids.clone().inner(),
            type_ids: self.type_ids.clone().map(|t| t.inner()),
            mask_pad: self.mask_pad.clone().map(|m| m.inner()),
        }
    }
}

impl<B: Backend> BertEncoder<B> {
    /// The encoder with every dropout (embeddings, attention weights, sub-blocks) at `prob`:
    /// 0 for a distillation, whose targets are the original's deterministic states and whose
    /// unlabeled data is plentiful, so that the student matches what inference computes.
    pub fn with_dropout(mut self, prob: f64) -> Self {
        let dropout = DropoutConfig::new(prob).init();
        self.embeddings.dropout = dropout.clone();
        for layer in &mut self.layers {
            layer.dropout = dropout.clone();
            layer.attention.dropout = dropout.clone();
        }
        self
    }
}
