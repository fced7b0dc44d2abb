//! The sketched 2-D convolution, a drop-in for `burn::nn::conv::Conv2d` (Panther's
//! `SKConv2d`).
//!
//! A convolution is a linear layer applied to every window of its input: with the windows
//! unfolded (`[N·L, C·kh·kw]`, im2col), the kernel is a `[C·kh·kw, O]` matrix `K`. `SkConv2d`
//! replaces `K` by the sketched estimate of [`SkLinear`](crate::SkLinear)'s math:
//!
//! ```text
//! K̂ = 1/(2T) · Σ_t ( S1_t·U1_t + U2_tᵀ·S2_t )
//! ```
//!
//! with `S1_t` `[C·kh·kw, k]` and `S2_t` `[k·kh·kw, O]` trained, and the fixed sign sketches
//! `U1_t` `[k, O]` and `U2_t` `[k·kh·kw, C·kh·kw]`, Panther's shapes and names. Groups split the
//! channels as Burn's `Conv2d` does, each group with sketches of its own.
//!
//! `K̂` is never formed: the layer is a `kh × kw` convolution to `r = T·k·(1 + kh·kw)` channels
//! followed by a `1 × 1` convolution to `O`, so a position costs `(C·kh·kw + O)·r` products
//! instead of `C·kh·kw·O`, and the backend's own convolutions do the work.

use burn::config::Config;
use burn::module::{Content, DisplaySettings, Module, ModuleDisplay, Param};
use burn::nn::PaddingConfig2d;
use burn::tensor::backend::Backend;
use burn::tensor::module::conv2d;
use burn::tensor::ops::{ConvOptions, PadMode};
use burn::tensor::{Distribution, Tensor};

use crate::FixedSketch;
use crate::SketchError;
use crate::linear::sign_sketch;

/// Configuration of an [`SkConv2d`].
///
/// ```
/// use burn::{backend::Flex, nn::PaddingConfig2d, tensor::{Distribution, Tensor}};
/// let device = Default::default();
/// let conv = burn_sketch::SkConv2dConfig::new([32, 64], [3, 3], 1, 4)
///     .with_padding(PaddingConfig2d::Same).init::<Flex>(&device);
/// let x = Tensor::<Flex, 4>::random([2, 32, 16, 16], Distribution::Default, &device);
/// assert_eq!(conv.forward(x).dims(), [2, 64, 16, 16]);
/// ```
#[derive(Config, Debug)]
pub struct SkConv2dConfig {
    /// The number of input and output channels.
    pub channels: [usize; 2],
    /// The size of the kernel.
    pub kernel_size: [usize; 2],
    /// `T`, the number of sketched terms.
    pub num_terms: usize,
    /// `k`, the rank of each term's first factor (the second has rank `k·kh·kw`).
    pub low_rank: usize,
    /// The stride of the convolution.
    #[config(default = "[1, 1]")]
    pub stride: [usize; 2],
    /// Spacing between kernel elements.
    #[config(default = "[1, 1]")]
    pub dilation: [usize; 2],
    /// Controls the connections between input and output channels.
    #[config(default = "1")]
    pub groups: usize,
    /// The padding configuration.
    #[config(default = "PaddingConfig2d::Valid")]
    pub padding: PaddingConfig2d,
    /// If a bias is added.
    #[config(default = true)]
    pub bias: bool,
    /// Draw the fixed sketches from this seed on the host and record them as the seed (see
    /// `SkLinearConfig::sketch_seed`); `None` draws them from the backend's generator.
    #[config(default = "None")]
    pub sketch_seed: Option<u64>,
}

