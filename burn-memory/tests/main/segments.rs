//! Segment checkpointing: its gradients against the plain backward's (called from the NdArray
//! and wgpu modules), its splits and errors, its memory (exact heap bytes), and its composition
//! with mixed precision.

use burn::backend::{Autodiff, NdArray};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param, ParamId};
use burn::nn::{
    BatchNorm, BatchNormConfig, Dropout, DropoutConfig, LayerNorm, LayerNormConfig, Linear,
    LinearConfig,
};
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::activation::{relu, silu};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, DType, Distribution, ElementConversion, Int, Tensor, TensorData};
use burn_memory::{
    Layers, LossScale, MemoryError, MemoryTracker, MixedPrecisionConfig, Precision, SegmentSeeds,
    Segments, StepOutcome, segmented_backward,
};

/// Linear layers of changing widths, each followed by a norm and an activation (ReLU and
/// SiLU in turn), and a head used only by the loss.
#[derive(Module, Debug)]
pub struct Deep<B: Backend> {
    layers: Vec<Linear<B>>,
    norms: Vec<LayerNorm<B>>,
    head: Linear<B>,
}

impl<B: Backend> Deep<B> {
    pub fn new(widths: &[usize], device: &B::Device) -> Self {
        let pairs = widths.windows(2);
        Self {
            layers: pairs
                .clone()
                .map(|w| LinearConfig::new(w[0], w[1]).init(device))
                .collect(),
            norms: pairs
                .map(|w| LayerNormConfig::new(w[1]).init(device))
                .collect(),
            head: LinearConfig::new(*widths.last().unwrap(), 3).init(device),
        }
    }

    /// The loss the tests train: a squared head output.
    fn loss(&self, out: Tensor<B, 2>) -> Tensor<B, 1> {
        self.head.forward(out).powi_scalar(2).mean()
    }
}

impl<B: Backend> Layers<B> for Deep<B> {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn forward_layer(&self, index: usize, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = self.norms[index].forward(self.layers[index].forward(x));
        if index.is_multiple_of(2) {
            relu(x)
        } else {
            silu(x)
        }
    }
}

/// Every parameter's gradient, by id, as flat values (running statistics, which take no
/// gradient, are skipped).
fn flat<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    grads: &GradientsParams,
) -> Vec<(ParamId, Vec<f32>)> {
    struct Collect<'a>(&'a GradientsParams, Vec<(ParamId, Vec<f32>)>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if !param.val().is_require_grad() {
                return;
            }
            let grad = self
                .0
                .get::<B::InnerBackend, D>(param.id)
                .unwrap_or_else(|| {
                    panic!(
                        "no gradient for a parameter of shape {:?}",
                        param.val().dims()
                    )
                });
            self.1
                .push((param.id, grad.into_data().to_vec::<f32>().unwrap()));
        }
    }
    let mut collect = Collect(grads, Vec::new());
    model.visit(&mut collect);
    collect.1
}

/// Largest `|a − b|` over the largest `|b|`: the deviation relative to the gradient's scale.
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// The gradients of every parameter and of the input, with 1 segment, one per layer, uneven
/// splits and explicit boundaries, equal the plain backward's (f32: 1e-5 relative).
pub fn gradients_match_the_plain_backward<B: AutodiffBackend>(device: &B::Device) {
    let widths = [12, 16, 9, 16, 16, 7, 11, 8];
    let model = Deep::<B>::new(&widths, device);
    let x = Tensor::<B, 2>::random([10, 12], Distribution::Default, device);

    let plain_x = x.clone().require_grad();
    let out = (0..model.num_layers()).fold(plain_x.clone(), |h, i| model.forward_layer(i, h));
    let loss = model.loss(out);
    let plain_loss = loss.clone().into_scalar();
    let mut graph = loss.backward();
    let plain_input = plain_x.grad_remove(&mut graph).unwrap().into_data();
    let plain = flat(&model, &GradientsParams::from_grads(graph, &model));

    for segments in [
        Segments::Count(1),
        Segments::Count(7),
        Segments::Count(3),
        Segments::Sqrt,
        Segments::Boundaries(vec![1, 5]),
    ] {
        let step = segmented_backward(&model, x.clone().require_grad(), &segments, |out| {
            model.loss(out)
        })
        .unwrap();
        let loss: f32 = step.loss.into_scalar().elem();
        let plain_loss: f32 = plain_loss.elem();
        assert!(
            (loss - plain_loss).abs() <= 1e-6 * plain_loss.abs(),
            "{segments:?}"
        );
        for ((id, got), (_, want)) in flat(&model, &step.grads).iter().zip(&plain) {
            let err = rel_err(got, want);
            assert!(
                err <= 1e-5,
                "{segments:?}: parameter {id} deviates by {err}"
            );
        }
        let input = step.input_grad.expect("the input required a gradient");
        let err = rel_err(
            &input.into_data().to_vec::<f32>().unwrap(),
            &plain_input.to_vec::<f32>().unwrap(),
        );
        assert!(
            err <= 1e-5,
            "{segments:?}: input gradient deviates by {err}"
        );
    }

    // An input that needs no gradient gets none.
    let step = segmented_backward(&model, x, &Segments::Count(2), |out| model.loss(out)).unwrap();
    assert!(step.input_grad.is_none());
}

