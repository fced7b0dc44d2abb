//! Pruning Burn's `Linear`: [`MaskedLinear`], and `Linear` as [`Prune`] and [`Shrink`].

use burn::module::Module;
use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::tensor::module::linear;

use super::mask::{index_tensor, kept_indices, leaf, magnitude_mask, mask_param, unit_mask};
use super::shrink::check_keep;
use super::{Prune, PruneConfig, PruneMethod, Shrink};
use crate::CompressError;

/// A `Linear` whose forward uses `weight ⊙ mask` (and `bias ⊙ output_mask` when the pruning
/// was structured): PyTorch's pruned module, with the mask held beside the weight.
///
/// Why a mask in the forward rather than zeros written once: fine-tuning after pruning would
/// move zeroed weights away from zero. Through the product with the mask, a pruned weight has
/// no effect on the output and gets a zero gradient, so it stays pruned however long the layer
/// trains. [`make_permanent`](Self::make_permanent) then returns a plain `Linear` with the
/// zeros in its weight (PyTorch's `prune.remove`).
///
/// The masks are parameters without gradient: optimizers skip them, and records save them,
/// so a checkpoint of a masked model resumes with its masks.
#[derive(Module, Debug)]
pub struct MaskedLinear<B: Backend> {
    /// The layer; its pruned weights are zero from the start.
    pub linear: Linear<B>,
    /// `1` where a weight is kept, `0` where it is pruned, `[d_input, d_output]`.
    pub weight_mask: Param<Tensor<B, 2>>,
    /// For structured pruning, `1` for a kept output and `0` for a removed one, `[d_output]`:
    /// it masks the bias too, so that a removed output is exactly `0`.
    pub output_mask: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> MaskedLinear<B> {
    /// Wraps `linear` with masks of its shapes: `weight_mask` `[d_input, d_output]`,
    /// `output_mask` `[d_output]` (structured pruning) or `None`.
    ///
    /// # Errors
    /// [`CompressError::ShapeMismatch`] if a mask does not have the layer's shape.
    pub fn new(
        linear: Linear<B>,
        weight_mask: Tensor<B, 2>,
        output_mask: Option<Tensor<B, 1>>,
    ) -> Result<Self, CompressError> {
        let dims = linear.weight.dims();
        check_shape("weight_mask", &weight_mask.dims(), &dims)?;
        if let Some(mask) = &output_mask {
            check_shape("output_mask", &mask.dims(), &[dims[1]])?;
        }
        let linear = Linear {
            weight: masked_leaf(linear.weight, weight_mask.clone()),
            bias: match (&output_mask, linear.bias) {
                (Some(mask), Some(bias)) => Some(masked_leaf(bias, mask.clone())),
                (None, bias) => bias.map(drawn),
                (Some(_), None) => None,
            },
        };
        Ok(Self {
            linear,
            weight_mask: mask_param(weight_mask),
            output_mask: output_mask.map(mask_param),
        })
    }

    /// The weight the forward uses, `weight ⊙ mask`, `[d_input, d_output]`.
    pub fn weight(&self) -> Tensor<B, 2> {
        self.linear.weight.val() * self.weight_mask.val()
    }

    /// The bias the forward uses, `[d_output]`.
    pub fn bias(&self) -> Option<Tensor<B, 1>> {
        let bias = self.linear.bias.as_ref()?.val();
        Some(match &self.output_mask {
            Some(mask) => bias * mask.val(),
            None => bias,
        })
    }

    /// `x·(W ⊙ M) + b`.
    ///
    /// # Shapes
    /// - input: `[..., d_input]`
    /// - output: `[..., d_output]`
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        linear(input, self.weight(), self.bias())
    }

    /// The outputs a structured pruning kept, in increasing order, for
    /// [`shrink_pair`](super::shrink_pair); `None` after unstructured pruning.
    ///
    /// # Errors
    /// [`CompressError::Unsupported`] if the mask cannot be read back as floats.
    pub fn kept_outputs(&self) -> Result<Option<Vec<usize>>, CompressError> {
        self.output_mask
            .as_ref()
            .map(|mask| kept_indices(mask.val()))
            .transpose()
    }

