//! The [`SkLinear`] module: its state, forward pass and conversions.

use burn::module::{Content, DisplaySettings, Module, ModuleDisplay, Param};
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::{SkLinearConfig, SketchInit};
use crate::FixedSketch;
use crate::SketchError;
use crate::backend::{Activation, KernelStrategy, SketchBackend, SketchWeights};

/// A linear layer whose weight is a sum of low-rank sketched terms (Panther's `SKLinear`):
/// `y = 1/(2T) · Σ_t (x·S1_t·U1_t + x·U2_t·S2_t) + bias`.
///
/// `S1s` and `S2s` are trained; the random sign sketches `U1s` and `U2s` are fixed at
/// initialisation. With `T = num_terms` and `k = low_rank`, the layer has
/// `T·k·(d_input + d_output)` trainable weights instead of `d_input·d_output`, and costs
/// `2·n·2Tk·(d_input + d_output)` FLOPs for `n` rows instead of `2·n·d_input·d_output`.
/// Create it with [`SkLinearConfig`], or from a trained dense layer with
/// [`SkLinear::from_linear`]; its tensors keep Panther's names and layouts, which lets
/// [`crate::panther`] move checkpoints between the two libraries.
#[derive(Module, Debug)]
#[module(custom_display)]
pub struct SkLinear<B: Backend> {
    /// Trainable left factors, `[T, d_input, k]`.
    pub s1s: Param<Tensor<B, 3>>,
    /// Trainable right factors, `[T, k, d_output]`.
    pub s2s: Param<Tensor<B, 3>>,
    /// Fixed sign sketches paired with `s1s`, `[T, k, d_output]`. Never trained; recorded
    /// whole, or as their seed ([`SkLinearConfig::sketch_seed`]).
    pub u1s: FixedSketch<B>,
    /// Fixed sign sketches paired with `s2s`, `[T, d_input, k]`, likewise.
    pub u2s: FixedSketch<B>,
    /// Optional bias, `[d_output]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// How the backend picks its implementation of the product; not saved in records.
    #[module(skip)]
    pub strategy: KernelStrategy,
}

/// Parameter counts of a [`SkLinear`], for comparison with the dense layer it replaces.
///
/// `Module::num_params` counts every tensor of the module, the fixed sketches included; this
/// separates what is trained from what is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamCounts {
    /// Weights updated by training: `S1s`, `S2s` and the bias.
    pub trainable: usize,
    /// Fixed sign sketches `U1s` and `U2s`: stored, but never trained.
    pub fixed: usize,
    /// Parameters of the dense `Linear` with the same sizes and bias.
    pub dense: usize,
}

impl<B: Backend> SkLinear<B> {
    /// Starts from a trained dense layer: the sketched layer estimates its weight without bias
    /// (unbiased over the random sketches) and copies its bias exactly.
    ///
    /// Works for both of `Linear`'s storage layouts, since `Linear::weight` always reads as
    /// `[d_input, d_output]`.
    ///
    /// # Panics
    /// If `num_terms` or `low_rank` is zero; [`try_from_linear`](Self::try_from_linear)
    /// returns the error instead.
    pub fn from_linear(linear: &Linear<B>, num_terms: usize, low_rank: usize) -> Self {
        Self::try_from_linear(linear, num_terms, low_rank)
            .unwrap_or_else(|err| panic!("cannot convert Linear to SkLinear: {err}"))
    }

    /// [`from_linear`](Self::from_linear), returning an error for a zero `num_terms` or
    /// `low_rank`.
    pub fn try_from_linear(
        linear: &Linear<B>,
        num_terms: usize,
        low_rank: usize,
    ) -> Result<Self, SketchError> {
        Self::try_from_linear_with(linear, num_terms, low_rank, SketchInit::Unbiased)
    }

