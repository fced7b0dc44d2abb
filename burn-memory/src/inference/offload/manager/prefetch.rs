//! Reading ahead: the order the modules ran in on the first pass, and the thread that reads
//! the next module of that order while the current one computes.

use std::sync::mpsc;
use std::sync::{Arc, Weak};
use std::thread::ThreadId;

use burn::tensor::backend::Backend;

use super::Inner;
use super::state::{Loaded, Source, Staged, State};
use crate::sync::lock;
use crate::{DeviceMemory, MemorySource};

impl<B: DeviceMemory> Inner<B> {
    /// Starts the prefetcher's thread, which reads the modules `request_prefetch` asks for.
    pub(super) fn start_prefetcher(inner: &Arc<Self>) {
        let (prefetch, requests) = mpsc::channel::<usize>();
        let weak: Weak<Self> = Arc::downgrade(inner);
        std::thread::Builder::new()
            .name("burn-memory-prefetch".into())
            .spawn(move || {
                while let Ok(module) = requests.recv() {
                    let Some(inner) = weak.upgrade() else { return };
                    inner.prefetch_now(module);
                }
            })
            .expect("the operating system refused to start the offload prefetcher's thread");
        *lock(&inner.prefetch) = Some(prefetch);
    }

    pub(super) fn request_prefetch(&self, next: Option<usize>) {
        let Some(module) = next else { return };
        {
            let mut state = lock(&self.state);
            if state.modules[module].device.is_some() || state.staged.contains_key(&module) {
                return;
            }
            state.staged.insert(module, Staged::Pending);
            state.counters.prefetches += 1;
        }
        let sent = lock(&self.prefetch)
            .as_ref()
            .is_some_and(|sender| sender.send(module).is_ok());
        if !sent {
            lock(&self.state).staged.remove(&module);
            self.staged_ready.notify_all();
        }
    }

    /// Reads a module ahead, on the prefetcher's thread.
    fn prefetch_now(&self, module: usize) {
        let source = lock(&self.state).source(module);
        let result = source.and_then(|source| {
            let data = match source {
                Source::Host(data) => data.to_vec(),
                Source::Disk(file) => self.cache_dir()?.read(&file)?,
                Source::Staged(result) => return result,
            };
            Ok(if B::SOURCE == MemorySource::Process {
                Loaded::Device(self.upload(&data))
            } else {
                Loaded::Host(data)
            })
        });
        let mut state = lock(&self.state);
        if let Some(Staged::Pending) = state.staged.get(&module) {
            state.staged.insert(module, Staged::Ready(result));
        }
        drop(state);
        self.staged_ready.notify_all();
    }
}

impl<B: Backend> State<B> {
    /// Follows the learned order: the module to prefetch next, or `None` (no prefetch, still
    /// learning, or the order just changed and is learned again).
    pub(super) fn advance(
        &mut self,
        thread: ThreadId,
        module: usize,
        prefetch: bool,
    ) -> Option<usize> {
        let pass = self.passes.get_mut(&thread)?;
        let position = pass.position;
        pass.position += 1;
        if self.order.get(position) == Some(&module) {
            // On the learned order.
        } else if self.learning && position == self.order.len() {
            self.order.push(module);
        } else {
            self.order.truncate(position);
            self.order.push(module);
            self.learning = true;
            self.counters.order_resets += 1;
            self.staged
                .retain(|_, staged| matches!(staged, Staged::Pending));
            return None;
        }
        if !prefetch || self.learning {
            return None;
        }
        let next = self.order.get(position + 1).or(self.order.first()).copied();
        next.filter(|&next| next != module)
    }
}
