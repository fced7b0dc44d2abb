//! Wrapping a model: which modules are managed, and the lazy parameters that load them.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};

use super::OffloadManager;
use super::host::HostTensor;
use super::manager::{Inner, ParamMeta};
use crate::{DeviceMemory, Layers, MemoryError};

/// Which modules of a model an [`OffloadManager`] manages. A module is named by its path in
/// the model, as Burn's module visitors see it (`layers.3`, `encoder.attention.query`), and
/// typed by its struct's name (`Linear`, `SkLinear`, `Conv2d`).
#[derive(Clone)]
pub enum OffloadSelection {
    /// Every module whose struct has one of these names.
    Types(Vec<String>),
    /// The one module at this path.
    Module(String),
    /// Every module whose path the predicate accepts.
    Predicate(Arc<dyn Fn(&str) -> bool + Send + Sync>),
}

impl OffloadSelection {
    /// Every module of these types: `OffloadSelection::types(["Linear", "Conv2d"])`.
    pub fn types<S: Into<String>>(types: impl IntoIterator<Item = S>) -> Self {
        Self::Types(types.into_iter().map(Into::into).collect())
    }

    /// The module at `path`.
    pub fn module(path: impl Into<String>) -> Self {
        Self::Module(path.into())
    }

    /// Every module whose path `predicate` accepts. (In `burn_sketch::nn::OffloadSelection`,
    /// `paths` takes a list of path patterns; a closure is a predicate in both crates.)
    pub fn predicate(predicate: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        Self::Predicate(Arc::new(predicate))
    }

    fn accepts(&self, path: &str, type_name: &str) -> bool {
        match self {
            Self::Types(types) => types.iter().any(|t| t == type_name),
            Self::Module(module) => module == path,
            Self::Predicate(predicate) => predicate(path),
        }
    }
}

/// `nn::Linear`, burn-sketch's `SkLinear` and `nn::conv::Conv2d`: the layers that hold a
/// model's weight matrices.
impl Default for OffloadSelection {
    fn default() -> Self {
        Self::types(["Linear", "SkLinear", "Conv2d"])
    }
}

impl fmt::Debug for OffloadSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Types(types) => f.debug_tuple("Types").field(types).finish(),
            Self::Module(path) => f.debug_tuple("Module").field(path).finish(),
            Self::Predicate(_) => f.write_str("Predicate(..)"),
        }
    }
}

/// A wrap that failed: the error and the model, whole and on the device as it came.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct WrapError<M> {
    /// Why the wrap failed.
    #[source]
    pub error: MemoryError,
    /// The model, with every parameter back in place.
    pub model: M,
}

/// A model whose managed modules live on the manager's tiers. Call it with
/// [`run`](Self::run) (any model) or [`forward_layers`](Self::forward_layers) (a layer
/// sequence, one layer on the device at a time). `Sync`: threads may call it at once.
pub struct OffloadedModel<B: DeviceMemory, M> {
    manager: OffloadManager<B>,
    template: M,
    modules: Vec<usize>,
    /// The parameters the wrap made lazy.
    params: HashSet<ParamId>,
}

impl<B: DeviceMemory, M: fmt::Debug> fmt::Debug for OffloadedModel<B, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OffloadedModel")
            .field("modules", &self.modules.len())
            .field("model", &self.template)
            .finish()
    }
}

impl<B: DeviceMemory> OffloadManager<B> {
    /// Puts the modules of `model` that `selection` picks under management: their parameters
    /// (2-D and up; 1-D too with `offload_1d_parameters`) go to the host or disk tier one at a
    /// time, so an uninitialised model (Burn's `init` makes lazy parameters) is never on the
    /// device whole.
    ///
    /// On error (a cache directory that cannot be created or written, a full disk cache with
    /// the host tier off) the model comes back in the error, every parameter on the device.
    pub fn wrap<M: Module<B>>(
        &self,
        model: M,
        selection: &OffloadSelection,
    ) -> Result<OffloadedModel<B, M>, WrapError<M>> {
        self.wrap_with(model, selection, None)
    }

