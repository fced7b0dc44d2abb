//! Pruning [`SkLinear`]'s trained factors: [`MaskedSkLinear`], and `SkLinear` as [`Prune`]
//! and [`Shrink`].
//!
//! The layer computes `x·W + b` with `W = 1/(2T)·Σ_t (S1_t·U1_t + U2_t·S2_t)`. Only `S1s`
//! (`[T, d_input, k]`) and `S2s` (`[T, k, d_output]`) are trained, so magnitude pruning masks
//! those two and leaves the fixed sketches whole. Output `j` of the layer is column `j` of `W`,
//! made of column `j` of every `U1_t` and of every `S2_t`: structured pruning masks both (a
//! fixed sketch's column set to zero stays zero, as nothing trains it), and shrinking drops
//! them, so the smaller layer computes exactly what the masked one did. Input `i` is row `i`
//! of every `S1_t` and `U2_t`.
//!
//! A shrunk or permanently pruned layer holds its sketches as tensors: they are no longer the
//! draws of their seed, so its record stores them rather than the seed.

use burn::module::{Module, Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::linear::{check_shape, drawn, fresh, masked_leaf};
use super::mask::{index_tensor, kept_indices, leaf, magnitude_mask, mask_param, unit_mask};
use super::shrink::check_keep;
use super::{Prune, PruneConfig, PruneMethod, Shrink};
use burn_sketch::SketchBackend;
use burn_sketch::{FixedSketch, SkLinear};

use crate::CompressError;

/// A [`SkLinear`] whose forward uses its trained factors times their masks (magnitude
/// pruning), or its outputs masked (structured pruning), for the reasons given at
/// [`MaskedLinear`](super::MaskedLinear).
#[derive(Module, Debug)]
pub struct MaskedSkLinear<B: Backend> {
    /// The layer; its pruned factor entries are zero from the start.
    pub layer: SkLinear<B>,
    /// Magnitude pruning: `1` where an entry of `S1s` is kept, `[T, d_input, k]`.
    pub s1s_mask: Option<Param<Tensor<B, 3>>>,
    /// Magnitude pruning: `1` where an entry of `S2s` is kept, `[T, k, d_output]`.
    pub s2s_mask: Option<Param<Tensor<B, 3>>>,
    /// Structured pruning: `1` for a kept output, `[d_output]`; masks the columns of `S2s`,
    /// of `U1s` and the bias.
    pub output_mask: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> MaskedSkLinear<B> {
    /// Wraps `layer` with masks of its factors' shapes (`None` for a factor left whole) and
    /// an output mask `[d_output]` (structured pruning) or `None`.
    ///
    /// # Errors
    /// [`CompressError::ShapeMismatch`] if a mask does not have its tensor's shape.
    pub fn new(
        layer: SkLinear<B>,
        s1s_mask: Option<Tensor<B, 3>>,
        s2s_mask: Option<Tensor<B, 3>>,
        output_mask: Option<Tensor<B, 1>>,
    ) -> Result<Self, CompressError> {
        if let Some(mask) = &s1s_mask {
            check_shape("s1s_mask", &mask.dims(), &layer.s1s.dims())?;
        }
        if let Some(mask) = &s2s_mask {
            check_shape("s2s_mask", &mask.dims(), &layer.s2s.dims())?;
        }
        if let Some(mask) = &output_mask {
            check_shape("output_mask", &mask.dims(), &[layer.d_output()])?;
        }
        let masks = Masks {
            s1s: s1s_mask.clone(),
            s2s: s2s_mask.clone(),
            output: output_mask.clone(),
        };
        let SkLinear {
            s1s,
            s2s,
            u1s,
            u2s,
            bias,
            strategy,
        } = layer;
        let s2s_full = masks.s2s_full(s2s.dims());
        let layer = SkLinear {
            s1s: match &masks.s1s {
                Some(mask) => masked_leaf(s1s, mask.clone()),
                None => drawn(s1s),
            },
            s2s: match s2s_full {
                Some(mask) => masked_leaf(s2s, mask),
                None => drawn(s2s),
            },
            u1s: match masks.u1s_full(u1s.dims()) {
                Some(mask) => FixedSketch::new(u1s.val() * mask),
                None => u1s,
            },
            u2s,
            bias: match (&masks.output, bias) {
                (Some(mask), Some(bias)) => Some(masked_leaf(bias, mask.clone())),
                (None, bias) => bias.map(drawn),
                (Some(_), None) => None,
            },
            strategy,
        };
        Ok(Self {
            layer,
            s1s_mask: s1s_mask.map(mask_param),
            s2s_mask: s2s_mask.map(mask_param),
            output_mask: output_mask.map(mask_param),
        })
    }

    fn masks(&self) -> Masks<B> {
        Masks {
            s1s: self.s1s_mask.as_ref().map(Param::val),
            s2s: self.s2s_mask.as_ref().map(Param::val),
            output: self.output_mask.as_ref().map(Param::val),
        }
    }

    /// The layer as the forward sees it: its factors times their masks, as tensors still in
    /// the autodiff graph of its parameters.
    pub(crate) fn view(&self) -> SkLinear<B> {
        let masks = self.masks();
        let layer = &self.layer;
        let apply = |value: Tensor<B, 3>, mask: Option<Tensor<B, 3>>| match mask {
            Some(mask) => value * mask,
            None => value,
        };
        let s2s_full = masks.s2s_full(layer.s2s.dims());
        let u1s_full = masks.u1s_full(layer.u1s.dims());
        SkLinear {
            s1s: Param::initialized(ParamId::new(), apply(layer.s1s.val(), masks.s1s.clone())),
            s2s: Param::initialized(ParamId::new(), apply(layer.s2s.val(), s2s_full)),
            u1s: FixedSketch::from(Param::initialized(
                ParamId::new(),
                apply(layer.u1s.val(), u1s_full),
            )),
            u2s: layer.u2s.clone(),
            bias: layer.bias.as_ref().map(|bias| {
                let bias = bias.val();
                let bias = match &masks.output {
                    Some(mask) => bias * mask.clone(),
                    None => bias,
                };
                Param::initialized(ParamId::new(), bias)
            }),
            strategy: layer.strategy,
        }
    }

    /// The dense weight `[d_input, d_output]` the forward applies.
    pub fn to_dense_weight(&self) -> Tensor<B, 2> {
        self.view().to_dense_weight()
    }

    /// The outputs a structured pruning kept, in increasing order; `None` after magnitude
    /// pruning.
    ///
    /// # Errors
    /// [`CompressError::Unsupported`] if the mask cannot be read back as floats.
    pub fn kept_outputs(&self) -> Result<Option<Vec<usize>>, CompressError> {
        self.output_mask
            .as_ref()
            .map(|mask| kept_indices(mask.val()))
            .transpose()
    }

    /// The plain [`SkLinear`] with the masks applied for good, and no mask left (PyTorch's
    /// `prune.remove`). After structured pruning, `U1s` holds zero columns and is stored as a
    /// tensor rather than its seed.
    pub fn make_permanent(self) -> SkLinear<B> {
        let view = self.view();
        let layer = self.layer;
        let grad = layer.s1s.val().is_require_grad();
        SkLinear {
            s1s: leaf(layer.s1s.id, view.s1s.val(), grad),
            s2s: leaf(layer.s2s.id, view.s2s.val(), grad),
            u1s: if self.output_mask.is_some() {
                FixedSketch::new(view.u1s.val().detach())
            } else {
                layer.u1s
            },
            u2s: layer.u2s,
            bias: match (layer.bias, view.bias) {
                (Some(param), Some(value)) => Some(leaf(param.id, value.val(), grad)),
                _ => None,
            },
            strategy: layer.strategy,
        }
    }
}

impl<B: SketchBackend> MaskedSkLinear<B> {
    /// The sketched product with the masked factors.
    ///
    /// # Shapes
    /// - input: `[..., d_input]`
    /// - output: `[..., d_output]`
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        self.view().forward(input)
    }
}

/// A layer's masks, as tensors.
struct Masks<B: Backend> {
    s1s: Option<Tensor<B, 3>>,
    s2s: Option<Tensor<B, 3>>,
    output: Option<Tensor<B, 1>>,
}

impl<B: Backend> Masks<B> {
    /// The output mask over the last dimension of `dims`.
    fn output_full(&self, dims: [usize; 3]) -> Option<Tensor<B, 3>> {
        let mask = self.output.clone()?;
        Some(mask.reshape([1, 1, dims[2]]).expand(dims))
    }

    /// What multiplies `S2s`: its own mask, the output mask, or both.
    fn s2s_full(&self, dims: [usize; 3]) -> Option<Tensor<B, 3>> {
        match (self.s2s.clone(), self.output_full(dims)) {
            (Some(a), Some(b)) => Some(a * b),
            (a, b) => a.or(b),
        }
    }

    /// What multiplies `U1s`: the output mask.
    fn u1s_full(&self, dims: [usize; 3]) -> Option<Tensor<B, 3>> {
        self.output_full(dims)
    }
}

impl<B: Backend> Prune for SkLinear<B> {
    type Masked = MaskedSkLinear<B>;

    fn prune(self, config: &PruneConfig) -> Result<MaskedSkLinear<B>, CompressError> {
        match config.method {
            PruneMethod::Magnitude => {
                let s1s = self.s1s.val();
                let s2s = self.s2s.val();
                let count1 = config.count(s1s.shape().num_elements());
                let count2 = config.count(s2s.shape().num_elements());
                let s1s_mask = magnitude_mask(s1s, count1)?;
                let s2s_mask = magnitude_mask(s2s, count2)?;
                MaskedSkLinear::new(self, Some(s1s_mask), Some(s2s_mask), None)
            }
            PruneMethod::Structured(norm) => {
                // Ranked by the columns of the weight the layer applies, the sum of both
                // terms: a column of `S2s` alone says nothing of `S1s·U1s`'s share.
                let weight = self.to_dense_weight().transpose();
                let units = unit_mask(weight, norm, config.count(self.d_output()))?;
                MaskedSkLinear::new(self, None, None, Some(units))
            }
        }
    }
}

impl<B: Backend> Shrink for SkLinear<B> {
    fn inputs(&self) -> usize {
        self.d_input()
    }

    fn outputs(&self) -> usize {
        self.d_output()
    }

    fn keep_outputs(&self, keep: &[usize]) -> Result<Self, CompressError> {
        check_keep("SkLinear::keep_outputs", keep, self.outputs())?;
        let s2s = self.s2s.val();
        let index = index_tensor::<B>(keep, &s2s.device());
        let grad = s2s.is_require_grad();
        Ok(SkLinear {
            s1s: fresh(self.s1s.val(), grad),
            s2s: fresh(s2s.select(2, index.clone()), grad),
            u1s: FixedSketch::new(self.u1s.val().select(2, index.clone()).detach()),
            u2s: self.u2s.clone(),
            bias: self
                .bias
                .as_ref()
                .map(|b| fresh(b.val().select(0, index), grad)),
            strategy: self.strategy,
        })
    }

    fn keep_inputs(&self, keep: &[usize]) -> Result<Self, CompressError> {
        check_keep("SkLinear::keep_inputs", keep, self.inputs())?;
        let s1s = self.s1s.val();
        let index = index_tensor::<B>(keep, &s1s.device());
        let grad = s1s.is_require_grad();
        Ok(SkLinear {
            s1s: fresh(s1s.select(1, index.clone()), grad),
            s2s: fresh(self.s2s.val(), grad),
            u1s: self.u1s.clone(),
            u2s: FixedSketch::new(self.u2s.val().select(1, index).detach()),
            bias: self.bias.as_ref().map(|b| fresh(b.val(), grad)),
            strategy: self.strategy,
        })
    }
}
