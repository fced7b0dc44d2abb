//! [`StepProfiler`]: profile a few training steps from inside a training loop (burn-train's
//! learner included) and write the results to a directory.
//!
//! The first steps of a run are not typical (kernels compile, memory pools fill, caches
//! warm), so the profiler skips some, records a few, and stops. A model's training step
//! calls [`StepProfiler::step`] at its start; the learner's optimizer update and the data
//! loading between steps fall inside the recorded window too, as they should.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::{Profile, Profiler, SortBy};
use crate::ProfileError;
use crate::sync::lock;

/// Starts the profiler when the window opens (the caller chooses memory sampling).
type Start = Box<dyn Fn() -> Result<Profiler, ProfileError> + Send + Sync>;

enum State {
    Waiting,
    Running(Profiler),
    Done,
}

struct Shared {
    dir: PathBuf,
    skip: usize,
    steps: usize,
    seen: usize,
    start: Start,
    state: State,
    written: Option<Result<PathBuf, String>>,
}

/// Profiles steps `skip + 1 ..= skip + steps` of a training loop and writes the profile to a
/// directory (see [`write_profile`]). Clones share one window, so the copies of a model that
/// a learner makes all count the same steps.
#[derive(Clone)]
pub struct StepProfiler {
    shared: Arc<Mutex<Shared>>,
}

impl fmt::Debug for StepProfiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = lock(&self.shared);
        f.debug_struct("StepProfiler")
            .field("dir", &shared.dir)
            .field("skip", &shared.skip)
            .field("steps", &shared.steps)
            .field("seen", &shared.seen)
            .finish()
    }
}

impl StepProfiler {
    /// A window of `steps` steps after the first `skip`, written to `dir`; `start` starts the
    /// profiler (for example `|| Profiler::start_with_memory::<B>(config, &device)`).
    ///
    /// # Errors
    /// [`ProfileError::Invalid`] for `steps = 0`.
    pub fn new(
        dir: impl Into<PathBuf>,
        skip: usize,
        steps: usize,
        start: impl Fn() -> Result<Profiler, ProfileError> + Send + Sync + 'static,
    ) -> Result<Self, ProfileError> {
        if steps == 0 {
            return Err(ProfileError::Invalid {
                name: "steps",
                message: "a window of 0 steps records nothing; use at least 1".into(),
            });
        }
        Ok(Self {
            shared: Arc::new(Mutex::new(Shared {
                dir: dir.into(),
                skip,
                steps,
                seen: 0,
                start: Box::new(start),
                state: State::Waiting,
                written: None,
            })),
        })
    }

    /// Marks the start of a training step: opens the window after `skip` steps, and closes
    /// it and writes the profile after `steps` more. Failures are logged (a training run
    /// should not stop because its profile could not be written) and kept for
    /// [`finish`](Self::finish).
    pub fn step(&self) {
        let mut shared = lock(&self.shared);
        shared.seen += 1;
        let first = shared.skip + 1;
        if shared.seen == first && matches!(shared.state, State::Waiting) {
            match (shared.start)() {
                Ok(profiler) => {
                    tracing::info!(
                        "profiling training steps {first}..={}",
                        shared.skip + shared.steps
                    );
                    shared.state = State::Running(profiler);
                }
                Err(error) => {
                    tracing::error!("the profiler did not start: {error}");
                    shared.written = Some(Err(error.to_string()));
                    shared.state = State::Done;
                }
            }
        } else if shared.seen == first + shared.steps {
            close(&mut shared);
        }
    }

    /// Closes the window if it is still open (a run shorter than the window) and returns
    /// the directory written, or why nothing was.
    ///
    /// # Errors
    /// [`ProfileError::Invalid`] when the run ended before the window opened; the error of
    /// the profiler's start or of the writing otherwise.
    pub fn finish(&self) -> Result<PathBuf, ProfileError> {
        let mut shared = lock(&self.shared);
        close(&mut shared);
        match &shared.written {
            Some(Ok(dir)) => Ok(dir.clone()),
            Some(Err(message)) => Err(ProfileError::Invalid {
                name: "profile",
                message: message.clone(),
            }),
            None => Err(ProfileError::Invalid {
                name: "profile",
                message: format!(
                    "the run had {} steps, fewer than the {} skipped before profiling",
                    shared.seen, shared.skip
                ),
            }),
        }
    }
}

/// Stops a running window and writes its profile; does nothing otherwise.
fn close(shared: &mut Shared) {
    if !matches!(shared.state, State::Running(_)) {
        return;
    }
    if let State::Running(profiler) = std::mem::replace(&mut shared.state, State::Done) {
        let profile = profiler.stop();
        let result = write_profile(&profile, &shared.dir);
        match &result {
            Ok(()) => tracing::info!(
                "profile of {} operations written to {}",
                profile.ops.len(),
                shared.dir.display()
            ),
            Err(error) => tracing::error!("the profile could not be written: {error}"),
        }
        shared.written = Some(
            result
                .map(|()| shared.dir.clone())
                .map_err(|error| error.to_string()),
        );
    }
}

/// Writes a profile's files into `dir` (created if needed):
/// - `operations.txt`: the [`key_averages`](Profile::key_averages) table, by total time;
/// - `operations_by_shape.txt`: the same grouped by input shapes, when they were recorded;
/// - `operations.json`: the table as JSON;
/// - `trace.json`: the Chrome trace (open it in <https://ui.perfetto.dev>);
/// - `viewer.html`: the memory timeline and the table in one self-contained page;
/// - `memory_snapshot.pickle`: the allocations in PyTorch's snapshot format (for
///   `python -m torch.cuda._memory_viz` and the memory_viz page), when they were recorded;
/// - `peak.txt`: where memory peaked, when it was sampled.
///
/// # Errors
/// [`ProfileError::Io`] when a file cannot be written.
pub fn write_profile(profile: &Profile, dir: &Path) -> Result<(), ProfileError> {
    let io = |path: PathBuf| move |source| ProfileError::Io { path, source };
    std::fs::create_dir_all(dir).map_err(io(dir.to_path_buf()))?;
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(io(path))
    };
    let table = profile.key_averages().sorted_by(SortBy::TotalTime);
    write("operations.txt", format!("{table}\n"))?;
    if profile.ops.iter().any(|op| !op.inputs.is_empty()) {
        let by_shape = profile.key_averages_by_shape();
        write("operations_by_shape.txt", format!("{by_shape}\n"))?;
    }
    write("operations.json", table.to_json())?;
    profile.write_chrome_trace(dir.join("trace.json"))?;
    profile.write_viewer(dir.join("viewer.html"))?;
    if !profile.allocations.is_empty() {
        profile.write_memory_snapshot(dir.join("memory_snapshot.pickle"))?;
    }
    if let Some(peak) = profile.peak() {
        let scopes = if peak.scopes.is_empty() {
            "no scope".to_owned()
        } else {
            peak.scopes.join(" > ")
        };
        write(
            "peak.txt",
            format!(
                "memory peaked after operation {} ({}), in {}: {} in use, {} reserved\n",
                peak.op,
                peak.name,
                scopes,
                burn_memory::Bytes(peak.memory.in_use),
                burn_memory::Bytes(peak.memory.reserved)
            ),
        )?;
    }
    Ok(())
}