impl SkConv2dConfig {
    /// Checks the sizes: none zero, channels divisible by `groups`.
    pub fn validate(&self) -> Result<(), SketchError> {
        let sizes = [
            ("channels[0]", self.channels[0]),
            ("channels[1]", self.channels[1]),
            ("kernel_size[0]", self.kernel_size[0]),
            ("kernel_size[1]", self.kernel_size[1]),
            ("num_terms", self.num_terms),
            ("low_rank", self.low_rank),
            ("stride[0]", self.stride[0]),
            ("stride[1]", self.stride[1]),
            ("dilation[0]", self.dilation[0]),
            ("dilation[1]", self.dilation[1]),
            ("groups", self.groups),
        ];
        SketchError::first_zero(sizes)?;
        for (name, value) in [
            ("channels[0]", self.channels[0]),
            ("channels[1]", self.channels[1]),
        ] {
            if value % self.groups != 0 {
                return Err(SketchError::InvalidConfig {
                    name,
                    value,
                    reason: "must be divisible by `groups`",
                });
            }
        }
        Ok(())
    }

    /// Initializes the layer with Panther's initialisation: a kernel drawn uniform in
    /// `±1/√(kh·kw·O/g)` (PyTorch's `kaiming_uniform_(a = √5)` on Panther's `[C, kh, kw, O]`
    /// kernel), sign sketches `±1/√rank`, `S1_t = K·U1_tᵀ` and `S2_t = U2_t·K`, and the bias
    /// uniform in the same bound.
    ///
    /// # Panics
    /// On an invalid size; [`try_init`](Self::try_init) returns the error instead.
    pub fn init<B: Backend>(&self, device: &B::Device) -> SkConv2d<B> {
        self.try_init(device)
            .unwrap_or_else(|err| panic!("cannot initialise SkConv2d: {err}"))
    }

    /// [`init`](Self::init), or the error naming the bad size.
    pub fn try_init<B: Backend>(&self, device: &B::Device) -> Result<SkConv2d<B>, SketchError> {
        self.validate()?;
        let g = self.groups;
        let (c, o) = (self.channels[0] / g, self.channels[1] / g);
        let window = self.kernel_size[0] * self.kernel_size[1];
        let (t, k) = (self.num_terms, self.low_rank);
        let bound = 1.0 / ((window * o) as f64).sqrt();
        let uniform = Distribution::Uniform(-bound, bound);
        // Per group, the kernel as a matrix `[C·kh·kw, O]` (rows ordered channel, row, column).
        let kernel = Tensor::<B, 3>::random([g, c * window, o], uniform, device);
        let (u1, u2) = match self.sketch_seed {
            Some(seed) => (
                FixedSketch::seeded([g * t, k, o], k, seed.wrapping_mul(2), device),
                FixedSketch::seeded(
                    [g * t, k * window, c * window],
                    k * window,
                    seed.wrapping_mul(2).wrapping_add(1),
                    device,
                ),
            ),
            None => (
                FixedSketch::new(sign_sketch::<B>([g * t, k, o], k, device)),
                FixedSketch::new(sign_sketch::<B>(
                    [g * t, k * window, c * window],
                    k * window,
                    device,
                )),
            ),
        };
        let (u1s, u2s) = (u1.val(), u2.val());
        // S1: [g, C·kk, O] · [g, O, T·k] → [g, C·kk, T, k] → [g·T, C·kk, k].
        let u1_stacked = u1s.clone().reshape([g, t * k, o]).swap_dims(1, 2);
        let s1s = kernel
            .clone()
            .matmul(u1_stacked)
            .reshape([g, c * window, t, k])
            .swap_dims(1, 2)
            .reshape([g * t, c * window, k]);
        // S2: [g, T·k·kk, C·kk] · [g, C·kk, O] → [g·T, k·kk, O].
        let s2s = u2s
            .clone()
            .reshape([g, t * k * window, c * window])
            .matmul(kernel)
            .reshape([g * t, k * window, o]);
        let bias = self
            .bias
            .then(|| Param::from_tensor(Tensor::random([self.channels[1]], uniform, device)));
        Ok(SkConv2d {
            s1s: Param::from_tensor(s1s),
            s2s: Param::from_tensor(s2s),
            u1s: u1,
            u2s: u2,
            bias,
            kernel_size: self.kernel_size,
            stride: self.stride,
            dilation: self.dilation,
            groups: self.groups,
            padding: self.padding.clone(),
        })
    }
}

