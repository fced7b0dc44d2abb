//! The MLP classifier the examples train, with sketched or dense hidden layers.

use burn::config::Config;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Int, Tensor};
use burn::train::{ClassificationOutput, InferenceStep, TrainOutput, TrainStep};
use burn_compress::Int8Linear;
use burn_compress::prune::{MaskedLinear, PruneConfig, SparsityReport, shrink_pair};
use burn_memory::{Layers, MixedPrecision, Segments, SharedMixedPrecision, segmented_backward};
use burn_profiler::{StepProfiler, scope};
use burn_sketch::{Activation, SkLinear, SkLinearConfig, SketchBackend};

use crate::data::DigitBatch;

/// Sizes of the MLP and how its hidden layers are built.
#[derive(Config, Debug)]
pub struct MlpConfig {
    /// Input features (784 for 28×28 digits).
    #[config(default = 784)]
    pub d_input: usize,
    /// Widths of the hidden layers.
    #[config(default = "vec![512, 256]")]
    pub hidden: Vec<usize>,
    /// Output classes.
    #[config(default = 10)]
    pub classes: usize,
    /// Sketched hidden layers: number of terms.
    #[config(default = 1)]
    pub num_terms: usize,
    /// Sketched hidden layers: rank of each term.
    #[config(default = 32)]
    pub low_rank: usize,
    /// Use dense `Linear` hidden layers instead (the baseline).
    #[config(default = false)]
    pub dense: bool,
}

/// An MLP whose hidden layers are either all sketched or all dense; the small output layer is
/// always dense.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    sketched: Vec<SkLinear<B>>,
    dense: Vec<Linear<B>>,
    output: Linear<B>,
    /// Mixed-precision training state, shared by the model's copies (the learner's
    /// `TrainStep` takes `&self`, yet the loss scale changes between steps) and saved with its
    /// checkpoints.
    amp: SharedMixedPrecision<B>,
    /// Segment checkpointing of the training step (burn-memory), if on: a run-time choice, not
    /// part of the model's record.
    #[module(skip)]
    segments: Option<Segments>,
    /// Profiling of a window of training steps (burn-memory), if on: each step marks its
    /// start. A run-time choice, not part of the model's record.
    #[module(skip)]
    profiler: Option<StepProfiler>,
}

impl MlpConfig {
    /// Initializes the model.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Mlp<B> {
        let widths: Vec<usize> = std::iter::once(self.d_input)
            .chain(self.hidden.iter().copied())
            .collect();
        let pairs = widths.windows(2).map(|w| (w[0], w[1]));
        let (sketched, dense) = if self.dense {
            let layers = pairs.map(|(i, o)| LinearConfig::new(i, o).init(device));
            (Vec::new(), layers.collect())
        } else {
            let layers = pairs.map(|(i, o)| {
                SkLinearConfig::new(i, o, self.num_terms, self.low_rank).init(device)
            });
            (layers.collect(), Vec::new())
        };
        let last = *widths.last().expect("at least the input width");
        Mlp {
            sketched,
            dense,
            output: LinearConfig::new(last, self.classes).init(device),
            amp: SharedMixedPrecision::none(),
            segments: None,
            profiler: None,
        }
    }
}

impl<B: SketchBackend> Mlp<B> {
    /// Logits `[n, classes]` for inputs `[n, d_input]`.
    ///
    /// Each layer runs in a profiler scope (`hidden 1`, …, `output`), which names it in
    /// `train_mnist --profile`'s table, trace and memory peak, and costs an atomic load
    /// otherwise.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        const HIDDEN: [&str; 8] = [
            "hidden 1", "hidden 2", "hidden 3", "hidden 4", "hidden 5", "hidden 6", "hidden 7",
            "hidden 8",
        ];
        let layers = self.num_layers();
        (0..layers).fold(x, |x, index| {
            let name = if index + 1 == layers {
                "output"
            } else {
                HIDDEN.get(index).copied().unwrap_or("hidden")
            };
            let _layer = scope(name);
            self.forward_layer(index, x)
        })
    }
}

/// The layers segment checkpointing splits: each hidden layer with its ReLU, then the output
/// layer.
impl<B: SketchBackend> Layers<B> for Mlp<B> {
    fn num_layers(&self) -> usize {
        self.layer_count()
    }

