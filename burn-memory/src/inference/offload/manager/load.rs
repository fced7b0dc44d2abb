//! Bringing a module to the device for a call: from the device cache, a prefetched copy, the
//! host or the disk; and each thread's call of the wrapped model (its pass), which keeps the
//! module it loaded last and the first error it met.

use std::sync::Arc;
use std::thread::ThreadId;

use burn::tensor::backend::Backend;

use super::super::host::HostTensor;
use super::state::{Loaded, Pass, Source, Staged, State};
use super::{DeviceParams, Inner};
use crate::sync::lock;
use crate::{DeviceMemory, MemoryError};

impl<B: DeviceMemory> Inner<B> {
    /// The parameters of `module` on the device, for a lazy parameter's initialiser.
    pub(crate) fn fetch(&self, module: usize) -> Result<DeviceParams<B>, MemoryError> {
        self.ensure_alive()?;
        let thread = std::thread::current().id();
        let mut state = lock(&self.state);
        if let Some(Pass {
            current: Some((current, params)),
            ..
        }) = state.passes.get(&thread)
            && *current == module
        {
            return Ok(params.clone());
        }
        state.tick += 1;
        let tick = state.tick;
        let next = state.advance(thread, module, self.config.prefetch);
        state.modules[module].last_used = tick;
        if let Some(params) = state.modules[module].device.clone() {
            state.counters.cache_hits += 1;
            state.set_current(thread, module, params.clone());
            drop(state);
            self.request_prefetch(next);
            return Ok(params);
        }
        let source = loop {
            match state.staged.remove(&module) {
                Some(Staged::Ready(result)) => {
                    state.counters.prefetch_hits += 1;
                    break Source::Staged(result);
                }
                Some(Staged::Pending) => {
                    state.staged.insert(module, Staged::Pending);
                    state = self
                        .staged_ready
                        .wait(state)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                None => break state.source(module)?,
            }
        };
        let from_disk = match &source {
            Source::Disk(_) => true,
            Source::Host(_) => false,
            Source::Staged(_) => state.modules[module].host.is_none(),
        };
        drop(state);
        self.request_prefetch(next);
        let params = match source {
            Source::Staged(result) => match result? {
                Loaded::Device(params) => params,
                Loaded::Host(data) => self.upload(&data),
            },
            Source::Host(data) => self.upload(&data),
            Source::Disk(file) => self.upload(&self.cache_dir()?.read(&file)?),
        };
        let mut state = lock(&self.state);
        let bytes = state.modules[module].bytes;
        if from_disk {
            state.counters.loads_from_disk += 1;
            state.counters.bytes_from_disk += bytes;
        } else {
            state.counters.loads_from_host += 1;
            state.counters.bytes_from_host += bytes;
        }
        let limit = self.cache_limit(&state);
        state.admit(module, params.clone(), limit);
        state.set_current(thread, module, params.clone());
        Ok(params)
    }

    pub(super) fn load_into_cache(&self, module: usize) -> Result<(), MemoryError> {
        let params = self.fetch(module)?;
        let mut state = lock(&self.state);
        state.admit(module, params, u64::MAX);
        state.release_current(std::thread::current().id());
        Ok(())
    }

    /// Tensors on the device over `data`: zero-copy on CPU backends, one upload on others.
    pub(super) fn upload(&self, data: &[HostTensor]) -> DeviceParams<B> {
        Arc::new(
            data.iter()
                .map(|data| B::float_from_data(data.to_data(), &self.device))
                .collect(),
        )
    }

    pub(crate) fn begin_pass(&self) {
        let thread = std::thread::current().id();
        let mut state = lock(&self.state);
        state
            .passes
            .entry(thread)
            .or_insert(Pass {
                depth: 0,
                position: 0,
                current: None,
                error: None,
            })
            .depth += 1;
    }

    /// Ends this thread's call; the first error a load met during it, if any.
    pub(crate) fn end_pass(&self) -> Result<(), MemoryError> {
        let thread = std::thread::current().id();
        let mut state = lock(&self.state);
        let Some(pass) = state.passes.get_mut(&thread) else {
            return Ok(());
        };
        pass.depth -= 1;
        if pass.depth > 0 {
            return Ok(());
        }
        let pass = state.passes.remove(&thread).expect("present above");
        match pass.error {
            Some(error) => Err(error),
            None => {
                if !state.order.is_empty() {
                    state.learning = false;
                }
                Ok(())
            }
        }
    }

    /// Drops the module this thread's call holds (between layers).
    pub(crate) fn release_current(&self) {
        lock(&self.state).release_current(std::thread::current().id());
    }

    /// Keeps the first error of this thread's call, for `end_pass`.
    pub(crate) fn record_error(&self, error: MemoryError) {
        let thread = std::thread::current().id();
        let mut state = lock(&self.state);
        match state.passes.get_mut(&thread) {
            Some(pass) => {
                pass.error.get_or_insert(error);
            }
            None => tracing::error!("offloaded parameter could not be loaded: {error}"),
        }
    }

    /// The first error of this thread's call so far.
    pub(crate) fn has_error(&self) -> bool {
        let thread = std::thread::current().id();
        lock(&self.state)
            .passes
            .get(&thread)
            .is_some_and(|pass| pass.error.is_some())
    }
}

impl<B: Backend> State<B> {
    fn set_current(&mut self, thread: ThreadId, module: usize, params: DeviceParams<B>) {
        if let Some(pass) = self.passes.get_mut(&thread) {
            pass.current = Some((module, params));
        }
    }

    fn release_current(&mut self, thread: ThreadId) {
        if let Some(pass) = self.passes.get_mut(&thread) {
            pass.current = None;
        }
    }
}
