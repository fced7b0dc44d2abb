//! [`SharedMixedPrecision`]: a model field that holds a mixed-precision run's state, shared by
//! the model's copies and saved with its record.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

use burn::module::{
    AutodiffModule, Content, Devices, Module, ModuleDisplay, ModuleDisplayDefault, ModuleMapper,
    ModuleVisitor,
};
use burn::record::{PrecisionSettings, Record};
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::{MixedPrecision, MixedPrecisionRecord};

/// A [`MixedPrecision`] state as a field of a Burn module on backend `B`, or none.
///
/// Why a module: burn-train's `TrainStep::step` takes the model by `&self` and the learner
/// clones it, yet the loss scale must change from step to step and survive a restart. As a
/// field of the model this type is shared by every clone (one state per run), its record (the
/// loss scale and counters, [`MixedPrecisionRecord`]) is saved in the model's checkpoints and
/// restored by `load_record`, and the model's summary shows it as one line. It is generic over
/// the backend only because Burn's `Module` derive persists exactly the fields whose type
/// names the backend. Example: the book's chapter on mixed precision.
pub struct SharedMixedPrecision<B> {
    state: Option<Arc<Mutex<MixedPrecision>>>,
    backend: PhantomData<fn() -> B>,
}

impl<B> std::fmt::Debug for SharedMixedPrecision<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedMixedPrecision")
            .field(&self.get())
            .finish()
    }
}

impl<B> Clone for SharedMixedPrecision<B> {
    /// Another handle on the same state.
    fn clone(&self) -> Self {
        Self::shared(self.state.clone())
    }
}

impl<B> SharedMixedPrecision<B> {
    /// Holds `amp`.
    pub fn new(amp: MixedPrecision) -> Self {
        Self::shared(Some(Arc::new(Mutex::new(amp))))
    }

    /// Holds nothing: training in full precision.
    pub fn none() -> Self {
        Self::shared(None)
    }

    fn shared(state: Option<Arc<Mutex<MixedPrecision>>>) -> Self {
        Self {
            state,
            backend: PhantomData,
        }
    }

    /// The state, locked for a training step; `None` without mixed precision.
    pub fn lock(&self) -> Option<MutexGuard<'_, MixedPrecision>> {
        self.state.as_ref().map(|amp| crate::sync::lock(amp))
    }

    /// A copy of the state now.
    pub fn get(&self) -> Option<MixedPrecision> {
        self.lock().map(|amp| amp.clone())
    }
}

impl<B: Backend> Module<B> for SharedMixedPrecision<B> {
    type Record = Option<MixedPrecisionRecord>;

    fn visit<V: ModuleVisitor<B>>(&self, _visitor: &mut V) {}

    fn map<M: ModuleMapper<B>>(self, _mapper: &mut M) -> Self {
        self
    }

    /// Continues from the record's scale and counters. A record without state (saved by a
    /// full-precision run) leaves the state as it is; so does an invalid one, with a warning.
    fn load_record(self, record: Self::Record) -> Self {
        if let (Some(mut amp), Some(record)) = (self.lock(), record)
            && let Err(err) = amp.load_record(record)
        {
            tracing::warn!("mixed precision: checkpoint state not restored: {err}");
        }
        self
    }

    fn into_record(self) -> Self::Record {
        self.get().map(|amp| amp.record())
    }

    fn to_device(self, _device: &B::Device) -> Self {
        self
    }

    /// The same state, except for a data-parallel peer's replica, which gets a copy of its own
    /// (every peer takes the same decisions from the same mean gradients).
    fn fork(self, _device: &B::Device) -> Self {
        if crate::hooks::forking_replica() {
            return Self::shared(self.get().map(|amp| Arc::new(Mutex::new(amp))));
        }
        self
    }

    fn collect_devices(&self, devices: Devices<B>) -> Devices<B> {
        devices
    }
}

/// The inner-backend module shares the state: validation and training see one run.
impl<B: AutodiffBackend> AutodiffModule<B> for SharedMixedPrecision<B> {
    type InnerModule = SharedMixedPrecision<B::InnerBackend>;

    fn valid(&self) -> Self::InnerModule {
        SharedMixedPrecision::shared(self.state.clone())
    }

    fn from_inner(module: Self::InnerModule) -> Self {
        Self::shared(module.state)
    }
}

impl<B> ModuleDisplayDefault for SharedMixedPrecision<B> {
    fn content(&self, content: Content) -> Option<Content> {
        let line = match self.get() {
            Some(amp) => amp.to_string(),
            None => "full precision".to_string(),
        };
        content.add_formatted(&line).optional()
    }
}

impl<B> ModuleDisplay for SharedMixedPrecision<B> {}

impl<B: Backend> Record<B> for MixedPrecisionRecord {
    type Item<S: PrecisionSettings> = Self;

    fn into_item<S: PrecisionSettings>(self) -> Self {
        self
    }

    fn from_item<S: PrecisionSettings>(item: Self, _device: &B::Device) -> Self {
        item
    }
}
