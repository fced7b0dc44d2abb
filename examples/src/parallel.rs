//! Data-parallel training in the examples: burn-data-parallel's types with the `data-parallel`
//! feature, and without it types of the same names that have no values, so that the code that
//! trains compiles unchanged and a run that asks for peers fails with [`NotCompiled`] before
//! any of them is needed. Likewise MPI (`--mpi`) with the `mpi` feature.

use std::path::{Path, PathBuf};

#[cfg(feature = "mpi")]
pub use burn_data_parallel::Mpi;
#[cfg(feature = "data-parallel")]
pub use burn_data_parallel::{
    DataParallel, DataParallelConfig, DataParallelReport, DistributedError,
};

#[cfg(not(feature = "mpi"))]
pub use absent::Mpi;
#[cfg(not(feature = "data-parallel"))]
pub use absent::{DataParallel, DataParallelReport, DistributedError};

pub use crate::backend::NotCompiled;

/// What a build without data parallel says when a run asks for it.
pub const NOT_COMPILED: NotCompiled = NotCompiled {
    what: "data-parallel training (`--devices`)",
    feature: "data-parallel",
};

/// What a build without MPI says when a run asks for it.
pub const MPI_NOT_COMPILED: NotCompiled = NotCompiled {
    what: "data-parallel training across MPI processes (`--mpi`)",
    feature: "mpi",
};

/// MPI, initialised when the run asks for it (`asked`): `main` holds it for the whole run.
///
/// # Errors
/// [`MPI_NOT_COMPILED`] in a build without the `mpi` feature; MPI's refusal otherwise.
pub fn init_mpi(asked: bool) -> anyhow::Result<Option<Mpi>> {
    if !asked {
        return Ok(None);
    }
    #[cfg(feature = "mpi")]
    return Ok(Some(Mpi::init()?));
    #[cfg(not(feature = "mpi"))]
    Err(MPI_NOT_COMPILED.into())
}

/// The run directory of MPI rank `rank` of a run in `dir`: `dir` itself for rank 0, which
/// validates and writes the checkpoints, and `dir/rank{rank}` for the others' logs.
pub fn rank_dir(dir: &Path, rank: u32) -> PathBuf {
    match rank {
        0 => dir.to_path_buf(),
        _ => dir.join(format!("rank{rank}")),
    }
}

/// Before a resumed run on rank `rank` > 0: rank 0's configuration and checkpoints copied into
/// this rank's directory, so that every rank resumes from the same epoch and weights (the run
/// directory must be reachable from every rank: one machine or a shared file system). The
/// replica check refuses ranks that resumed from different states.
pub fn share_checkpoints(dir: &Path, rank: u32) -> std::io::Result<()> {
    if rank == 0 {
        return Ok(());
    }
    let checkpoints = dir.join("checkpoint");
    if !checkpoints.is_dir() {
        // Nothing to resume: every rank starts afresh.
        return Ok(());
    }
    let own = rank_dir(dir, rank);
    std::fs::create_dir_all(own.join("checkpoint"))?;
    std::fs::copy(dir.join("config.json"), own.join("config.json"))?;
    for entry in std::fs::read_dir(checkpoints)? {
        let path = entry?.path();
        if let Some(name) = path.file_name() {
            std::fs::copy(&path, own.join("checkpoint").join(name))?;
        }
    }
    Ok(())
}

mod absent {
    #![allow(dead_code, unreachable_pub)]

    /// MPI in this process: none in this build.
    #[derive(Debug)]
    pub enum Mpi {}

    impl Mpi {
        /// Unreachable: MPI is not in this build.
        pub fn rank(&self) -> u32 {
            match *self {}
        }

        /// Unreachable: MPI is not in this build.
        pub fn size(&self) -> u32 {
            match *self {}
        }
    }

    #[cfg(not(feature = "data-parallel"))]
    pub use no_data_parallel::*;

    #[cfg(not(feature = "data-parallel"))]
    mod no_data_parallel {
        use std::convert::Infallible;
        use std::marker::PhantomData;

        use burn::tensor::backend::AutodiffBackend;
        use burn::train::{LearningComponentsTypes, TrainingStrategy};

        /// A data-parallel run: none in this build.
        #[derive(Debug)]
        pub struct DataParallel<B>(Infallible, PhantomData<B>);

        impl<B: AutodiffBackend> DataParallel<B> {
            /// Unreachable: no run exists.
            pub fn strategy<LC: LearningComponentsTypes<Backend = B>>(
                &self,
            ) -> TrainingStrategy<LC> {
                match self.0 {}
            }