    /// [`try_from_linear`](Self::try_from_linear), the factors set by `init`: Panther's unbiased
    /// estimate, or [`SketchInit::Fitted`], a least-squares fit that starts closer to `linear`.
    ///
    /// ```
    /// use burn::{backend::Flex, nn::LinearConfig};
    /// use burn_sketch::{SkLinear, SketchInit::{Fitted, Unbiased}};
    /// let dense = LinearConfig::new(128, 64).init::<Flex>(&Default::default());
    /// let error = |init| (SkLinear::try_from_linear_with(&dense, 1, 8, init).unwrap()
    ///     .to_dense_weight() - dense.weight.val()).powi_scalar(2).sum().into_scalar();
    /// assert!(error(Fitted) < error(Unbiased));
    /// ```
    pub fn try_from_linear_with(
        linear: &Linear<B>,
        num_terms: usize,
        low_rank: usize,
        init: SketchInit,
    ) -> Result<Self, SketchError> {
        // Detached, so that on an autodiff backend the new parameters are fresh leaves of
        // their own rather than results of the dense layer's graph (which cannot become
        // trainable parameters, and would tie the two layers' gradients).
        let weight = linear.weight.val().detach().set_require_grad(false);
        let [d_input, d_output] = weight.dims();
        SkLinearConfig::new(d_input, d_output, num_terms, low_rank)
            .with_bias(linear.bias.is_some())
            .validate()?;
        let bias = linear
            .bias
            .as_ref()
            .map(|b| b.val().detach().set_require_grad(false));
        let unbiased = Self::from_dense_parts(weight.clone(), bias, num_terms, low_rank, None);
        match init {
            SketchInit::Unbiased => Ok(unbiased),
            SketchInit::Fitted => unbiased.fitted_to(weight),
        }
    }

    /// The expected relative error `‖Ŵ − W‖_F / ‖W‖_F` of the weight that
    /// [`from_linear`](Self::from_linear) derives from a dense `W` (root mean square over the
    /// random sketches): `√((d_input + d_output − 2) / (4·T·k))`.
    ///
    /// Why: each sign sketch `U` (`[k, d]`, entries `±1/√k`) has `UᵀU` with ones on the
    /// diagonal and off-diagonal entries of variance `1/k`, so a term's error `W·(U1ᵀU1 − I)`
    /// has expected squared norm `‖W‖²·(d_output − 1)/k` (and `(U2U2ᵀ − I)·W` the same with
    /// `d_input`); the `2T` independent terms are averaged. A converted layer starts this far
    /// from the dense one (for `d = 512`, `T = 1`, `k = 16`: 4.0), which is why conversion is
    /// followed by fine-tuning.
    pub fn expected_relative_error(
        d_input: usize,
        d_output: usize,
        num_terms: usize,
        low_rank: usize,
    ) -> f64 {
        let spread = (d_input + d_output).saturating_sub(2) as f64;
        (spread / (4.0 * num_terms as f64 * low_rank as f64)).sqrt()
    }

    /// The size of the input features.
    pub fn d_input(&self) -> usize {
        self.s1s.dims()[1]
    }

    /// The size of the output features.
    pub fn d_output(&self) -> usize {
        self.s2s.dims()[2]
    }

    /// The number of sketched terms `T`.
    pub fn num_terms(&self) -> usize {
        self.s1s.dims()[0]
    }

    /// The rank `k` of each term.
    pub fn low_rank(&self) -> usize {
        self.s1s.dims()[2]
    }

    /// The configuration that describes this layer's sizes.
    pub fn config(&self) -> SkLinearConfig {
        SkLinearConfig::new(
            self.d_input(),
            self.d_output(),
            self.num_terms(),
            self.low_rank(),
        )
        .with_bias(self.bias.is_some())
        .with_strategy(self.strategy)
    }

