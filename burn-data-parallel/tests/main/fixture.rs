//! What the data-parallel tests share: the model (`Net`), its data (`rows`, `RowBatcher`),
//! comparisons of weights and gradients, threads as peers, and the lock on the process's one
//! collective.
//!
//! burn-collective keeps one collective per process and backend: the in-process tests take
//! `exclusive()`; the ones that may leave the collective blocked run in their own process.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor, TensorData};
use burn::train::{InferenceStep, RegressionOutput, TrainOutput, TrainStep};
use burn_data_parallel::DataParallelConfig;
use burn_memory::SharedMixedPrecision;

pub(crate) type B = Autodiff<Flex>;

static COLLECTIVE: Mutex<()> = Mutex::new(());

/// Holds the process's one collective for an in-process test.
pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
    COLLECTIVE
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
}

/// A regression MLP with what data parallelism must handle besides plain weights: a fixed
/// random projection (trained by nobody, like a sketch), a layer no step uses (no gradient on
/// any peer), and mixed precision when asked.
#[derive(Module, Debug)]
pub(crate) struct Net<B: Backend> {
    pub(crate) fixed: Param<Tensor<B, 2>>,
    pub(crate) hidden: Linear<B>,
    pub(crate) out: Linear<B>,
    pub(crate) unused: Linear<B>,
    pub(crate) amp: SharedMixedPrecision<B>,
}

impl<B: Backend> Net<B> {
    pub(crate) fn new(device: &B::Device) -> Self {
        let fixed = Tensor::random([6, 6], Distribution::Normal(0.0, 1.0), device);
        Self {
            fixed: Param::from_tensor(fixed).set_require_grad(false),
            hidden: LinearConfig::new(6, 16).init(device),
            out: LinearConfig::new(16, 1).init(device),
            unused: LinearConfig::new(3, 3).init(device),
            amp: SharedMixedPrecision::none(),
        }
    }

    pub(crate) fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = x.matmul(self.fixed.val());
        self.out
            .forward(burn::tensor::activation::tanh(self.hidden.forward(x)))
    }

    fn regression(&self, batch: Rows<B>) -> RegressionOutput<B> {
        let output = self.forward(batch.x);
        let loss = MseLoss::new().forward(output.clone(), batch.y.clone(), Reduction::Mean);
        RegressionOutput::new(loss, output, batch.y)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Rows<B: Backend> {
    pub(crate) x: Tensor<B, 2>,
    pub(crate) y: Tensor<B, 2>,
}

/// Row `i` of the data set: 6 features and a target, all of them functions of `i`.
pub(crate) type Row = ([f32; 6], f32);

/// `n` rows of the data set.
pub(crate) fn rows(n: usize) -> Vec<Row> {
    (0..n)
        .map(|i| {
            let t = i as f32 * 0.37;
            let x = [
                t.sin(),
                t.cos(),
                (2.0 * t).sin(),
                0.1 * (i % 7) as f32,
                0.5,
                -t.cos(),
            ];
            (x, (3.0 * t).sin() + 0.2 * x[3])
        })
        .collect()
}

/// Makes a batch of rows on a device.
#[derive(Clone)]
pub(crate) struct RowBatcher;

impl<B: Backend> Batcher<B, Row, Rows<B>> for RowBatcher {
    fn batch(&self, items: Vec<Row>, device: &B::Device) -> Rows<B> {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|(x, _)| *x).collect();
        let y: Vec<f32> = items.iter().map(|(_, y)| *y).collect();
        Rows {
            x: Tensor::from_data(TensorData::new(x, [n, 6]), device),
            y: Tensor::from_data(TensorData::new(y, [n, 1]), device),
        }
    }
}

impl<B: AutodiffBackend> TrainStep for Net<B> {
    type Input = Rows<B>;
    type Output = RegressionOutput<B>;

    fn step(&self, batch: Rows<B>) -> TrainOutput<RegressionOutput<B>> {
        let Some(mut amp) = self.amp.lock() else {
            let item = self.regression(batch);
            return TrainOutput::new(self, item.loss.backward(), item);
        };
        let item = self.regression(batch);
        let scaled =
            GradientsParams::from_grads(amp.scale_loss(item.loss.clone()).backward(), self);
        let grads = amp.unscale(self, scaled).unwrap_or_default();
        TrainOutput { grads, item }
    }
}

impl<B: Backend> InferenceStep for Net<B> {
    type Input = Rows<B>;
    type Output = RegressionOutput<B>;

    fn step(&self, batch: Rows<B>) -> RegressionOutput<B> {
        self.regression(batch)
    }
}

/// Every float parameter's values, in visiting order.
pub(crate) fn weights<B: Backend, M: Module<B>>(module: &M) -> Vec<Vec<f32>> {
    struct Collect(Vec<Vec<f32>>);
    impl<B: Backend> ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0
                .push(param.val().into_data().convert::<f32>().into_vec().unwrap());
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

/// Largest `|a - b| / max(|b|, floor)` over two gradient or weight sets.
pub(crate) fn max_rel(a: &[Vec<f32>], b: &[Vec<f32>], floor: f32) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(a, b)| {
            assert_eq!(a.len(), b.len());
            a.iter()
                .zip(b)
                .map(move |(a, b)| (a - b).abs() / b.abs().max(floor))
        })
        .fold(0.0, f32::max)
}

/// Largest `‖a - b‖ / ‖b‖` over the tensors of two gradient or weight sets.
pub(crate) fn norm_rel(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| {
            assert_eq!(a.len(), b.len());
            let diff: f32 = a.iter().zip(b).map(|(a, b)| (a - b).powi(2)).sum();
            let norm: f32 = b.iter().map(|b| b * b).sum();
            (diff / norm).sqrt()
        })
        .fold(0.0, f32::max)
}

/// The gradients in `grads` of `module`'s trained parameters, in visiting order.
pub(crate) fn grad_values(module: &Net<B>, grads: &GradientsParams) -> Vec<Vec<f32>> {
    struct Collect<'a>(&'a GradientsParams, Vec<Vec<f32>>);
    impl<Bk: AutodiffBackend> ModuleVisitor<Bk> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
            if let Some(grad) = self.0.get::<Bk::InnerBackend, D>(param.id) {
                self.1
                    .push(grad.into_data().convert::<f32>().into_vec().unwrap());
            }
        }
    }
    let mut collect = Collect(grads, Vec::new());
    module.visit(&mut collect);
    collect.1
}

/// A configuration with this timeout.
pub(crate) fn config(timeout_ms: u64) -> DataParallelConfig {
    DataParallelConfig::new().with_timeout(Duration::from_millis(timeout_ms))
}

/// `model` with leaves of its own (same parameter ids and values): what a peer thread works
/// on. Peers that shared one model's autodiff leaves would share one graph, and burn-autodiff
/// 0.21 can deadlock when two threads run forward and backward on one graph (its graph
/// locator and graph cleaner take their locks in opposite orders), as a data-parallel run never
/// does: each peer has its replica.
pub(crate) fn replica<M: Module<B>>(model: &M, device: &burn::tensor::Device<B>) -> M {
    model.clone().fork(device)
}

/// Runs `body(rank)` on `peers` threads and returns their results in rank order.
pub(crate) fn on_peers<T: Send>(peers: usize, body: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..peers)
            .map(|rank| {
                scope.spawn({
                    let body = &body;
                    move || body(rank)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("peer thread"))
            .collect()
    })
}
