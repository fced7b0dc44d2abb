//! Data-parallel training: peers' mean gradients against one device on the whole batch, K
//! learner steps against a one-device loop, the replica check, faults (a peer that stops, a
//! peer that panics), threads as peers on Flex, NdArray and wgpu; and MPI jobs of two and three
//! processes on loopback under `mpirun` (the same checks, mixed precision's skip, a killed
//! rank).
//!
//! burn-collective keeps one collective per process and backend: the in-process tests take
//! `exclusive()`; the ones that may leave the collective blocked run in their own process.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor, TensorData};
use burn::train::{
    InferenceStep, Learner, RegressionOutput, SupervisedTraining, TrainOutput, TrainStep,
};
use burn_data_parallel::{DataParallel, DataParallelConfig, DistributedError, Mpi, Peer};
use burn_memory::{
    DeviceTransfer, LossScale, MixedPrecisionConfig, Precision, SharedMixedPrecision,
};

use crate::own_process::in_own_process;

type B = Autodiff<Flex>;

static COLLECTIVE: Mutex<()> = Mutex::new(());

fn exclusive() -> MutexGuard<'static, ()> {
    COLLECTIVE
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
}

/// A regression MLP with what data parallelism must handle besides plain weights: a fixed
/// random projection (trained by nobody, like a sketch), a layer no step uses (no gradient on
/// any peer), and mixed precision when asked.
#[derive(Module, Debug)]
struct Net<B: Backend> {
    fixed: Param<Tensor<B, 2>>,
    hidden: Linear<B>,
    out: Linear<B>,
    unused: Linear<B>,
    amp: SharedMixedPrecision<B>,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        let fixed = Tensor::random([6, 6], Distribution::Normal(0.0, 1.0), device);
        Self {
            fixed: Param::from_tensor(fixed).set_require_grad(false),
            hidden: LinearConfig::new(6, 16).init(device),
            out: LinearConfig::new(16, 1).init(device),
            unused: LinearConfig::new(3, 3).init(device),
            amp: SharedMixedPrecision::none(),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = x.matmul(self.fixed.val());
        self.out
            .forward(burn::tensor::activation::tanh(self.hidden.forward(x)))
    }

    fn regression(&self, batch: Rows<B>) -> RegressionOutput<B> {
        let output = self.forward(batch.x);
        let loss = MseLoss::new().forward(output.clone(), batch.y.clone(), Reduction::Mean);
        RegressionOutput::new(loss, output, batch.y)
    }
}

#[derive(Clone, Debug)]
struct Rows<B: Backend> {
    x: Tensor<B, 2>,
    y: Tensor<B, 2>,
}

/// Row `i` of the data set: 6 features and a target, all of them functions of `i`.
type Row = ([f32; 6], f32);

fn rows(n: usize) -> Vec<Row> {
    (0..n)
        .map(|i| {
            let t = i as f32 * 0.37;
            let x = [
                t.sin(),
                t.cos(),
                (2.0 * t).sin(),
                0.1 * (i % 7) as f32,
                0.5,
                -t.cos(),
            ];
            (x, (3.0 * t).sin() + 0.2 * x[3])
        })
        .collect()
}

#[derive(Clone)]
struct RowBatcher;

impl<B: Backend> Batcher<B, Row, Rows<B>> for RowBatcher {
    fn batch(&self, items: Vec<Row>, device: &B::Device) -> Rows<B> {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|(x, _)| *x).collect();
        let y: Vec<f32> = items.iter().map(|(_, y)| *y).collect();
        Rows {
            x: Tensor::from_data(TensorData::new(x, [n, 6]), device),
            y: Tensor::from_data(TensorData::new(y, [n, 1]), device),
        }
    }
}

impl<B: AutodiffBackend> TrainStep for Net<B> {
    type Input = Rows<B>;
    type Output = RegressionOutput<B>;

    fn step(&self, batch: Rows<B>) -> TrainOutput<RegressionOutput<B>> {
        let Some(mut amp) = self.amp.lock() else {
            let item = self.regression(batch);
            return TrainOutput::new(self, item.loss.backward(), item);
        };
        let item = self.regression(batch);
        let scaled =
            GradientsParams::from_grads(amp.scale_loss(item.loss.clone()).backward(), self);
        let grads = amp.unscale(self, scaled).unwrap_or_default();
        TrainOutput { grads, item }
    }
}

impl<B: Backend> InferenceStep for Net<B> {
    type Input = Rows<B>;
    type Output = RegressionOutput<B>;

    fn step(&self, batch: Rows<B>) -> RegressionOutput<B> {
        self.regression(batch)
    }
}

