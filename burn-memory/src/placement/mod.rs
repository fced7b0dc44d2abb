//! Model parallelism: consecutive layers of a [`Layers`] model placed on a list of devices,
//! the activation moved from device to device in the forward pass.
//!
//! Why: when a model's weights, gradients and optimizer state do not fit on one device, each
//! device can hold a slice of its layers. A layer's parameters go to their device as
//! [`Module::fork`] would move them (the same parameter ids and gradient requirements, new
//! leaves), and the activation follows as [`Tensor::to_device`](burn::tensor::Tensor::to_device)
//! would move it: the move is an operation Burn's autodiff records, so the backward pass
//! brings each gradient back to the device that computed it, and every parameter's gradient
//! lands on the parameter's own device, where an optimizer updates it. Both moves go through
//! [`DeviceTransfer`], because Burn 0.21's own cannot move a tensor between two `Wgpu` devices
//! (see [`transfer`]).
//!
//! The devices run one after the other (the layers are a sequence): placement saves memory on
//! each device, not time. [`Placed`] implements [`Layers`] itself, so a placed model composes
//! with [`segmented_backward`](crate::segmented_backward) (segment checkpointing across
//! devices) and runs wherever a [`Layers`] model does.
//!
//! - [`MapLayer`]: the one method a model adds so that its layers can be moved one at a time
//!   (`Layers` runs a layer; it cannot move one).
//! - [`Placement`]: which layer goes to which device, [`even`](Placement::even) (consecutive
//!   groups as equal as the count allows) or by explicit [`ranges`](Placement::ranges).
//! - [`Placed`]: the model with its layers on their devices; [`Placed::forward`] runs them and
//!   returns the output on the last layer's device, or on the device chosen with
//!   [`Placed::with_output_device`].
//! - [`ToDevice`]: what flows between layers moves part by part (tensors of every kind,
//!   tuples of them).

pub mod transfer;

pub use transfer::{DeviceTransfer, ToDevice};

use std::fmt;
use std::ops::Range;

use burn::module::{
    AutodiffModule, Content, Devices, Module, ModuleDisplay, ModuleDisplayDefault, ModuleMapper,
    ModuleVisitor,
};
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::{Layers, MemoryError};
use transfer::Mover;

/// A model whose layers can be moved to a device one at a time: what [`Placed`] needs beside
/// [`Layers`]. `map_layer(index, mapper)` applies `mapper` ([`Module::map`]) to the modules layer
/// `index` uses and leaves the rest; parameters no layer uses (a head applied by the loss, an
/// embedding before the first layer) stay on the device they were created on.
///
/// ```
/// # use burn::module::{Module, ModuleMapper};
/// # use burn::nn::Linear;
/// # use burn::tensor::backend::Backend;
/// # use burn_memory::MapLayer;
/// # #[derive(Module, Debug)]
/// # struct Mlp<B: Backend> { layers: Vec<Linear<B>> }
/// impl<B: Backend> MapLayer<B> for Mlp<B> {
///     fn map_layer<Mp: ModuleMapper<B>>(mut self, index: usize, mapper: &mut Mp) -> Self {
///         self.layers[index] = self.layers[index].clone().map(mapper);
///         self
///     }
/// }
/// ```
pub trait MapLayer<B: Backend>: Module<B> {
    /// Maps the modules of layer `index` (from 0) with `mapper`.
    fn map_layer<Mp: ModuleMapper<B>>(self, index: usize, mapper: &mut Mp) -> Self;
}

/// Which device each layer of an `L`-layer sequence runs on (`D` is the backend's device type;
/// a device may appear more than once).
///
/// ```
/// use burn_memory::Placement;
///
/// // 10 layers on 3 devices: 4, 3 and 3 layers, the larger groups first.
/// let placement = Placement::even(10, &["gpu0", "gpu1", "gpu2"])?;
/// assert_eq!(placement.groups(), vec![(0..4, "gpu0"), (4..7, "gpu1"), (7..10, "gpu2")]);
/// # Ok::<(), burn_memory::MemoryError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement<D> {
    /// The device of each layer, by layer index.
    devices: Vec<D>,
}

impl<D: Clone + PartialEq> Placement<D> {
    /// `num_layers` layers split into `devices.len()` consecutive groups, one per device in
    /// the order given, as even as the count allows (sizes differ by at most one, the larger
    /// groups first).
    ///
    /// Fails with [`MemoryError::Invalid`] when there are no layers, no devices, or more
    /// devices than layers.
    pub fn even(num_layers: usize, devices: &[D]) -> Result<Self, MemoryError> {
        if num_layers == 0 {
            return Err(MemoryError::invalid(
                "layers",
                "there are no layers to place",
            ));
        }
        if devices.is_empty() {
            return Err(MemoryError::invalid("devices", "the device list is empty"));
        }
        if devices.len() > num_layers {
            return Err(MemoryError::invalid(
                "devices",
                format!(
                    "{} devices for {num_layers} layers: each device needs at least one layer",
                    devices.len()
                ),
            ));
        }
        let (size, longer) = (num_layers / devices.len(), num_layers % devices.len());
        let devices = devices
            .iter()
            .enumerate()
            .flat_map(|(i, device)| {
                let count = size + usize::from(i < longer);
                std::iter::repeat_n(device.clone(), count)
            })
            .collect();
        Ok(Self { devices })
    }