/// `model` with its lazy parameters drawn, so that its clones (and `valid()`) share values.
fn with_params_drawn<B: Backend, M: Module<B>>(model: M) -> M {
    burn_memory::draw_params(&model);
    model
}

/// Each parameter's gradient in `got` is within `tolerance` (relative) of its gradient in
/// `want`, and both have the same parameters.
fn assert_grads_match<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    got: &GradientsParams,
    want: &GradientsParams,
    tolerance: f32,
    what: &str,
) {
    let (got, want) = (flat(model, got), flat(model, want));
    assert_eq!(got.len(), want.len(), "{what}");
    for ((id, got), (_, want)) in got.iter().zip(&want) {
        let err = rel_err(got, want);
        assert!(err <= tolerance, "{what}: parameter {id} deviates by {err}");
    }
}

/// `got` is within `tolerance` of `want`, relative to `want`'s largest magnitude.
fn assert_close<B: Backend, const D: usize>(
    got: Tensor<B, D>,
    want: Tensor<B, D>,
    tolerance: f32,
    what: &str,
) {
    let err = rel_err(
        &got.into_data().to_vec::<f32>().unwrap(),
        &want.into_data().to_vec::<f32>().unwrap(),
    );
    assert!(err <= tolerance, "{what} deviates by {err}");
}

/// The two losses agree to float rounding.
fn assert_same_loss(got: f32, want: f32, what: &str) {
    assert!(
        (got - want).abs() <= 1e-6 * want.abs(),
        "{what}: loss {got} against {want}"
    );
}

/// A plain training step over every layer of a 2-D sequence: the loss, the parameters'
/// gradients and the input's.
fn plain_step<B, M>(
    model: &M,
    x: Tensor<B, 2>,
    loss: impl FnOnce(Tensor<B, 2>) -> Tensor<B, 1>,
) -> (f32, GradientsParams, Tensor<B::InnerBackend, 2>)
where
    B: AutodiffBackend,
    M: AutodiffModule<B> + Layers<B>,
{
    let x = x.require_grad();
    let out = (0..model.num_layers()).fold(x.clone(), |h, i| model.forward_layer(i, h));
    let loss = loss(out);
    let value = loss.clone().into_scalar().elem::<f32>();
    let mut graph = loss.backward();
    let input = x.grad_remove(&mut graph).expect("the input's gradient");
    (value, GradientsParams::from_grads(graph, model), input)
}

fn mean_square<B: Backend>(out: Tensor<B, 2>) -> Tensor<B, 1> {
    out.powi_scalar(2).mean()
}

/// Linear → BatchNorm → ReLU blocks: batch statistics in training, running statistics updated.
#[derive(Module, Debug)]
pub struct Normed<B: Backend> {
    layers: Vec<Linear<B>>,
    norms: Vec<BatchNorm<B>>,
}

