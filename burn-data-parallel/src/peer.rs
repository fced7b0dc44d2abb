//! One peer of a data-parallel run: every collective operation it takes part in, each bounded
//! in time. Peers of one process reduce through burn-collective's local server; with MPI, the
//! process's sum then meets the other processes' in MPI's all-reduce.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::backend::flex::FlexDevice;
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorPrimitive};
use burn_collective::{CollectiveError, PeerId, ReduceOperation};
use burn_memory::DeviceTransfer;

use crate::bucket::{self, Checksums, GradientLayout};
use crate::config::local_collective;
#[cfg(feature = "mpi")]
use crate::processes::ProcessGroup;
use crate::{DataParallelConfig, DistributedError};

/// A job for the peer's collective thread.
type Job = Box<dyn FnOnce() + Send>;

/// One peer of a data-parallel run on the (non-autodiff) backend `B`, for a training loop of
/// one's own; [`DataParallel`](super::DataParallel) runs one per device inside burn-train's
/// learner.
///
/// burn-collective's operations block until every peer has called them, so a peer calls them
/// on a thread of its own and waits at most the configured timeout: a peer that died or never
/// arrived is [`DistributedError::Timeout`] (across MPI processes,
/// [`DistributedError::ProcessesLost`], naming the ranks), not a hang. After a timeout the peer
/// is spent: its thread may stay blocked until the process ends, and every later call fails at
/// once. A two-thread example is in the book's chapter on data-parallel training.
pub struct Peer<B: Backend> {
    id: PeerId,
    /// This peer's index among the peers of its process.
    local: usize,
    local_peers: usize,
    world: usize,
    device: B::Device,
    timeout: Duration,
    jobs: mpsc::Sender<Job>,
    spent: AtomicBool,
    /// Whether the collective runs on Flex with the tensors staged through host memory: for
    /// every backend whose tensors are not host memory ([`DeviceTransfer::HOST_MEMORY`]).
    /// burn-fusion 0.21 loses a tensor shared between two threads' streams (burn-collective
    /// hands each peer a clone of one sum: reading it on a second stream fails, "Should have
    /// handle for tensor"), and CubeCL 0.10 moves a tensor between two wgpu devices only on
    /// CUDA.
    staged: bool,
    /// The processes of an MPI job, on the process's first peer (the others get the sum from
    /// it).
    #[cfg(feature = "mpi")]
    group: Option<ProcessGroup>,
}

impl<B: DeviceTransfer> Peer<B> {
    /// Joins as peer `local` of `local_peers` in this process, on `device`, and waits (at most
    /// the timeout) until every peer of the process has joined. The peers of other processes
    /// meet at the first operation.
    ///
    /// # Errors
    /// [`DistributedError::InvalidConfig`] for a configuration that cannot describe the run,
    /// [`DistributedError::Timeout`] when the others do not all arrive in time,
    /// [`DistributedError::Collective`] when burn-collective refuses the registration (a peer
    /// registered twice, peers with different configurations).
    pub fn join(
        local: usize,
        local_peers: usize,
        device: B::Device,
        config: &DataParallelConfig,
    ) -> Result<Self, DistributedError> {
        let processes = config.validate(local_peers)?;
        if local >= local_peers {
            return Err(DistributedError::InvalidConfig(format!(
                "peer {local} of {local_peers}: peers are numbered from 0"
            )));
        }
        let id = PeerId(processes.global_rank(local_peers, local));
        let (jobs, receiver) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(format!("collective peer {}", id.0))
            .spawn(move || {
                while let Ok(job) = receiver.recv() {
                    job();
                }
            })
            .map_err(|error| DistributedError::Collective {
                peer: id.0,
                operation: "register",
                message: format!("cannot start the peer's thread: {error}"),
            })?;
        let peer = Self {
            id,
            local,
            local_peers,
            world: processes.world_size(local_peers),
            device: device.clone(),
            timeout: config.timeout,
            jobs,
            spent: AtomicBool::new(false),
            staged: !B::HOST_MEMORY,
            #[cfg(feature = "mpi")]
            group: if processes.size > 1 && local == 0 {
                Some(ProcessGroup::new()?)
            } else {
                None
            },
        };
        if local_peers > 1 {
            peer.register(local_collective(local_peers))?;
        }
        tracing::debug!("peer {} of {} joined", id.0, peer.world);
        Ok(peer)
    }
}

