//! The memory tools on NdArray (exact heap bytes: the binary installs `CountingAllocator`) and
//! the logic that does not depend on a device.

use std::time::{Duration, Instant};

use burn::backend::{Autodiff, NdArray};
use burn::module::{AutodiffModule, Module};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsAccumulator, GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor, TensorData, Tolerance};
use burn_memory::{
    LossScale, MemoryError, MemoryMonitor, MemoryTracker, MixedPrecision, MixedPrecisionConfig,
    Precision, StepOutcome, chunked_forward,
};

type B = NdArray;
type A = Autodiff<NdArray>;

fn weights(model: &Linear<A>) -> TensorData {
    model.weight.val().into_data()
}

/// A fixed model and batch, so that steps can be compared exactly.
fn setup() -> (Linear<A>, Tensor<A, 2>, Tensor<A, 2>) {
    let device = Default::default();
    let mut model = LinearConfig::new(3, 2).init::<A>(&device);
    model.weight = model.weight.map(|_| {
        Tensor::from_data(
            TensorData::new(vec![0.1f32, -0.2, 0.3, 0.4, 0.5, -0.6], [3, 2]),
            &device,
        )
        .require_grad()
    });
    // Initialise the lazy bias now, so that clones of the model share it.
    let _ = model.bias.as_ref().unwrap().val();
    let x = Tensor::from_data(
        TensorData::new((0..24).map(|i| i as f32 / 10.0 - 1.0).collect(), [8, 3]),
        &device,
    );
    let y = Tensor::from_data(
        TensorData::new((0..16).map(|i| (i % 3) as f32).collect(), [8, 2]),
        &device,
    );
    (model, x, y)
}

fn scaled_grads(
    amp: &MixedPrecision,
    model: &Linear<A>,
    x: Tensor<A, 2>,
    y: Tensor<A, 2>,
) -> GradientsParams {
    let out = amp.cast_module(model).forward(amp.cast_input(x));
    let loss = (out - y).powi_scalar(2).mean();
    GradientsParams::from_grads(amp.scale_loss(loss).backward(), model)
}

fn f32_amp(loss_scale: LossScale) -> MixedPrecision {
    MixedPrecisionConfig::new()
        .with_compute(Precision::F32)
        .with_loss_scale(loss_scale)
        .init::<A>(&Default::default())
        .unwrap()
}

#[test]
fn an_infinite_gradient_skips_the_step_halves_the_scale_and_keeps_the_weights() {
    let (model, x, y) = setup();
    let mut amp = f32_amp(LossScale::dynamic());
    let mut optim = SgdConfig::new().init();
    let mut grads = scaled_grads(&amp, &model, x, y);
    // Inject an infinite entry into the weight's gradient.
    let grad = grads.remove::<B, 2>(model.weight.id).unwrap();
    let poisoned = grad.slice_assign(
        [0..1, 0..1],
        Tensor::from_data([[f32::INFINITY]], &Default::default()),
    );
    grads.register(model.weight.id, poisoned);

    let before = weights(&model);
    let (after, outcome) = amp.step(&mut optim, 0.5, model, grads);
    assert_eq!(outcome, StepOutcome::Skipped);
    assert_eq!(amp.scale(), 32768.0);
    assert_eq!(amp.skipped_steps(), 1);
    weights(&after).assert_eq(&before, true);
}

#[test]
fn a_nan_gradient_also_skips_and_a_static_scale_stays() {
    let (model, x, y) = setup();
    let mut amp = f32_amp(LossScale::Static(128.0));
    let mut optim = SgdConfig::new().init();
    let mut grads = scaled_grads(&amp, &model, x, y);
    let bias = model.bias.as_ref().unwrap().id;
    let grad = grads.remove::<B, 1>(bias).unwrap();
    grads.register(bias, grad.mul_scalar(f32::NAN));
    let before = weights(&model);
    let (after, outcome) = amp.step(&mut optim, 0.5, model, grads);
    assert_eq!(outcome, StepOutcome::Skipped);
    assert_eq!(amp.scale(), 128.0);
    weights(&after).assert_eq(&before, true);
}