impl<B: Backend> Normed<B> {
    pub fn new(width: usize, depth: usize, device: &B::Device) -> Self {
        with_params_drawn(Self {
            layers: (0..depth)
                .map(|_| LinearConfig::new(width, width).init(device))
                .collect(),
            norms: (0..depth)
                .map(|_| BatchNormConfig::new(width).init(device))
                .collect(),
        })
    }

    /// Every norm's running mean and variance, synced.
    fn running_statistics(&self) -> Vec<TensorData>
    where
        B: AutodiffBackend,
    {
        let synced = self.valid();
        synced
            .norms
            .iter()
            .flat_map(|norm| [&norm.running_mean, &norm.running_var])
            .map(|state| state.value().into_data())
            .collect()
    }
}

impl<B: Backend> Layers<B> for Normed<B> {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn forward_layer(&self, index: usize, x: Tensor<B, 2>) -> Tensor<B, 2> {
        relu(self.norms[index].forward(self.layers[index].forward(x)))
    }
}

/// Batch norm in training mode (6 blocks, 3 segments): the loss and the gradients equal the
/// plain backward's. A first pass on the inner backend normalised with the running statistics
/// instead, and its gradients were 50–80× off.
pub fn batch_norm_gradients_match_the_plain_backward<B: AutodiffBackend>(device: &B::Device) {
    let model = Normed::<B>::new(10, 6, device);
    let x = Tensor::<B, 2>::random([16, 10], Distribution::Default, device);
    let (plain_loss, plain, plain_input) = plain_step(&model, x.clone(), mean_square);
    let step =
        segmented_backward(&model, x.require_grad(), &Segments::Count(3), mean_square).unwrap();
    assert_same_loss(step.loss.into_scalar().elem(), plain_loss, "batch norm");
    assert_grads_match(&model, &step.grads, &plain, 1e-5, "batch norm");
    let input = step.input_grad.expect("the input required a gradient");
    assert_close(input, plain_input, 1e-5, "batch norm: the input gradient");
}

/// One segmented step leaves the running statistics exactly where one plain training forward
/// leaves them: updated once (by the first pass), not again by the recompute.
pub fn running_statistics_are_updated_once<B: AutodiffBackend>(device: &B::Device) {
    let model = Normed::<B>::new(10, 6, device);
    // Same parameters and statistics, its own running states (clones would share them).
    let twin = Normed::<B>::new(10, 6, device).load_record(model.clone().into_record());
    let before = model.running_statistics();
    let x = Tensor::<B, 2>::random([16, 10], Distribution::Default, device);

    let _ = (0..twin.num_layers()).fold(x.clone(), |h, i| twin.forward_layer(i, h));
    segmented_backward(&model, x, &Segments::Count(3), mean_square).unwrap();

    let (segmented, plain) = (model.running_statistics(), twin.running_statistics());
    assert_eq!(segmented.len(), 12);
    for (index, ((got, want), initial)) in segmented.iter().zip(&plain).zip(&before).enumerate() {
        assert_ne!(got, initial, "statistic {index} was not updated");
        got.assert_eq(want, true);
    }
}

/// Linear → SiLU → dropout (p = 0.3) layers.
#[derive(Module, Debug)]
pub struct Dropped<B: Backend> {
    layers: Vec<Linear<B>>,
    dropout: Dropout,
}

impl<B: Backend> Dropped<B> {
    pub fn new(width: usize, depth: usize, device: &B::Device) -> Self {
        with_params_drawn(Self {
            layers: (0..depth)
                .map(|_| LinearConfig::new(width, width).init(device))
                .collect(),
            dropout: DropoutConfig::new(0.3).init(),
        })
    }
}

impl<B: Backend> Layers<B> for Dropped<B> {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn forward_layer(&self, index: usize, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.dropout.forward(silu(self.layers[index].forward(x)))
    }
}

