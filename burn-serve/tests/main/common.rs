//! Models shared by the tests.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use burn::module::Module;
use burn::nn::{BatchNorm, BatchNormConfig, Dropout, DropoutConfig, Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData};
use burn_serve::{BurnModel, Client, HostData, HostTensor, Servable, ServeError};
use hyper::Method;
use serde_json::Value;

/// Linear → BatchNorm → Dropout → ReLU → Linear, at odd widths. Outside autodiff, BatchNorm
/// uses its running statistics and Dropout is the identity, so each output row depends on its
/// own input row only: batched answers must equal unbatched ones.
#[derive(Module, Debug)]
pub struct Net<B: Backend> {
    first: Linear<B>,
    norm: BatchNorm<B>,
    dropout: Dropout,
    second: Linear<B>,
}

pub const IN: usize = 37;
pub const OUT: usize = 11;

impl<B: Backend> Net<B> {
    pub fn new(device: &B::Device) -> Self {
        let mut norm = BatchNormConfig::new(23).init(device);
        // Running statistics that are not the identity, so that using batch statistics instead
        // would change the answers.
        norm.running_mean = burn::module::RunningState::new(Tensor::random(
            [23],
            Distribution::Uniform(-0.5, 0.5),
            device,
        ));
        norm.running_var = burn::module::RunningState::new(Tensor::random(
            [23],
            Distribution::Uniform(0.5, 2.0),
            device,
        ));
        let net = Self {
            first: LinearConfig::new(IN, 23).init(device),
            norm,
            dropout: DropoutConfig::new(0.5).init(),
            second: LinearConfig::new(23, OUT).init(device),
        };
        // Burn draws parameters on first use, and an undrawn clone draws its own: draw them
        // now, so that the served copies and this one hold the same weights.
        burn_memory::draw_params(&net);
        net
    }

    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let h = self.first.forward(x);
        let h = self.norm.forward(h.unsqueeze_dim::<3>(2)).squeeze_dim(2);
        self.second.forward(relu(self.dropout.forward(h)))
    }

    /// The model's answer for `rows` alone.
    pub fn answer(&self, input: &HostTensor, device: &B::Device) -> Vec<f32> {
        let HostData::F32(values) = input.data() else {
            panic!("FP32 input")
        };
        let x = Tensor::from_data(TensorData::new(values.clone(), [input.rows(), IN]), device);
        self.forward(x).into_data().to_vec().unwrap()
    }
}

pub fn served<B: burn_memory::DeviceMemory>(
    net: &Net<B>,
    device: &B::Device,
) -> BurnModel<B, Net<B>> {
    BurnModel::float(net.clone(), device.clone(), |net, x| net.forward(x))
}

/// `rows` rows of seeded inputs.
pub fn rows(rows: usize, seed: usize) -> HostTensor {
    let values = (0..rows * IN)
        .map(|i| (((i + seed * 7919) * 2_654_435_761 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    HostTensor::f32(rows, IN, values).unwrap()
}

/// Doubles its input after `delay`, recording each batch's rows; panics on a row whose first
/// value is `PANIC`.
pub struct Slow {
    pub delay: Duration,
    pub batches: Arc<Mutex<Vec<usize>>>,
}

pub const PANIC: f32 = -12345.0;

impl Slow {
    pub fn new(delay: Duration) -> (Self, Arc<Mutex<Vec<usize>>>) {
        let batches = Arc::new(Mutex::new(Vec::new()));
        (
            Self {
                delay,
                batches: Arc::clone(&batches),
            },
            batches,
        )
    }
}

impl Servable for Slow {
    fn infer(&mut self, batch: HostTensor) -> Result<HostTensor, ServeError> {
        std::thread::sleep(self.delay);
        self.batches.lock().unwrap().push(batch.rows());
        let HostData::F32(values) = batch.data() else {
            return Err(ServeError::BadRequest("FP32 only".into()));
        };
        assert!(values.first() != Some(&PANIC), "asked to panic");
        let doubled = values.iter().map(|v| v * 2.0).collect();
        HostTensor::new(batch.shape().to_vec(), HostData::F32(doubled))
    }
}

/// A single-row `[1, 2]` request `[value, 1]`.
pub fn pair(value: f32) -> HostTensor {
    HostTensor::f32(1, 2, vec![value, 1.0]).unwrap()
}

pub fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "element {i}: {g} against {w}"
        );
    }
}

/// Records the rows of each batch `inner` runs.
pub struct Recording<S> {
    pub inner: S,
    pub batches: Arc<Mutex<Vec<usize>>>,
}

impl<S: Servable> Servable for Recording<S> {
    fn infer(&mut self, batch: HostTensor) -> Result<HostTensor, ServeError> {
        self.batches.lock().unwrap().push(batch.rows());
        self.inner.infer(batch)
    }
}

/// The runtime the HTTP tests' clients run on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn body(value: Value) -> Vec<u8> {
    serde_json::to_vec(&value).unwrap()
}

/// `POST path` with `value` as JSON: the status and the JSON answer (`null` if none).
pub async fn post(client: &mut Client, path: &str, value: Value) -> (u16, Value) {
    let answer = client.send(Method::POST, path, body(value)).await.unwrap();
    (
        answer.status,
        serde_json::from_slice(&answer.body).unwrap_or(Value::Null),
    )
}