/// `unscale`, the half of `step` a `TrainStep` uses: the true gradients when finite; `None`
/// otherwise, and then an empty gradient set makes the optimizer a no-op, as documented.
#[test]
fn unscale_gives_the_true_gradients_or_none_for_a_skipped_step() {
    let (model, x, y) = setup();
    let plain = f32_amp(LossScale::Static(1.0));
    let mut amp = f32_amp(LossScale::Static(512.0));
    let mut expected = scaled_grads(&plain, &model, x.clone(), y.clone());
    let scaled = scaled_grads(&amp, &model, x.clone(), y.clone());
    let mut unscaled = amp.unscale(&model, scaled).expect("finite gradients");
    let grad = |grads: &mut GradientsParams| grads.remove::<B, 2>(model.weight.id).unwrap();
    grad(&mut unscaled)
        .into_data()
        .assert_approx_eq::<f32>(&grad(&mut expected).into_data(), Tolerance::absolute(1e-6));

    let mut poisoned = scaled_grads(&amp, &model, x, y);
    let bias = model.bias.as_ref().unwrap().id;
    let grad = poisoned.remove::<B, 1>(bias).unwrap();
    poisoned.register(bias, grad.mul_scalar(f32::INFINITY));
    assert!(amp.unscale(&model, poisoned).is_none());
    assert_eq!(amp.skipped_steps(), 1);

    let before = weights(&model);
    let mut optim = SgdConfig::new().init();
    let after = optim.step(0.5, model, GradientsParams::new());
    weights(&after).assert_eq(&before, true);
}

#[test]
fn scaled_steps_equal_unscaled_ones_and_the_scale_grows_after_clean_steps() {
    let (model, x, y) = setup();
    let mut plain = f32_amp(LossScale::Static(1.0));
    let mut scaled = f32_amp(LossScale::Dynamic {
        initial: 1024.0,
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 3,
    });
    let (mut a, mut b) = (model.clone(), model);
    let (mut optim_a, mut optim_b) = (SgdConfig::new().init(), SgdConfig::new().init());
    for step in 1..=4 {
        let grads = scaled_grads(&plain, &a, x.clone(), y.clone());
        (a, _) = plain.step(&mut optim_a, 0.1, a, grads);
        let grads = scaled_grads(&scaled, &b, x.clone(), y.clone());
        let outcome;
        (b, outcome) = scaled.step(&mut optim_b, 0.1, b, grads);
        assert_eq!(outcome, StepOutcome::Applied);
        let expected = if step >= 3 { 2048.0 } else { 1024.0 };
        assert_eq!(scaled.scale(), expected, "after step {step}");
    }
    weights(&b).assert_approx_eq::<f32>(&weights(&a), Tolerance::absolute(1e-6));
}

#[test]
fn gradient_accumulation_composes_with_loss_scaling() {
    let (model, x, y) = setup();
    let mut amp = f32_amp(LossScale::Static(256.0));
    // One step on the whole batch.
    let mut optim = SgdConfig::new().init();
    let grads = scaled_grads(&amp, &model, x.clone(), y.clone());
    let (whole, _) = amp.step(&mut optim, 0.1, model.clone(), grads);

    // The same step as two accumulated halves (each loss halved, as the mean requires).
    let mut accumulator = GradientsAccumulator::new();
    for half in 0..2 {
        let xs = x.clone().narrow(0, half * 4, 4);
        let ys = y.clone().narrow(0, half * 4, 4);
        let out = amp.cast_module(&model).forward(amp.cast_input(xs));
        let loss = (out - ys).powi_scalar(2).mean().div_scalar(2.0);
        let grads = GradientsParams::from_grads(amp.scale_loss(loss).backward(), &model);
        accumulator.accumulate(&model, grads);
    }
    let mut optim = SgdConfig::new().init();
    let (accumulated, outcome) = amp.step(&mut optim, 0.1, model, accumulator.grads());
    assert_eq!(outcome, StepOutcome::Applied);
    weights(&accumulated).assert_approx_eq::<f32>(&weights(&whole), Tolerance::absolute(1e-6));
}

