//! What the server runs: a model's description ([`ModelSpec`]) and its replicas ([`Servable`]),
//! with [`BurnModel`] adapting any Burn module and forward function.

use std::sync::Arc;

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_memory::{DeviceMemory, MemoryCap, draw_params};
use serde::{Deserialize, Serialize};

use crate::{DataType, HostData, HostTensor, ServeError};

/// A named, typed, shaped tensor of a model's signature; `-1` marks a dimension of any size
/// (the batch).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// The tensor's name in requests and responses.
    pub name: String,
    /// Its element type.
    pub datatype: DataType,
    /// Its shape, the batch dimension (`-1`) first.
    pub shape: Vec<i64>,
}

impl TensorSpec {
    /// A tensor of rows shaped `row_shape`: `[-1, row_shape...]`.
    pub fn rows(name: impl Into<String>, datatype: DataType, row_shape: &[usize]) -> Self {
        let shape = std::iter::once(-1)
            .chain(row_shape.iter().map(|&dim| dim as i64))
            .collect();
        Self {
            name: name.into(),
            datatype,
            shape,
        }
    }

    /// The shape of one row: the dimensions after the batch.
    pub fn row_shape(&self) -> Vec<usize> {
        self.shape[1..].iter().map(|&dim| dim as usize).collect()
    }
}

/// A served model's description: what `GET /v2/models/{name}` returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The model's name in URLs.
    pub name: String,
    /// Its version (the protocol lists versions as strings).
    pub version: String,
    /// What runs it, for clients that display it (`burn-flex`, `burn-wgpu`).
    pub platform: String,
    /// Its one input.
    pub input: TensorSpec,
    /// Its one output.
    pub output: TensorSpec,
}

/// A check of one request's values (ids within the vocabulary, lengths, ranges) that the
/// batcher runs before the request joins a batch, on the caller's thread: a request at fault
/// fails alone, with its own message, instead of failing the batch it would have joined.
pub type Validate = Arc<dyn Fn(&HostTensor) -> Result<(), ServeError> + Send + Sync>;

/// How many tokens a request holds (its real ids, padding left out), for a batcher with a
/// token budget ([`crate::BatcherConfig::max_batch_tokens`]).
pub type CountTokens = Arc<dyn Fn(&HostTensor) -> usize + Send + Sync>;

/// One replica of a model, owned by one worker thread: it maps a batch of rows to as many
/// rows of output.
pub trait Servable: Send + 'static {
    /// The output for `batch` (`[rows, ...]`), row `i` for input row `i`.
    fn infer(&mut self, batch: HostTensor) -> Result<HostTensor, ServeError>;

    /// The check each request passes before batching (`None`: shape and type only, which
    /// the server checks against the [`ModelSpec`]). The batcher takes it from its first
    /// replica.
    fn validator(&self) -> Option<Validate> {
        None
    }

    /// How the model counts a request's tokens, for a token budget (`None`: every element
    /// is one). The batcher takes it from its first replica.
    fn token_count(&self) -> Option<CountTokens> {
        None
    }

    /// Device memory in use after the last batch, in bytes, where the replica knows it; the
    /// server exports it as a metric.
    fn memory_in_use(&self) -> Option<u64> {
        None
    }
}

/// Replicas of different types behind one batcher (a model and its `int8` copy, say).
impl Servable for Box<dyn Servable> {
    fn infer(&mut self, batch: HostTensor) -> Result<HostTensor, ServeError> {
        (**self).infer(batch)
    }

    fn validator(&self) -> Option<Validate> {
        (**self).validator()
    }

    fn token_count(&self) -> Option<CountTokens> {
        (**self).token_count()
    }

    fn memory_in_use(&self) -> Option<u64> {
        (**self).memory_in_use()
    }
}

type FloatForward<B, M> = dyn Fn(&M, Tensor<B, 2>) -> Tensor<B, 2> + Send + Sync;
type IntForward<B, M> = dyn Fn(&M, Tensor<B, 2, Int>) -> Tensor<B, 2> + Send + Sync;

enum Forward<B: Backend, M> {
    Float(Arc<FloatForward<B, M>>),
    Int(Arc<IntForward<B, M>>),
}

impl<B: Backend, M> Clone for Forward<B, M> {
    fn clone(&self) -> Self {
        match self {
            Self::Float(forward) => Self::Float(Arc::clone(forward)),
            Self::Int(forward) => Self::Int(Arc::clone(forward)),
        }
    }
}

/// A Burn module served on one device: each row of the request, flattened, is a row of the
/// `[rows, features]` tensor the forward function receives; the forward returns
/// `[rows, outputs]`.
///
/// ```
/// # use burn::backend::Flex;
/// # use burn::nn::LinearConfig;
/// # use burn_serve::{BurnModel, HostTensor, Servable};
/// # let device = Default::default();
/// let layer = LinearConfig::new(4, 2).init::<Flex>(&device);
/// let mut model = BurnModel::float(layer, device, |layer, x| layer.forward(x));
/// let out = model.infer(HostTensor::f32(3, 4, vec![0.5; 12]).unwrap()).unwrap();
/// assert_eq!(out.shape(), &[3, 2]);
/// ```
pub struct BurnModel<B: DeviceMemory, M> {
    model: M,
    device: B::Device,
    forward: Forward<B, M>,
    in_use: Option<u64>,
    /// The memory cap and the bytes a row is expected to take, with [`BurnModel::with_memory_cap`].
    cap: Option<(MemoryCap<B>, u64)>,
    /// When memory was last read: at most every [`MEMORY_PERIOD`], as a reading costs a system
    /// call on CPU backends.
    read_at: Option<std::time::Instant>,
    /// The per-request check, with [`BurnModel::with_validator`].
    validate: Option<Validate>,
}

