//! Data-parallel training of the sketched MLP through burn-train's learner (burn-data-parallel's
//! `DataParallel`, two peers on Flex): with segment checkpointing and with f16 mixed precision
//! on top, K steps end where K steps on one device over the same digits end; and `train`'s
//! `devices` option trains.

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::{Dataset, InMemDataset};
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::{AdamConfig, Optimizer};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn::train::{Learner, SupervisedTraining, TrainStep};
use burn_data_parallel::{DataParallel, DataParallelConfig};
use burn_memory::{LossScale, MixedPrecisionConfig, Precision, Segments};
use examples::data::{Digit, DigitBatcher, DigitDataset};
use examples::mlp::{Mlp, MlpConfig};
use examples::mnist::Mnist;
use examples::training::{TrainingConfig, train};

type F = Autodiff<Flex>;

/// burn-collective keeps one collective per process and backend: one run at a time.
fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

const PEERS: usize = 2;
const BATCH: usize = 8;
const STEPS: usize = 4;

/// Every float parameter's values, in visiting order (the fixed sketches included).
fn weights<B: Backend, M: Module<B>>(module: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let values = param.val().into_data().convert::<f32>().into_vec::<f32>();
            self.0.extend(values.unwrap());
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

/// `‖a − b‖ / ‖b‖`.
fn norm_rel(a: &[f32], b: &[f32]) -> f32 {
    let diff: f32 = a.iter().zip(b).map(|(a, b)| (a - b) * (a - b)).sum();
    let norm: f32 = b.iter().map(|b| b * b).sum();
    (diff / norm).sqrt()
}

/// The largest `|a − b| / max(|b|, 0.01)`.
fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1e-2))
        .fold(0.0, f32::max)
}

/// The learner with two peers against one device, on the sketched MLP as `prepare` sets it up
/// (segments, mixed precision).
/// `tolerance` bounds [`max_rel`] of the weights; `Some(norm)` bounds [`norm_rel`] instead
/// (under f16, Adam turns a rounding difference in a near-zero gradient into a full step of
/// the other sign, so element-wise errors say little).
fn two_peers_match_one_device(
    prepare: impl Fn(Mlp<F>) -> Mlp<F>,
    tolerance: f32,
    norm: Option<f32>,
    what: &str,
) {
    let device = Default::default();
    let dir = tempfile::tempdir().unwrap();
    let mnist = DigitDataset::new(Mnist::read(&Mnist::embedded_dir(), "train").unwrap());
    let digits: Vec<Digit> = (0..PEERS * BATCH * STEPS)
        .filter_map(|i| mnist.get(i))
        .collect();
    <Flex as Backend>::seed(&device, 11);
    let model = prepare(
        MlpConfig::new()
            .with_hidden(vec![48, 32])
            .with_low_rank(6)
            .init::<F>(&device),
    );
    // Burn initialises parameters at first use: read them all before copying the model.
    let start = weights(&model);

    let train_loader = DataLoaderBuilder::<F, _, _>::new(DigitBatcher)
        .batch_size(BATCH)
        .build(InMemDataset::new(digits.clone()));
    let valid_loader = DataLoaderBuilder::<Flex, _, _>::new(DigitBatcher)
        .batch_size(BATCH)
        .build(InMemDataset::new(digits[..BATCH].to_vec()));
    let timeout = std::time::Duration::from_secs(120);
    let parallel = DataParallel::<F>::new(
        vec![device; PEERS],
        DataParallelConfig::new().with_timeout(timeout),
    )
    .unwrap();
    let result = SupervisedTraining::new(dir.path(), train_loader, valid_loader)
        .num_epochs(1)
        .with_training_strategy(parallel.strategy())
        .launch(Learner::new(model.clone(), AdamConfig::new().init(), 1e-2));
    let report = parallel.report().unwrap();
    assert_eq!(report.steps, STEPS, "{what}");

    // One device: each step on both peers' batches (each peer's shard is a contiguous half).
    let mut reference = prepare(model.clone());
    let mut optim = AdamConfig::new().init();
    let shard = digits.len() / PEERS;
    for step in 0..STEPS {
        let items: Vec<Digit> = (0..PEERS)
            .flat_map(|peer| {
                let first = peer * shard + step * BATCH;
                digits[first..first + BATCH].to_vec()
            })
            .collect();
        let output = TrainStep::step(&reference, DigitBatcher.batch(items, &device));
        reference = optim.step(1e-2, reference, output.grads);
    }
    let expected = weights(&reference.valid());
    assert_ne!(start, expected, "{what}: the steps moved the weights");
    let got = weights(&result.model);
    let (element, whole) = (max_rel(&got, &expected), norm_rel(&got, &expected));
    match norm {
        None => assert!(
            element <= tolerance,
            "{what}: relative error {element} ({whole} in norm)"
        ),
        Some(norm) => assert!(
            whole <= norm,
            "{what}: relative error {whole} in norm ({element})"
        ),
    }
    if let (Some(got), Some(want)) = (result.model.amp(), reference.amp()) {
        assert_eq!(got.scale(), want.scale(), "{what}: loss scale");
        assert!(got.scale() > 256.0, "{what}: the scale grew");
        assert_eq!(got.skipped_steps(), want.skipped_steps(), "{what}: skipped");
    }
}

