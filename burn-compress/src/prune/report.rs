//! How sparse a model is: [`SparsityReport`].

use std::fmt;

use burn::nn::Linear;
use burn::nn::conv::Conv2d;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor};
use serde::{Deserialize, Serialize};

use super::{MaskedConv2d, MaskedLinear, MaskedSkLinear};
use burn_sketch::SkLinear;

/// A layer's trained parameters and how many of them are zero.
///
/// Implemented by the layers [`prune`](super) handles, masked or not: a masked layer counts
/// the parameters its forward uses (weights times masks). A [`SkLinear`] counts `S1s`, `S2s`
/// and the bias, not its fixed sketches.
pub trait Sparsity {
    /// Parameters and zeros, under an empty name.
    fn sparsity(&self) -> LayerSparsity;
}

/// One layer's line of a [`SparsityReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerSparsity {
    /// The layer's name, as the report was given it.
    pub name: String,
    /// Trained parameters (weights and bias).
    pub params: usize,
    /// Those equal to zero.
    pub zeros: usize,
}

impl LayerSparsity {
    /// The fraction of parameters that are zero, `0` for a layer with none.
    pub fn fraction(&self) -> f64 {
        if self.params == 0 {
            0.0
        } else {
            self.zeros as f64 / self.params as f64
        }
    }
}

/// Per-layer and total sparsity of a model: printable as a table, serializable as JSON (the
/// [module docs](crate::prune) have an example).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SparsityReport {
    /// One line per layer, in the order added.
    pub layers: Vec<LayerSparsity>,
}

impl SparsityReport {
    /// An empty report.
    pub fn new() -> Self {
        Self::default()
    }

    /// The report with `layer` added under `name`.
    pub fn with(mut self, name: impl Into<String>, layer: &impl Sparsity) -> Self {
        self.push(name, layer);
        self
    }

    /// Adds `layer` under `name`.
    pub fn push(&mut self, name: impl Into<String>, layer: &impl Sparsity) {
        let mut line = layer.sparsity();
        line.name = name.into();
        self.layers.push(line);
    }

    /// The sums over all layers, named `total`.
    pub fn total(&self) -> LayerSparsity {
        LayerSparsity {
            name: "total".into(),
            params: self.layers.iter().map(|l| l.params).sum(),
            zeros: self.layers.iter().map(|l| l.zeros).sum(),
        }
    }
}

impl fmt::Display for SparsityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self
            .layers
            .iter()
            .map(|l| l.name.len())
            .max()
            .unwrap_or(0)
            .max(5);
        writeln!(
            f,
            "{:<width$}  {:>10}  {:>10}  {:>7}",
            "layer", "params", "zeros", "sparse"
        )?;
        for line in self.layers.iter().chain([&self.total()]) {
            writeln!(
                f,
                "{:<width$}  {:>10}  {:>10}  {:>6.2}%",
                line.name,
                line.params,
                line.zeros,
                100.0 * line.fraction()
            )?;
        }
        Ok(())
    }
}

/// Parameters and zeros of `tensors`.
fn count<B: Backend, const D: usize>(
    weights: impl IntoIterator<Item = Tensor<B, D>>,
    bias: Option<Tensor<B, 1>>,
) -> LayerSparsity {
    let zeros_of = |numel: usize, zeros: Tensor<B, 1, burn::tensor::Int>| {
        (numel, zeros.into_scalar().elem::<i64>() as usize)
    };
    let mut params = 0;
    let mut zeros = 0;
    for weight in weights {
        let numel = weight.shape().num_elements();
        let (n, z) = zeros_of(numel, weight.equal_elem(0.0).int().sum());
        params += n;
        zeros += z;
    }
    if let Some(bias) = bias {
        let numel = bias.shape().num_elements();
        let (n, z) = zeros_of(numel, bias.equal_elem(0.0).int().sum());
        params += n;
        zeros += z;
    }
    LayerSparsity {
        name: String::new(),
        params,
        zeros,
    }
}

impl<B: Backend> Sparsity for Linear<B> {
    fn sparsity(&self) -> LayerSparsity {
        count([self.weight.val()], self.bias.as_ref().map(|b| b.val()))
    }
}

impl<B: Backend> Sparsity for MaskedLinear<B> {
    fn sparsity(&self) -> LayerSparsity {
        count([self.weight()], self.bias())
    }
}

impl<B: Backend> Sparsity for Conv2d<B> {
    fn sparsity(&self) -> LayerSparsity {
        count([self.weight.val()], self.bias.as_ref().map(|b| b.val()))
    }
}

impl<B: Backend> Sparsity for MaskedConv2d<B> {
    fn sparsity(&self) -> LayerSparsity {
        count([self.weight()], self.bias())
    }
}

impl<B: Backend> Sparsity for SkLinear<B> {
    fn sparsity(&self) -> LayerSparsity {
        count(
            [self.s1s.val(), self.s2s.val()],
            self.bias.as_ref().map(|b| b.val()),
        )
    }
}

impl<B: Backend> Sparsity for MaskedSkLinear<B> {
    fn sparsity(&self) -> LayerSparsity {
        self.view().sparsity()
    }
}