impl<B: Backend> Peer<B> {
    /// This peer's global rank, from 0; rank 0 is the main peer.
    pub fn rank(&self) -> u32 {
        self.id.0
    }

    /// How many peers train together, in every process.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The device this peer trains on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Checks that every peer holds the same parameters as this one, the fixed sketches
    /// included: a CRC-32 of each parameter's bytes, compared across peers in one all-reduce.
    /// (A model copied before Burn initialised its lazy parameters gives copies with weights
    /// of their own: this check catches it.)
    ///
    /// # Errors
    /// [`DistributedError::ReplicasDiffer`] naming the parameters that differ somewhere; every
    /// peer gets the same answer. Timeouts and the engines' errors as for every operation (a
    /// model of another structure on some peer is a shape mismatch).
    pub fn check_replicas<BA, M>(&self, module: &M) -> Result<(), DistributedError>
    where
        BA: Backend,
        M: Module<BA>,
    {
        let checksums = Checksums::of(module);
        let values = checksums.agreement_values();
        let summed = self.all_reduce_values("check replicas", values)?;
        let parameters = checksums.disagreements(&summed, self.world);
        if parameters.is_empty() {
            Ok(())
        } else {
            Err(DistributedError::ReplicasDiffer { parameters })
        }
    }

    /// Replaces `grads` by the mean of every peer's gradients of `module`, in one all-reduce,
    /// and tells whether any peer asked to stop (`stop`): every peer then gets the same
    /// gradients and the same decision.
    ///
    /// A gradient missing on some peers counts as zero in the mean; a parameter that no peer
    /// has a gradient for gets none.
    ///
    /// # Errors
    /// [`DistributedError::Timeout`], [`DistributedError::ProcessesLost`] and
    /// [`DistributedError::Collective`], as for every operation.
    pub fn mean_gradients<BA, M>(
        &self,
        module: &M,
        grads: GradientsParams,
        stop: bool,
    ) -> Result<(GradientsParams, bool), DistributedError>
    where
        BA: AutodiffBackend<InnerBackend = B>,
        M: Module<BA>,
    {
        self.mean_gradients_of(&GradientLayout::of::<BA, M>(module), grads, stop)
    }

    /// [`mean_gradients`](Self::mean_gradients) with the module's layout made beforehand.
    pub(crate) fn mean_gradients_of(
        &self,
        layout: &GradientLayout,
        mut grads: GradientsParams,
        stop: bool,
    ) -> Result<(GradientsParams, bool), DistributedError> {
        const OPERATION: &str = "all-reduce gradients";
        // The stop flag, and this peer's 1 in the count of peers.
        let control = [f32::from(u8::from(stop)), 1.0];
        let bucket = layout.pack::<B>(&mut grads, &control, &self.device);
        let summed = self.all_reduce(OPERATION, bucket)?;
        let (mean, control) = layout.unpack(summed, self.world, control.len());
        self.check_count(OPERATION, control[1])?;
        Ok((mean, control[0] > 0.0))
    }

    /// Whether any peer says `yes`: one small all-reduce, the same answer everywhere.
    ///
    /// # Errors
    /// As for every operation.
    pub fn any(&self, yes: bool) -> Result<bool, DistributedError> {
        let summed = self.all_reduce_values("agree", vec![f32::from(u8::from(yes))])?;
        Ok(summed[0] > 0.0)
    }

    /// Leaves the run: waits (at most the timeout) until every peer of the process has left,
    /// so that burn-collective can be used again in this process.
    ///
    /// # Errors
    /// [`DistributedError::Timeout`] and [`DistributedError::Collective`].
    pub fn leave(self) -> Result<(), DistributedError> {
        if self.local_peers == 1 {
            return Ok(());
        }
        let id = self.id;
        if self.staged {
            return self.call("finish", move || {
                burn_collective::finish_collective::<Flex>(id)
            });
        }
        self.call("finish", move || {
            burn_collective::finish_collective::<B>(id)
        })
    }