#[test]
fn two_peers_train_the_sketched_mlp_as_one_device() {
    let _lock = exclusive();
    two_peers_match_one_device(|model| model, 1e-4, None, "f32");
    two_peers_match_one_device(
        |model| model.with_segments(Segments::Count(2)).unwrap(),
        1e-4,
        None,
        "segment checkpointing",
    );
    // f16 rounds the two halves of a batch differently from the whole: a looser tolerance.
    // Each peer's loss is the mean over half the digits, so its f16 backward carries values
    // twice the whole batch's: at a scale just below overflow, a peer overflows where one
    // device does not (so does PyTorch's DDP). The scale here starts far from overflow and
    // grows every two clean steps: both runs must take the same decisions.
    two_peers_match_one_device(
        |model| {
            let amp = MixedPrecisionConfig::new()
                .with_compute(Precision::F16)
                .with_loss_scale(LossScale::Dynamic {
                    initial: 256.0,
                    growth_factor: 2.0,
                    backoff_factor: 0.5,
                    growth_interval: 2,
                })
                .init::<F>(&Default::default())
                .unwrap();
            model
                .with_segments(Segments::Count(2))
                .unwrap()
                .with_amp(amp)
        },
        0.0,
        Some(1e-3),
        "f16 mixed precision and segments",
    );
}

/// `train` with two data-parallel peers: the loss falls, the report says how the peers ran,
/// and a batch the peers cannot share evenly is refused.
#[test]
fn train_with_two_devices() {
    let _lock = exclusive();
    let dir = tempfile::tempdir().unwrap();
    let data = Mnist::embedded_dir();
    let device = Default::default();
    let model = MlpConfig::new().with_hidden(vec![64]).with_low_rank(8);
    let config = TrainingConfig::new(model)
        .with_epochs(1)
        .with_batch_size(32)
        .with_train_limit(Some(1024))
        .with_learning_rate(3e-3)
        .with_seed(7)
        .with_devices(2);
    let report = train::<F>(&config, &data, &dir.path().join("run"), false, &device).unwrap();
    let parallel = report.parallel.expect("a data-parallel report");
    assert_eq!((parallel.world_size, parallel.steps), (2, 32));
    assert_eq!(parallel.items, 1024);
    assert!(report.test_accuracy > 0.4, "{}", report.test_accuracy);

    let uneven = config.with_batch_size(33);
    let err = train::<F>(&uneven, &data, &dir.path().join("uneven"), false, &device).unwrap_err();
    assert!(err.to_string().contains("cannot be split evenly"), "{err}");
}
