//! Data-parallel training inside burn-train's learner: one peer per device, each with its
//! shard of the data, gradients averaged over every peer before each optimizer step.

use std::any::Any;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burn::data::dataloader::Progress;
use burn::module::{AutodiffModule, Module};
use burn::optim::GradientsAccumulator;
use burn::tensor::backend::AutodiffBackend;
use burn::train::metric::store::EventStoreClient;
use burn::train::{
    CloneEarlyStoppingStrategy, EventProcessorTraining, InferenceStep, Interrupter, Learner,
    LearnerEvent, LearningCheckpointer, LearningComponentsTypes, SupervisedLearningStrategy,
    SupervisedTrainingEventProcessor, TrainLoader, TrainingComponents, TrainingItem, TrainingModel,
    TrainingStrategy, ValidLoader,
};

use burn_memory::hooks::{fork_replica, with_gradient_reduction};
use burn_memory::{DeviceTransfer, draw_params};

use crate::bucket::GradientLayout;
use crate::config::Processes;
use crate::step::StepReduction;
use crate::sync::lock;
use crate::{DataParallelConfig, DistributedError, Peer};

/// burn-collective keeps one collective per process and backend: one run at a time.
static RUN: Mutex<()> = Mutex::new(());

/// Data-parallel training for burn-train's learner: one peer per device (a thread each), every
/// peer training a replica of the model on its equal shard of the data, the gradients averaged
/// over all peers (of every process, with [`DataParallelConfig::mpi`]) before each optimizer
/// step, so that `N` peers at batch `b` train as one device at batch `N·b`.
///
/// Replicas are checked at the start, every collective operation waits at most the
/// [`timeout`](DataParallelConfig::timeout), and under burn-memory's mixed precision every peer
/// takes the same skip decision; rank 0 validates and checkpoints. Give the learner
/// [`strategy`](Self::strategy) and read [`report`](Self::report) after the run: the book's
/// chapter on data-parallel training shows both, and what each step does.
pub struct DataParallel<B: AutodiffBackend> {
    devices: Vec<B::Device>,
    config: DataParallelConfig,
    processes: Processes,
    outcome: Arc<Mutex<Option<Result<DataParallelReport, DistributedError>>>>,
}

/// What a data-parallel run did, and where its peers' time went.
#[derive(Debug, Clone, PartialEq)]
pub struct DataParallelReport {
    /// Peers of the run, in every process.
    pub world_size: usize,
    /// Peers in this process.
    pub local_peers: usize,
    /// Training steps each peer took.
    pub steps: usize,
    /// Training items the peers on this machine processed.
    pub items: usize,
    /// Wall time of the training, seconds.
    pub seconds: f64,
    /// For each local peer, the seconds spent in collective operations: reducing, and waiting
    /// for the slowest peer.
    pub collective_seconds: Vec<f64>,
}

impl std::fmt::Display for DataParallelReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let waited = self.collective_seconds.iter().copied().fold(0.0, f64::max);
        write!(
            f,
            "{} peer(s) ({} here), {} steps each, {} items here in {:.2} s ({:.0} items/s here); \
             at most {:.2} s ({:.0}%) in collective operations",
            self.world_size,
            self.local_peers,
            self.steps,
            self.items,
            self.seconds,
            self.items as f64 / self.seconds.max(1e-9),
            waited,
            100.0 * waited / self.seconds.max(1e-9),
        )
    }
}

impl<B: AutodiffBackend> DataParallel<B> {
    /// One peer per device of `devices` (a device may be listed more than once: threads on the
    /// same device), laid out by `config`.
    ///
    /// # Errors
    /// [`DistributedError::InvalidConfig`] when `config` cannot describe the run.
    pub fn new(
        devices: Vec<B::Device>,
        config: DataParallelConfig,
    ) -> Result<Self, DistributedError> {
        let processes = config.validate(devices.len())?;
        Ok(Self {
            devices,
            config,
            processes,
            outcome: Arc::new(Mutex::new(None)),
        })
    }

    /// How many peers train together, in every process: a step's batch is spread over them.
    pub fn world_size(&self) -> usize {
        self.processes.world_size(self.devices.len())
    }

    /// The strategy to give burn-train's `SupervisedTraining::with_training_strategy`.
    pub fn strategy<LC>(&self) -> TrainingStrategy<LC>
    where
        LC: LearningComponentsTypes<Backend = B> + Send + 'static,
        B::InnerBackend: DeviceTransfer,
    {
        TrainingStrategy::Custom(Arc::new(Strategy::<LC> {
            devices: self.devices.clone(),
            config: self.config.clone(),
            processes: self.processes,
            outcome: self.outcome.clone(),
        }))
    }