    /// The layer with another [`KernelStrategy`] (a per-layer, per-call choice: tests and
    /// benchmarks pin the kernels or the tensor-op path this way).
    pub fn with_strategy(mut self, strategy: KernelStrategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// The layer's four factor tensors, as the backend's sketched product takes them.
    pub fn weights(&self) -> SketchWeights<B> {
        SketchWeights {
            s1s: self.s1s.val(),
            s2s: self.s2s.val(),
            u1s: self.u1s.val(),
            u2s: self.u2s.val(),
        }
    }

    /// The dense weight `[d_input, d_output]` that the layer applies:
    /// `1/(2T)·Σ_t (S1_t·U1_t + U2_t·S2_t)`, so that `forward(x) = x·W + bias`.
    pub fn to_dense_weight(&self) -> Tensor<B, 2> {
        let (a, b) = self.weights().factors();
        a.matmul(b).div_scalar(2.0 * self.num_terms() as f64)
    }

    /// Trainable, fixed and dense-equivalent parameter counts.
    pub fn param_counts(&self) -> ParamCounts {
        let (d_in, d_out) = (self.d_input(), self.d_output());
        let factors = self.num_terms() * self.low_rank() * (d_in + d_out);
        let bias = if self.bias.is_some() { d_out } else { 0 };
        ParamCounts {
            trainable: factors + bias,
            fixed: factors,
            dense: d_in * d_out + bias,
        }
    }
}

impl<B: SketchBackend> SkLinear<B> {
    /// Applies the layer to the input's last dimension: leading dimensions are flattened into
    /// rows, as `nn::Linear` does, and restored after (no rows give an empty output).
    ///
    /// # Shapes
    /// - input: `[..., d_input]`
    /// - output: `[..., d_output]`
    ///
    /// # Panics
    /// If the input's last dimension is not `d_input`.
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        self.forward_activated(input, Activation::Identity)
    }

    /// [`forward`](Self::forward) then `activation`, in the product's output pass where the
    /// backend has one (Flex, CubeCL), saving a pass over the output; same shapes and panics.
    ///
    /// ```
    /// use burn::{backend::Flex, tensor::{Tensor, activation::relu}};
    /// use burn_sketch::{Activation, SkLinearConfig};
    /// let layer = SkLinearConfig::new(64, 32, 1, 8).init::<Flex>(&Default::default());
    /// let x = Tensor::<Flex, 2>::ones([4, 64], &Default::default());
    /// let fused = layer.forward_activated(x.clone(), Activation::Relu).into_data();
    /// fused.assert_approx_eq::<f32>(&relu(layer.forward(x)).into_data(), Default::default());
    /// ```
    pub fn forward_activated<const D: usize>(
        &self,
        input: Tensor<B, D>,
        activation: Activation,
    ) -> Tensor<B, D> {
        let dims = input.dims();
        let d_input = self.d_input();
        assert_eq!(
            dims[D - 1],
            d_input,
            "SkLinear expects inputs whose last dimension is d_input = {d_input}, got shape {dims:?}"
        );
        let rows = dims[..D - 1].iter().product();
        let mut out_dims = dims;
        out_dims[D - 1] = self.d_output();
        if rows == 0 {
            // No rows, no product: backends' kernels and reshapes need not handle zero sizes.
            return Tensor::zeros(out_dims, &input.device());
        }
        let output = B::sketched_linear(
            with_shape(input, [rows, d_input]),
            self.weights(),
            self.bias.as_ref().map(|b| b.val()),
            activation,
            self.strategy,
        );
        with_shape(output, out_dims)
    }
}

/// `tensor` with `shape`, passed through untouched when it has that shape already (a rank-2
/// input and its output).
///
/// Why not always `reshape`: burn-ndarray 0.21 copies the whole array on every reshape, even to
/// the shape it has: for a `[256, 8192]` input, two 8 MB copies per forward and two more in
/// the backward (the book's CPU benchmark page has the measured effect).
fn with_shape<B: Backend, const D: usize, const D2: usize>(
    tensor: Tensor<B, D>,
    shape: [usize; D2],
) -> Tensor<B, D2> {
    if tensor.dims()[..] == shape[..] {
        Tensor::from_primitive(tensor.into_primitive())
    } else {
        tensor.reshape(shape)
    }
}

impl<B: Backend> ModuleDisplay for SkLinear<B> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        DisplaySettings::new()
            .with_new_line_after_attribute(false)
            .optional()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        content
            .add("d_input", &self.d_input())
            .add("d_output", &self.d_output())
            .add("num_terms", &self.num_terms())
            .add("low_rank", &self.low_rank())
            .add("bias", &self.bias.is_some())
            .optional()
    }
}