    /// The element-wise sum of `values` over every peer.
    fn all_reduce_values(
        &self,
        operation: &'static str,
        mut values: Vec<f32>,
    ) -> Result<Vec<f32>, DistributedError> {
        // This peer's 1 in the count of peers.
        values.push(1.0);
        let tensor = Tensor::<B, 1>::from_floats(values.as_slice(), &self.device);
        let mut summed = bucket::into_f32(self.all_reduce(operation, tensor)?);
        let count = summed.pop().expect("the count of peers");
        self.check_count(operation, count)?;
        Ok(summed)
    }

    /// The element-wise sum of `tensor` over every peer: over the process's peers first, then
    /// across processes.
    fn all_reduce(
        &self,
        operation: &'static str,
        tensor: Tensor<B, 1>,
    ) -> Result<Tensor<B, 1>, DistributedError> {
        let sum = match self.local_peers {
            1 => tensor,
            _ => self.local::<Sum>(operation, Some(tensor))?,
        };
        // Peers beyond this process's: the run spans several processes.
        if self.world == self.local_peers {
            return Ok(sum);
        }
        self.across_processes(operation, sum)
    }

    /// The sum over every process of each process's sum `sum`: the process's first peer takes
    /// part in MPI's all-reduce, and hands the result to the others.
    #[cfg(feature = "mpi")]
    fn across_processes(
        &self,
        operation: &'static str,
        sum: Tensor<B, 1>,
    ) -> Result<Tensor<B, 1>, DistributedError> {
        let total = match &self.group {
            Some(group) => {
                if self.spent.load(Ordering::Relaxed) {
                    return Err(self.timeout_error(operation));
                }
                let values = bucket::into_f32(sum);
                let len = values.len();
                let summed = group.all_reduce_sum(values, self.timeout).map_err(|lost| {
                    self.spent.store(true, Ordering::Relaxed);
                    tracing::error!(
                        "peer {}: {operation} across processes timed out after {:?}; MPI \
                         ranks that never came: {:?}",
                        self.id.0,
                        self.timeout,
                        lost.ranks
                    );
                    match lost.ranks.is_empty() {
                        true => self.timeout_error(operation),
                        false => DistributedError::ProcessesLost {
                            peer: self.id.0,
                            operation,
                            ranks: lost.ranks,
                            timeout: self.timeout,
                        },
                    }
                })?;
                Some(Tensor::from_data(
                    burn::tensor::TensorData::new(summed, [len]),
                    &self.device,
                ))
            }
            None => None,
        };
        match self.local_peers {
            1 => Ok(total.expect("a process's only peer holds its group")),
            _ => self.local::<Broadcast>(operation, total),
        }
    }

    #[cfg(not(feature = "mpi"))]
    fn across_processes(
        &self,
        _operation: &'static str,
        _sum: Tensor<B, 1>,
    ) -> Result<Tensor<B, 1>, DistributedError> {
        unreachable!("a run across processes needs the `mpi` feature (refused by `validate`)")
    }

    /// Runs the local collective operation `Op` on `tensor` (of B, or of Flex when staged).
    fn local<Op: LocalOperation>(
        &self,
        operation: &'static str,
        tensor: Option<Tensor<B, 1>>,
    ) -> Result<Tensor<B, 1>, DistributedError> {
        let id = self.id;
        if self.staged {
            let host = tensor.map(|tensor| {
                Tensor::<Flex, 1>::from_data(tensor.into_data(), &FlexDevice)
                    .into_primitive()
                    .tensor()
            });
            let result = self.call(operation, move || Op::run::<Flex>(id, host))?;
            let result = Tensor::<Flex, 1>::from_primitive(TensorPrimitive::Float(result));
            return Ok(Tensor::from_data(result.into_data(), &self.device));
        }
        let primitive = tensor.map(|tensor| tensor.into_primitive().tensor());
        let result = self.call(operation, move || Op::run::<B>(id, primitive))?;
        Ok(Tensor::from_primitive(TensorPrimitive::Float(result)))
    }