            /// Unreachable: no run exists.
            pub fn report(&self) -> Result<DataParallelReport, DistributedError> {
                match self.0 {}
            }
        }

        /// What a data-parallel run did: none in this build.
        #[derive(Debug, Clone, PartialEq)]
        pub enum DataParallelReport {}

        impl std::fmt::Display for DataParallelReport {
            fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match *self {}
            }
        }

        /// A data-parallel failure: none in this build.
        #[derive(Debug, Clone)]
        pub enum DistributedError {}

        impl std::fmt::Display for DistributedError {
            fn fmt(&self, _: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match *self {}
            }
        }

        impl std::error::Error for DistributedError {}
    }
}

/// A training loop of one's own as one rank of an MPI job (the language-model study's
/// `--mpi`): each rank takes its contiguous slice of every batch, and the gradients are
/// averaged over the job, so that the job takes the steps of one process on the whole batch.
#[cfg(feature = "mpi")]
pub struct MpiShare<B: burn::tensor::backend::Backend> {
    peer: burn_data_parallel::Peer<B>,
}

#[cfg(feature = "mpi")]
impl<B: burn_memory::DeviceTransfer> MpiShare<B> {
    /// Joins the job (MPI initialised by [`init_mpi`]) with `model`, whose replicas on every
    /// rank must be equal (checked).
    ///
    /// # Errors
    /// burn-data-parallel's: replicas that differ, a rank lost or late past `timeout`.
    pub fn join<BA, M>(
        model: &M,
        device: &B::Device,
        timeout: std::time::Duration,
    ) -> Result<Self, DistributedError>
    where
        BA: burn::tensor::backend::AutodiffBackend<InnerBackend = B>,
        M: burn::module::Module<BA>,
    {
        let config = DataParallelConfig::new()
            .with_mpi(true)
            .with_timeout(timeout);
        let peer = burn_data_parallel::Peer::join(0, 1, device.clone(), &config)?;
        peer.check_replicas(model)?;
        Ok(Self { peer })
    }

    /// This rank's contiguous slice of `batch`.
    ///
    /// # Errors
    /// [`DistributedError::InvalidConfig`] when the ranks cannot share it equally.
    pub fn shard<T: Clone>(&self, batch: &[T]) -> Result<Vec<T>, DistributedError> {
        let ranks = self.peer.world_size();
        if !batch.len().is_multiple_of(ranks) {
            return Err(DistributedError::InvalidConfig(format!(
                "a batch of {} cannot be shared by {ranks} ranks",
                batch.len()
            )));
        }
        let len = batch.len() / ranks;
        let start = self.peer.rank() as usize * len;
        Ok(batch[start..start + len].to_vec())
    }

    /// The mean over the job of every rank's `grads` of `model`.
    ///
    /// # Errors
    /// burn-data-parallel's: a rank lost or late past the timeout.
    pub fn mean_gradients<BA, M>(
        &self,
        model: &M,
        grads: burn::optim::GradientsParams,
    ) -> Result<burn::optim::GradientsParams, DistributedError>
    where
        BA: burn::tensor::backend::AutodiffBackend<InnerBackend = B>,
        M: burn::module::Module<BA>,
    {
        Ok(self.peer.mean_gradients(model, grads, false)?.0)
    }
}

/// Without MPI in this build: no share exists, and joining is [`MPI_NOT_COMPILED`].
#[cfg(not(feature = "mpi"))]
pub struct MpiShare<B>(std::convert::Infallible, std::marker::PhantomData<B>);

#[cfg(not(feature = "mpi"))]
impl<B: burn::tensor::backend::Backend> MpiShare<B> {
    /// Always [`MPI_NOT_COMPILED`].
    pub fn join<BA, M>(
        _model: &M,
        _device: &B::Device,
        _timeout: std::time::Duration,
    ) -> Result<Self, NotCompiled>
    where
        BA: burn::tensor::backend::AutodiffBackend<InnerBackend = B>,
        M: burn::module::Module<BA>,
    {
        Err(MPI_NOT_COMPILED)
    }

    /// Unreachable: no share exists.
    pub fn shard<T: Clone>(&self, _batch: &[T]) -> Result<Vec<T>, NotCompiled> {
        match self.0 {}
    }

    /// Unreachable: no share exists.
    pub fn mean_gradients<BA, M>(
        &self,
        _model: &M,
        _grads: burn::optim::GradientsParams,
    ) -> Result<burn::optim::GradientsParams, NotCompiled>
    where
        BA: burn::tensor::backend::AutodiffBackend<InnerBackend = B>,
        M: burn::module::Module<BA>,
    {
        match self.0 {}
    }
}