#[test]
fn half_precision_on_ndarray_is_refused_and_bad_scales_rejected() {
    let device = Default::default();
    for precision in [Precision::F16, Precision::Bf16] {
        let err = MixedPrecisionConfig::new()
            .with_compute(precision)
            .init::<A>(&device)
            .unwrap_err();
        assert!(matches!(err, MemoryError::UnsupportedPrecision(_)), "{err}");
    }
    // 1e-39 is positive and finite, but its inverse is not: every unscaled gradient would be
    // infinite.
    for scale in [0.0, -1.0, f32::INFINITY, 1e-39] {
        let err = MixedPrecisionConfig::new()
            .with_compute(Precision::F32)
            .with_loss_scale(LossScale::Static(scale))
            .init::<A>(&device)
            .unwrap_err();
        assert!(matches!(err, MemoryError::Invalid { .. }), "{err}");
    }
}

/// The skip decision looks at the unscaled gradients: with a small scale, a finite scaled
/// gradient can overflow once divided by it, and that step must be skipped, not applied.
#[test]
fn gradients_that_overflow_when_unscaled_skip_the_step() {
    let (model, _, _) = setup();
    // 1e-30's inverse, 1e30, is finite: the scale is legal.
    let mut amp = f32_amp(LossScale::Static(1e-30));
    let device = Default::default();
    let mut grads = GradientsParams::new();
    grads.register(model.weight.id, Tensor::<B, 2>::full([3, 2], 1e10, &device));
    let before = weights(&model);
    let mut optim = SgdConfig::new().init();
    let (after, outcome) = amp.step(&mut optim, 0.5, model, grads);
    assert_eq!(outcome, StepOutcome::Skipped);
    weights(&after).assert_eq(&before, true);
}

/// A dynamic scale that keeps backing off (here from 1e-37, ten overflowing steps in a row)
/// stops where its inverse is still finite: the next clean step trains with the true
/// gradients instead of multiplying them by infinity.
#[test]
fn a_collapsing_dynamic_scale_never_corrupts_the_weights() {
    let (model, x, y) = setup();
    let mut amp = f32_amp(LossScale::Dynamic {
        initial: 1e-37,
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 2000,
    });
    let mut optim = SgdConfig::new().init();
    let mut model = model;
    for _ in 0..10 {
        let mut grads = GradientsParams::new();
        grads.register(
            model.weight.id,
            Tensor::<B, 2>::full([3, 2], f32::INFINITY, &Default::default()),
        );
        let outcome;
        (model, outcome) = amp.step(&mut optim, 0.1, model, grads);
        assert_eq!(outcome, StepOutcome::Skipped);
    }
    assert!(
        amp.scale() > 0.0 && (1.0 / amp.scale()).is_finite(),
        "{}",
        amp.scale()
    );

    let mut plain = f32_amp(LossScale::Static(1.0));
    let grads = scaled_grads(&plain, &model, x.clone(), y.clone());
    let (expected, _) = plain.step(&mut SgdConfig::new().init(), 0.1, model.clone(), grads);
    let grads = scaled_grads(&amp, &model, x, y);
    let (after, outcome) = amp.step(&mut optim, 0.1, model, grads);
    assert_eq!(outcome, StepOutcome::Applied);
    let trained = weights(&after);
    assert!(
        trained.iter::<f32>().all(f32::is_finite),
        "weights became non-finite: {trained:?}"
    );
    // The scaled gradients are subnormal here, with a few bits fewer than f32's 24.
    trained.assert_approx_eq::<f32>(&weights(&expected), Tolerance::absolute(1e-3));
}

/// A recorded scale whose inverse is not finite is refused on resume, as `init` refuses it.
#[test]
fn a_recorded_scale_with_an_infinite_inverse_is_refused() {
    let mut amp = f32_amp(LossScale::dynamic());
    let mut record = amp.record();
    record.scale = 1e-39;
    assert!(matches!(
        amp.load_record(record),
        Err(MemoryError::Invalid { .. })
    ));
    assert_eq!(amp.scale(), 65536.0);
}