/// Every float parameter's values, in visiting order.
fn weights<B: Backend, M: Module<B>>(module: &M) -> Vec<Vec<f32>> {
    struct Collect(Vec<Vec<f32>>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0
                .push(param.val().into_data().convert::<f32>().into_vec().unwrap());
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

/// Largest `|a - b| / max(|b|, floor)` over two gradient or weight sets.
fn max_rel(a: &[Vec<f32>], b: &[Vec<f32>], floor: f32) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(a, b)| {
            assert_eq!(a.len(), b.len());
            a.iter()
                .zip(b)
                .map(move |(a, b)| (a - b).abs() / b.abs().max(floor))
        })
        .fold(0.0, f32::max)
}

/// Largest `‖a - b‖ / ‖b‖` over the tensors of two gradient or weight sets.
fn norm_rel(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| {
            assert_eq!(a.len(), b.len());
            let diff: f32 = a.iter().zip(b).map(|(a, b)| (a - b).powi(2)).sum();
            let norm: f32 = b.iter().map(|b| b * b).sum();
            (diff / norm).sqrt()
        })
        .fold(0.0, f32::max)
}

/// The gradients in `grads` of `module`'s trained parameters, in visiting order.
fn grad_values(module: &Net<B>, grads: &GradientsParams) -> Vec<Vec<f32>> {
    struct Collect<'a>(&'a GradientsParams, Vec<Vec<f32>>);
    impl<Bk: AutodiffBackend> ModuleVisitor<Bk> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
            if let Some(grad) = self.0.get::<Bk::InnerBackend, D>(param.id) {
                self.1
                    .push(grad.into_data().convert::<f32>().into_vec().unwrap());
            }
        }
    }
    let mut collect = Collect(grads, Vec::new());
    module.visit(&mut collect);
    collect.1
}

fn config(timeout_ms: u64) -> DataParallelConfig {
    DataParallelConfig::new().with_timeout(Duration::from_millis(timeout_ms))
}

/// `model` with leaves of its own (same parameter ids and values): what a peer thread works
/// on. Peers that shared one model's autodiff leaves would share one graph, and burn-autodiff
/// 0.21 can deadlock when two threads run forward and backward on one graph (its graph
/// locator and graph cleaner take their locks in opposite orders), as a data-parallel run never
/// does: each peer has its replica.
fn replica<M: Module<B>>(model: &M, device: &burn::tensor::Device<B>) -> M {
    model.clone().fork(device)
}

/// Runs `body(rank)` on `peers` threads and returns their results in rank order.
fn on_peers<T: Send>(peers: usize, body: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..peers)
            .map(|rank| {
                scope.spawn({
                    let body = &body;
                    move || body(rank)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("peer thread"))
            .collect()
    })
}

/// `peers` peers each on its 1/`peers` of a batch hold, after `mean_gradients`, the gradients
/// of one device on the whole batch; parameters without a gradient anywhere stay without.
#[test]
fn peers_on_shards_give_the_whole_batch_gradients() {
    let _lock = exclusive();
    let device = Default::default();
    let model = Net::<B>::new(&device);
    let data = rows(24);
    let whole: Rows<B> = RowBatcher.batch(data.clone(), &device);
    let loss = MseLoss::new().forward(model.forward(whole.x), whole.y, Reduction::Mean);
    let expected = GradientsParams::from_grads(loss.backward(), &model);
    let expected_values = grad_values(&model, &expected);
    assert_eq!(
        expected_values.len(),
        4,
        "hidden and out: weights and biases"
    );

    for peers in [2, 3] {
        let shard = data.len() / peers;
        let grads = on_peers(peers, |rank| {
            let model = replica(&model, &device);
            let peer = Peer::<Flex>::join(rank, peers, device, &config(20_000)).unwrap();
            peer.check_replicas(&model).unwrap();
            let batch: Rows<B> =
                RowBatcher.batch(data[rank * shard..(rank + 1) * shard].to_vec(), &device);
            let loss = MseLoss::new().forward(model.forward(batch.x), batch.y, Reduction::Mean);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            let (mean, stop) = peer.mean_gradients(&model, grads, rank == 1).unwrap();
            assert!(stop, "peer 1 asked to stop: every peer hears it");
            peer.leave().unwrap();
            grad_values(&model, &mean)
        });
        for (rank, got) in grads.iter().enumerate() {
            // Relative to each gradient's norm: an element-wise ratio is large where a
            // gradient entry is a near-cancelling sum, whatever the order of the additions.
            let err = norm_rel(got, &expected_values);
            assert!(
                err <= 1e-5,
                "{peers} peers, peer {rank}: relative error {err}"
            );
        }
        assert_eq!(grads[0], grads[peers - 1], "every peer holds the same mean");
    }
}

/// A model whose two hidden layers are one layer (tied weights: the same parameters, used
/// twice in the forward pass).
#[derive(Module, Debug)]
struct Tied<B: Backend> {
    first: Linear<B>,
    second: Linear<B>,
    out: Linear<B>,
}

impl<B: Backend> Tied<B> {
    fn new(device: &B::Device) -> Self {
        let shared = LinearConfig::new(6, 6).init(device);
        // Initialise before copying: a copy of a lazy parameter draws values of its own.
        let _ = weights(&shared);
        Self {
            first: shared.clone(),
            second: shared,
            out: LinearConfig::new(6, 1).init(device),
        }
    }