    /// The plain `Linear` with the mask applied for good: pruned weights (and masked biases)
    /// are stored zeros, and no mask is left (PyTorch's `prune.remove`). Its parameters keep
    /// their ids, so an optimizer's state carries over.
    pub fn make_permanent(self) -> Linear<B> {
        let weight = self.weight();
        let bias = self.bias();
        let grad = self.linear.weight.val().is_require_grad();
        Linear {
            weight: leaf(self.linear.weight.id, weight, grad),
            bias: match (self.linear.bias, bias) {
                (Some(param), Some(value)) => Some(leaf(param.id, value, grad)),
                _ => None,
            },
        }
    }
}

pub(crate) fn check_shape(
    key: &str,
    found: &[usize],
    expected: &[usize],
) -> Result<(), CompressError> {
    if found == expected {
        Ok(())
    } else {
        Err(CompressError::ShapeMismatch {
            key: key.to_string(),
            found: found.to_vec(),
            expected: format!("{expected:?}, the layer's"),
        })
    }
}

impl<B: Backend> Prune for Linear<B> {
    type Masked = MaskedLinear<B>;

    fn prune(self, config: &PruneConfig) -> Result<MaskedLinear<B>, CompressError> {
        let weight = self.weight.val();
        let [d_input, d_output] = weight.dims();
        match config.method {
            PruneMethod::Magnitude => {
                let mask = magnitude_mask(weight, config.count(d_input * d_output))?;
                MaskedLinear::new(self, mask, None)
            }
            PruneMethod::Structured(norm) => {
                // Output `j` is column `j` of the `[d_input, d_output]` weight.
                let units = unit_mask(weight.transpose(), norm, config.count(d_output))?;
                let mask = units.clone().unsqueeze::<2>().expand([d_input, d_output]);
                MaskedLinear::new(self, mask, Some(units))
            }
        }
    }
}

impl<B: Backend> Shrink for Linear<B> {
    fn inputs(&self) -> usize {
        self.weight.dims()[0]
    }

    fn outputs(&self) -> usize {
        self.weight.dims()[1]
    }

    fn keep_outputs(&self, keep: &[usize]) -> Result<Self, CompressError> {
        check_keep("Linear::keep_outputs", keep, self.outputs())?;
        let weight = self.weight.val();
        let index = index_tensor::<B>(keep, &weight.device());
        let grad = weight.is_require_grad();
        Ok(Linear {
            weight: fresh(weight.select(1, index.clone()), grad),
            bias: self
                .bias
                .as_ref()
                .map(|b| fresh(b.val().select(0, index), grad)),
        })
    }

    fn keep_inputs(&self, keep: &[usize]) -> Result<Self, CompressError> {
        check_keep("Linear::keep_inputs", keep, self.inputs())?;
        let weight = self.weight.val();
        let index = index_tensor::<B>(keep, &weight.device());
        let grad = weight.is_require_grad();
        Ok(Linear {
            weight: fresh(weight.select(0, index), grad),
            bias: self.bias.as_ref().map(|b| fresh(b.val(), grad)),
        })
    }
}

/// `param ⊙ mask` as the parameter's new value, a leaf with the same id and gradient flag.
pub(crate) fn masked_leaf<B: Backend, const D: usize>(
    param: Param<Tensor<B, D>>,
    mask: Tensor<B, D>,
) -> Param<Tensor<B, D>> {
    let value = param.val();
    let grad = value.is_require_grad();
    leaf(param.id, value * mask, grad)
}

/// `param` with its value drawn now: Burn draws a lazily initialised parameter on first use,
/// and each clone of one not yet drawn draws its own values, so a masked layer's clones
/// (the optimizer's, a record's) would disagree on it.
pub(crate) fn drawn<B: Backend, const D: usize>(param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
    let _ = param.val();
    param
}

/// A new parameter (new id: its shape changed, so no optimizer state fits it) holding `value`
/// as a leaf.
pub(crate) fn fresh<B: Backend, const D: usize>(
    value: Tensor<B, D>,
    require_grad: bool,
) -> Param<Tensor<B, D>> {
    leaf(burn::module::ParamId::new(), value, require_grad)
}
