//! `MemoryMonitor`: a device's memory over time, sampled on a background thread.

use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::sync::lock;
use crate::{Bytes, DeviceMemory, MemoryError, MemoryTracker};

/// One reading of the device's memory.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Seconds since the monitor started.
    pub seconds: f64,
    /// Bytes in use.
    pub in_use: u64,
    /// Bytes reserved.
    pub reserved: u64,
}

/// A labelled stretch of time (forward, backward, optimizer step...), from a
/// [`MemoryMonitor::mark`] to the next mark or the end of the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// The label given to [`MemoryMonitor::mark`].
    pub label: String,
    /// Seconds since the monitor started.
    pub start: f64,
    /// Seconds since the monitor started; the stop time for the last phase.
    pub end: f64,
}

/// What a [`MemoryMonitor`] recorded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// The samples, in time order.
    pub samples: Vec<Sample>,
    /// The labelled phases, in time order.
    pub phases: Vec<Phase>,
}

/// Summary figures of a [`Timeline`], in bytes in use.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelineStats {
    /// Largest sample.
    pub max: u64,
    /// Mean of the samples.
    pub mean: f64,
    /// Last sample.
    pub last: u64,
    /// Largest reserved sample.
    pub max_reserved: u64,
}

/// Samples a device's memory every `interval` on a thread of its own until stopped or dropped,
/// into a [`Timeline`] of labelled phases: when memory rose, not only how high.
///
/// ```
/// # use std::time::Duration;
/// # use burn::backend::Flex;
/// # use burn_memory::{MemoryMonitor, MemoryTracker};
/// # let device = Default::default();
/// let monitor = MemoryMonitor::start(MemoryTracker::<Flex>::new(&device), Duration::from_millis(5));
/// monitor.mark("forward");
/// // ... the work to watch ...
/// let timeline = monitor.stop();
/// assert_eq!(timeline.phases.len(), 1);
/// ```
pub struct MemoryMonitor {
    started: Instant,
    state: Arc<Mutex<Timeline>>,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MemoryMonitor {
    /// Starts sampling `tracker`'s device every `interval` (the samples also feed the tracker's
    /// peak). Sampling reads the device's counters without waiting for its queued work.
    pub fn start<B: DeviceMemory>(tracker: MemoryTracker<B>, interval: Duration) -> Self {
        let started = Instant::now();
        let state = Arc::new(Mutex::new(Timeline::default()));
        let (stop, stopped) = mpsc::channel::<()>();
        let samples = state.clone();
        let thread = std::thread::Builder::new()
            .name("burn-memory-monitor".into())
            .spawn(move || {
                loop {
                    match tracker.sample() {
                        Ok(usage) => lock(&samples).samples.push(Sample {
                            seconds: started.elapsed().as_secs_f64(),
                            in_use: usage.in_use,
                            reserved: usage.reserved,
                        }),
                        Err(error) => {
                            tracing::warn!("memory monitor stops: {error}");
                            return;
                        }
                    }
                    match stopped.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => continue,
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })
            .expect("the operating system refused to start the memory monitor's thread");
        Self {
            started,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Ends the current phase (if any) and starts one called `label`.
    pub fn mark(&self, label: impl Into<String>) {
        let now = self.started.elapsed().as_secs_f64();
        let mut timeline = lock(&self.state);
        if let Some(last) = timeline.phases.last_mut() {
            last.end = now;
        }
        timeline.phases.push(Phase {
            label: label.into(),
            start: now,
            end: now,
        });
    }

    /// A copy of what has been recorded so far.
    pub fn snapshot(&self) -> Timeline {
        lock(&self.state).clone()
    }

    /// Stops the thread, waits for it to end and returns the timeline.
    pub fn stop(mut self) -> Timeline {
        self.halt();
        std::mem::take(&mut *lock(&self.state))
    }

    fn halt(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let now = self.started.elapsed().as_secs_f64();
        if let Some(last) = lock(&self.state).phases.last_mut() {
            last.end = now;
        }
    }
}

impl Drop for MemoryMonitor {
    fn drop(&mut self) {
        self.halt();
    }
}

impl Timeline {
    /// Max, mean and last of the in-use samples; `None` without samples.
    pub fn stats(&self) -> Option<TimelineStats> {
        let last = self.samples.last()?;
        let sum: f64 = self.samples.iter().map(|s| s.in_use as f64).sum();
        Some(TimelineStats {
            max: self.samples.iter().map(|s| s.in_use).max().unwrap_or(0),
            mean: sum / self.samples.len() as f64,
            last: last.in_use,
            max_reserved: self.samples.iter().map(|s| s.reserved).max().unwrap_or(0),
        })
    }

    /// The label of the phase running at `seconds`, if any.
    pub fn phase_at(&self, seconds: f64) -> Option<&str> {
        self.phases
            .iter()
            .rev()
            .find(|phase| phase.start <= seconds)
            .filter(|phase| seconds <= phase.end)
            .map(|phase| phase.label.as_str())
    }

    /// Writes the samples as CSV: `seconds,in_use_bytes,reserved_bytes,phase`.
    pub fn write_csv(&self, path: impl AsRef<Path>) -> Result<(), MemoryError> {
        let path = path.as_ref();
        let io = |source| MemoryError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
        writeln!(out, "seconds,in_use_bytes,reserved_bytes,phase").map_err(io)?;
        for sample in &self.samples {
            let phase = self.phase_at(sample.seconds).unwrap_or("");
            writeln!(
                out,
                "{:.6},{},{},{}",
                sample.seconds,
                sample.in_use,
                sample.reserved,
                phase.replace([',', '\n'], " ")
            )
            .map_err(io)?;
        }
        out.flush().map_err(io)
    }

    /// Plots memory in use and reserved over time, with the phases shaded and labelled, as PNG
    /// or SVG (chosen from the extension: `.svg` is SVG, anything else PNG). Needs the `plot`
    /// feature.
    #[cfg(feature = "plot")]
    pub fn plot(&self, path: impl AsRef<Path>, title: &str) -> Result<(), MemoryError> {
        crate::measure::plot::plot_timeline(
            self,
            path.as_ref(),
            crate::PlotFormat::from_path(path.as_ref()),
            title,
        )
    }

    /// A one-line summary, e.g. for logs.
    pub fn summary(&self) -> String {
        match self.stats() {
            Some(stats) => format!(
                "{} samples: max {}, mean {}, last {}, max reserved {}",
                self.samples.len(),
                Bytes(stats.max),
                Bytes(stats.mean as u64),
                Bytes(stats.last),
                Bytes(stats.max_reserved)
            ),
            None => "no samples".to_string(),
        }
    }
}