    fn loss(&self, batch: Rows<B>) -> Tensor<B, 1> {
        let hidden = burn::tensor::activation::tanh(self.first.forward(batch.x));
        let hidden = burn::tensor::activation::tanh(self.second.forward(hidden));
        MseLoss::new().forward(self.out.forward(hidden), batch.y, Reduction::Mean)
    }
}

/// Tied weights: the layer used twice has one gradient (the sum over both uses), on one
/// device and after the peers' mean alike.
#[test]
fn tied_weights_get_the_whole_batch_gradients() {
    let _lock = exclusive();
    let device = Default::default();
    let model = Tied::<B>::new(&device);
    let _ = weights(&model);
    let data = rows(16);
    let grads_of = |grads: &GradientsParams| -> Vec<Vec<f32>> {
        struct Collect<'a>(&'a GradientsParams, Vec<Vec<f32>>);
        impl<Bk: AutodiffBackend> ModuleVisitor<Bk> for Collect<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
                let grad = self
                    .0
                    .get::<Bk::InnerBackend, D>(param.id)
                    .expect("a gradient");
                self.1
                    .push(grad.into_data().convert::<f32>().into_vec().unwrap());
            }
        }
        let mut collect = Collect(grads, Vec::new());
        model.visit(&mut collect);
        collect.1
    };
    let whole = GradientsParams::from_grads(
        model
            .loss(RowBatcher.batch(data.clone(), &device))
            .backward(),
        &model,
    );
    assert_eq!(whole.len(), 4, "one weight and one bias per distinct layer");
    let expected = grads_of(&whole);
    let grads = on_peers(2, |rank| {
        // The peer's replica keeps the tie: one forked layer, used twice.
        let shared = replica(&model.first, &device);
        let model = Tied {
            first: shared.clone(),
            second: shared,
            out: replica(&model.out, &device),
        };
        let peer = Peer::<Flex>::join(rank, 2, device, &config(20_000)).unwrap();
        peer.check_replicas(&model).unwrap();
        let batch: Rows<B> = RowBatcher.batch(data[rank * 8..(rank + 1) * 8].to_vec(), &device);
        let grads = GradientsParams::from_grads(model.loss(batch).backward(), &model);
        let (mean, _) = peer.mean_gradients(&model, grads, false).unwrap();
        peer.leave().unwrap();
        assert_eq!(
            mean.len(),
            4,
            "peer {rank}: one gradient per distinct parameter"
        );
        grads_of(&mean)
    });
    for (rank, got) in grads.iter().enumerate() {
        let err = norm_rel(got, &expected);
        assert!(err <= 1e-5, "peer {rank}: relative error {err}");
    }
}

/// A model whose training forward differs from its inference one: BatchNorm normalises each
/// batch with its own statistics and keeps running ones, which are parameters without
/// gradients.
#[derive(Module, Debug)]
struct Normed<B: Backend> {
    hidden: Linear<B>,
    norm: burn::nn::BatchNorm<B>,
    out: Linear<B>,
}

impl<B: Backend> Normed<B> {
    fn loss(&self, batch: Rows<B>) -> Tensor<B, 1> {
        let hidden = self.norm.forward(self.hidden.forward(batch.x));
        let output = self.out.forward(burn::tensor::activation::relu(hidden));
        MseLoss::new().forward(output, batch.y, Reduction::Mean)
    }
}

/// BatchNorm on peers: each peer normalises its own shard, as PyTorch's DDP does without
/// `SyncBatchNorm`, so the mean gradients are the mean of one device's gradients over each
/// shard separately, not those of the whole batch. The running statistics (parameters without
/// gradients) pass the replica check and the all-reduce.
#[test]
fn batch_norm_peers_average_their_shards_gradients() {
    let _lock = exclusive();
    let device = Default::default();
    let case = BatchNormCase::new(&device);
    let peers_model = case.copy();
    let results = on_peers(2, |rank| {
        let replica = replica(&peers_model, &device);
        let peer = Peer::<Flex>::join(rank, 2, device, &config(20_000)).unwrap();
        let mean = case.peer_mean(&peer, &replica, rank);
        peer.leave().unwrap();
        mean
    });
    for (rank, got) in results.iter().enumerate() {
        let err = norm_rel(got, &case.expected);
        assert!(err <= 1e-5, "peer {rank}: relative error {err}");
    }
}

/// The BatchNorm case of two shards of 8 rows: the model, and the mean of one device's
/// gradients over each shard (not the whole batch's, which the case checks differ).
struct BatchNormCase {
    model: Normed<B>,
    data: Vec<Row>,
    expected: Vec<Vec<f32>>,
}

