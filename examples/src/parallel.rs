//! Data-parallel training in the examples: burn-data-parallel's types with the `data-parallel`
//! feature, and without it types of the same names that have no values, so that the code that
//! trains compiles unchanged and a run that asks for peers fails with [`NotCompiled`] before
//! any of them is needed.

#[cfg(feature = "data-parallel")]
pub use burn_data_parallel::{
    DataParallel, DataParallelConfig, DataParallelReport, DistributedError, NodeConfig,
    spawn_orchestrator,
};

#[cfg(not(feature = "data-parallel"))]
pub use absent::{DataParallel, DataParallelReport, DistributedError, NodeConfig};

pub use crate::backend::NotCompiled;

/// What a build without data parallel says when a run asks for it.
pub const NOT_COMPILED: NotCompiled = NotCompiled {
    what: "data-parallel training (`--devices`, `--nodes`)",
    feature: "data-parallel",
};

#[cfg(not(feature = "data-parallel"))]
mod absent {
    use std::convert::Infallible;
    use std::marker::PhantomData;

    use burn::tensor::backend::AutodiffBackend;
    use burn::train::{LearningComponentsTypes, TrainingStrategy};

    /// A node of a multi-node run: none in this build.
    #[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
    pub enum NodeConfig {}

    /// A data-parallel run: none in this build.
    #[derive(Debug)]
    pub struct DataParallel<B>(Infallible, PhantomData<B>);

    impl<B: AutodiffBackend> DataParallel<B> {
        /// Unreachable: no run exists.
        pub fn strategy<LC: LearningComponentsTypes<Backend = B>>(&self) -> TrainingStrategy<LC> {
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