/// How often a replica reads its device's memory for the metrics.
const MEMORY_PERIOD: std::time::Duration = std::time::Duration::from_millis(250);

impl<B: DeviceMemory, M> std::fmt::Debug for BurnModel<B, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BurnModel")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl<B: DeviceMemory, M: Module<B>> BurnModel<B, M> {
    /// A model whose input is `FP32` rows. Its parameters not yet drawn are drawn now, so that
    /// [`BurnModel::replicas`] share them.
    pub fn float(
        model: M,
        device: B::Device,
        forward: impl Fn(&M, Tensor<B, 2>) -> Tensor<B, 2> + Send + Sync + 'static,
    ) -> Self {
        draw_params(&model);
        Self {
            model,
            device,
            forward: Forward::Float(Arc::new(forward)),
            in_use: None,
            read_at: None,
            cap: None,
            validate: None,
        }
    }

    /// A model whose input is `INT64` rows (token ids), drawn as for [`BurnModel::float`].
    pub fn int(
        model: M,
        device: B::Device,
        forward: impl Fn(&M, Tensor<B, 2, Int>) -> Tensor<B, 2> + Send + Sync + 'static,
    ) -> Self {
        draw_params(&model);
        Self {
            model,
            device,
            forward: Forward::Int(Arc::new(forward)),
            in_use: None,
            read_at: None,
            cap: None,
            validate: None,
        }
    }

    /// A checked memory cap (burn-memory's [`MemoryCap`]): before each batch, its bytes in use
    /// plus `bytes_per_row` times its rows must stay within `limit` bytes, or the batch fails
    /// with [`ServeError::MemoryLimit`] (503) without running. Measure `bytes_per_row` once
    /// (burn-memory's `MemoryTracker::profile` of a forward, divided by its rows).
    pub fn with_memory_cap(mut self, limit: u64, bytes_per_row: u64) -> Self {
        self.cap = Some((MemoryCap::new(&self.device, limit), bytes_per_row));
        self
    }

    /// A check each request passes before it joins a batch ([`Validate`]): a model whose
    /// forward would fail on some values (token ids beyond its vocabulary) refuses them here,
    /// so that they fail alone.
    pub fn with_validator(
        mut self,
        validate: impl Fn(&HostTensor) -> Result<(), ServeError> + Send + Sync + 'static,
    ) -> Self {
        self.validate = Some(Arc::new(validate));
        self
    }

    /// One replica per device (the module forked to each): give them all to one
    /// [`crate::Batcher`] to run a worker per device.
    pub fn replicas(&self, devices: &[B::Device]) -> Vec<Self> {
        devices
            .iter()
            .map(|device| Self {
                model: self.model.clone().fork(device),
                device: device.clone(),
                forward: self.forward.clone(),
                in_use: None,
                read_at: None,
                cap: self
                    .cap
                    .as_ref()
                    .map(|(cap, per_row)| (MemoryCap::new(device, cap.limit()), *per_row)),
                validate: self.validate.clone(),
            })
            .collect()
    }
}

impl<B, M> Servable for BurnModel<B, M>
where
    B: DeviceMemory,
    M: Module<B> + 'static,
{
    fn infer(&mut self, batch: HostTensor) -> Result<HostTensor, ServeError> {
        let rows = batch.rows();
        if let Some((cap, per_row)) = &self.cap {
            cap.reserve(per_row.saturating_mul(rows as u64))
                .map_err(|error| ServeError::MemoryLimit(error.to_string()))?;
        }
        let shape = [rows, batch.row_len()];
        let output = match (&self.forward, batch.into_data()) {
            (Forward::Float(forward), HostData::F32(values)) => {
                let x = Tensor::from_data(TensorData::new(values, shape), &self.device);
                forward(&self.model, x)
            }
            (Forward::Int(forward), HostData::I64(values)) => {
                let x = Tensor::from_data(TensorData::new(values, shape), &self.device);
                forward(&self.model, x)
            }
            (Forward::Float(_), data) | (Forward::Int(_), data) => {
                return Err(ServeError::bad(format!(
                    "the model does not take {} input",
                    data.data_type().name()
                )));
            }
        };
        let [out_rows, cols] = output.dims();
        if out_rows != rows {
            return Err(ServeError::Model(format!(
                "the forward returned {out_rows} rows for {rows}"
            )));
        }
        let values = output
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|error| ServeError::Model(format!("{error:?}")))?;
        if self.read_at.is_none_or(|at| at.elapsed() >= MEMORY_PERIOD) {
            self.in_use = B::memory_usage(&self.device, B::current_stream())
                .ok()
                .map(|usage| usage.in_use);
            self.read_at = Some(std::time::Instant::now());
        }
        HostTensor::f32(rows, cols, values)
    }

    fn validator(&self) -> Option<Validate> {
        self.validate.clone()
    }

    fn memory_in_use(&self) -> Option<u64> {
        self.in_use
    }
}
