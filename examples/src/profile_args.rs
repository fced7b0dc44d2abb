//! The `--profile` options shared by the examples that train.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn_memory::DeviceMemory;
use burn_profiler::{ProfileError, Profiler, ProfilerConfig, StepProfiler};

/// `--profile DIR` and the options that shape it: a window of training steps recorded with
/// their shapes and memory after a warm-up, written as the operation table, the Chrome trace,
/// the viewer and where memory peaked.
#[derive(clap::Args, Debug, Clone)]
pub struct ProfileArgs {
    /// Profile a few training steps and write the operation table, the Chrome trace, the
    /// viewer and where memory peaked to DIR (a folder per arm where a study trains several).
    #[arg(long, value_name = "DIR")]
    pub profile: Option<PathBuf>,
    /// With --profile: training steps to run before profiling (warm-up).
    #[arg(long, value_name = "N", default_value_t = 3, requires = "profile")]
    pub profile_skip: usize,
    /// With --profile: training steps to profile.
    #[arg(long, value_name = "N", default_value_t = 3, requires = "profile",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub profile_steps: u64,
    /// With --profile: sync the device after every operation, so that each records its
    /// device time (slower; changes the timing of lazy backends such as wgpu).
    #[arg(long, requires = "profile")]
    pub profile_sync: bool,
}

impl ProfileArgs {
    /// Training steps to run in all: the warm-up, then the recorded window.
    pub fn total_steps(&self) -> usize {
        self.profile_skip + self.profile_steps as usize
    }

    /// A step profiler that writes the window of `B`'s steps on `device` to `dir`.
    ///
    /// # Errors
    /// [`ProfileError::Invalid`] for an empty window.
    pub fn step_profiler<B>(
        &self,
        dir: &Path,
        device: &B::Device,
    ) -> Result<StepProfiler, ProfileError>
    where
        B: Backend + DeviceMemory,
    {
        let recording = ProfilerConfig::new()
            .with_record_shapes(true)
            .with_sync_each_op(self.profile_sync);
        let device = device.clone();
        StepProfiler::new(
            dir,
            self.profile_skip,
            self.profile_steps as usize,
            move || Profiler::start_with_memory::<B>(recording, &device),
        )
    }
}