impl BatchNormCase {
    fn new(device: &burn::tensor::Device<B>) -> Self {
        let model = Self::fresh(device);
        let _ = weights(&model);
        let data = rows(16);
        let mut case = Self {
            model,
            data,
            expected: Vec::new(),
        };
        let of = |batch: Rows<B>| {
            let model = case.copy();
            case.values(&GradientsParams::from_grads(
                model.loss(batch).backward(),
                &model,
            ))
        };
        let (first, second) = (of(case.shard(0)), of(case.shard(1)));
        let whole = of(RowBatcher.batch(case.data.clone(), device));
        let expected: Vec<Vec<f32>> = first
            .iter()
            .zip(&second)
            .map(|(a, b)| a.iter().zip(b).map(|(a, b)| (a + b) / 2.0).collect())
            .collect();
        assert!(
            norm_rel(&expected, &whole) > 1e-3,
            "the whole batch's statistics give other gradients"
        );
        case.expected = expected;
        case
    }

    fn fresh(device: &burn::tensor::Device<B>) -> Normed<B> {
        Normed::<B> {
            hidden: LinearConfig::new(6, 8).init(device),
            norm: burn::nn::BatchNormConfig::new(8).init(device),
            out: LinearConfig::new(8, 1).init(device),
        }
    }

    /// A copy with running statistics of its own (a clone would share them).
    fn copy(&self) -> Normed<B> {
        Self::fresh(&Default::default()).load_record(self.model.clone().into_record())
    }

    fn shard(&self, rank: usize) -> Rows<B> {
        RowBatcher.batch(
            self.data[rank * 8..(rank + 1) * 8].to_vec(),
            &Default::default(),
        )
    }

    fn values(&self, grads: &GradientsParams) -> Vec<Vec<f32>> {
        let two = |id| grads.get::<Flex, 2>(id).expect("a gradient").into_data();
        let one = |id| grads.get::<Flex, 1>(id).expect("a gradient").into_data();
        [
            two(self.model.hidden.weight.id),
            one(self.model.norm.gamma.id),
            one(self.model.norm.beta.id),
            two(self.model.out.weight.id),
        ]
        .into_iter()
        .map(|data| data.convert::<f32>().into_vec().unwrap())
        .collect()
    }

    /// Peer `rank`'s mean gradients of `replica` on its shard.
    fn peer_mean(&self, peer: &Peer<Flex>, replica: &Normed<B>, rank: usize) -> Vec<Vec<f32>> {
        peer.check_replicas(replica).unwrap();
        let grads = GradientsParams::from_grads(replica.loss(self.shard(rank)).backward(), replica);
        let (mean, _) = peer.mean_gradients(replica, grads, false).unwrap();
        self.values(&mean)
    }
}

/// Replicas that differ in a fixed parameter (another seed for the sketches) are refused at
/// the start, on every peer, naming the parameter.
#[test]
fn replicas_that_differ_are_refused() {
    let _lock = exclusive();
    let device = Default::default();
    let results = on_peers(2, |rank| {
        let model = Net::<B>::new(&device); // each thread draws its own fixed projection
        let peer = Peer::<Flex>::join(rank, 2, device, &config(20_000)).unwrap();
        let result = peer.check_replicas(&model);
        let _ = model;
        peer.leave().unwrap();
        result
    });
    for result in results {
        match result {
            Err(DistributedError::ReplicasDiffer { parameters }) => {
                assert!(parameters.contains(&"fixed".to_string()), "{parameters:?}")
            }
            other => panic!("expected ReplicasDiffer, got {other:?}"),
        }
    }
}

/// K steps of burn-train's learner with `DataParallel` on 2 peers (batch 4 each) end with the
/// weights of K Adam steps on one device over the same 8 rows per step.
#[test]
fn learner_steps_on_two_peers_match_one_device() {
    let _lock = exclusive();
    learner_matches_one_device::<B>(Default::default(), None, false, None);
}

/// The same under f16 mixed precision with dynamic loss scaling: the still-scaled gradients
/// are reduced inside the step, so both peers take the same skip decisions.
#[test]
fn learner_steps_under_mixed_precision_match_one_device() {
    let _lock = exclusive();
    learner_matches_one_device::<B>(Default::default(), Some(Precision::F16), false, None);
}

/// One peer's gradients overflow (a target of 1e38 in its third batch), the other's do not:
/// reduced before the overflow check, the step is skipped on both, as on one device over
/// both batches, and the loss scales stay equal. Reduced after it, peer 0 would step with half
/// a gradient while peer 1 skipped.
#[test]
fn an_overflow_on_one_peer_is_skipped_by_all() {
    let _lock = exclusive();
    learner_matches_one_device::<B>(Default::default(), Some(Precision::F32), true, None);
}

/// The same on wgpu (lavapipe in CI): two peers, threads on the one device, against one
/// device.
#[test]
fn learner_steps_on_two_wgpu_peers_match_one_device() {
    let _device = crate::wgpu::exclusive();
    // One data-parallel run per process, whatever the backend.
    let _lock = exclusive();
    learner_matches_one_device::<Autodiff<burn::backend::Wgpu>>(
        Default::default(),
        None,
        false,
        None,
    );
}

