//! Adaptive batch-size search: the largest batch whose whole training step fits a budget.
//!
//! The search runs the caller's training step (forward, backward and optimizer step, so that
//! optimizer state counts) at growing batch sizes: doubling from `start` until a size is over
//! budget or fails, then bisecting between the last size that fit and the first that did not.
//! Every trial starts from cleaned memory (the CubeCL pools' free pages are released) and
//! reports its peak as [`MemoryTracker`] measures it.
//!
//! Out-of-memory is contained, not fatal: a trial may return
//! [`BatchTrialFailure::OutOfMemory`] (for example from a CUDA allocation error read back as a
//! `Result`) or panic with an out-of-memory message (wgpu panics on failed allocations); both
//! count as "did not fit". A panic that is not about memory is a bug in the step and is
//! propagated unchanged.
//!
//! Run it before building the data loaders, then give them the result:
//!
//! ```
//! use burn::backend::{Autodiff, NdArray};
//! use burn::module::Module;
//! use burn::nn::LinearConfig;
//! use burn::optim::{AdamConfig, GradientsParams, Optimizer};
//! use burn::tensor::{Distribution, Tensor};
//! use burn_memory::{BatchSizeSearchConfig, MemoryBudget};
//!
//! type B = Autodiff<NdArray>;
//! let device = Default::default();
//! let model = LinearConfig::new(256, 256).init::<B>(&device);
//! let search = BatchSizeSearchConfig::new(MemoryBudget::FractionOfDevice(0.5))
//!     .with_max(64)
//!     .init::<B>(&device)
//!     .unwrap();
//! let result = search
//!     .run(|batch| {
//!         let mut optim = AdamConfig::new().init();
//!         let x = Tensor::<B, 2>::random([batch, 256], Distribution::Default, &device);
//!         let loss = model.forward(x).powi_scalar(2).mean();
//!         let grads = GradientsParams::from_grads(loss.backward(), &model);
//!         let _ = optim.step(1e-3, model.clone(), grads);
//!         Ok(())
//!     })
//!     .unwrap();
//! assert_eq!(result.batch_size, 64); // half the RAM fits a 64 × 256 batch easily
//! // DataLoaderBuilder::new(batcher).batch_size(result.batch_size)...
//! ```

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use burn::config::Config;
use serde::{Deserialize, Serialize};

use crate::{Bytes, DeviceMemory, MemoryError, MemoryTracker};

/// How much memory a training step may use.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum MemoryBudget {
    /// At most this many bytes at the peak: the device's whole usage (model, optimizer state,
    /// anything else alive), not what the step adds to it.
    Bytes(u64),
    /// At most this fraction (in `(0, 1]`) of the device's memory, where the backend knows its
    /// size (CPU backends, CUDA; not wgpu).
    FractionOfDevice(f64),
}

/// Settings of a batch-size search.
#[derive(Config, Debug)]
pub struct BatchSizeSearchConfig {
    /// The memory the device may hold at the step's peak (its absolute usage, not the step's
    /// increase over what was held before it).
    pub budget: MemoryBudget,
    /// The first batch size tried.
    #[config(default = 1)]
    pub start: usize,
    /// The largest batch size worth trying (the dataset size, say).
    #[config(default = 65536)]
    pub max: usize,
    /// Bisection tries only multiples of this (8 or 64 suit tensor cores), and stops when the
    /// sizes that fit and do not fit are this close: fewer trials than bisecting to 1.
    #[config(default = 1)]
    pub multiple_of: usize,
}

impl BatchSizeSearchConfig {
    /// A search on `device`. Fails for an empty range, a budget that is not positive, or a
    /// fraction of a device whose size the backend does not report.
    pub fn init<B: DeviceMemory>(
        &self,
        device: &B::Device,
    ) -> Result<BatchSizeSearch<B>, MemoryError> {
        if self.multiple_of == 0 {
            return Err(MemoryError::invalid("multiple_of", "0"));
        }
        if self.start == 0 || self.start > self.max {
            return Err(MemoryError::invalid(
                "batch-size range",
                format!(
                    "start {} and max {}: need 1 ≤ start ≤ max",
                    self.start, self.max
                ),
            ));
        }
        let budget = match self.budget {
            MemoryBudget::Bytes(0) => {
                return Err(MemoryError::invalid("memory budget", "0 bytes"));
            }
            MemoryBudget::Bytes(bytes) => bytes,
            MemoryBudget::FractionOfDevice(fraction) => {
                if !(fraction > 0.0 && fraction <= 1.0) {
                    return Err(MemoryError::invalid(
                        "memory budget",
                        format!("fraction {fraction}: must be in (0, 1]"),
                    ));
                }
                let capacity = B::memory_capacity(device).ok_or_else(|| {
                    MemoryError::invalid(
                        "memory budget",
                        "this backend does not report its device's size; give the budget in bytes",
                    )
                })?;
                (capacity as f64 * fraction) as u64
            }
        };
        Ok(BatchSizeSearch {
            tracker: MemoryTracker::new(device),
            budget,
            start: self.start,
            max: self.max,
            multiple_of: self.multiple_of,
        })
    }
}

/// Why a trial did not complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchTrialFailure {
    /// The device ran out of memory.
    OutOfMemory(String),
}

/// How one trial ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchTrialOutcome {
    /// The step ran and its peak was within budget.
    Fits,
    /// The step ran but its peak exceeded the budget.
    OverBudget,
    /// The step ran out of memory (an error or a contained panic), with its message.
    OutOfMemory(String),
}