/// Dropout after each of 4 layers, with a boundary after the first, one per layer, and two
/// segments: the segmented gradients equal a plain backward's with the same masks (its
/// segments seeded as the step seeds them), the loss is not the dropout-free one (masks were
/// drawn), the generator's stream after the step does not depend on the split, and the next
/// step draws other masks.
///
/// Uses the backend's process-wide generator: NdArray and Flex run it in a process of its own.
pub fn dropout_masks_are_reproduced<B: AutodiffBackend>(device: &B::Device) {
    let model = Dropped::<B>::new(10, 4, device);
    let x = Tensor::<B, 2>::random([12, 10], Distribution::Default, device);
    // The inner backend runs without dropout.
    let valid = model.valid();
    let no_dropout: f32 = mean_square(
        (0..valid.num_layers()).fold(x.clone().inner(), |h, i| valid.forward_layer(i, h)),
    )
    .into_scalar()
    .elem();

    let mut after_steps = Vec::new();
    for segments in [
        Segments::Boundaries(vec![1]),
        Segments::Count(4),
        Segments::Count(2),
    ] {
        B::seed(device, 42);
        let step =
            segmented_backward(&model, x.clone().require_grad(), &segments, mean_square).unwrap();
        let after_step = Tensor::<B, 1>::random([8], Distribution::Default, device).into_data();

        // The reference: the plain backward, each segment drawing from its seed.
        B::seed(device, 42);
        let seeds = SegmentSeeds::draw::<B>(device).unwrap();
        let ranges = segments.ranges(model.num_layers()).unwrap();
        let input = x.clone().require_grad();
        let mut out = input.clone();
        for (segment, range) in ranges.into_iter().enumerate() {
            B::seed(device, seeds.segment(segment));
            out = range.fold(out, |h, i| model.forward_layer(i, h));
        }
        let loss = mean_square(out);
        let plain_loss: f32 = loss.clone().into_scalar().elem();
        let mut graph = loss.backward();
        let plain_input = input.grad_remove(&mut graph).unwrap();
        let plain = GradientsParams::from_grads(graph, &model);
        B::seed(device, seeds.after());
        let expected_after = Tensor::<B, 1>::random([8], Distribution::Default, device).into_data();

        let what = format!("dropout, {segments:?}");
        let loss: f32 = step.loss.into_scalar().elem();
        assert_same_loss(loss, plain_loss, &what);
        assert!(
            (loss - no_dropout).abs() > 1e-3 * no_dropout.abs(),
            "{what}: the loss {loss} is the dropout-free loss"
        );
        assert_grads_match(&model, &step.grads, &plain, 1e-5, &what);
        let input_grad = step.input_grad.expect("the input required a gradient");
        assert_close(input_grad, plain_input, 1e-5, &format!("{what}: input"));
        after_step.assert_eq(&expected_after, true);
        after_steps.push(after_step);
    }
    for after_step in &after_steps[1..] {
        after_step.assert_eq(&after_steps[0], true);
    }

    // Steps in a row draw new seeds, so new masks: the seeds come from the stream, which the
    // step moves on (a draw that always gave the same integers would repeat every mask).
    let first = SegmentSeeds::draw::<B>(device).unwrap();
    assert_ne!(first, SegmentSeeds::draw::<B>(device).unwrap());
    let step = || {
        let step = segmented_backward(&model, x.clone(), &Segments::Count(2), mean_square);
        step.unwrap().loss.into_scalar().elem::<f32>()
    };
    let (one, two) = (step(), step());
    assert_ne!(one, two, "two steps drew the same masks");
}

/// A transformer-like state: the activation `[batch, time, width]`, the residual stream, the
/// padding mask `[batch, time]` (true where padded) and the positions.
type Stream<B> = (
    Tensor<B, 3>,
    Tensor<B, 3>,
    Tensor<B, 2, Bool>,
    Tensor<B, 2, Int>,
);

/// Residual blocks over a [`Stream`]: each adds a masked, position-shifted linear layer's
/// output to the residual stream and normalises it into the next activation.
#[derive(Module, Debug)]
pub struct Blocks<B: Backend> {
    layers: Vec<Linear<B>>,
    norms: Vec<LayerNorm<B>>,
    head: Linear<B>,
}

impl<B: Backend> Blocks<B> {
    pub fn new(width: usize, depth: usize, device: &B::Device) -> Self {
        Self {
            layers: (0..depth)
                .map(|_| LinearConfig::new(width, width).init(device))
                .collect(),
            norms: (0..depth)
                .map(|_| LayerNormConfig::new(width).init(device))
                .collect(),
            head: LinearConfig::new(width, 3).init(device),
        }
    }

