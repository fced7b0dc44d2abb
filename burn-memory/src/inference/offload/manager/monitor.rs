//! The monitor: a thread that samples the device and, past the offload thresholds, empties
//! the device cache (least recently used first) and spills the host tier to disk.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::Inner;
use super::state::State;
use crate::DeviceMemory;
use crate::sync::lock;

impl<B: DeviceMemory> Inner<B> {
    /// Starts the monitor's thread, which checks the device every `check_interval_ms`.
    pub(super) fn start_monitor(inner: &Arc<Self>) {
        let (stop, stopped) = mpsc::channel::<()>();
        let weak: Weak<Self> = Arc::downgrade(inner);
        let interval = Duration::from_millis(inner.config.check_interval_ms);
        std::thread::Builder::new()
            .name("burn-memory-offload-monitor".into())
            .spawn(move || {
                loop {
                    match stopped.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    let started = Instant::now();
                    inner.monitor_tick();
                    let mut state = lock(&inner.state);
                    state.counters.monitor_ticks += 1;
                    state.counters.monitor_busy_seconds += started.elapsed().as_secs_f64();
                }
            })
            .expect("the operating system refused to start the offload monitor's thread");
        *lock(&inner.monitor_stop) = Some(stop);
    }

    fn monitor_tick(&self) {
        let in_use = match self.tracker.sample() {
            Ok(usage) => usage.in_use,
            Err(error) => {
                tracing::warn!("offload monitor cannot read the device: {error}");
                return;
            }
        };
        let ratio = in_use as f64 / self.device_budget as f64;
        {
            let mut state = lock(&self.state);
            let count = if ratio > self.config.device_emergency_threshold {
                usize::MAX
            } else if ratio > self.config.device_offload_threshold {
                self.config.offload_batch_size
            } else {
                0
            };
            for module in state.least_recently_used(count, |slot| slot.device.is_some()) {
                state.evict(module);
            }
        }
        if !self.config.disk_tier {
            return;
        }
        let spill_over = |state: &State<B>| {
            state.host_bytes as f64 > self.config.host_offload_threshold * self.host_budget as f64
        };
        let candidates = {
            let state = lock(&self.state);
            if !spill_over(&state) {
                return;
            }
            state.least_recently_used(self.config.offload_batch_size, |slot| {
                slot.host.is_some() && slot.disk.is_none()
            })
        };
        for module in candidates {
            if !spill_over(&lock(&self.state)) || !self.spill(module) {
                break;
            }
        }
    }
}
