//! Segment checkpointing: its gradients against the plain backward's (called from the NdArray
//! and wgpu modules), its splits and errors, its memory (exact heap bytes), and its composition
//! with mixed precision.

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::activation::{relu, silu};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, ElementConversion, Tensor};
use burn_memory::{
    Layers, LossScale, MemoryError, MemoryTracker, MixedPrecisionConfig, Precision, Segments,
    StepOutcome, segmented_backward,
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

impl<B: Backend> Layers<B, 2> for Deep<B> {
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

/// Every parameter's gradient, by id, as flat values.
fn flat<B: AutodiffBackend>(model: &Deep<B>, grads: &GradientsParams) -> Vec<(ParamId, Vec<f32>)> {
    struct Collect<'a>(&'a GradientsParams, Vec<(ParamId, Vec<f32>)>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
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