    /// Uses both float parts of the output.
    fn loss(&self, (x, residual, _, _): Stream<B>) -> Tensor<B, 1> {
        let head = self.head.forward(x).powi_scalar(2).mean();
        head + residual.powi_scalar(2).mean().mul_scalar(0.1)
    }
}

impl<B: Backend> Layers<B, Stream<B>> for Blocks<B> {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn forward_layer(&self, index: usize, (x, residual, mask, positions): Stream<B>) -> Stream<B> {
        let [batch, time, width] = x.dims();
        let shift = positions
            .clone()
            .float()
            .mul_scalar(0.05)
            .unsqueeze_dim::<3>(2)
            .expand([batch, time, width]);
        let h = silu(self.layers[index].forward(x + shift));
        let padded = mask
            .clone()
            .unsqueeze_dim::<3>(2)
            .expand([batch, time, width]);
        let residual = residual + h.mask_fill(padded, 0.0);
        let x = self.norms[index].forward(residual.clone());
        (x, residual, mask, positions)
    }
}

/// A tuple state (activation, residual stream, padding mask, positions) through `Layers`: the
/// loss and the gradients of the parameters and of both float inputs equal the plain
/// backward's.
pub fn tuple_state_gradients_match_the_plain_backward<B: AutodiffBackend>(device: &B::Device) {
    let model = Blocks::<B>::new(8, 6, device);
    let x = Tensor::<B, 3>::random([2, 5, 8], Distribution::Default, device);
    let residual = Tensor::<B, 3>::random([2, 5, 8], Distribution::Default, device);
    let mask =
        Tensor::<B, 2, Int>::from_data([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]], device).equal_elem(1);
    let positions = Tensor::<B, 1, Int>::arange(0..5, device)
        .unsqueeze::<2>()
        .repeat_dim(0, 2);
    let input = || {
        (
            x.clone().require_grad(),
            residual.clone().require_grad(),
            mask.clone(),
            positions.clone(),
        )
    };

    let plain_input = input();
    let out = (0..6).fold(plain_input.clone(), |h, i| model.forward_layer(i, h));
    let loss = model.loss(out);
    let plain_loss: f32 = loss.clone().into_scalar().elem();
    let mut graph = loss.backward();
    let plain_x = plain_input.0.grad_remove(&mut graph).unwrap();
    let plain_residual = plain_input.1.grad_remove(&mut graph).unwrap();
    let plain = GradientsParams::from_grads(graph, &model);

    for segments in [Segments::Count(3), Segments::Boundaries(vec![1, 4])] {
        let what = format!("tuple state, {segments:?}");
        let step = segmented_backward(&model, input(), &segments, |out| model.loss(out)).unwrap();
        assert_same_loss(step.loss.into_scalar().elem(), plain_loss, &what);
        assert_grads_match(&model, &step.grads, &plain, 1e-5, &what);
        let (grad_x, grad_residual, (), ()) = step.input_grad.expect("the input required one");
        assert_close(grad_x, plain_x.clone(), 1e-5, &format!("{what}: x"));
        assert_close(
            grad_residual,
            plain_residual.clone(),
            1e-5,
            &format!("{what}: residual"),
        );
    }
}

/// Under mixed precision in half precision, the segmented step's scaled gradients equal a
/// half-precision plain backward's (the same cast model and loss), and the input's gradient
/// is the cast input's.
pub fn half_precision_segments_match_the_plain_backward<B: AutodiffBackend>(
    device: &B::Device,
    precision: Precision,
) {
    let model = Deep::<B>::new(&[8, 12, 12, 12, 12, 6], device);
    let amp = MixedPrecisionConfig::new()
        .with_compute(precision)
        .with_loss_scale(LossScale::Static(64.0))
        .init::<B>(device)
        .unwrap();
    let x = Tensor::<B, 2>::random([6, 8], Distribution::Default, device);
    let loss = |out: Tensor<B, 2>| model.loss(out.cast(DType::F32));

    let cast = amp.cast_module(&model);
    let input = x.clone().cast(precision.dtype()).require_grad();
    let out = (0..cast.num_layers()).fold(input.clone(), |h, i| cast.forward_layer(i, h));
    let scaled = amp.scale_loss(loss(out));
    let plain_loss: f32 = scaled.clone().into_scalar().elem();
    let mut graph = scaled.backward();
    let plain_input = input.grad_remove(&mut graph).unwrap();
    let plain = GradientsParams::from_grads(graph, &model);

    let step = amp
        .segmented_backward(&model, x.require_grad(), &Segments::Count(3), loss)
        .unwrap();
    let what = format!("{precision:?}");
    assert_same_loss(step.loss.into_scalar().elem(), plain_loss, &what);
    assert_grads_match(&model, &step.grads, &plain, 1e-5, &what);
    let input_grad = step.input_grad.expect("the input required a gradient");
    assert_eq!(input_grad.dtype(), precision.dtype());
    assert_close(
        input_grad.cast(DType::F32),
        plain_input.cast(DType::F32),
        1e-5,
        &format!("{what}: input"),
    );
}

