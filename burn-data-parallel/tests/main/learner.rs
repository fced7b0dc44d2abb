//! burn-train's learner with `DataParallel`: K steps on two peers against K Adam steps of one
//! device (plain, mixed precision, an overflow on one peer; Flex, wgpu, NdArray), and a model
//! whose parameters are still lazy.

use burn::backend::Autodiff;
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::train::{Learner, SupervisedTraining, TrainStep};
use burn_data_parallel::{DataParallel, DataParallelConfig};
use burn_memory::{
    DeviceTransfer, LossScale, MixedPrecisionConfig, Precision, SharedMixedPrecision,
};

use crate::fixture::{B, Net, Row, RowBatcher, Rows, config, exclusive, max_rel, rows, weights};
use crate::mpi_jobs::MpiLayout;

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

/// One epoch of burn-train's learner with `DataParallel` on `peers` threads of `device`, over
/// `data` in batches of `batch` made by `batcher`, Adam at 1e-2, laid out by `config`: the
/// trained model and the run (for its report).
pub(crate) fn fit_on_peers<Bk, Bt>(
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
pub(crate) fn learner_matches_one_device<B>(
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