    fn forward_layer(&self, index: usize, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let dense = index.checked_sub(self.sketched.len());
        match (
            self.sketched.get(index),
            dense.and_then(|i| self.dense.get(i)),
        ) {
            // The ReLU inside the sketched product's output pass.
            (Some(layer), _) => layer.forward_activated(x, Activation::Relu),
            (None, Some(layer)) => relu(layer.forward(x)),
            (None, None) => self.output.forward(x),
        }
    }
}

impl<B: Backend> Mlp<B> {
    /// The same network with each dense hidden layer replaced by
    /// [`SkLinear::try_from_linear`] (an unbiased sketch of its weight, its bias copied); the
    /// output layer is kept as it is. Hidden layers that are already sketched stay.
    pub fn to_sketched(
        &self,
        num_terms: usize,
        low_rank: usize,
    ) -> Result<Self, burn_sketch::SketchError> {
        let converted = self
            .dense
            .iter()
            .map(|layer| SkLinear::try_from_linear(layer, num_terms, low_rank))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            sketched: self.sketched.iter().cloned().chain(converted).collect(),
            dense: Vec::new(),
            output: self.output.clone(),
            amp: self.amp.clone(),
            segments: self.segments.clone(),
            profiler: self.profiler.clone(),
        })
    }

    /// Relative Frobenius error `‖W − Ŵ‖ / ‖W‖` of each hidden layer of `sketched` (from
    /// [`to_sketched`](Self::to_sketched)) against the dense layer it replaced.
    pub fn weight_errors(&self, sketched: &Self) -> Vec<f64> {
        use burn::tensor::ElementConversion;
        self.dense
            .iter()
            .zip(&sketched.sketched)
            .map(|(dense, sketch)| {
                let w = dense.weight.val();
                let diff = w.clone() - sketch.to_dense_weight();
                let norm = |t: Tensor<B, 2>| t.square().sum().sqrt().into_scalar().elem::<f64>();
                norm(diff) / norm(w)
            })
            .collect()
    }

    /// The model trained with mixed precision: its training steps run forward and backward in
    /// `amp`'s compute type over the f32 weights, with loss scaling (burn-memory).
    pub fn with_amp(mut self, amp: MixedPrecision) -> Self {
        self.amp = SharedMixedPrecision::new(amp);
        self
    }

    /// The model trained with segment checkpointing (burn-memory's `segmented_backward`):
    /// its training steps keep only the inputs of `segments` and recompute each segment in the
    /// backward pass. Fails if `segments` does not fit the model's layers (hidden layers and
    /// the output layer).
    pub fn with_segments(mut self, segments: Segments) -> Result<Self, burn_memory::MemoryError> {
        segments.ranges(self.layer_count())?;
        self.segments = Some(segments);
        Ok(self)
    }

    /// The model with `profiler` told of each training step's start (see burn-profiler's
    /// `StepProfiler`).
    pub fn with_profiler(mut self, profiler: StepProfiler) -> Self {
        self.profiler = Some(profiler);
        self
    }

    /// The layers segment checkpointing splits: the hidden layers and the output layer.
    fn layer_count(&self) -> usize {
        self.sketched.len() + self.dense.len() + 1
    }

    /// The mixed-precision state (current loss scale, skipped steps), if training uses it.
    pub fn amp(&self) -> Option<MixedPrecision> {
        self.amp.get()
    }

    /// Trainable parameters of the hidden layers, the part that sketching shrinks.
    pub fn hidden_trainable_params(&self) -> usize {
        let sketched: usize = self
            .sketched
            .iter()
            .map(|l| l.param_counts().trainable)
            .sum();
        let dense: usize = self.dense.iter().map(|l| l.num_params()).sum();
        sketched + dense
    }

    /// Trainable parameters of the whole model (fixed sketches excluded).
    pub fn trainable_params(&self) -> usize {
        self.hidden_trainable_params() + self.output.num_params()
    }

    /// The network for inference with `int8` weights: every layer, hidden and output,
    /// quantized (burn-compress's [`Int8Linear`], PyTorch's `quantize_dynamic` of the same
    /// layers).
    pub fn to_int8(&self) -> Int8Mlp<B> {
        let hidden = self.sketched.iter().map(Int8Linear::from_sketched);
        let dense = self
            .dense
            .iter()
            .chain([&self.output])
            .map(Int8Linear::from_linear);
        Int8Mlp {
            layers: hidden.chain(dense).collect(),
        }
    }
}

