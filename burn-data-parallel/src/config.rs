//! How a data-parallel run is laid out: its peers in this process, the processes, the timeout.

use std::time::Duration;

use burn::config::Config;
use burn_collective::{AllReduceStrategy, CollectiveConfig};

use crate::DistributedError;

/// A data-parallel run: how long a collective operation may wait, and whether the run spans
/// the processes of an MPI job.
///
/// The peers in this process are the devices given to [`DataParallel`](super::DataParallel):
/// one thread each, reducing through burn-collective in memory. With [`mpi`](Self::mpi), every
/// process of the job (`mpirun -np N`, `srun`) runs its own peers, and the processes' sums meet
/// in MPI's all-reduce.
#[derive(Config, Debug)]
pub struct DataParallelConfig {
    /// How long a collective operation (the replica check, a gradient all-reduce, the stop
    /// agreement) may wait for the other peers before the run fails with
    /// [`DistributedError::Timeout`] or [`DistributedError::ProcessesLost`]. It must exceed
    /// the longest time a peer spends between two of them: a training step, and validation on
    /// the main peer (the others wait for it at the next epoch's first all-reduce). PyTorch's
    /// default for NCCL is 10 minutes.
    #[config(default = "Duration::from_secs(600)")]
    pub timeout: Duration,
    /// This process is one rank of an MPI job: the peers of every process train together,
    /// process 0's first peer being the main peer. MPI must be initialised while the run
    /// lasts (`Mpi::init`, with the crate's `mpi` feature).
    #[config(default = false)]
    pub mpi: bool,
    /// Threads of each peer's own rayon pool, the pool CPU backends (Flex, NdArray) compute
    /// on. `None` lets all peers share the process's pool: peers that are threads on one CPU
    /// then compete for the same cores, as processes with the default OpenMP threads do under
    /// PyTorch's DDP. Give `cores / peers`.
    #[config(default = "None")]
    pub threads_per_peer: Option<usize>,
}

/// Where a run's processes stand: this one's rank and how many there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Processes {
    pub(crate) rank: u32,
    pub(crate) size: u32,
}

impl DataParallelConfig {
    /// Checks the configuration for `local_peers` peers in this process, and reads the
    /// processes of the run.
    pub(crate) fn validate(&self, local_peers: usize) -> Result<Processes, DistributedError> {
        let invalid = |message: String| Err(DistributedError::InvalidConfig(message));
        if local_peers == 0 {
            return invalid("no device: give at least one".into());
        }
        if self.threads_per_peer == Some(0) {
            return invalid("`threads_per_peer` is 0".into());
        }
        if self.timeout.is_zero() {
            return invalid("a timeout of zero lets no collective operation complete".into());
        }
        let processes = self.processes()?;
        let world = local_peers * processes.size as usize;
        // The replica check sums bytes and their squares in f32, exact up to 256 peers.
        if world > 256 {
            return invalid(format!("{world} peers: at most 256 are supported"));
        }
        Ok(processes)
    }

    /// This process's rank and the number of processes: MPI's with [`mpi`](Self::mpi), else
    /// one.
    fn processes(&self) -> Result<Processes, DistributedError> {
        if !self.mpi {
            return Ok(Processes { rank: 0, size: 1 });
        }
        #[cfg(feature = "mpi")]
        {
            let (rank, size) = crate::processes::rank_and_size()?;
            Ok(Processes { rank, size })
        }
        #[cfg(not(feature = "mpi"))]
        Err(DistributedError::InvalidConfig(
            "`mpi` is set but burn-data-parallel was built without its `mpi` feature".into(),
        ))
    }
}

impl Processes {
    /// All peers of the run, in every process.
    pub(crate) fn world_size(&self, local_peers: usize) -> usize {
        local_peers * self.size as usize
    }

    /// The global rank of this process's peer `local`.
    pub(crate) fn global_rank(&self, local_peers: usize, local: usize) -> u32 {
        (self.rank as usize * local_peers + local) as u32
    }
}

/// burn-collective's configuration for `local_peers` peers in this process.
pub(crate) fn local_collective(local_peers: usize) -> CollectiveConfig {
    // Threads of one process share memory: the centralised all-reduce adds the tensors on one
    // peer and hands the sum back, with the fewest copies.
    CollectiveConfig::default()
        .with_num_devices(local_peers)
        .with_local_all_reduce_strategy(AllReduceStrategy::Centralized)
}