    /// Wraps a model whose parameters come from the safetensors checkpoint at `path` (as
    /// burn-store's `SafetensorsStore` writes it: one tensor per parameter, named by its path,
    /// `layers.0.weight`), without running the model's own initialisers: build the model with
    /// its config's `init` (lazy) and wrap it here. The managed parameters go from the
    /// memory-mapped file straight to the host tier (slices of the mapping: no copy until
    /// used) or the disk cache, never through the device; the others are loaded onto the
    /// device. Parameters keep the file's dtype.
    ///
    /// Errors, with the model back as it came: the file cannot be read or parsed, a parameter
    /// is missing from it or has another shape, or any error [`wrap`](Self::wrap) can give.
    pub fn wrap_checkpoint<M: Module<B>>(
        &self,
        model: M,
        path: impl AsRef<Path>,
        selection: &OffloadSelection,
    ) -> Result<OffloadedModel<B, M>, WrapError<M>> {
        match Checkpoint::open(path.as_ref()) {
            Ok(checkpoint) => self.wrap_with(model, selection, Some(checkpoint)),
            Err(error) => Err(WrapError { error, model }),
        }
    }

    fn wrap_with<M: Module<B>>(
        &self,
        model: M,
        selection: &OffloadSelection,
        checkpoint: Option<Checkpoint>,
    ) -> Result<OffloadedModel<B, M>, WrapError<M>> {
        if let Err(error) = self.inner.ensure_alive() {
            return Err(WrapError { error, model });
        }
        if self.inner.config.disk_tier
            && let Err(error) = self.inner.cache_dir()
        {
            return Err(WrapError { error, model });
        }
        let mut wrapper = Wrapper {
            inner: self.inner.clone(),
            checkpoint,
            selection,
            path: Vec::new(),
            pending: None,
            modules: Vec::new(),
            params: HashSet::new(),
            error: None,
        };
        let template = model.map(&mut wrapper);
        wrapper.finish();
        let model = OffloadedModel {
            manager: self.clone(),
            template,
            modules: wrapper.modules,
            params: wrapper.params,
        };
        match wrapper.error {
            None => Ok(model),
            Some(error) => {
                let modules = model.modules.clone();
                let restored = model.into_inner();
                self.inner.forget(&modules);
                match restored {
                    Ok(model) => Err(WrapError { error, model }),
                    Err(restore) => panic!(
                        "wrapping failed ({error}) and the model could not be restored: {restore}"
                    ),
                }
            }
        }
    }
}

impl<B: DeviceMemory, M: Module<B>> OffloadedModel<B, M> {
    /// Runs `f` on a copy of the model whose managed parameters load on first use, and releases
    /// them when `f` returns (those the device cache keeps stay for the next call). The model's
    /// own `forward` runs unchanged. Within one call every module `f` touches stays on the
    /// device until the call ends; for a model larger than the device, use
    /// [`forward_layers`](Self::forward_layers).
    ///
    /// An error when a parameter could not be loaded (a damaged or deleted cache file): `f`'s
    /// output is dropped, never returned.
    pub fn run<R>(&self, f: impl FnOnce(&M) -> R) -> Result<R, MemoryError> {
        let pass = PassGuard::begin(&self.manager.inner);
        let view = self.template.clone();
        let output = f(&view);
        drop(view);
        pass.finish().map(|()| output)
    }

    /// Runs a layer sequence one layer at a time, each on its own copy of the model, so that
    /// only the running layer's parameters (and the next one's, prefetched) are in memory
    /// beside the device cache. Stops at the first layer whose parameters could not be loaded.
    /// `X` is what the layers pass on: a tensor, or a tuple or struct of several (see
    /// [`Layers`]).
    pub fn forward_layers<X>(&self, input: X) -> Result<X, MemoryError>
    where
        M: Layers<B, X>,
    {
        let inner = &self.manager.inner;
        let pass = PassGuard::begin(inner);
        let mut x = input;
        for layer in 0..self.template.num_layers() {
            let view = self.template.clone();
            x = view.forward_layer(layer, x);
            drop(view);
            inner.release_current();
            if inner.has_error() {
                break;
            }
        }
        pass.finish().map(|()| x)
    }

    /// The manager.
    pub fn manager(&self) -> &OffloadManager<B> {
        &self.manager
    }

    /// How many modules this wrap put under management.
    pub fn module_count(&self) -> usize {
        self.modules.len()
    }

    /// Takes every managed module out of the device cache.
    pub fn offload_all(&self) {
        self.manager.offload_all();
    }