    /// Layers placed by explicit ranges: `[(0..2, a), (2..10, b)]` puts layers 0 and 1 on `a`
    /// and layers 2 to 9 on `b`.
    ///
    /// Fails with [`MemoryError::Invalid`] unless the ranges are non-empty, in order and
    /// contiguous from layer 0 (each starts where the previous one ends): the last range's
    /// end is the layer count.
    pub fn ranges(
        ranges: impl IntoIterator<Item = (Range<usize>, D)>,
    ) -> Result<Self, MemoryError> {
        let mut devices = Vec::new();
        for (range, device) in ranges {
            if range.start != devices.len() || range.is_empty() {
                return Err(MemoryError::invalid(
                    "placement ranges",
                    format!(
                        "{range:?} after layers 0..{}: the ranges must be non-empty, in order \
                         and contiguous from layer 0",
                        devices.len()
                    ),
                ));
            }
            devices.extend(std::iter::repeat_n(device, range.len()));
        }
        if devices.is_empty() {
            return Err(MemoryError::invalid(
                "placement ranges",
                "no range was given",
            ));
        }
        Ok(Self { devices })
    }

    /// How many layers are placed.
    pub fn num_layers(&self) -> usize {
        self.devices.len()
    }

    /// The device of layer `index` (from 0), `None` past the last layer.
    pub fn device(&self, index: usize) -> Option<&D> {
        self.devices.get(index)
    }

    /// The consecutive layers that share a device, in order: what [`ranges`](Self::ranges)
    /// would take to build this placement.
    pub fn groups(&self) -> Vec<(Range<usize>, D)> {
        let mut groups: Vec<(Range<usize>, D)> = Vec::new();
        for (index, device) in self.devices.iter().enumerate() {
            match groups.last_mut() {
                Some((range, last)) if last == device => range.end = index + 1,
                _ => groups.push((index..index + 1, device.clone())),
            }
        }
        groups
    }

    /// Every layer on `device`: what a placed model becomes when it is moved whole.
    fn all_on(&self, device: &D) -> Self {
        Self {
            devices: vec![device.clone(); self.devices.len()],
        }
    }
}

/// A [`Layers`] model whose layers live on the devices of a [`Placement`] (model
/// parallelism): layer `i`'s parameters are on `placement.device(i)`, and its input moves there
/// before it runs, as an autodiff operation, so every gradient ends on its parameter's device.
///
/// It is a [`Module`] and an [`AutodiffModule`] that delegate to the model (same record, same
/// parameter ids), so an optimizer and [`segmented_backward`](crate::segmented_backward) take
/// it as they take the model. `fork` and `to_device` move it whole, as burn-train's learners
/// do: train it with a loop of your own. The backend needs [`DeviceTransfer`]. An example, and
/// what to watch (running statistics move in place), are in the book's chapter "Several
/// devices: placing layers".
pub struct Placed<B: Backend, M> {
    model: M,
    placement: Placement<B::Device>,
    output: Option<B::Device>,
}

impl<B: DeviceTransfer, M: MapLayer<B>> Placed<B, M> {
    /// Moves each layer of `model` to its device in `placement`, as [`Module::fork`] would
    /// (the model's parameters that no layer uses stay where they are).
    ///
    /// Fails with [`MemoryError::Invalid`] when the placement's layer count is not the
    /// model's.
    pub fn new<X>(model: M, placement: Placement<B::Device>) -> Result<Self, MemoryError>
    where
        M: Layers<B, X>,
    {
        let layers = model.num_layers();
        if placement.num_layers() != layers {
            return Err(MemoryError::invalid(
                "placement",
                format!(
                    "it places {} layers and the model has {layers}",
                    placement.num_layers()
                ),
            ));
        }
        let model = placement
            .devices
            .iter()
            .enumerate()
            .fold(model, |model, (index, device)| {
                let mut fork = Mover {
                    device,
                    keep_graph: false,
                };
                model.map_layer(index, &mut fork)
            });
        tracing::debug!(groups = ?placement.groups(), "layers placed");
        Ok(Self {
            model,
            placement,
            output: None,
        })
    }
}

impl<B: Backend, M> Placed<B, M> {
    /// Moves the last layer's output to `device` (where the targets and the loss are, for
    /// example), in [`forward`](Self::forward) and in [`forward_layer`](Layers::forward_layer)
    /// of the last layer.
    pub fn with_output_device(mut self, device: B::Device) -> Self {
        self.output = Some(device);
        self
    }

