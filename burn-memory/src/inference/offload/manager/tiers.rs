//! The host and disk tiers: registering a wrapped module's parameters, placing them on a
//! tier, spilling the host tier to the disk cache, and forgetting modules whose wrap failed.

use std::sync::Arc;

use super::super::host::HostTensor;
use super::state::{Slot, State};
use super::{DeviceParams, Inner, ParamMeta};
use crate::sync::lock;
use crate::{DeviceMemory, MemoryError};

impl<B: DeviceMemory> Inner<B> {
    /// Registers a parameter of the module at `path` (a new module when the path is new) and
    /// returns the module's index and the parameter's index in it.
    pub(crate) fn register(&self, path: &str, meta: ParamMeta) -> (usize, usize) {
        let mut state = lock(&self.state);
        let module = match state.modules.iter().rposition(|slot| slot.path == path) {
            Some(module) => module,
            None => {
                state.modules.push(Slot {
                    path: path.to_string(),
                    params: Vec::new(),
                    bytes: 0,
                    host: None,
                    disk: None,
                    device: None,
                    last_used: 0,
                });
                state.modules.len() - 1
            }
        };
        let slot = &mut state.modules[module];
        slot.bytes += meta.bytes;
        slot.params.push(meta);
        let (index, bytes) = (slot.params.len() - 1, slot.bytes);
        state.largest = state.largest.max(bytes);
        (module, index)
    }

    /// Places a freshly wrapped module's parameters on the host or disk tier (host first, while
    /// the host is below its threshold), and in the device cache when `device` is given and
    /// there is room. On a disk error the data stays on the host (the module stays loadable)
    /// and the error is returned.
    pub(crate) fn place(
        &self,
        module: usize,
        data: Vec<HostTensor>,
        device: Option<DeviceParams<B>>,
    ) -> Result<(), MemoryError> {
        let (bytes, host_room) = {
            let state = lock(&self.state);
            let bytes = state.modules[module].bytes;
            let room = (state.host_bytes + bytes) as f64
                <= self.config.host_offload_threshold * self.host_budget as f64;
            (bytes, room)
        };
        let to_host = self.config.host_tier && (host_room || !self.config.disk_tier);
        let result = if to_host {
            Ok(())
        } else {
            match self.write_to_disk(module, &data) {
                Ok(true) => {
                    let mut state = lock(&self.state);
                    state.counters.offloads += 1;
                    if let Some(params) = device {
                        let limit = self.cache_limit(&state);
                        state.admit(module, params, limit);
                    }
                    return Ok(());
                }
                Ok(false) if self.config.host_tier => Ok(()),
                Ok(false) => Err(MemoryError::OffloadDiskFull {
                    needed: bytes,
                    limit: self.config.max_disk_bytes,
                }),
                Err(error) => Err(error),
            }
        };
        let mut state = lock(&self.state);
        state.modules[module].host = Some(Arc::new(data));
        state.host_bytes += bytes;
        state.counters.offloads += 1;
        if let Some(params) = device {
            let limit = self.cache_limit(&state);
            state.admit(module, params, limit);
        }
        result
    }

    /// Writes a module to the disk cache if it has room: `Ok(false)` (and a warning, once per
    /// module) when `max_disk_bytes` would be passed.
    pub(super) fn write_to_disk(
        &self,
        module: usize,
        data: &[HostTensor],
    ) -> Result<bool, MemoryError> {
        let bytes: u64 = data.iter().map(HostTensor::len).sum();
        {
            let mut state = lock(&self.state);
            if state.disk_bytes + bytes > self.config.max_disk_bytes {
                state.counters.disk_full += 1;
                tracing::warn!(
                    "offload disk cache full ({} of {} bytes): {} stays on the host",
                    state.disk_bytes,
                    self.config.max_disk_bytes,
                    state.modules[module].path
                );
                return Ok(false);
            }
            // Reserve the room before writing, so that concurrent spills cannot overshoot.
            state.disk_bytes += bytes;
        }
        let written = self.cache_dir().and_then(|dir| {
            dir.write(
                &format!("m{module:05}"),
                data,
                self.config.compress_disk_cache,
            )
        });
        let mut state = lock(&self.state);
        state.disk_bytes -= bytes;
        let file = written?;
        state.disk_bytes += file.len;
        state.counters.spills_to_disk += 1;
        state.counters.bytes_to_disk += file.len;
        state.modules[module].disk = Some(file);
        Ok(true)
    }

    /// Moves a host-tier module to disk; `false` when it cannot (no room, a write error:
    /// warned, the module stays on the host).
    pub(super) fn spill(&self, module: usize) -> bool {
        let data = {
            let state = lock(&self.state);
            match (&state.modules[module].host, &state.modules[module].disk) {
                (Some(data), None) => data.clone(),
                _ => return false,
            }
        };
        match self.write_to_disk(module, &data) {
            Ok(true) => {
                let mut state = lock(&self.state);
                if state.modules[module].host.take().is_some() {
                    state.host_bytes -= state.modules[module].bytes;
                }
                true
            }
            Ok(false) => false,
            Err(error) => {
                tracing::warn!("cannot spill a module to disk, it stays on the host: {error}");
                false
            }
        }
    }

    /// Bytes the device cache may hold: the reload threshold of the budget, less two modules
    /// (the one running and the next).
    pub(super) fn cache_limit(&self, state: &State<B>) -> u64 {
        let limit = self.config.device_reload_threshold * self.device_budget as f64;
        (limit as u64).saturating_sub(2 * state.largest)
    }

    /// Forgets modules whose wrap failed: their data is dropped and their files removed.
    pub(crate) fn forget(&self, modules: &[usize]) {
        let mut state = lock(&self.state);
        for &module in modules {
            state.evict(module);
            let slot = &mut state.modules[module];
            let host = slot.host.take().map_or(0, |_| slot.bytes);
            let file = slot.disk.take();
            state.host_bytes -= host;
            if let Some(file) = file {
                state.disk_bytes -= file.len;
                if let Some(dir) = self.cache.get() {
                    dir.remove(&file);
                }
            }
        }
    }
}