    /// Loads every managed module into the device cache.
    pub fn load_all(&self) -> Result<(), MemoryError> {
        self.manager.load_all()
    }

    /// The model with every parameter back on the device and no link to the manager.
    pub fn into_inner(self) -> Result<M, MemoryError> {
        let pass = PassGuard::begin(&self.manager.inner);
        let model = self.template.clone().map(&mut LoadWrappedParams {
            only: Some(&self.params),
        });
        pass.finish().map(|()| model)
    }
}

/// One call of the wrapped model on this thread: ended by `finish` (which returns the first
/// load error) or, when the call panics, by `Drop`, so that the thread's next call starts clean.
struct PassGuard<'a, B: DeviceMemory> {
    inner: &'a Inner<B>,
    finished: bool,
}

impl<'a, B: DeviceMemory> PassGuard<'a, B> {
    fn begin(inner: &'a Inner<B>) -> Self {
        inner.begin_pass();
        Self {
            inner,
            finished: false,
        }
    }

    fn finish(mut self) -> Result<(), MemoryError> {
        self.finished = true;
        self.inner.end_pass()
    }
}

impl<B: DeviceMemory> Drop for PassGuard<'_, B> {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.inner.end_pass();
        }
    }
}

/// A safetensors checkpoint, memory-mapped: its tensors are slices of the mapping.
struct Checkpoint {
    path: PathBuf,
    tensors: HashMap<String, HostTensor>,
}

impl Checkpoint {
    fn open(path: &Path) -> Result<Self, MemoryError> {
        let fail = |message: String| MemoryError::OffloadCache {
            path: path.to_path_buf(),
            message,
        };
        let file = std::fs::File::open(path).map_err(|source| MemoryError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // SAFETY: read-only mapping of the user's checkpoint, which must not change while the
        // model uses it (as with burn-store's memory-mapped loading).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| fail(e.to_string()))?;
        let raw = bytes::Bytes::from_owner(map);
        let tensors = HostTensor::all_in_safetensors(&raw, burn::tensor::AllocationProperty::File)
            .map_err(fail)?;
        Ok(Self {
            path: path.to_path_buf(),
            tensors: tensors.into_iter().collect(),
        })
    }

    fn get(&self, name: &str, shape: &burn::tensor::Shape) -> Result<HostTensor, MemoryError> {
        let fail = |message: String| MemoryError::OffloadCache {
            path: self.path.clone(),
            message,
        };
        let tensor = self
            .tensors
            .get(name)
            .ok_or_else(|| fail(format!("no tensor `{name}` in the checkpoint")))?;
        if tensor.shape != *shape {
            return Err(fail(format!(
                "`{name}` has shape {:?}, the model's parameter {:?}",
                tensor.shape, shape
            )));
        }
        Ok(tensor.clone())
    }
}

/// Loads the parameters a wrap made lazy (all of them without a list) through the manager
/// into plain parameters on the device, with no link left to the manager; others stay as
/// they are.
struct LoadWrappedParams<'a> {
    only: Option<&'a HashSet<ParamId>>,
}

impl<B: Backend> ModuleMapper<B> for LoadWrappedParams<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        match self.only {
            Some(ids) if !ids.contains(&param.id) => param,
            _ => param.map(|tensor| tensor),
        }
    }
}

/// A module being wrapped: its parameters' data until the module is complete.
struct PendingModule<B: Backend> {
    module: usize,
    data: Vec<HostTensor>,
    device: Vec<B::FloatTensorPrimitive>,
}

struct Wrapper<'a, B: DeviceMemory> {
    inner: Arc<Inner<B>>,
    /// Parameters come from this checkpoint instead of the model.
    checkpoint: Option<Checkpoint>,
    selection: &'a OffloadSelection,
    /// The fields entered: (name, the type of the struct they belong to).
    path: Vec<(String, String)>,
    pending: Option<PendingModule<B>>,
    modules: Vec<usize>,
    params: HashSet<ParamId>,
    error: Option<MemoryError>,
}

impl<B: DeviceMemory> Wrapper<'_, B> {
    fn finish(&mut self) {
        if let Some(pending) = self.pending.take() {
            let device = (!self.inner.config.eager_offload && !pending.device.is_empty())
                .then(|| Arc::new(pending.device));
            if let Err(error) = self.inner.place(pending.module, pending.data, device) {
                self.error.get_or_insert(error);
            }
        }
    }
}