type A = Autodiff<NdArray>;

#[test]
fn splits_are_even_or_as_given_and_bad_ones_are_errors() {
    let ranges = |s: Segments, l| s.ranges(l).unwrap();
    assert_eq!(
        ranges(Segments::Sqrt, 24),
        [0..5, 5..10, 10..15, 15..20, 20..24]
    );
    assert_eq!(ranges(Segments::Sqrt, 1), vec![0..1]);
    assert_eq!(ranges(Segments::Count(3), 7), [0..3, 3..5, 5..7]);
    assert_eq!(ranges(Segments::Count(7), 7).len(), 7);
    assert_eq!(
        ranges(Segments::Boundaries(vec![8, 16]), 24),
        [0..8, 8..16, 16..24]
    );
    for (segments, layers) in [
        (Segments::Count(0), 4),
        (Segments::Count(5), 4),
        (Segments::Boundaries(vec![0, 2]), 4),
        (Segments::Boundaries(vec![2, 2]), 4),
        (Segments::Boundaries(vec![4]), 4),
        (Segments::Sqrt, 0),
    ] {
        let err = segments.ranges(layers).unwrap_err();
        assert!(
            matches!(err, MemoryError::Invalid { .. }),
            "{segments:?}: {err}"
        );
    }

    // The same errors from the step, before any work: an empty model, too many segments.
    let device = Default::default();
    let x = Tensor::<A, 2>::ones([2, 4], &device);
    let empty = Deep::<A>::new(&[4], &device);
    let err = segmented_backward(&empty, x.clone(), &Segments::Sqrt, |o| o.sum()).unwrap_err();
    assert!(err.to_string().contains("no layers"), "{err}");
    let model = Deep::<A>::new(&[4, 4, 4], &device);
    let err = segmented_backward(&model, x, &Segments::Count(3), |o| o.sum()).unwrap_err();
    assert!(err.to_string().contains("3 segments for 2 layers"), "{err}");
}

/// The heap held for a training step's backward: segments keep a few layer inputs instead of
/// every layer's activations (exact heap bytes, in a process of its own).
#[test]
fn segments_lower_the_peak_of_a_deep_model() {
    crate::own_process::in_own_process("segments::segments_lower_the_peak_of_a_deep_model", || {
        let device = Default::default();
        let model = Deep::<A>::new(&[256; 17], &device);
        let x = Tensor::<A, 2>::random([512, 256], Distribution::Default, &device);
        let tracker = MemoryTracker::<NdArray>::new(&device);
        let peak = |segments: Option<Segments>| {
            let (_, report) = tracker
                .profile(|| match &segments {
                    None => {
                        let out = (0..16).fold(x.clone(), |h, i| model.forward_layer(i, h));
                        let graph = model.loss(out).backward();
                        GradientsParams::from_grads(graph, &model).len()
                    }
                    Some(s) => segmented_backward(&model, x.clone(), s, |o| model.loss(o))
                        .unwrap()
                        .grads
                        .len(),
                })
                .unwrap();
            report.peak_increase()
        };
        let plain = peak(None);
        let segmented = peak(Some(Segments::Sqrt));
        // 16 layers: plain keeps every layer's activations (linear, norm and activation
        // outputs, 512 KiB each); 4 segments keep 4 inputs and one segment's activations.
        assert!(
            (segmented as f64) < 0.6 * plain as f64,
            "segmented peak {segmented} B vs plain {plain} B"
        );
    });
}