/// A 2-D convolution whose kernel is the sketched estimate
/// `K̂ = 1/(2T) · Σ_t (S1_t·U1_t + U2_tᵀ·S2_t)`, run as a `kh × kw` convolution to
/// `T·k·(1 + kh·kw)` channels and a `1 × 1` one (the book's "The sketched convolution").
#[derive(Module, Debug)]
#[module(custom_display)]
pub struct SkConv2d<B: Backend> {
    /// Trained first factors, `[groups·T, C/g·kh·kw, k]`.
    pub s1s: Param<Tensor<B, 3>>,
    /// Trained second factors, `[groups·T, k·kh·kw, O/g]`.
    pub s2s: Param<Tensor<B, 3>>,
    /// Fixed sign sketches paired with `s1s`, `[groups·T, k, O/g]`; recorded whole, or as
    /// their seed ([`SkConv2dConfig::sketch_seed`]).
    pub u1s: FixedSketch<B>,
    /// Fixed sign sketches paired with `s2s`, `[groups·T, k·kh·kw, C/g·kh·kw]`, likewise.
    pub u2s: FixedSketch<B>,
    /// Optional bias, `[O]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// The size of the kernel.
    pub kernel_size: [usize; 2],
    /// The stride.
    pub stride: [usize; 2],
    /// The dilation.
    pub dilation: [usize; 2],
    /// The groups.
    pub groups: usize,
    /// The padding configuration.
    pub padding: PaddingConfig2d,
}

impl<B: Backend> SkConv2d<B> {
    /// Applies the convolution.
    ///
    /// # Shapes
    /// - input: `[batch, channels_in, height, width]`
    /// - output: `[batch, channels_out, height_out, width_out]`
    ///
    /// # Panics
    /// If the input's channels differ from the layer's.
    pub fn forward(&self, input: Tensor<B, 4>) -> Tensor<B, 4> {
        let [_, channels, height, width] = input.dims();
        assert_eq!(
            channels,
            self.channels_in(),
            "SkConv2d expects {} input channels, got {channels}",
            self.channels_in()
        );
        let (input, padding) = self.pad(input, height, width);
        let (spatial, mixing) = self.factors();
        // Both terms are a `kh × kw` convolution to `T·k·(1 + kh·kw)` channels (`x·S1` and
        // `x·U2ᵀ`, stacked), then a 1 × 1 convolution to the outputs (`·U1` and `·S2`):
        // Burn's own convolutions, on every backend, with its strides, dilation and groups.
        let reduced = conv2d(
            input,
            spatial,
            None,
            ConvOptions::new(self.stride, padding, self.dilation, self.groups),
        );
        conv2d(
            reduced,
            mixing,
            self.bias.as_ref().map(|bias| bias.val()),
            ConvOptions::new([1, 1], [0, 0], [1, 1], self.groups),
        )
    }