/// One batch size tried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchTrial {
    /// The batch size.
    pub batch_size: usize,
    /// The measured peak (see [`MemoryTracker`]); for an out-of-memory trial, the peak up to
    /// the failure.
    pub peak: u64,
    /// How it ended.
    pub outcome: BatchTrialOutcome,
}

/// What a search found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSearchResult {
    /// The largest batch size that fit.
    pub batch_size: usize,
    /// Its measured peak.
    pub peak: u64,
    /// The budget in bytes.
    pub budget: u64,
    /// Every trial, in the order run.
    pub trials: Vec<BatchTrial>,
}

impl fmt::Display for BatchSearchResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "batch size {} (peak {} of a {} budget), {} trials:",
            self.batch_size,
            Bytes(self.peak),
            Bytes(self.budget),
            self.trials.len()
        )?;
        for trial in &self.trials {
            let outcome = match &trial.outcome {
                BatchTrialOutcome::Fits => "fits".to_string(),
                BatchTrialOutcome::OverBudget => "over budget".to_string(),
                BatchTrialOutcome::OutOfMemory(message) => format!("out of memory ({message})"),
            };
            writeln!(
                f,
                "  {:>7}: peak {:>10}  {outcome}",
                trial.batch_size,
                Bytes(trial.peak).to_string()
            )?;
        }
        Ok(())
    }
}

/// A configured search; see the [module docs](crate::training::batch_search).
#[derive(Debug)]
pub struct BatchSizeSearch<B: DeviceMemory> {
    tracker: MemoryTracker<B>,
    budget: u64,
    start: usize,
    max: usize,
    multiple_of: usize,
}

impl<B: DeviceMemory> BatchSizeSearch<B> {
    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Runs `step(batch_size)` at the sizes the search chooses and returns the largest that fit.
    /// `step` must do everything a real training step does at that batch size.
    pub fn run(
        &self,
        mut step: impl FnMut(usize) -> Result<(), BatchTrialFailure>,
    ) -> Result<BatchSearchResult, MemoryError> {
        let mut trials = Vec::new();
        let mut fits = |batch: usize, trials: &mut Vec<BatchTrial>| -> Result<bool, MemoryError> {
            let trial = self.trial(batch, &mut step)?;
            tracing::info!(
                "batch-size search: {batch} -> peak {} ({:?})",
                Bytes(trial.peak),
                trial.outcome
            );
            let ok = trial.outcome == BatchTrialOutcome::Fits;
            trials.push(trial);
            Ok(ok)
        };

        // Doubling: `good` fits, `bad` (if any) does not.
        let mut good = self.start;
        if !fits(good, &mut trials)? {
            let trial = &trials[0];
            return Err(MemoryError::NothingFits {
                batch_size: good,
                reason: match &trial.outcome {
                    BatchTrialOutcome::OutOfMemory(message) => {
                        format!("ran out of memory: {message}")
                    }
                    _ => format!(
                        "peaked at {}, over the {} budget",
                        Bytes(trial.peak),
                        Bytes(self.budget)
                    ),
                },
            });
        }
        let mut bad = None;
        while good < self.max {
            let next = good.saturating_mul(2).min(self.max);
            if fits(next, &mut trials)? {
                good = next;
            } else {
                bad = Some(next);
                break;
            }
        }
        // Bisection between the two, on multiples of `multiple_of`.
        if let Some(mut bad) = bad {
            let m = self.multiple_of;
            loop {
                let mid = (good + (bad - good) / 2) / m * m;
                if mid <= good || mid >= bad {
                    break;
                }
                if fits(mid, &mut trials)? {
                    good = mid;
                } else {
                    bad = mid;
                }
            }
        }
        let peak = trials
            .iter()
            .rev()
            .find(|t| t.batch_size == good && t.outcome == BatchTrialOutcome::Fits)
            .map_or(0, |t| t.peak);
        Ok(BatchSearchResult {
            batch_size: good,
            peak,
            budget: self.budget,
            trials,
        })
    }

    fn trial(
        &self,
        batch: usize,
        step: &mut impl FnMut(usize) -> Result<(), BatchTrialFailure>,
    ) -> Result<BatchTrial, MemoryError> {
        self.tracker.reset_peak()?;
        let ran = catch_unwind(AssertUnwindSafe(|| step(batch)));
        let outcome = match ran {
            Ok(Ok(())) => None,
            Ok(Err(BatchTrialFailure::OutOfMemory(message))) => Some(message),
            Err(payload) => match panic_message(&payload) {
                Some(message) if is_out_of_memory(&message) => Some(message),
                _ => resume_unwind(payload),
            },
        };
        // After a failure the device may still hold the partial step's buffers; the next
        // trial's `reset_peak` releases them, so that it starts clean.
        let peak = self.tracker.peak()?;
        Ok(BatchTrial {
            batch_size: batch,
            peak,
            outcome: match outcome {
                Some(message) => BatchTrialOutcome::OutOfMemory(message),
                None if peak > self.budget => BatchTrialOutcome::OverBudget,
                None => BatchTrialOutcome::Fits,
            },
        })
    }
}

fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> Option<String> {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
}

/// Whether a panic message reports an allocation failure, as wgpu, CubeCL and CUDA word them.
fn is_out_of_memory(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "out of memory",
        "outofmemory",
        "out_of_memory",
        "failed to allocate",
        "allocation failed",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::is_out_of_memory;

    #[test]
    fn recognises_out_of_memory_messages() {
        assert!(is_out_of_memory("CUDA_ERROR_OUT_OF_MEMORY"));
        assert!(is_out_of_memory(
            "wgpu error: Validation Error ... Out of Memory"
        ));
        assert!(is_out_of_memory("Failed to allocate buffer of 8 GB"));
        assert!(!is_out_of_memory("index out of bounds"));
    }
}
