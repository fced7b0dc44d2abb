//! The bookkeeping behind the manager's lock: where each module's parameters are, what the
//! device cache holds, and each thread's call.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::ThreadId;

use burn::tensor::backend::Backend;

use super::super::cache::DiskFile;
use super::super::host::HostTensor;
use super::super::summary::OffloadCounters;
use super::{DeviceParams, ParamMeta};
use crate::MemoryError;

/// One managed module.
pub(super) struct Slot<B: Backend> {
    pub(super) path: String,
    pub(super) params: Vec<ParamMeta>,
    pub(super) bytes: u64,
    pub(super) host: Option<Arc<Vec<HostTensor>>>,
    pub(super) disk: Option<DiskFile>,
    pub(super) device: Option<DeviceParams<B>>,
    pub(super) last_used: u64,
}

/// Everything the manager knows, behind its lock.
pub(super) struct State<B: Backend> {
    pub(super) modules: Vec<Slot<B>>,
    pub(super) tick: u64,
    pub(super) host_bytes: u64,
    pub(super) disk_bytes: u64,
    pub(super) cached_bytes: u64,
    pub(super) largest: u64,
    pub(super) order: Vec<usize>,
    pub(super) learning: bool,
    pub(super) passes: HashMap<ThreadId, Pass<B>>,
    pub(super) staged: HashMap<usize, Staged<B>>,
    pub(super) counters: OffloadCounters,
}

/// Where a module is loaded from.
pub(super) enum Source<B: Backend> {
    Staged(Result<Loaded<B>, MemoryError>),
    Host(Arc<Vec<HostTensor>>),
    Disk(DiskFile),
}

impl<B: Backend> State<B> {
    /// No module yet, learning the order.
    pub(super) fn new() -> Self {
        Self {
            modules: Vec::new(),
            tick: 0,
            host_bytes: 0,
            disk_bytes: 0,
            cached_bytes: 0,
            largest: 0,
            order: Vec::new(),
            learning: true,
            passes: HashMap::new(),
            staged: HashMap::new(),
            counters: OffloadCounters::default(),
        }
    }

    pub(super) fn find(&self, path: &str) -> Result<usize, MemoryError> {
        self.modules
            .iter()
            .position(|slot| slot.path == path)
            .ok_or_else(|| MemoryError::invalid("module", format!("no managed module at `{path}`")))
    }

    /// Where to load `module` from: the host tier first.
    pub(super) fn source(&self, module: usize) -> Result<Source<B>, MemoryError> {
        let slot = &self.modules[module];
        match (&slot.host, &slot.disk) {
            (Some(data), _) => Ok(Source::Host(data.clone())),
            (None, Some(file)) => Ok(Source::Disk(file.clone())),
            (None, None) => Err(MemoryError::invalid(
                "offload manager",
                format!(
                    "`{}` has no copy left (the manager was cleaned up)",
                    slot.path
                ),
            )),
        }
    }

    /// Keeps `params` in the device cache if the cache stays within `limit`.
    pub(super) fn admit(&mut self, module: usize, params: DeviceParams<B>, limit: u64) {
        let bytes = self.modules[module].bytes;
        if self.modules[module].device.is_none() && self.cached_bytes + bytes <= limit {
            self.modules[module].device = Some(params);
            self.cached_bytes += bytes;
        }
    }

    pub(super) fn evict(&mut self, module: usize) {
        if self.modules[module].device.take().is_some() {
            self.cached_bytes -= self.modules[module].bytes;
            self.counters.offloads += 1;
        }
    }

    /// Up to `count` modules matching `filter`, least recently used first.
    pub(super) fn least_recently_used(
        &self,
        count: usize,
        filter: impl Fn(&Slot<B>) -> bool,
    ) -> Vec<usize> {
        let mut modules: Vec<usize> = (0..self.modules.len())
            .filter(|&m| filter(&self.modules[m]))
            .collect();
        modules.sort_by_key(|&m| self.modules[m].last_used);
        modules.truncate(count);
        modules
    }
}

/// One call of the wrapped model on one thread.
pub(super) struct Pass<B: Backend> {
    pub(super) depth: usize,
    pub(super) position: usize,
    /// The module this pass loaded last: its other parameters come from here.
    pub(super) current: Option<(usize, DeviceParams<B>)>,
    pub(super) error: Option<MemoryError>,
}

/// A module the prefetcher was asked for: being read, or read.
pub(super) enum Staged<B: Backend> {
    Pending,
    Ready(Result<Loaded<B>, MemoryError>),
}

/// A module read ahead: on CPU backends already a tensor (the prefetcher's thread made it), on
/// device backends the bytes to upload (uploads stay on the thread whose stream runs the
/// model).
pub(super) enum Loaded<B: Backend> {
    Host(Vec<HostTensor>),
    Device(DeviceParams<B>),
}