    /// How the run went, once the learner returned.
    ///
    /// # Errors
    /// The error that stopped the run: a timeout, replicas that differ, a peer that panicked,
    /// burn-collective's refusal, ranks of an MPI job that were lost;
    /// [`DistributedError::InvalidConfig`] when no run happened.
    pub fn report(&self) -> Result<DataParallelReport, DistributedError> {
        lock(&self.outcome).clone().unwrap_or_else(|| {
            Err(DistributedError::InvalidConfig(
                "no data-parallel run has happened: give `strategy()` to the learner first".into(),
            ))
        })
    }
}

/// The learner's side of [`DataParallel`].
struct Strategy<LC: LearningComponentsTypes> {
    devices: Vec<burn::tensor::Device<LC::Backend>>,
    config: DataParallelConfig,
    /// The processes `DataParallel::new` found when it validated `config`.
    processes: Processes,
    outcome: Arc<Mutex<Option<Result<DataParallelReport, DistributedError>>>>,
}

/// What every peer of this machine shares.
struct Shared<'a, LC: LearningComponentsTypes> {
    config: &'a DataParallelConfig,
    processes: Processes,
    local_peers: usize,
    num_epochs: usize,
    starting_epoch: usize,
    grad_accumulation: Option<usize>,
    interrupter: &'a Interrupter,
    processor: &'a Mutex<SupervisedTrainingEventProcessor<LC>>,
}

/// What only the main peer (rank 0) does.
struct Main<LC: LearningComponentsTypes> {
    valid: ValidLoader<LC>,
    checkpointer: Option<LearningCheckpointer<LC>>,
    early_stopping: Option<Box<dyn CloneEarlyStoppingStrategy>>,
    event_store: Arc<EventStoreClient>,
}

/// A peer's result: its model, steps, items and time in collective operations.
struct PeerRun<M> {
    model: M,
    steps: usize,
    items: usize,
    collective: Duration,
}

impl<LC> SupervisedLearningStrategy<LC> for Strategy<LC>
where
    LC: LearningComponentsTypes + Send + 'static,
    Inner<LC>: DeviceTransfer,
{
    fn fit(
        &self,
        components: TrainingComponents<LC>,
        mut learner: Learner<LC>,
        dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        starting_epoch: usize,
    ) -> (TrainingModel<LC>, SupervisedTrainingEventProcessor<LC>) {
        let start = Instant::now();
        let fail = |error: DistributedError| {
            *lock(&self.outcome) = Some(Err(error));
        };
        let Ok(_run) = RUN.try_lock() else {
            fail(DistributedError::Busy);
            return (learner.model(), components.event_processor);
        };
        // Burn initialises parameters at their first use, and a copy made before that draws
        // values of its own: the replicas below must copy initialised parameters.
        let model = learner.model();
        draw_params(&model);
        learner.load_model(model.into_record());
        // A fresh collective: an earlier run's peers are gone.
        crate::peer::reset_collectives::<Inner<LC>>();

        let local_peers = self.devices.len();
        let processes = self.processes;
        let world = processes.world_size(local_peers);
        let shard_len = dataloader_train.num_items() / world;
        let is_main_node = processes.rank == 0;
        let processor = Mutex::new(components.event_processor);
        let shared = Shared::<LC> {
            config: &self.config,
            processes,
            local_peers,
            num_epochs: components.num_epochs,
            starting_epoch,
            grad_accumulation: components.grad_accumulation,
            interrupter: &components.interrupter,
            processor: &processor,
        };
        let main = is_main_node.then(|| Main::<LC> {
            valid: dataloader_valid.to_device(&self.devices[0]),
            checkpointer: components.checkpointer,
            early_stopping: components.early_stopping,
            event_store: components.event_store,
        });

        let results = self.run_peers(&shared, &learner, &dataloader_train, shard_len, main);
        let processor = processor.into_inner().unwrap_or_else(|p| p.into_inner());

        // The error to report is the first peer's that is not a timeout: a timeout is usually
        // what the others see of it.
        let error = results
            .iter()
            .filter_map(|result| result.as_ref().err())
            .min_by_key(|error| matches!(error, DistributedError::Timeout { .. }))
            .cloned();
        if let Some(error) = error {
            components.interrupter.stop(Some(&error.to_string()));
            tracing::error!("data-parallel training stopped: {error}");
            let model = results
                .into_iter()
                .find_map(Result::ok)
                .map(|run| run.model)
                .unwrap_or_else(|| learner.model());
            fail(error);
            return (model, processor);
        }
        let runs: Vec<PeerRun<TrainingModel<LC>>> = results.into_iter().flatten().collect();
        let report = DataParallelReport {
            world_size: world,
            local_peers,
            steps: runs[0].steps,
            items: runs.iter().map(|run| run.items).sum(),
            seconds: start.elapsed().as_secs_f64(),
            collective_seconds: runs
                .iter()
                .map(|run| run.collective.as_secs_f64())
                .collect(),
        };
        tracing::info!("data-parallel training: {report}");
        *lock(&self.outcome) = Some(Ok(report));
        let model = runs.into_iter().next().expect("one peer at least").model;
        (model, processor)
    }
}

