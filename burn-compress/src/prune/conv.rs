//! Pruning Burn's `Conv2d`: [`MaskedConv2d`], and `Conv2d` as [`Prune`] and [`Shrink`].

use burn::module::{Module, Param, ParamId};
use burn::nn::conv::Conv2d;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::linear::{check_shape, drawn, fresh, masked_leaf};
use super::mask::{index_tensor, kept_indices, leaf, magnitude_mask, mask_param, unit_mask};
use super::shrink::check_keep;
use super::{Prune, PruneConfig, PruneMethod, Shrink};
use crate::CompressError;

/// A `Conv2d` whose forward uses `weight ⊙ mask` (and `bias ⊙ output_mask` after structured
/// pruning), for the reasons given at [`MaskedLinear`](super::MaskedLinear).
#[derive(Module, Debug)]
pub struct MaskedConv2d<B: Backend> {
    /// The convolution; its pruned weights are zero from the start.
    pub conv: Conv2d<B>,
    /// `1` where a weight is kept, `[channels_out, channels_in / groups, kernel_h, kernel_w]`.
    pub weight_mask: Param<Tensor<B, 4>>,
    /// For structured pruning, `1` for a kept output channel, `[channels_out]`.
    pub output_mask: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> MaskedConv2d<B> {
    /// Wraps `conv` with masks of its shapes: `weight_mask` as its weight, `output_mask`
    /// `[channels_out]` (structured pruning) or `None`.
    ///
    /// # Errors
    /// [`CompressError::ShapeMismatch`] if a mask does not have the layer's shape.
    pub fn new(
        conv: Conv2d<B>,
        weight_mask: Tensor<B, 4>,
        output_mask: Option<Tensor<B, 1>>,
    ) -> Result<Self, CompressError> {
        let dims = conv.weight.dims();
        check_shape("weight_mask", &weight_mask.dims(), &dims)?;
        if let Some(mask) = &output_mask {
            check_shape("output_mask", &mask.dims(), &[dims[0]])?;
        }
        let conv = Conv2d {
            weight: masked_leaf(conv.weight, weight_mask.clone()),
            bias: match (&output_mask, conv.bias) {
                (Some(mask), Some(bias)) => Some(masked_leaf(bias, mask.clone())),
                (None, bias) => bias.map(drawn),
                (Some(_), None) => None,
            },
            ..conv
        };
        Ok(Self {
            conv,
            weight_mask: mask_param(weight_mask),
            output_mask: output_mask.map(mask_param),
        })
    }

    /// The weight the forward uses, `weight ⊙ mask`.
    pub fn weight(&self) -> Tensor<B, 4> {
        self.conv.weight.val() * self.weight_mask.val()
    }

    /// The bias the forward uses, `[channels_out]`.
    pub fn bias(&self) -> Option<Tensor<B, 1>> {
        let bias = self.conv.bias.as_ref()?.val();
        Some(match &self.output_mask {
            Some(mask) => bias * mask.val(),
            None => bias,
        })
    }

    /// The convolution with the masked weight and bias.
    ///
    /// # Shapes
    /// As `Conv2d::forward`: `[batch, channels_in, height, width]` to
    /// `[batch, channels_out, height_out, width_out]`.
    pub fn forward(&self, input: Tensor<B, 4>) -> Tensor<B, 4> {
        // `Conv2d`'s own forward (its padding arithmetic is private to burn-nn) on a view
        // whose parameters are the masked tensors, still in the autodiff graph.
        self.view().forward(input)
    }

    fn view(&self) -> Conv2d<B> {
        Conv2d {
            weight: Param::initialized(ParamId::new(), self.weight()),
            bias: self
                .bias()
                .map(|bias| Param::initialized(ParamId::new(), bias)),
            stride: self.conv.stride,
            kernel_size: self.conv.kernel_size,
            dilation: self.conv.dilation,
            groups: self.conv.groups,
            padding: self.conv.padding.clone(),
        }
    }

    /// The output channels a structured pruning kept, in increasing order; `None` after
    /// unstructured pruning.
    ///
    /// # Errors
    /// [`CompressError::Unsupported`] if the mask cannot be read back as floats.
    pub fn kept_outputs(&self) -> Result<Option<Vec<usize>>, CompressError> {
        self.output_mask
            .as_ref()
            .map(|mask| kept_indices(mask.val()))
            .transpose()
    }

    /// The plain `Conv2d` with the mask applied for good, and no mask left (PyTorch's
    /// `prune.remove`).
    pub fn make_permanent(self) -> Conv2d<B> {
        let weight = self.weight();
        let bias = self.bias();
        let grad = self.conv.weight.val().is_require_grad();
        Conv2d {
            weight: leaf(self.conv.weight.id, weight, grad),
            bias: match (self.conv.bias, bias) {
                (Some(param), Some(value)) => Some(leaf(param.id, value, grad)),
                _ => None,
            },
            stride: self.conv.stride,
            kernel_size: self.conv.kernel_size,
            dilation: self.conv.dilation,
            groups: self.conv.groups,
            padding: self.conv.padding,
        }
    }
}

impl<B: Backend> Prune for Conv2d<B> {
    type Masked = MaskedConv2d<B>;