/// The same on NdArray, the other CPU backend that reduces in place.
#[test]
fn learner_steps_on_two_ndarray_peers_match_one_device() {
    let _lock = exclusive();
    learner_matches_one_device::<Autodiff<burn::backend::NdArray>>(
        Default::default(),
        None,
        false,
        None,
    );
}

/// One epoch of burn-train's learner with `DataParallel` on `peers` threads of `device`, over
/// `data` in batches of `batch` made by `batcher`, Adam at 1e-2, laid out by `config`: the
/// trained model and the run (for its report).
fn fit_on_peers<Bk, Bt>(
    batcher: Bt,
    data: Vec<Row>,
    batch: usize,
    peers: usize,
    device: &Bk::Device,
    config: DataParallelConfig,
    model: Net<Bk>,
) -> (Net<Bk::InnerBackend>, DataParallel<Bk>)
where
    Bk: AutodiffBackend,
    Bk::InnerBackend: DeviceTransfer,
    Bt: Batcher<Bk, Row, Rows<Bk>> + 'static,
{
    let dir = tempfile::tempdir().unwrap();
    let train = DataLoaderBuilder::new(batcher)
        .batch_size(batch)
        .build(InMemDataset::new(data));
    let valid = DataLoaderBuilder::<Bk::InnerBackend, _, _>::new(RowBatcher)
        .batch_size(4)
        .build(InMemDataset::new(rows(4)));
    let parallel = DataParallel::<Bk>::new(vec![device.clone(); peers], config).unwrap();
    let result = SupervisedTraining::new(dir.path(), train, valid)
        .num_epochs(1)
        .with_training_strategy(parallel.strategy())
        .launch(Learner::new(model, AdamConfig::new().init(), 1e-2));
    (result.model, parallel)
}

/// Five learner steps of `DataParallel` against five Adam steps of one device over the same
/// rows: the same weights (and loss scale and skipped steps under `amp`). Two peers in this
/// process, or `mpi`'s layout: `local_peers` in each process of the MPI job. Returns the trained
/// weights.
fn learner_matches_one_device<B>(
    device: B::Device,
    amp: Option<Precision>,
    overflow: bool,
    mpi: Option<MpiLayout>,
) -> Vec<Vec<f32>>
where
    B: AutodiffBackend,
    B::InnerBackend: DeviceTransfer,
{
    let (local_peers, processes, config) = match &mpi {
        None => (2, 1, config(60_000)),
        Some(layout) => (
            layout.local_peers,
            layout.processes,
            config(60_000).with_mpi(true),
        ),
    };
    if mpi.is_some() {
        // Every process draws the same model (the replica check refuses others).
        B::seed(&device, 7);
    }
    let peers = local_peers * processes;
    const BATCH: usize = 4;
    const STEPS: usize = 5;
    let mut data = rows(peers * BATCH * STEPS);
    if overflow {
        // Peer 1's shard is the second; its third batch starts 2 batches in.
        data[BATCH * STEPS + 2 * BATCH + 1].1 = 1e38;
    }
    let amp = amp.map(|precision| {
        MixedPrecisionConfig::new()
            .with_compute(precision)
            .with_loss_scale(LossScale::dynamic())
            .init::<B>(&device)
            .unwrap()
    });
    let fresh = || {
        let mut model = Net::<B>::new(&device);
        if let Some(amp) = &amp {
            model.amp = SharedMixedPrecision::new(amp.clone());
        }
        model
    };
    let model = fresh();
    let start = weights(&model);

    let (trained_model, parallel) = fit_on_peers(
        RowBatcher,
        data.clone(),
        BATCH,
        local_peers,
        &device,
        config,
        model.clone(),
    );
    let report = parallel.report().expect("the run went through");
    assert_eq!((report.world_size, report.steps), (peers, STEPS));
    assert_eq!(report.items, local_peers * BATCH * STEPS);
    let trained = weights(&trained_model);

    // One device: step s sees peer 0's batch s and peer 1's batch s (each peer's shard is a
    // contiguous half of the data, unshuffled).
    let mut reference = model.clone();
    if let Some(amp) = &amp {
        reference.amp = SharedMixedPrecision::new(amp.clone());
    }
    let mut optim = AdamConfig::new().init();
    let shard = data.len() / peers;
    for step in 0..STEPS {
        let rows: Vec<Row> = (0..peers)
            .flat_map(|peer| {
                let start = peer * shard + step * BATCH;
                data[start..start + BATCH].to_vec()
            })
            .collect();
        let output = TrainStep::step(&reference, RowBatcher.batch(rows, &device));
        reference = optim.step(1e-2, reference, output.grads);
    }
    let expected = weights(&reference.valid());
    assert_ne!(start, expected, "the steps moved the weights");
    let err = max_rel(&trained, &expected, 1e-2);
    assert!(
        err <= 1e-4,
        "weights after {STEPS} steps: relative error {err}"
    );
    if amp.is_some() {
        let (got, want) = (
            trained_model.amp.get().unwrap(),
            reference.amp.get().unwrap(),
        );
        assert_eq!(got.scale(), want.scale(), "the same loss scale");
        assert_eq!(
            got.skipped_steps(),
            want.skipped_steps(),
            "the same skipped steps"
        );
        if overflow {
            assert_eq!(want.skipped_steps(), 1, "the overflowing step is skipped");
        }
    }
    trained
}