/// Under mixed precision, a gradient that overflows in one segment (a large activation there
/// meets a large loss scale) skips the step like any other: weights unchanged.
#[test]
fn mixed_precision_skips_a_step_whose_segment_overflows() {
    let device = Default::default();
    let mut model = Deep::<A>::new(&[6, 6, 6, 6, 6], &device);
    // Layer 1's activations reach about 1e15 (its norm is scaled up), layer 2 brings them back.
    // (New leaves: a parameter mapped through an autodiff op would have no gradient of its own.)
    let scaled =
        |t: Tensor<A, 1>, s: f64| Tensor::from_inner(t.inner().mul_scalar(s)).require_grad();
    model.norms[1].gamma = model.norms[1].gamma.clone().map(|g| scaled(g, 1e15));
    model.layers[2].weight = model.layers[2]
        .weight
        .clone()
        .map(|w| Tensor::from_inner(w.inner().mul_scalar(1e-15)).require_grad());
    let mut amp = MixedPrecisionConfig::new()
        .with_compute(Precision::F32)
        .with_loss_scale(LossScale::Static(1e30))
        .init::<A>(&device)
        .unwrap();
    let x = Tensor::<A, 2>::random([4, 6], Distribution::Default, &device);
    let step = amp
        .segmented_backward(&model, x, &Segments::Count(4), |out| model.loss(out))
        .unwrap();
    assert!(step.loss.into_scalar().elem::<f32>().is_finite());

    let before = model.layers[0].weight.val().into_data();
    let (after, outcome) = amp.step(&mut SgdConfig::new().init(), 0.1, model, step.grads);
    assert_eq!(outcome, StepOutcome::Skipped);
    after.layers[0]
        .weight
        .val()
        .into_data()
        .assert_eq(&before, true);
}

/// Gradient accumulation composes: two half-batches' segmented gradients (each loss halved),
/// accumulated, equal the whole batch's.
#[test]
fn segmented_gradients_accumulate() {
    use burn::optim::GradientsAccumulator;
    let device = Default::default();
    let model = Deep::<A>::new(&[5, 8, 8, 8, 6], &device);
    let x = Tensor::<A, 2>::random([8, 5], Distribution::Default, &device);
    let whole = segmented_backward(&model, x.clone(), &Segments::Count(2), |o| model.loss(o))
        .unwrap()
        .grads;
    let mut accumulator = GradientsAccumulator::new();
    for half in 0..2 {
        let part = x.clone().narrow(0, half * 4, 4);
        let step = segmented_backward(&model, part, &Segments::Count(2), |o| {
            model.loss(o).div_scalar(2.0)
        })
        .unwrap();
        accumulator.accumulate(&model, step.grads);
    }
    let accumulated = accumulator.grads();
    for ((id, got), (_, want)) in flat(&model, &accumulated).iter().zip(&flat(&model, &whole)) {
        let err = rel_err(got, want);
        assert!(err <= 1e-5, "parameter {id} deviates by {err}");
    }
}

#[test]
fn gradients_match_the_plain_backward_on_ndarray() {
    gradients_match_the_plain_backward::<A>(&Default::default());
}

#[test]
fn batch_norm_gradients_match_the_plain_backward_on_ndarray() {
    batch_norm_gradients_match_the_plain_backward::<A>(&Default::default());
}

#[test]
fn running_statistics_are_updated_once_on_ndarray() {
    running_statistics_are_updated_once::<A>(&Default::default());
}

/// In a process of its own: NdArray's generator is the whole process's.
#[test]
fn dropout_masks_are_reproduced_on_ndarray() {
    crate::own_process::in_own_process("segments::dropout_masks_are_reproduced_on_ndarray", || {
        dropout_masks_are_reproduced::<A>(&Default::default())
    });
}

#[test]
fn tuple_state_gradients_match_the_plain_backward_on_ndarray() {
    tuple_state_gradients_match_the_plain_backward::<A>(&Default::default());
}