#[test]
fn monitor_records_a_timeline_writes_csv_and_plots_and_its_thread_ends() {
    let device = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let monitor = MemoryMonitor::start(MemoryTracker::<B>::new(&device), Duration::from_millis(2));
    monitor.mark("allocate");
    let x = Tensor::<B, 2>::random([1024, 1024], Distribution::Default, &device);
    std::thread::sleep(Duration::from_millis(30));
    monitor.mark("multiply");
    let y = x.clone().matmul(x);
    let _ = y.sum().into_scalar();
    std::thread::sleep(Duration::from_millis(30));
    let timeline = monitor.stop();

    assert!(timeline.samples.len() >= 5, "{}", timeline.summary());
    assert!(
        timeline
            .samples
            .windows(2)
            .all(|w| w[0].seconds <= w[1].seconds)
    );
    let labels: Vec<_> = timeline.phases.iter().map(|p| p.label.as_str()).collect();
    assert_eq!(labels, ["allocate", "multiply"]);
    let stats = timeline.stats().unwrap();
    assert!(stats.max >= stats.last && stats.mean > 0.0 && stats.max as f64 >= stats.mean);

    let csv = dir.path().join("memory.csv");
    timeline.write_csv(&csv).unwrap();
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("seconds,in_use_bytes,reserved_bytes,phase")
    );
    assert_eq!(lines.clone().count(), timeline.samples.len());
    assert!(lines.any(|line| line.ends_with(",multiply")));

    let png = dir.path().join("memory.png");
    timeline.plot(&png, "test").unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let svg = dir.path().join("memory.svg");
    timeline.plot(&svg, "test").unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("<svg") && text.contains("multiply"),
        "labels missing from the SVG"
    );

    // A long interval must not delay stopping: the thread wakes up when told to stop.
    let monitor = MemoryMonitor::start(MemoryTracker::<B>::new(&device), Duration::from_secs(60));
    let started = Instant::now();
    let timeline = monitor.stop();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(timeline.samples.len(), 1);
    // Dropping without `stop` also ends it (the drop joins the thread).
    let started = Instant::now();
    drop(MemoryMonitor::start(
        MemoryTracker::<B>::new(&device),
        Duration::from_secs(60),
    ));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn chunked_inference_equals_one_pass_and_rejects_bad_chunks() {
    chunked_equals_one_pass_and_rejects_bad_chunks::<A>(&Default::default());
}

/// A trained model's inference half, run over chunks of every size (1, uneven, exactly the
/// input, more than it) gives the one-pass output; a zero chunk and a `forward` that changes
/// the row count are errors. Generic: the Flex module runs it too.
pub(crate) fn chunked_equals_one_pass_and_rejects_bad_chunks<AB: AutodiffBackend>(
    device: &AB::Device,
) {
    let model = LinearConfig::new(20, 7).init::<AB>(device).valid();
    let x = Tensor::<AB::InnerBackend, 2>::random([333, 20], Distribution::Default, device);
    let whole = model.forward(x.clone()).into_data();
    for chunk in [1, 10, 100, 332, 333, 1000] {
        let chunked = chunked_forward(x.clone(), chunk, |c| model.forward(c)).unwrap();
        chunked
            .into_data()
            .assert_approx_eq::<f32>(&whole, Tolerance::absolute(1e-6));
    }
    assert!(chunked_forward(x.clone(), 0, |c| model.forward(c)).is_err());
    let err = chunked_forward(x, 10, |c| c.narrow(0, 0, 1)).unwrap_err();
    assert!(err.to_string().contains("rows"), "{err}");
    let _ = Module::<AB::InnerBackend>::num_params(&model);
}

/// A `forward` whose rows change shape from one chunk to the next is an error, not a panic in
/// the slice assignment; an empty input is one pass, like any input that fits in one chunk.
#[test]
fn chunked_inference_rejects_changing_widths_and_passes_empty_inputs() {
    chunked_rejects_changing_widths_and_passes_empty_inputs::<B>(&Default::default());
}

/// Generic: the Flex module runs it too.
pub(crate) fn chunked_rejects_changing_widths_and_passes_empty_inputs<D: Backend>(
    device: &D::Device,
) {
    let x = Tensor::<D, 2>::random([30, 8], Distribution::Default, device);
    let mut calls = 0;
    let err = chunked_forward(x, 10, |c| {
        calls += 1;
        let width = if calls == 1 { 8 } else { 5 };
        c.narrow(1, 0, width)
    })
    .unwrap_err();
    assert!(matches!(err, MemoryError::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("same"), "{err}");

    let empty = Tensor::<D, 2>::zeros([0, 8], device);
    let out = chunked_forward(empty, 10, |c| c.narrow(1, 0, 3)).unwrap();
    assert_eq!(out.dims(), [0, 3]);
}