impl<LC> Strategy<LC>
where
    LC: LearningComponentsTypes + Send + 'static,
    Inner<LC>: DeviceTransfer,
{
    /// Runs one peer per device, each on a thread of its own (in a rayon pool of its own with
    /// `threads_per_peer`) with its shard of `dataloader_train`; local peer 0 gets `main`.
    /// Returns each peer's run, or its error (a panic included), in local order.
    fn run_peers(
        &self,
        shared: &Shared<'_, LC>,
        learner: &Learner<LC>,
        dataloader_train: &TrainLoader<LC>,
        shard_len: usize,
        mut main: Option<Main<LC>>,
    ) -> Vec<Result<PeerRun<TrainingModel<LC>>, DistributedError>> {
        let local_peers = self.devices.len();
        std::thread::scope(|scope| {
            let handles: Vec<_> =
                self.devices
                    .iter()
                    .enumerate()
                    .map(|(local, device)| {
                        let rank = shared.processes.global_rank(local_peers, local) as usize;
                        let shard = dataloader_train
                            .slice(rank * shard_len, (rank + 1) * shard_len)
                            .to_device(device);
                        let learner = learner.clone();
                        let main = if local == 0 { main.take() } else { None };
                        std::thread::Builder::new()
                            .name(format!("data-parallel peer {rank}"))
                            .spawn_scoped(scope, move || {
                                let run = || {
                                    run_peer(shared, local, device.clone(), learner, shard, main)
                                };
                                match shared.config.threads_per_peer {
                                None => run(),
                                Some(threads) => rayon::ThreadPoolBuilder::new()
                                    .num_threads(threads)
                                    .thread_name(move |i| format!("peer {rank} compute {i}"))
                                    .build()
                                    .map_err(|error| DistributedError::InvalidConfig(format!(
                                        "a pool of {threads} threads for peer {rank}: {error}"
                                    )))?
                                    .install(run),
                            }
                            })
                            .expect("a thread for the peer")
                    })
                    .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(local, handle)| {
                    handle.join().unwrap_or_else(|panic| {
                        Err(DistributedError::PeerPanicked {
                            peer: shared.processes.global_rank(local_peers, local),
                            message: panic_message(panic.as_ref()),
                        })
                    })
                })
                .collect()
        })
    }
}

/// One peer's training: join, check the replicas, then the epochs.
fn run_peer<LC>(
    shared: &Shared<'_, LC>,
    local: usize,
    device: burn::tensor::Device<LC::Backend>,
    mut learner: Learner<LC>,
    shard: TrainLoader<LC>,
    mut main: Option<Main<LC>>,
) -> Result<PeerRun<TrainingModel<LC>>, DistributedError>
where
    LC: LearningComponentsTypes,
    Inner<LC>: DeviceTransfer,
{
    let peer = Rc::new(Peer::<Inner<LC>>::join(
        local,
        shared.local_peers,
        device.clone(),
        shared.config,
    )?);
    fork_replica(|| learner.fork(&device));
    peer.check_replicas(&learner.model())?;
    let layout = Rc::new(GradientLayout::of(&learner.model()));
    let (mut steps, mut items, mut collective) = (0, 0, Duration::ZERO);

    for epoch in shared.starting_epoch..=shared.num_epochs {
        let global_progress = Progress {
            items_processed: epoch,
            items_total: shared.num_epochs,
        };
        let run = train_epoch(
            shared,
            &peer,
            &layout,
            &mut learner,
            &shard,
            &global_progress,
        )?;
        steps += run.steps;
        items += run.items;
        collective += run.collective;
        let stop_here = match &mut main {
            Some(main) => end_epoch(main, &learner, &global_progress, shared, run.stop),
            None => false,
        };
        if run.stop {
            break;
        }
        // The main peer's early stopping, or an interrupt seen anywhere, ends the run for all.
        let waited = Instant::now();
        let any = peer.any(stop_here || shared.interrupter.should_stop())?;
        collective += waited.elapsed();
        if any {
            break;
        }
    }

    let model = learner.model();
    let peer = Rc::try_unwrap(peer).unwrap_or_else(|_| unreachable!("the step reductions ended"));
    peer.leave()?;
    Ok(PeerRun {
        model,
        steps,
        items,
        collective,
    })
}