    fn prune(self, config: &PruneConfig) -> Result<MaskedConv2d<B>, CompressError> {
        let weight = self.weight.val();
        let dims = weight.dims();
        let fan_in: usize = dims[1..].iter().product();
        match config.method {
            PruneMethod::Magnitude => {
                let mask = magnitude_mask(weight, config.count(dims.iter().product()))?;
                MaskedConv2d::new(self, mask, None)
            }
            PruneMethod::Structured(norm) => {
                let rows = weight.reshape([dims[0], fan_in]);
                let units = unit_mask(rows, norm, config.count(dims[0]))?;
                let mask = units.clone().reshape([dims[0], 1, 1, 1]).expand(dims);
                MaskedConv2d::new(self, mask, Some(units))
            }
        }
    }
}

/// Output channels (dimension 0 of the weight) and input channels (dimension 1); only for
/// `groups = 1`, where every output channel reads every input channel.
impl<B: Backend> Shrink for Conv2d<B> {
    fn inputs(&self) -> usize {
        self.weight.dims()[1] * self.groups
    }

    fn outputs(&self) -> usize {
        self.weight.dims()[0]
    }

    fn keep_outputs(&self, keep: &[usize]) -> Result<Self, CompressError> {
        check_groups(self.groups)?;
        check_keep("Conv2d::keep_outputs", keep, self.outputs())?;
        let weight = self.weight.val();
        let index = index_tensor::<B>(keep, &weight.device());
        let grad = weight.is_require_grad();
        Ok(Conv2d {
            weight: fresh(weight.select(0, index.clone()), grad),
            bias: self
                .bias
                .as_ref()
                .map(|b| fresh(b.val().select(0, index), grad)),
            ..self.clone()
        })
    }

    fn keep_inputs(&self, keep: &[usize]) -> Result<Self, CompressError> {
        check_groups(self.groups)?;
        check_keep("Conv2d::keep_inputs", keep, self.inputs())?;
        let weight = self.weight.val();
        let index = index_tensor::<B>(keep, &weight.device());
        let grad = weight.is_require_grad();
        Ok(Conv2d {
            weight: fresh(weight.select(1, index), grad),
            bias: self.bias.as_ref().map(|b| fresh(b.val(), grad)),
            ..self.clone()
        })
    }
}

fn check_groups(groups: usize) -> Result<(), CompressError> {
    if groups == 1 {
        Ok(())
    } else {
        Err(CompressError::Unsupported {
            what: format!(
                "shrinking a grouped convolution (groups = {groups}): removing a channel \
                 would unbalance its groups"
            ),
        })
    }
}
