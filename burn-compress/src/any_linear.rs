//! [`AnyLinear`]: a linear layer whose kind (dense, sketched, low-rank, `int8`) is chosen at
//! run time, so one model type serves every arm of a study and a trained dense model can be
//! sketched or quantized in place (see [`Converter`](super::Converter)).

use burn::config::Config;
use burn::module::{
    AutodiffModule, Content, Devices, HasAutodiffModule, Module, ModuleDisplay,
    ModuleDisplayDefault, ModuleMapper, ModuleVisitor,
};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use serde::{Deserialize, Serialize};

use super::{Int8Linear, LowRankLinear, LowRankLinearConfig};
use burn_sketch::{Activation, ActivationExt, SkLinear, SkLinearConfig, SketchBackend, SketchInit};

use crate::CompressError;

/// Which layer an [`AnyLinearConfig`] builds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinearKind {
    /// Burn's `nn::Linear`.
    #[default]
    Dense,
    /// [`SkLinear`] with `num_terms` terms of rank `low_rank`.
    Sketched {
        /// The number of terms `T`.
        num_terms: usize,
        /// The rank `k` of each term.
        low_rank: usize,
    },
    /// [`LowRankLinear`] of rank `rank`.
    LowRank {
        /// The rank `r`.
        rank: usize,
    },
    /// [`Int8Linear`]: a trained dense or sketched layer quantized to `int8` for inference.
    /// It is made by converting one ([`AnyLinear::try_convert`]), never initialised, and has
    /// nothing to train.
    Int8,
}

impl LinearKind {
    /// Trainable parameters of a `d_input → d_output` layer of this kind, bias included.
    pub fn trainable_params(&self, d_input: usize, d_output: usize, bias: bool) -> usize {
        let bias = if bias { d_output } else { 0 };
        bias + match *self {
            Self::Dense => d_input * d_output,
            Self::Sketched {
                num_terms,
                low_rank,
            } => num_terms * low_rank * (d_input + d_output),
            Self::LowRank { rank } => rank * (d_input + d_output),
            Self::Int8 => return 0,
        }
    }
}

impl std::fmt::Display for LinearKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dense => write!(f, "dense"),
            Self::Sketched {
                num_terms,
                low_rank,
            } => write!(f, "sketched T={num_terms} k={low_rank}"),
            Self::LowRank { rank } => write!(f, "low-rank r={rank}"),
            Self::Int8 => write!(f, "int8"),
        }
    }
}

/// Configuration of an [`AnyLinear`].
///
/// ```
/// use burn::backend::Flex;
/// use burn_compress::{AnyLinearConfig, LinearKind};
///
/// let kind = LinearKind::Sketched { num_terms: 1, low_rank: 8 };
/// let layer = AnyLinearConfig::new(64, 32).with_kind(kind).init::<Flex>(&Default::default());
/// assert_eq!(layer.kind(), kind);
/// ```
#[derive(Config, Debug)]
pub struct AnyLinearConfig {
    /// The size of the input features.
    pub d_input: usize,
    /// The size of the output features.
    pub d_output: usize,
    /// If a bias is added.
    #[config(default = true)]
    pub bias: bool,
    /// The layer to build.
    #[config(default = "LinearKind::Dense")]
    pub kind: LinearKind,
}

impl AnyLinearConfig {
    /// Initializes the layer with its kind's own initialisation.
    ///
    /// # Panics
    /// If a size is zero; [`try_init`](Self::try_init) returns the error instead.
    pub fn init<B: Backend>(&self, device: &B::Device) -> AnyLinear<B> {
        self.try_init(device)
            .unwrap_or_else(|err| panic!("cannot initialise AnyLinear: {err}"))
    }

    /// [`init`](Self::init), or the error naming the bad size ([`LinearKind::Int8`] is
    /// [`CompressError::Unsupported`]: an `int8` layer comes from a trained one).
    pub fn try_init<B: Backend>(&self, device: &B::Device) -> Result<AnyLinear<B>, CompressError> {
        let (d_in, d_out) = (self.d_input, self.d_output);
        let layer = match self.kind {
            LinearKind::Dense => {
                CompressError::first_zero([("d_input", d_in), ("d_output", d_out)])?;
                LinearLayer::Dense(
                    LinearConfig::new(d_in, d_out)
                        .with_bias(self.bias)
                        .init(device),
                )
            }
            LinearKind::Sketched {
                num_terms,
                low_rank,
            } => LinearLayer::Sketched(
                SkLinearConfig::new(d_in, d_out, num_terms, low_rank)
                    .with_bias(self.bias)
                    .try_init(device)?,
            ),
            LinearKind::LowRank { rank } => LinearLayer::LowRank(
                LowRankLinearConfig::new(d_in, d_out, rank)
                    .with_bias(self.bias)
                    .try_init(device)?,
            ),
            LinearKind::Int8 => {
                return Err(CompressError::Unsupported {
                    what: "initialising an int8 layer (convert a trained one instead)".into(),
                });
            }
        };
        Ok(AnyLinear { layer })
    }
}