    /// Registers with burn-collective's local server (of `B`, or of Flex when staged).
    fn register(
        &self,
        collective: burn_collective::CollectiveConfig,
    ) -> Result<(), DistributedError> {
        const OPERATION: &str = "register";
        let id = self.id;
        if self.staged {
            return self.call(OPERATION, move || {
                burn_collective::register::<Flex>(id, FlexDevice, collective)
            });
        }
        let device = self.device.clone();
        self.call(OPERATION, move || {
            burn_collective::register::<B>(id, device, collective)
        })
    }

    /// Checks `count`, the sum of every peer's 1 in `operation`: it must count them all (a
    /// reduction that went on without some peer would otherwise let the others train alone
    /// on their shards with gradients divided by the whole run's size).
    fn check_count(&self, operation: &'static str, count: f32) -> Result<(), DistributedError> {
        if count == self.world as f32 {
            return Ok(());
        }
        self.spent.store(true, Ordering::Relaxed);
        Err(DistributedError::PeersMissing {
            peer: self.id.0,
            operation,
            expected: self.world,
            found: count as usize,
        })
    }

    fn timeout_error(&self, operation: &'static str) -> DistributedError {
        DistributedError::Timeout {
            peer: self.id.0,
            operation,
            timeout: self.timeout,
        }
    }

    /// Runs `operation` on the peer's collective thread and waits at most the timeout.
    fn call<T: Send + 'static>(
        &self,
        name: &'static str,
        operation: impl FnOnce() -> Result<T, CollectiveError> + Send + 'static,
    ) -> Result<T, DistributedError> {
        if self.spent.load(Ordering::Relaxed) {
            return Err(self.timeout_error(name));
        }
        let (answer, receive) = mpsc::sync_channel(1);
        let start = Instant::now();
        self.jobs
            .send(Box::new(move || {
                let _ = answer.send(operation());
            }))
            .map_err(|_| DistributedError::Collective {
                peer: self.id.0,
                operation: name,
                message: "the peer's collective thread is gone".into(),
            })?;
        match receive.recv_timeout(self.timeout) {
            Ok(Ok(value)) => {
                tracing::trace!("peer {}: {name} in {:?}", self.id.0, start.elapsed());
                Ok(value)
            }
            Ok(Err(error)) => Err(DistributedError::Collective {
                peer: self.id.0,
                operation: name,
                message: format!("{error:?}"),
            }),
            Err(_) => {
                self.spent.store(true, Ordering::Relaxed);
                tracing::error!(
                    "peer {} (local {}): {name} timed out after {:?}",
                    self.id.0,
                    self.local,
                    self.timeout
                );
                Err(self.timeout_error(name))
            }
        }
    }
}

/// A collective operation of burn-collective's local server, for any backend.
trait LocalOperation {
    /// Runs it as peer `id`; `tensor` is `None` for a peer that only receives.
    fn run<C: Backend>(
        id: PeerId,
        tensor: Option<C::FloatTensorPrimitive>,
    ) -> Result<C::FloatTensorPrimitive, CollectiveError>;
}

/// The element-wise sum over the process's peers.
struct Sum;

impl LocalOperation for Sum {
    fn run<C: Backend>(
        id: PeerId,
        tensor: Option<C::FloatTensorPrimitive>,
    ) -> Result<C::FloatTensorPrimitive, CollectiveError> {
        let tensor = tensor.expect("every peer gives a tensor to sum");
        burn_collective::all_reduce::<C>(id, tensor, ReduceOperation::Sum)
    }
}

/// One peer's tensor handed to every peer of the process.
#[cfg(feature = "mpi")]
struct Broadcast;

#[cfg(feature = "mpi")]
impl LocalOperation for Broadcast {
    fn run<C: Backend>(
        id: PeerId,
        tensor: Option<C::FloatTensorPrimitive>,
    ) -> Result<C::FloatTensorPrimitive, CollectiveError> {
        burn_collective::broadcast::<C>(id, tensor)
    }
}

/// Gives burn-collective's collectives of `B` (and of Flex, for staged peers) a fresh start:
/// an earlier run's peers are gone.
pub(crate) fn reset_collectives<B: Backend>() {
    burn_collective::reset_collective::<B>();
    burn_collective::reset_collective::<Flex>();
}

// A peer may move to another thread (its group's buffers are owned, and MPI runs at threading
// level `Serialized` or above): checked when the crate compiles.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Peer<Flex>>();
};