    /// The two convolutions' kernels: `[g·r, C/g, kh, kw]` (`S1_tᵀ` then `U2_t` of each term,
    /// `r = T·k·(1 + kh·kw)` rows per group) and `[O, r, 1, 1]` (`U1_t` then `S2_t`, over
    /// `2T`).
    fn factors(&self) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (g, t) = (self.groups, self.num_terms());
        let [_, c_window, k] = self.s1s.dims();
        let rank2 = self.s2s.dims()[1];
        let o = self.u1s.dims()[2];
        let [kh, kw] = self.kernel_size;
        let c = c_window / (kh * kw);
        // [g·T, C·kk, k] → [g, T·k, C·kk]
        let s1t = self.s1s.val().swap_dims(1, 2).reshape([g, t * k, c_window]);
        let u2 = self.u2s.val().reshape([g, t * rank2, c_window]);
        let r = t * (k + rank2);
        let spatial = Tensor::cat(vec![s1t, u2], 1).reshape([g * r, c, kh, kw]);
        let u1 = self.u1s.val().reshape([g, t * k, o]);
        let s2 = self.s2s.val().reshape([g, t * rank2, o]);
        let mixing = Tensor::cat(vec![u1, s2], 1)
            .swap_dims(1, 2)
            .reshape([g * o, r, 1, 1])
            .div_scalar(2.0 * t as f64);
        (spatial, mixing)
    }

    /// The symmetric padding to hand the convolution, the input zero-padded first (Burn's
    /// `Tensor::pad`) where the padding
    /// is asymmetric (`Same` with an even kernel, or `Explicit` with unequal sides).
    fn pad(&self, input: Tensor<B, 4>, height: usize, width: usize) -> (Tensor<B, 4>, [usize; 2]) {
        let same = |size: usize, kernel: usize, stride: usize, dilation: usize| {
            let extent = dilation * (kernel - 1) + 1;
            let out = size.div_ceil(stride);
            let total = ((out - 1) * stride + extent).saturating_sub(size);
            (total / 2, total - total / 2)
        };
        let ((top, bottom), (left, right)) = match self.padding {
            PaddingConfig2d::Valid => ((0, 0), (0, 0)),
            PaddingConfig2d::Same => (
                same(
                    height,
                    self.kernel_size[0],
                    self.stride[0],
                    self.dilation[0],
                ),
                same(width, self.kernel_size[1], self.stride[1], self.dilation[1]),
            ),
            PaddingConfig2d::Explicit(top, left, bottom, right) => ((top, bottom), (left, right)),
        };
        if top == bottom && left == right {
            return (input, [top, left]);
        }
        (
            input.pad((left, right, top, bottom), PadMode::Constant(0.0)),
            [0, 0],
        )
    }

    /// The effective kernel `K̂` in Burn's `Conv2d` layout, `[O, C/g, kh, kw]`: the
    /// convolution by it equals [`forward`](Self::forward).
    pub fn to_dense_kernel(&self) -> Tensor<B, 4> {
        let (spatial, mixing) = self.factors();
        let [rows, c, kh, kw] = spatial.dims();
        let [outputs, r, _, _] = mixing.dims();
        let g = self.groups;
        // Per group, [O, r] · [r, C·kh·kw].
        mixing
            .reshape([g, outputs / g, r])
            .matmul(spatial.reshape([g, rows / g, c * kh * kw]))
            .reshape([outputs, c, kh, kw])
    }

    /// The number of input channels.
    pub fn channels_in(&self) -> usize {
        self.u2s.dims()[2] / (self.kernel_size[0] * self.kernel_size[1]) * self.groups
    }

    /// The number of output channels.
    pub fn channels_out(&self) -> usize {
        self.u1s.dims()[2] * self.groups
    }

    /// `T`.
    pub fn num_terms(&self) -> usize {
        self.s1s.dims()[0] / self.groups
    }

    /// `k`.
    pub fn low_rank(&self) -> usize {
        self.s1s.dims()[2]
    }

    /// Trained weights: both factors and the bias (the sketches are fixed).
    pub fn num_trainable(&self) -> usize {
        self.s1s.val().shape().num_elements()
            + self.s2s.val().shape().num_elements()
            + self.bias.as_ref().map_or(0, |_| self.channels_out())
    }
}

impl<B: Backend> ModuleDisplay for SkConv2d<B> {
    fn custom_settings(&self) -> Option<DisplaySettings> {
        DisplaySettings::new()
            .with_new_line_after_attribute(false)
            .optional()
    }

    fn custom_content(&self, content: Content) -> Option<Content> {
        content
            .add("channels_in", &self.channels_in())
            .add("channels_out", &self.channels_out())
            .add("kernel_size", &format!("{:?}", self.kernel_size))
            .add("num_terms", &self.num_terms())
            .add("low_rank", &self.low_rank())
            .optional()
    }
}