/// The inner backend of a learner's training backend: the one peers reduce on.
type Inner<LC> = <<LC as LearningComponentsTypes>::Backend as AutodiffBackend>::InnerBackend;

/// What one epoch of a peer's training did.
struct EpochRun {
    /// Optimizer steps taken (one per batch).
    steps: usize,
    /// Items of this peer's shard trained on.
    items: usize,
    /// Time spent in the all-reduces the strategy ran itself.
    collective: Duration,
    /// Whether a peer asked to stop: the epoch ended after that step.
    stop: bool,
}

/// One epoch of a peer over its shard: each step's gradients averaged over every peer (inside
/// the step when mixed precision asks for them, after it otherwise), then applied, with or
/// without accumulation; every step reported to the event processor.
fn train_epoch<LC: LearningComponentsTypes>(
    shared: &Shared<'_, LC>,
    peer: &Rc<Peer<Inner<LC>>>,
    layout: &Rc<GradientLayout>,
    learner: &mut Learner<LC>,
    shard: &TrainLoader<LC>,
    global_progress: &Progress,
) -> Result<EpochRun, DistributedError> {
    let world = peer.world_size();
    let mut run = EpochRun {
        steps: 0,
        items: 0,
        collective: Duration::ZERO,
        stop: false,
    };
    let mut iterator = shard.iter();
    let mut iteration = 0;
    let mut accumulator = GradientsAccumulator::new();
    let mut accumulated = 0;
    while let Some(item) = iterator.next() {
        iteration += world;
        learner.lr_step();
        let asked = shared.interrupter.should_stop();

        let reduction = Rc::new(StepReduction::new(peer.clone(), layout.clone(), asked));
        let output = with_gradient_reduction(reduction.clone(), || learner.train_step(item));
        let (grads, any_stop) = match reduction.outcome() {
            Some(reduced) => (output.grads, reduced?),
            None => {
                let reduced = Instant::now();
                let result = peer.mean_gradients_of(layout, output.grads, asked)?;
                run.collective += reduced.elapsed();
                result
            }
        };
        match shared.grad_accumulation {
            Some(every) => {
                accumulator.accumulate(&learner.model(), grads);
                accumulated += 1;
                if accumulated >= every {
                    learner.optimizer_step(accumulator.grads());
                    accumulated = 0;
                }
            }
            None => learner.optimizer_step(grads),
        }
        run.steps += 1;

        let mut progress = iterator.progress();
        run.items = progress.items_processed;
        progress.items_processed *= world;
        progress.items_total *= world;
        let item = TrainingItem::new(
            output.item,
            progress,
            global_progress.clone(),
            Some(iteration),
            Some(learner.lr_current()),
        );
        lock(shared.processor).process_train(LearnerEvent::ProcessedItem(item));
        if any_stop {
            run.stop = true;
            break;
        }
    }
    Ok(run)
}

/// The main peer's end of an epoch: the dashboard's epoch ends and, unless the run stops
/// (`stopping`), validation, the checkpoint and early stopping run. Returns whether early
/// stopping asks to stop.
fn end_epoch<LC: LearningComponentsTypes>(
    main: &mut Main<LC>,
    learner: &Learner<LC>,
    global_progress: &Progress,
    shared: &Shared<'_, LC>,
    stopping: bool,
) -> bool {
    let epoch = global_progress.items_processed;
    lock(shared.processor).process_train(LearnerEvent::EndEpoch(epoch));
    if stopping {
        return false;
    }
    validate::<LC>(learner, &main.valid, global_progress, shared);
    if let Some(checkpointer) = &mut main.checkpointer {
        checkpointer.checkpoint(learner, epoch, &main.event_store);
    }
    main.early_stopping
        .as_mut()
        .is_some_and(|early| early.should_stop(epoch, &main.event_store))
}

/// The main peer's validation epoch, as burn-train's single-device strategy runs it.
fn validate<LC: LearningComponentsTypes>(
    learner: &Learner<LC>,
    loader: &ValidLoader<LC>,
    global_progress: &Progress,
    shared: &Shared<'_, LC>,
) {
    let epoch = global_progress.items_processed;
    let model = learner.model().valid();
    let mut iterator = loader.iter();
    let mut iteration = 0;
    while let Some(item) = iterator.next() {
        iteration += 1;
        let progress = iterator.progress();
        let item = model.step(item);
        let item = TrainingItem::new(
            item,
            progress,
            global_progress.clone(),
            Some(iteration),
            None,
        );
        lock(shared.processor).process_valid(LearnerEvent::ProcessedItem(item));
        if shared.interrupter.should_stop() {
            break;
        }
    }
    lock(shared.processor).process_valid(LearnerEvent::EndEpoch(epoch));
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