/// A peer that stops taking part (it died, or hangs) makes the other's next all-reduce fail
/// with a timeout, within the configured time. Own process: the collective stays blocked.
#[test]
fn a_peer_that_stops_is_a_timeout_on_the_others() {
    in_own_process(
        "distributed::a_peer_that_stops_is_a_timeout_on_the_others",
        || {
            let device = Default::default();
            let model = Net::<B>::new(&device);
            let timeout = Duration::from_millis(1500);
            let results = on_peers(2, |rank| {
                let model = replica(&model, &device);
                let peer = Peer::<Flex>::join(rank, 2, device, &config(1500)).unwrap();
                for step in 0..3 {
                    if rank == 1 && step == 2 {
                        return Ok(Duration::ZERO); // gone
                    }
                    let batch: Rows<B> = RowBatcher.batch(rows(4), &device);
                    let loss =
                        MseLoss::new().forward(model.forward(batch.x), batch.y, Reduction::Mean);
                    let grads = GradientsParams::from_grads(loss.backward(), &model);
                    let start = Instant::now();
                    if let Err(error) = peer.mean_gradients(&model, grads, false) {
                        return Err((error, start.elapsed()));
                    }
                }
                Ok(Duration::ZERO)
            });
            match &results[0] {
                Err((
                    DistributedError::Timeout {
                        peer: 0, operation, ..
                    },
                    waited,
                )) => {
                    assert_eq!(*operation, "all-reduce gradients");
                    assert!(*waited >= timeout && *waited < timeout + Duration::from_secs(2));
                }
                other => panic!("peer 0 should time out, got {other:?}"),
            }
        },
    );
}

/// A step that panics on one peer ends the learner's run within the timeout; the report names
/// the panic rather than the others' timeouts.
#[test]
fn a_peer_that_panics_ends_the_run_with_its_error() {
    in_own_process(
        "distributed::a_peer_that_panics_ends_the_run_with_its_error",
        || {
            let device = Default::default();
            // Row 13 has a NaN feature: the batcher of the peer that gets it panics.
            #[derive(Clone)]
            struct Picky;
            impl<B: Backend> Batcher<B, Row, Rows<B>> for Picky {
                fn batch(&self, items: Vec<Row>, device: &B::Device) -> Rows<B> {
                    assert!(items.iter().all(|(x, _)| !x[0].is_nan()), "a NaN feature");
                    RowBatcher.batch(items, device)
                }
            }
            let mut data = rows(32);
            data[21].0[0] = f32::NAN; // peer 1's third batch
            let start = Instant::now();
            let (_, parallel) = fit_on_peers(
                Picky,
                data,
                4,
                2,
                &device,
                config(2000),
                Net::<B>::new(&device),
            );
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "bounded: {:?}",
                start.elapsed()
            );
            match parallel.report() {
                Err(DistributedError::PeerPanicked { peer: 1, message }) => {
                    assert!(message.contains("NaN"), "{message}")
                }
                other => panic!("expected peer 1's panic, got {other:?}"),
            }
        },
    );
}

/// `mpi` without MPI initialised, and layouts that cannot be, are refused before anything
/// starts. (No test initialises MPI in this process: the MPI jobs below run in `mpirun`'s.)
#[test]
fn invalid_layouts_are_refused() {
    match DataParallel::<B>::new(vec![Default::default()], config(1000).with_mpi(true)) {
        Err(DistributedError::InvalidConfig(message)) => {
            assert!(message.contains("Mpi::init"), "{message}")
        }
        other => panic!("expected InvalidConfig, got {:?}", other.map(|_| ())),
    }
    assert!(matches!(
        DataParallel::<B>::new(vec![], config(1000)),
        Err(DistributedError::InvalidConfig(_))
    ));
    assert!(matches!(
        DataParallel::<B>::new(vec![Default::default()], config(0)),
        Err(DistributedError::InvalidConfig(_))
    ));
    assert!(matches!(
        Peer::<Flex>::join(2, 2, Default::default(), &config(1000)),
        Err(DistributedError::InvalidConfig(_))
    ));
}

/// The scenario an MPI job's processes run: this test binary under `mpirun`, one test, with
/// this variable naming what to do.
const MPI_SCENARIO: &str = "BURN_DATA_PARALLEL_MPI_SCENARIO";

/// The layout of an MPI job: its processes and the peers in each.
#[derive(Clone, Copy, Debug)]
struct MpiLayout {
    processes: usize,
    local_peers: usize,
}