impl<B: Backend> Mlp<B> {
    /// The network with its dense hidden layers pruned as `config` says, each keeping its
    /// mask in the forward so that fine-tuning leaves the pruned weights at zero
    /// (burn-compress's `prune`); the small output layer is kept whole.
    ///
    /// # Errors
    /// From the pruning (an amount outside `[0, 1]`); [`CompressError::Unsupported`] for an
    /// MLP with sketched hidden layers, which this prunes no part of.
    ///
    /// [`CompressError::Unsupported`]: burn_compress::CompressError::Unsupported
    pub fn to_masked(
        &self,
        config: &PruneConfig,
    ) -> Result<MaskedMlp<B>, burn_compress::CompressError> {
        self.dense_only()?;
        let hidden = self
            .dense
            .iter()
            .map(|layer| config.prune(layer.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MaskedMlp {
            hidden,
            output: self.output.clone(),
        })
    }

    /// The network with a fraction of each dense hidden layer's units removed for real:
    /// `config` (a structured pruning) picks the rows of each hidden layer, and the rows and
    /// the next layer's matching inputs are dropped, giving narrower dense layers.
    ///
    /// # Errors
    /// As [`to_masked`](Self::to_masked); [`CompressError::Unsupported`] for an unstructured
    /// `config`, which removes no whole unit; `InvalidShape` when a layer would keep no unit.
    ///
    /// [`CompressError::Unsupported`]: burn_compress::CompressError::Unsupported
    pub fn shrink_hidden(
        &self,
        config: &PruneConfig,
    ) -> Result<Self, burn_compress::CompressError> {
        self.dense_only()?;
        let mut hidden = self.dense.clone();
        let mut output = self.output.clone();
        for i in 0..hidden.len() {
            let masked = config.prune(hidden[i].clone())?;
            let keep = masked.kept_outputs()?.ok_or_else(|| {
                burn_compress::CompressError::Unsupported {
                    what: "shrinking after unstructured pruning (it removes no whole unit)".into(),
                }
            })?;
            let next = hidden.get(i + 1).unwrap_or(&output);
            let (first, second) = shrink_pair(&masked.make_permanent(), next, &keep)?;
            hidden[i] = first;
            match hidden.get_mut(i + 1) {
                Some(layer) => *layer = second,
                None => output = second,
            }
        }
        Ok(Self {
            sketched: Vec::new(),
            dense: hidden,
            output,
            amp: self.amp.clone(),
            segments: self.segments.clone(),
            profiler: self.profiler.clone(),
        })
    }

    /// Widths of the hidden layers' outputs.
    pub fn hidden_widths(&self) -> Vec<usize> {
        let dense = self.dense.iter().map(|l| l.weight.dims()[1]);
        self.sketched
            .iter()
            .map(|l| l.d_output())
            .chain(dense)
            .collect()
    }

    /// Parameters and zeros of each dense layer, the output layer included.
    pub fn sparsity(&self) -> SparsityReport {
        let mut report = SparsityReport::new();
        for (i, layer) in self.dense.iter().enumerate() {
            report.push(format!("hidden {}", i + 1), layer);
        }
        report.with("output", &self.output)
    }

    fn dense_only(&self) -> Result<(), burn_compress::CompressError> {
        if self.sketched.is_empty() {
            Ok(())
        } else {
            Err(burn_compress::CompressError::Unsupported {
                what: "pruning the MLP's sketched hidden layers (prune SkLinear layers one by \
                       one)"
                    .into(),
            })
        }
    }
}

/// [`Mlp`] with masked dense hidden layers ([`Mlp::to_masked`]), for fine-tuning after
/// pruning.
#[derive(Module, Debug)]
pub struct MaskedMlp<B: Backend> {
    hidden: Vec<MaskedLinear<B>>,
    output: Linear<B>,
}

impl<B: Backend> MaskedMlp<B> {
    /// Logits `[n, classes]` for inputs `[n, d_input]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self
            .hidden
            .iter()
            .fold(x, |x, layer| relu(layer.forward(x)));
        self.output.forward(x)
    }

    /// Parameters and zeros of each layer, as the forward uses them.
    pub fn sparsity(&self) -> SparsityReport {
        let mut report = SparsityReport::new();
        for (i, layer) in self.hidden.iter().enumerate() {
            report.push(format!("hidden {}", i + 1), layer);
        }
        report.with("output", &self.output)
    }

    /// The plain [`Mlp`], the zeros stored in its weights and no mask left.
    pub fn make_permanent(self) -> Mlp<B> {
        Mlp {
            sketched: Vec::new(),
            dense: self
                .hidden
                .into_iter()
                .map(MaskedLinear::make_permanent)
                .collect(),
            output: self.output,
            amp: SharedMixedPrecision::none(),
            segments: None,
            profiler: None,
        }
    }
}