/// The layers an [`AnyLinear`] can hold.
// The variants differ in size (a `SkLinear` holds five tensor handles), but a model holds a
// handful of layers, and Burn's `Module` derive has no boxed form.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum LinearLayer<B: Backend> {
    /// A dense `nn::Linear`.
    Dense(Linear<B>),
    /// A sketched layer.
    Sketched(SkLinear<B>),
    /// A plain low-rank layer.
    LowRank(LowRankLinear<B>),
    /// A dense or sketched layer quantized to `int8`.
    Int8(Int8Linear<B>),
}

/// A linear layer that is dense, sketched or low-rank: the kind is data, not a type, so a
/// model built from `AnyLinear`s can be trained dense, sketched by a
/// [`Converter`](super::Converter), and loaded from either kind of checkpoint.
///
/// Records and paths go through the held layer, with the variant as one more path segment
/// (`attention.query.Dense.weight`, `attention.query.Sketched.s1s`), so a dense checkpoint loads
/// into a dense-built model and a sketched one into a sketched-built model.
#[derive(Debug, Clone)]
pub struct AnyLinear<B: Backend> {
    layer: LinearLayer<B>,
}

impl<B: Backend> AnyLinear<B> {
    /// The held layer.
    pub fn layer(&self) -> &LinearLayer<B> {
        &self.layer
    }

    /// The held layer, by value.
    pub fn into_layer(self) -> LinearLayer<B> {
        self.layer
    }

    /// The layer's kind and sizes.
    pub fn kind(&self) -> LinearKind {
        match &self.layer {
            LinearLayer::Dense(_) => LinearKind::Dense,
            LinearLayer::Sketched(layer) => LinearKind::Sketched {
                num_terms: layer.num_terms(),
                low_rank: layer.low_rank(),
            },
            LinearLayer::LowRank(layer) => LinearKind::LowRank { rank: layer.rank() },
            LinearLayer::Int8(_) => LinearKind::Int8,
        }
    }

    /// The size of the input features.
    pub fn d_input(&self) -> usize {
        match &self.layer {
            LinearLayer::Dense(layer) => layer.weight.dims()[0],
            LinearLayer::Sketched(layer) => layer.d_input(),
            LinearLayer::LowRank(layer) => layer.d_input(),
            LinearLayer::Int8(layer) => layer.d_input(),
        }
    }

    /// The size of the output features.
    pub fn d_output(&self) -> usize {
        match &self.layer {
            LinearLayer::Dense(layer) => layer.weight.dims()[1],
            LinearLayer::Sketched(layer) => layer.d_output(),
            LinearLayer::LowRank(layer) => layer.d_output(),
            LinearLayer::Int8(layer) => layer.d_output(),
        }
    }

    /// If the layer adds a bias.
    pub fn has_bias(&self) -> bool {
        match &self.layer {
            LinearLayer::Dense(layer) => layer.bias.is_some(),
            LinearLayer::Sketched(layer) => layer.bias.is_some(),
            LinearLayer::LowRank(layer) => layer.bias.is_some(),
            LinearLayer::Int8(layer) => layer.bias.is_some(),
        }
    }

    /// Weights that training updates (a sketched layer's fixed sketches excluded).
    pub fn num_trainable(&self) -> usize {
        self.kind()
            .trainable_params(self.d_input(), self.d_output(), self.has_bias())
    }

    /// The dense weight `[d_input, d_output]` the layer applies (`forward(x) = x·W + b`).
    pub fn to_dense_weight(&self) -> Tensor<B, 2> {
        match &self.layer {
            LinearLayer::Dense(layer) => layer.weight.val(),
            LinearLayer::Sketched(layer) => layer.to_dense_weight(),
            LinearLayer::LowRank(layer) => layer.a.val().matmul(layer.b.val()),
            LinearLayer::Int8(layer) => layer.to_dense_weight(),
        }
    }

    /// This layer converted as `kind` says: a dense layer becomes the [`SkLinear`] that
    /// estimates it ([`SkLinear::try_from_linear`]) or its best low-rank approximation by the
    /// randomized SVD ([`LowRankLinear::try_from_linear`]); a dense or sketched layer becomes
    /// its [`Int8Linear`] for [`LinearKind::Int8`]; a layer already of that kind is returned as
    /// it is. Other conversions (between sketch sizes or ranks, or out of `int8`) are
    /// [`CompressError::Unsupported`].
    pub fn try_convert(self, kind: LinearKind) -> Result<Self, CompressError> {
        self.try_convert_with(kind, SketchInit::Unbiased)
    }