    /// Runs every layer, each on its device: `input` may be on any device and is moved to the
    /// first layer's; the output is on the last layer's device, or on the output device.
    pub fn forward<X>(&self, input: X) -> X
    where
        B: DeviceTransfer,
        M: Layers<B, X>,
        X: ToDevice<B>,
    {
        (0..self.placement.num_layers()).fold(input, |x, index| self.forward_layer(index, x))
    }

    /// The placed model (its layers on their devices).
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The placed model, out of the wrapper: its layers stay on their devices.
    pub fn into_model(self) -> M {
        self.model
    }

    /// Which layer is on which device.
    pub fn placement(&self) -> &Placement<B::Device> {
        &self.placement
    }

    /// The device the output is moved to, if one was chosen.
    pub fn output_device(&self) -> Option<&B::Device> {
        self.output.as_ref()
    }
}

impl<B, M, X> Layers<B, X> for Placed<B, M>
where
    B: DeviceTransfer,
    M: Layers<B, X>,
    X: ToDevice<B>,
{
    fn num_layers(&self) -> usize {
        self.placement.num_layers()
    }

    /// Moves `input` to layer `index`'s device and runs the layer there; the last layer's
    /// output then goes to the output device, if one was chosen. Panics past the last layer,
    /// as indexing the model's layers would.
    fn forward_layer(&self, index: usize, input: X) -> X {
        let device = self.placement.device(index).unwrap_or_else(|| {
            panic!(
                "layer {index} of a placed model with {} layers",
                self.placement.num_layers()
            )
        });
        let output = self.model.forward_layer(index, input.to_device(device));
        match &self.output {
            Some(out) if index + 1 == self.placement.num_layers() => output.to_device(out),
            _ => output,
        }
    }
}

impl<B: Backend, M: Clone> Clone for Placed<B, M> {
    fn clone(&self) -> Self {
        Self {
            model: self.model.clone(),
            placement: self.placement.clone(),
            output: self.output.clone(),
        }
    }
}

impl<B: Backend, M: fmt::Debug> fmt::Debug for Placed<B, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Placed")
            .field("model", &self.model)
            .field("placement", &self.placement.groups())
            .field("output", &self.output)
            .finish()
    }
}

/// Everything but moving the whole model delegates to the model: the record, the parameters
/// and their ids are the model's. Moving the whole model goes through [`DeviceTransfer`].
impl<B: DeviceTransfer, M: Module<B>> Module<B> for Placed<B, M> {
    type Record = M::Record;

    fn collect_devices(&self, devices: Devices<B>) -> Devices<B> {
        self.model.collect_devices(devices)
    }

    fn fork(self, device: &B::Device) -> Self {
        let mut fork = Mover {
            device,
            keep_graph: false,
        };
        Self {
            placement: self.placement.all_on(device),
            model: self.model.map(&mut fork),
            output: self.output,
        }
    }

    fn to_device(self, device: &B::Device) -> Self {
        let mut mover = Mover {
            device,
            keep_graph: true,
        };
        Self {
            placement: self.placement.all_on(device),
            model: self.model.map(&mut mover),
            output: self.output,
        }
    }

    fn visit<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        self.model.visit(visitor);
    }

    fn map<Mapper: ModuleMapper<B>>(self, mapper: &mut Mapper) -> Self {
        Self {
            model: self.model.map(mapper),
            ..self
        }
    }

    /// Loads into the placed model: Burn loads each parameter onto the device it is on.
    fn load_record(self, record: Self::Record) -> Self {
        Self {
            model: self.model.load_record(record),
            ..self
        }
    }

    fn into_record(self) -> Self::Record {
        self.model.into_record()
    }
}

/// `valid()` keeps the placement: the inner model's parameters stay on their devices.
impl<B, M> AutodiffModule<B> for Placed<B, M>
where
    B: AutodiffBackend + DeviceTransfer,
    B::InnerBackend: DeviceTransfer,
    M: AutodiffModule<B>,
{
    type InnerModule = Placed<B::InnerBackend, M::InnerModule>;

    fn valid(&self) -> Self::InnerModule {
        Placed {
            model: self.model.valid(),
            placement: self.placement.clone(),
            output: self.output.clone(),
        }
    }

    fn from_inner(module: Self::InnerModule) -> Self {
        Self {
            model: M::from_inner(module.model),
            placement: module.placement,
            output: module.output,
        }
    }
}

/// Displayed as the model it wraps.
impl<B: Backend, M: ModuleDisplay> ModuleDisplayDefault for Placed<B, M> {
    fn content(&self, content: Content) -> Option<Content> {
        self.model.content(content)
    }

    fn num_params(&self) -> usize {
        ModuleDisplayDefault::num_params(&self.model)
    }
}

impl<B: Backend, M: ModuleDisplay> ModuleDisplay for Placed<B, M> {}