/// What each rank of a finished `mpirun` printed, by rank, and whether `mpirun` succeeded.
struct MpiJob {
    success: bool,
    ranks: Vec<String>,
    all: String,
}

/// Runs `test` of this binary in an MPI job of `processes` processes on this machine with
/// `scenario`, bounded by `limit` (`mpirun` ends the job 5 s before, and is killed past it).
/// `--enable-recovery` lets the job's other processes go on when one dies, as a killed rank's
/// test needs.
fn mpirun(test: &str, processes: usize, scenario: &str, limit: Duration) -> MpiJob {
    let exe = std::env::current_exe().unwrap();
    let outputs = tempfile::tempdir().unwrap();
    let child = std::process::Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--enable-recovery",
        ])
        .args(["--timeout", &(limit.as_secs() - 5).to_string()])
        .arg("--output-filename")
        .arg(outputs.path())
        .args(["-np", &processes.to_string()])
        .args(["-x", MPI_SCENARIO])
        .arg(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(MPI_SCENARIO, scenario)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| {
            panic!("`mpirun` (Open MPI's `openmpi-bin`) could not start: {error}")
        });
    let start = Instant::now();
    let output = wait_bounded(child, limit);
    let elapsed = start.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let all = format!("{stdout}\n{stderr}");
    assert!(elapsed < limit, "the MPI job ran past {limit:?}:\n{all}");
    // `--output-filename` writes each rank's standard output to `DIR/1/rank.R/stdout`.
    let ranks = (0..processes)
        .map(|rank| {
            let path = outputs.path().join(format!("1/rank.{rank}/stdout"));
            std::fs::read_to_string(path).unwrap_or_default()
        })
        .collect();
    MpiJob {
        success: output.status.success(),
        ranks,
        all,
    }
}

fn wait_bounded(mut child: std::process::Child, limit: Duration) -> std::process::Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The line of `text` that starts with `key`, without it.
fn line(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(key).map(str::to_string))
        .unwrap_or_else(|| panic!("no `{key}` in:\n{text}"))
}

/// This process's scenario when it is one rank of an MPI job.
fn mpi_scenario() -> Option<String> {
    std::env::var(MPI_SCENARIO).ok()
}

/// burn-train's learner with `DataParallel` over the processes of MPI jobs, two and three
/// processes of one peer and two processes of two peers (reduced in the process first, then
/// across processes), ends with the same weights on every rank, equal to K Adam steps of one
/// device over the same rows. Then f16-range mixed precision with an overflow in one rank's
/// batch: every rank skips that step, as one device does.
#[test]
fn mpi_processes_train_as_one_device() {
    const TEST: &str = "distributed::mpi_processes_train_as_one_device";
    if let Some(scenario) = mpi_scenario() {
        let mpi = Mpi::init().unwrap();
        let parts: Vec<usize> = scenario
            .split(' ')
            .skip(1)
            .map(|v| v.parse().unwrap())
            .collect();
        let layout = MpiLayout {
            processes: mpi.size() as usize,
            local_peers: parts[0],
        };
        let (amp, overflow) = match scenario.split(' ').next() {
            Some("overflow") => (Some(Precision::F32), true),
            _ => (None, false),
        };
        let trained =
            learner_matches_one_device::<B>(Default::default(), amp, overflow, Some(layout));
        let flat: Vec<String> = trained.concat().iter().map(|v| v.to_string()).collect();
        println!("\nWEIGHTS {}", flat.join(","));
        return;
    }
    let jobs = [
        ("agree 1", 2),
        ("agree 1", 3),
        ("agree 2", 2),
        ("overflow 1", 2),
    ];
    for (scenario, processes) in jobs {
        let job = mpirun(TEST, processes, scenario, Duration::from_secs(120));
        assert!(
            job.success,
            "`{scenario}` on {processes} processes:\n{}",
            job.all
        );
        let weights: Vec<String> = job.ranks.iter().map(|out| line(out, "WEIGHTS ")).collect();
        assert!(
            weights.iter().all(|w| *w == weights[0]),
            "`{scenario}` on {processes} processes: the ranks' weights differ"
        );
        for out in &job.ranks {
            assert!(
                out.contains("1 passed"),
                "a rank did not pass:\n{}",
                job.all
            );
        }
    }
}