    /// [`try_convert`](Self::try_convert), a dense layer sketched with `init`
    /// ([`SkLinear::try_from_linear_with`]).
    pub fn try_convert_with(
        self,
        kind: LinearKind,
        init: SketchInit,
    ) -> Result<Self, CompressError> {
        if self.kind() == kind {
            return Ok(self);
        }
        let from = self.kind();
        match (self.layer, kind) {
            (
                LinearLayer::Dense(dense),
                LinearKind::Sketched {
                    num_terms,
                    low_rank,
                },
            ) => Ok(Self {
                layer: LinearLayer::Sketched(SkLinear::try_from_linear_with(
                    &dense, num_terms, low_rank, init,
                )?),
            }),
            (LinearLayer::Dense(dense), LinearKind::LowRank { rank }) => Ok(Self {
                layer: LinearLayer::LowRank(LowRankLinear::try_from_linear(&dense, rank)?),
            }),
            (LinearLayer::Dense(dense), LinearKind::Int8) => Ok(Self {
                layer: LinearLayer::Int8(Int8Linear::from_linear(&dense)),
            }),
            (LinearLayer::Sketched(sketched), LinearKind::Int8) => Ok(Self {
                layer: LinearLayer::Int8(Int8Linear::from_sketched(&sketched)),
            }),
            _ => Err(CompressError::Unsupported {
                what: format!("converting a {from} layer to {kind}"),
            }),
        }
    }
}

impl<B: SketchBackend> AnyLinear<B> {
    /// Applies the layer to the input's last dimension.
    ///
    /// # Shapes
    /// - input: `[..., d_input]`
    /// - output: `[..., d_output]`
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        self.forward_activated(input, Activation::Identity)
    }

    /// [`forward`](Self::forward) followed by `activation`: inside the product's output pass
    /// for sketched layers ([`SkLinear::forward_activated`]) and `int8` ones, a tensor
    /// operation after it for dense and low-rank ones.
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    pub fn forward_activated<const D: usize>(
        &self,
        input: Tensor<B, D>,
        activation: Activation,
    ) -> Tensor<B, D> {
        match &self.layer {
            LinearLayer::Dense(layer) => activation.apply(layer.forward(input)),
            LinearLayer::Sketched(layer) => layer.forward_activated(input, activation),
            LinearLayer::LowRank(layer) => activation.apply(layer.forward(input)),
            LinearLayer::Int8(layer) => layer.forward_activated(input, activation),
        }
    }
}

impl<B: Backend> From<Linear<B>> for AnyLinear<B> {
    fn from(layer: Linear<B>) -> Self {
        Self {
            layer: LinearLayer::Dense(layer),
        }
    }
}

impl<B: Backend> From<SkLinear<B>> for AnyLinear<B> {
    fn from(layer: SkLinear<B>) -> Self {
        Self {
            layer: LinearLayer::Sketched(layer),
        }
    }
}

impl<B: Backend> From<LowRankLinear<B>> for AnyLinear<B> {
    fn from(layer: LowRankLinear<B>) -> Self {
        Self {
            layer: LinearLayer::LowRank(layer),
        }
    }
}

// `Module` by hand rather than derived: `map` is where a `Converter` swaps the held layer (a
// `ModuleMapper` can only replace parameter values, never a module's type). Everything else
// goes to the held layer, with no path segment of its own.
impl<B: Backend> Module<B> for AnyLinear<B> {
    type Record = <LinearLayer<B> as Module<B>>::Record;

    fn collect_devices(&self, devices: Devices<B>) -> Devices<B> {
        self.layer.collect_devices(devices)
    }

    fn fork(self, device: &B::Device) -> Self {
        Self {
            layer: self.layer.fork(device),
        }
    }

    fn to_device(self, device: &B::Device) -> Self {
        Self {
            layer: self.layer.to_device(device),
        }
    }

    fn visit<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        self.layer.visit(visitor)
    }

    fn map<M: ModuleMapper<B>>(self, mapper: &mut M) -> Self {
        let converted = super::convert::convert_in_place(self);
        Self {
            layer: converted.layer.map(mapper),
        }
    }

    fn load_record(self, record: Self::Record) -> Self {
        Self {
            layer: self.layer.load_record(record),
        }
    }

    fn into_record(self) -> Self::Record {
        self.layer.into_record()
    }
}

impl<B: AutodiffBackend> AutodiffModule<B> for AnyLinear<B> {
    type InnerModule = AnyLinear<B::InnerBackend>;

    fn valid(&self) -> Self::InnerModule {
        AnyLinear {
            layer: self.layer.valid(),
        }
    }

    fn from_inner(module: Self::InnerModule) -> Self {
        Self {
            layer: LinearLayer::from_inner(module.layer),
        }
    }
}

impl<B: AutodiffBackend> HasAutodiffModule<B> for AnyLinear<B::InnerBackend> {
    type TrainModule = AnyLinear<B>;
}

impl<B: Backend> ModuleDisplayDefault for AnyLinear<B> {
    fn content(&self, content: Content) -> Option<Content> {
        self.layer.content(content)
    }
}

impl<B: Backend> ModuleDisplay for AnyLinear<B> {
    fn format(&self, passed_settings: burn::module::DisplaySettings) -> String {
        self.layer.format(passed_settings)
    }
}
