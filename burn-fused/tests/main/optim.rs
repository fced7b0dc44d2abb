//! `FusedAdam` and `FusedAdamW` against Burn's `Adam` and `AdamW`: a small model trained 20
//! steps from the same parameters by both, compared after every step, and the FastFlex
//! kernel's in-place and shared-buffer cases.

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::{AdamConfig, AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_fast_cpu::{FastFlex, flex_view};
use burn_fused::FusedBackend;
use burn_fused::composed;
use burn_fused::optim::{AdamStep, FusedAdamConfig, FusedAdamWConfig};

use super::common::{seeded, values};

#[derive(Module, Debug)]
struct TwoLayers<B: Backend> {
    first: Linear<B>,
    second: Linear<B>,
    relu: Relu,
}

const INPUT: usize = 64;
/// Wide enough that `first`'s weight (70 400 values) takes the kernel's parallel path.
const HIDDEN: usize = 1100;
const OUTPUT: usize = 5;
const BATCH: usize = 8;
const STEPS: usize = 20;
const LR: f64 = 1e-2;

impl<B: Backend> TwoLayers<B> {
    fn init(device: &B::Device) -> Self {
        Self {
            first: LinearConfig::new(INPUT, HIDDEN).init(device),
            second: LinearConfig::new(HIDDEN, OUTPUT).init(device),
            relu: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.second
            .forward(self.relu.forward(self.first.forward(x)))
    }

    fn parameters(&self) -> Vec<Tensor<B, 1>> {
        let mut out = Vec::new();
        for layer in [&self.first, &self.second] {
            out.push(layer.weight.val().reshape([-1]));
            out.push(layer.bias.as_ref().expect("bias").val().reshape([-1]));
        }
        out
    }
}

/// One step of `optim` on the squared error of a seeded batch.
fn step<B: AutodiffBackend, O: Optimizer<TwoLayers<B>, B>>(
    model: TwoLayers<B>,
    optim: &mut O,
    i: usize,
    device: &B::Device,
) -> TwoLayers<B> {
    let x = seeded::<B, 2>([BATCH, INPUT], 100 + i as u64, 1.0, device);
    let target = seeded::<B, 2>([BATCH, OUTPUT], 200 + i as u64, 1.0, device);
    let loss = (model.forward(x) - target).square().mean();
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    optim.step(LR, model, grads)
}

/// The largest difference between two models' parameters, relative to each tensor's
/// largest value, and the number of values that differ at all.
fn difference<B: Backend>(a: &TwoLayers<B>, b: &TwoLayers<B>) -> (f64, usize) {
    let (mut worst, mut differing) = (0.0f64, 0);
    for (x, y) in a.parameters().into_iter().zip(b.parameters()) {
        let (x, y) = (values(x), values(y));
        let scale = y.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
        for (x, y) in x.iter().zip(&y) {
            if x.to_bits() != y.to_bits() {
                differing += 1;
            }
            worst = worst.max((x - y).abs() / scale);
        }
    }
    (worst, differing)
}

/// Trains the same model with Burn's optimizer and the fused one, comparing every step.
fn compare<B, O1, O2>(mut reference: O1, mut fused: O2, what: &str)
where
    B: AutodiffBackend,
    O1: Optimizer<TwoLayers<B>, B>,
    O2: Optimizer<TwoLayers<B>, B>,
{
    let device = Default::default();
    let mut expected = TwoLayers::<B>::init(&device);
    // Initialised (the parameters are lazy) and then cloned: the same values, in shared
    // buffers for the first step.
    expected.parameters();
    let mut actual = expected.clone();
    let start = expected.clone();
    assert_eq!(
        difference(&actual, &expected),
        (0.0, 0),
        "{what}: same start"
    );
    let mut worst = 0.0f64;
    for i in 0..STEPS {
        expected = step(expected, &mut reference, i, &device);
        actual = step(actual, &mut fused, i, &device);
        let (err, differing) = difference(&actual.valid(), &expected.valid());
        worst = worst.max(err);
        assert!(
            err <= 1e-5,
            "{what}: step {i}: parameters differ by {err:.2e} ({differing} values)"
        );
        if differing > 0 {
            println!("{what}: step {i}: {differing} values differ, by up to {err:.2e}");
        }
    }
    let (moved, _) = difference(&actual.valid(), &start.valid());
    assert!(
        moved > 1e-3,
        "{what}: the parameters moved by {moved:.2e} only"
    );
    println!("{what}: {STEPS} steps, largest relative difference {worst:.2e}");
}

fn compare_all<B: AutodiffBackend>(backend: &str)
where
    B::InnerBackend: FusedBackend,
{
    let decay = Some(WeightDecayConfig::new(0.1));
    compare::<B, _, _>(
        AdamConfig::new().init(),
        FusedAdamConfig::new().init(),
        &format!("{backend} Adam"),
    );
    compare::<B, _, _>(
        AdamConfig::new()
            .with_epsilon(1e-8)
            .with_weight_decay(decay.clone())
            .init(),
        FusedAdamConfig::new()
            .with_epsilon(1e-8)
            .with_weight_decay(decay)
            .init(),
        &format!("{backend} Adam with weight decay"),
    );
    compare::<B, _, _>(
        AdamWConfig::new().with_weight_decay(0.05).init(),
        FusedAdamWConfig::new().with_weight_decay(0.05).init(),
        &format!("{backend} AdamW"),
    );
    compare::<B, _, _>(
        AdamWConfig::new().with_weight_decay(0.0).init(),
        FusedAdamWConfig::new().with_weight_decay(0.0).init(),
        &format!("{backend} AdamW without decay"),
    );
}

#[test]
fn fused_adam_matches_burn_adam_on_fast_flex() {
    compare_all::<Autodiff<FastFlex>>("FastFlex");
}

#[test]
fn fused_adam_matches_burn_adam_on_flex() {
    compare_all::<Autodiff<Flex>>("Flex");
}

/// The address of a FastFlex tensor's first value.
fn address(tensor: &Tensor<FastFlex, 1>) -> usize {
    let primitive = tensor.clone().into_primitive().tensor();
    flex_view::values::<f32>(&primitive)
        .expect("contiguous")
        .as_ptr() as usize
}

fn operands(n: usize) -> [Tensor<FastFlex, 1>; 4] {
    let device = Default::default();
    [1, 2, 3, 4].map(|seed| {
        let t = seeded::<FastFlex, 1>([n], seed, 1.0, &device);
        if seed == 4 { t.abs() } else { t }
    })
}

const STEP: AdamStep = AdamStep {
    lr: 1e-2,
    beta_1: 0.9,
    beta_2: 0.999,
    epsilon: 1e-5,
    weight_decay: Some(0.1),
    decoupled_weight_decay: false,
    time: 3,
};

#[test]
fn shared_buffers_are_not_written() {
    for n in [1000, 100_000] {
        let [param, grad, m, v] = operands(n);
        let kept = [param.clone(), m.clone(), v.clone()].map(values);
        let expected = composed::adam_step(param.clone(), grad.clone(), m.clone(), v.clone(), STEP);
        let actual = FastFlex::fused_adam_step(param.clone(), grad, m.clone(), v.clone(), STEP);
        for (tensor, kept) in [param, m, v].into_iter().zip(&kept) {
            assert_eq!(
                &values(tensor),
                kept,
                "n = {n}: a shared buffer was written"
            );
        }
        for (a, e) in actual.into_iter().zip(expected) {
            assert_eq!(values(a), values(e), "n = {n}: kernel and composition");
        }
    }
}

#[test]
fn buffers_held_alone_are_updated_in_place() {
    for n in [1000, 100_000] {
        let [param, grad, m, v] = operands(n);
        let expected = composed::adam_step(param.clone(), grad.clone(), m.clone(), v.clone(), STEP)
            .map(values);
        let addresses = [&param, &m, &v].map(address);
        let actual = FastFlex::fused_adam_step(param, grad, m, v, STEP);
        assert_eq!(
            actual.each_ref().map(address),
            addresses,
            "n = {n}: in place"
        );
        assert_eq!(
            actual.map(values),
            expected,
            "n = {n}: kernel and composition"
        );
    }
}

#[test]
fn half_precision_takes_the_composition() {
    let [param, grad, m, v] = operands(300).map(|t| t.cast(burn::tensor::DType::F16));
    let expected = composed::adam_step(param.clone(), grad.clone(), m.clone(), v.clone(), STEP);
    let actual = FastFlex::fused_adam_step(param, grad, m, v, STEP);
    for (a, e) in actual.into_iter().zip(expected) {
        assert_eq!(a.dtype(), burn::tensor::DType::F16);
        assert_eq!(values(a), values(e));
    }
}