impl<B: DeviceMemory> ModuleMapper<B> for Wrapper<'_, B> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path
            .push((name.to_string(), container_type.to_string()));
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let Some((_, container)) = self.path.last() else {
            return param;
        };
        let type_name = container
            .strip_prefix("Struct:")
            .unwrap_or(container)
            .to_string();
        let module_path = self.path[..self.path.len() - 1]
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>()
            .join(".");
        let wanted = self.selection.accepts(&module_path, &type_name)
            && (D > 1 || self.inner.config.offload_1d_parameters);
        if self.error.is_some() {
            return param;
        }
        let (id, host, require_grad, shape, mapper, device_tensor) = match &self.checkpoint {
            None if !wanted => return param,
            None => {
                let (id, tensor, mapper) = param.consume();
                let require_grad = tensor.is_require_grad();
                let shape = tensor.shape();
                let device = (!self.inner.config.eager_offload)
                    .then(|| tensor.clone().into_primitive().tensor());
                let host = HostTensor::from_data(tensor.into_data());
                (id, host, require_grad, shape, mapper, device)
            }
            Some(checkpoint) => {
                let name = if module_path.is_empty() {
                    self.path
                        .last()
                        .map(|(field, _)| field.clone())
                        .unwrap_or_default()
                } else {
                    format!(
                        "{module_path}.{}",
                        self.path.last().expect("checked above").0
                    )
                };
                let host = match checkpoint.get(&name, &param.lazy_shape()) {
                    Ok(host) => host,
                    Err(error) => {
                        self.error = Some(error);
                        return param;
                    }
                };
                let id = param.id;
                if !wanted {
                    let tensor = Tensor::from_primitive(TensorPrimitive::Float(
                        B::float_from_data(host.to_data(), &param.lazy_device()),
                    ));
                    return param.transform_for_load(tensor, id);
                }
                // Burn reads a lazy parameter's gradient setting only in `transform_for_load`:
                // ask it with a one-element stand-in rather than run the initialiser.
                let stand_in = Tensor::<B, D>::zeros([1; D], &param.lazy_device());
                let require_grad = param
                    .clone()
                    .transform_for_load(stand_in, id)
                    .is_require_grad();
                let shape = param.lazy_shape();
                // Taking the load/save mapper out of a parameter runs its initialiser; a model
                // fresh from `init` has none to keep.
                (id, host, require_grad, shape, Default::default(), None)
            }
        };
        let bytes = host.len();
        let (module, index) = self.inner.register(
            &module_path,
            ParamMeta {
                shape: shape.clone(),
                bytes,
            },
        );
        if self.pending.as_ref().is_some_and(|p| p.module != module) {
            self.finish();
        }
        if !self.modules.contains(&module) {
            self.modules.push(module);
        }
        let pending = self.pending.get_or_insert_with(|| PendingModule {
            module,
            data: Vec::new(),
            device: Vec::new(),
        });
        pending.device.extend(device_tensor);
        self.params.insert(id);
        pending.data.push(host);
        let inner = self.inner.clone();
        let lazy = Param::uninitialized(
            id,
            move |device: &B::Device, require_grad: bool| {
                load_param::<B, D>(&inner, module, index, device, require_grad)
            },
            self.inner.device.clone(),
            require_grad,
            shape,
        );
        let (load, save) = (mapper.clone(), mapper);
        lazy.load_mapper(move |t| load.on_load(t))
            .save_mapper(move |t| save.on_save(t))
    }
}

/// A managed parameter's initialiser: the module's parameters from the manager, or, when they
/// cannot be loaded, zeros of the right shape and the error kept for the call to return.
fn load_param<B: DeviceMemory, const D: usize>(
    inner: &Inner<B>,
    module: usize,
    index: usize,
    device: &B::Device,
    require_grad: bool,
) -> Tensor<B, D> {
    let tensor = match inner.fetch(module) {
        Ok(params) => Tensor::from_primitive(TensorPrimitive::Float(params[index].clone())),
        Err(error) => {
            inner.record_error(error);
            Tensor::zeros(inner.param_meta(module, index).shape, device)
        }
    };
    if require_grad {
        tensor.require_grad()
    } else {
        tensor
    }
}