/// [`Mlp`] with `int8` weights, for inference ([`Mlp::to_int8`]).
#[derive(Module, Debug)]
pub struct Int8Mlp<B: Backend> {
    layers: Vec<Int8Linear<B>>,
}

impl<B: Backend> Int8Mlp<B> {
    /// Logits `[n, classes]` for inputs `[n, d_input]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let last = self.layers.len() - 1;
        self.layers.iter().enumerate().fold(x, |x, (i, layer)| {
            // The ReLU in the int8 kernel's store.
            let activation = if i == last {
                Activation::Identity
            } else {
                Activation::Relu
            };
            layer.forward_activated(x, activation)
        })
    }

    /// Bytes of its tensors (one per weight).
    pub fn stored_bytes(&self) -> usize {
        self.layers.iter().map(Int8Linear::stored_bytes).sum()
    }
}

impl<B: SketchBackend> Mlp<B> {
    /// Logits, cross-entropy loss and targets of a batch, what burn-train's metrics read.
    pub fn forward_classification(&self, batch: DigitBatch<B>) -> ClassificationOutput<B> {
        classification(self.forward(batch.images), batch.targets)
    }
}

/// The cross-entropy loss of `logits` against `targets`, with both.
pub(crate) fn classification<B: Backend>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
) -> ClassificationOutput<B> {
    let loss = CrossEntropyLossConfig::new()
        .init(&logits.device())
        .forward(logits.clone(), targets.clone());
    ClassificationOutput::new(loss, logits, targets)
}

impl<B> TrainStep for Mlp<B>
where
    B: AutodiffBackend + SketchBackend,
    B::InnerBackend: SketchBackend,
{
    type Input = DigitBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: DigitBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        if let Some(profiler) = &self.profiler {
            profiler.step();
        }
        if let Some(segments) = &self.segments {
            return self.segmented_step(segments, batch);
        }
        let Some(mut amp) = self.amp.lock() else {
            let item = {
                let _forward = scope("forward");
                self.forward_classification(batch)
            };
            let grads = {
                let _backward = scope("backward");
                item.loss.backward()
            };
            return TrainOutput::new(self, grads, item);
        };
        // Forward and backward in the compute type; logits back in f32 for a stable loss.
        let logits = amp
            .cast_module(self)
            .forward(amp.cast_input(batch.images))
            .cast(DType::F32);
        let item = classification(logits, batch.targets);
        let scaled =
            GradientsParams::from_grads(amp.scale_loss(item.loss.clone()).backward(), self);
        // No gradients at all: the learner's optimizer then leaves the model alone.
        let grads = amp.unscale(self, scaled).unwrap_or_default();
        TrainOutput { grads, item }
    }
}

impl<B> Mlp<B>
where
    B: AutodiffBackend + SketchBackend,
    B::InnerBackend: SketchBackend,
{
    /// The training step with segment checkpointing, under mixed precision if it is on.
    fn segmented_step(
        &self,
        segments: &Segments,
        batch: DigitBatch<B>,
    ) -> TrainOutput<ClassificationOutput<B>> {
        let mut item = None;
        // The loss inside the last segment's graph; the classification output (logits, loss)
        // is kept for the learner's metrics.
        let loss = |logits: Tensor<B, 2>| {
            let out = classification(logits.cast(DType::F32), batch.targets.clone());
            let loss = out.loss.clone();
            item = Some(out);
            loss
        };
        let images = batch.images.clone();
        // `with_segments` checked the split against the layers; what is left to fail is the
        // read of the step's seeds from the device, which a `TrainStep` cannot report.
        const FITS: &str = "segments checked by with_segments; the device read the step's seeds";
        let grads = match self.amp.lock() {
            None => {
                segmented_backward(self, images, segments, loss)
                    .expect(FITS)
                    .grads
            }
            Some(mut amp) => {
                let scaled = amp
                    .segmented_backward(self, images, segments, loss)
                    .expect(FITS);
                amp.unscale(self, scaled.grads).unwrap_or_default()
            }
        };
        TrainOutput {
            grads,
            item: item.expect("the loss ran"),
        }
    }
}

impl<B: SketchBackend> InferenceStep for Mlp<B> {
    type Input = DigitBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, batch: DigitBatch<B>) -> ClassificationOutput<B> {
        self.forward_classification(batch)
    }
}