/// Ranks whose models differ (another seed on rank 1) are refused on every rank, naming the
/// parameter that differs; a rank killed mid-run makes the others end with `ProcessesLost`
/// naming it, within the timeout.
#[test]
fn mpi_replicas_that_differ_and_a_killed_rank_are_typed_errors() {
    const TEST: &str = "distributed::mpi_replicas_that_differ_and_a_killed_rank_are_typed_errors";
    const TIMEOUT_MS: u64 = 3000;
    if let Some(scenario) = mpi_scenario() {
        let mpi = Mpi::init().unwrap();
        let rank = mpi.rank() as usize;
        let device = Default::default();
        let seed = match scenario.as_str() {
            "differ" => 7 + rank as u64,
            _ => 7,
        };
        <Flex as Backend>::seed(&device, seed);
        let mut model = Net::<B>::new(&device);
        let _ = weights(&model);
        let peer = Peer::<Flex>::join(0, 1, device, &config(TIMEOUT_MS).with_mpi(true)).unwrap();
        if scenario == "differ" {
            match peer.check_replicas(&model) {
                Err(DistributedError::ReplicasDiffer { parameters }) => {
                    println!("\nDIFFER {}", parameters.join(","))
                }
                other => panic!("expected ReplicasDiffer, got {other:?}"),
            }
            return;
        }
        peer.check_replicas(&model).unwrap();
        let mut optim = AdamConfig::new().init();
        let data = rows(64);
        let processes = mpi.size() as usize;
        for step in 0..8 {
            if rank == processes - 1 && step == 3 {
                std::process::exit(3);
            }
            let mine = (step * processes + rank) * 4;
            let batch: Rows<B> = RowBatcher.batch(data[mine..mine + 4].to_vec(), &device);
            let loss = MseLoss::new().forward(model.forward(batch.x), batch.y, Reduction::Mean);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            let start = Instant::now();
            match peer.mean_gradients(&model, grads, false) {
                Ok((grads, _)) => model = optim.step(1e-2, model, grads),
                Err(DistributedError::ProcessesLost { ranks, .. }) => {
                    let ms = start.elapsed().as_millis();
                    println!("\nLOST {ranks:?} AT {step} AFTER {ms}");
                    return;
                }
                Err(other) => panic!("expected ProcessesLost, got {other:?}"),
            }
        }
        panic!("rank {rank} trained on after a rank was killed");
    }
    let job = mpirun(TEST, 2, "differ", Duration::from_secs(60));
    assert!(job.success, "{}", job.all);
    let differ: Vec<String> = job.ranks.iter().map(|out| line(out, "DIFFER ")).collect();
    assert_eq!(differ[0], differ[1], "every rank names the same parameters");
    assert!(differ[0].split(',').any(|p| p == "fixed"), "{}", differ[0]);

    let job = mpirun(TEST, 3, "killed", Duration::from_secs(60));
    // (Under `--enable-recovery`, `mpirun` itself succeeds when a rank dies.)
    assert!(
        !job.ranks[2].contains("test result"),
        "rank 2 exited mid-run:\n{}",
        job.all
    );
    for out in &job.ranks[..2] {
        let lost = line(out, "LOST ");
        let (ranks, rest) = lost.split_once(" AT ").unwrap();
        assert_eq!(ranks, "[2]", "{}", job.all);
        let (step, ms) = rest.split_once(" AFTER ").unwrap();
        assert_eq!(step, "3", "{}", job.all);
        let ms: u64 = ms.parse().unwrap();
        assert!(
            (TIMEOUT_MS..=TIMEOUT_MS + 2000).contains(&ms),
            "bounded by the timeout: {ms} ms"
        );
        assert!(out.contains("1 passed"), "{}", job.all);
    }
}

/// The BatchNorm case as two MPI processes: each rank normalises its own shard, and both end
/// with the mean of one device's gradients over each shard.
#[test]
fn mpi_batch_norm_ranks_average_their_shards_gradients() {
    const TEST: &str = "distributed::mpi_batch_norm_ranks_average_their_shards_gradients";
    if mpi_scenario().is_some() {
        let mpi = Mpi::init().unwrap();
        let device = Default::default();
        // Every process draws the same model.
        <Flex as Backend>::seed(&device, 7);
        let case = BatchNormCase::new(&device);
        let peer = Peer::<Flex>::join(0, 1, device, &config(20_000).with_mpi(true)).unwrap();
        let got = case.peer_mean(&peer, &case.copy(), mpi.rank() as usize);
        let err = norm_rel(&got, &case.expected);
        assert!(err <= 1e-5, "rank {}: relative error {err}", mpi.rank());
        println!("\nERROR {err:e}");
        return;
    }
    let job = mpirun(TEST, 2, "batch-norm", Duration::from_secs(60));
    assert!(job.success, "{}", job.all);
    for out in &job.ranks {
        line(out, "ERROR ");
        assert!(out.contains("1 passed"), "{}", job.all);
    }
}

/// A model whose parameters Burn has not initialised yet (its linear layers are lazy) trains:
/// the strategy initialises them once before making the replicas, which would otherwise each
/// draw weights of their own and be refused by the replica check.
#[test]
fn a_lazily_initialised_model_trains() {
    let _lock = exclusive();
    let device = Default::default();
    let (_, parallel) = fit_on_peers(
        RowBatcher,
        rows(16),
        4,
        2,
        &device,
        config(60_000),
        Net::<B>::new(&device),
    );
    let report = parallel.report().expect("the replicas agree");
    assert_eq!((report.steps, report.items), (2, 16));
}
