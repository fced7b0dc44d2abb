//! Threads as peers of one process, each on its shard: the mean gradients against one device
//! on the whole batch (plain, tied weights, BatchNorm), and replicas that differ refused.

use burn::backend::Flex;
use burn::data::dataloader::batcher::Batcher;
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_data_parallel::{DistributedError, Peer};

use crate::fixture::{
    B, Net, Row, RowBatcher, Rows, config, exclusive, grad_values, norm_rel, on_peers, replica,
    rows, weights,
};

/// `peers` peers each on its 1/`peers` of a batch hold, after `mean_gradients`, the gradients
/// of one device on the whole batch; parameters without a gradient anywhere stay without.
#[test]
fn peers_on_shards_give_the_whole_batch_gradients() {
    let _lock = exclusive();
    let device = Default::default();
    let model = Net::<B>::new(&device);
    let data = rows(24);
    let whole: Rows<B> = RowBatcher.batch(data.clone(), &device);
    let loss = MseLoss::new().forward(model.forward(whole.x), whole.y, Reduction::Mean);
    let expected = GradientsParams::from_grads(loss.backward(), &model);
    let expected_values = grad_values(&model, &expected);
    assert_eq!(
        expected_values.len(),
        4,
        "hidden and out: weights and biases"
    );

    for peers in [2, 3] {
        let shard = data.len() / peers;
        let grads = on_peers(peers, |rank| {
            let model = replica(&model, &device);
            let peer = Peer::<Flex>::join(rank, peers, device, &config(20_000)).unwrap();
            peer.check_replicas(&model).unwrap();
            let batch: Rows<B> =
                RowBatcher.batch(data[rank * shard..(rank + 1) * shard].to_vec(), &device);
            let loss = MseLoss::new().forward(model.forward(batch.x), batch.y, Reduction::Mean);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            let (mean, stop) = peer.mean_gradients(&model, grads, rank == 1).unwrap();
            assert!(stop, "peer 1 asked to stop: every peer hears it");
            peer.leave().unwrap();
            grad_values(&model, &mean)
        });
        for (rank, got) in grads.iter().enumerate() {
            // Relative to each gradient's norm: an element-wise ratio is large where a
            // gradient entry is a near-cancelling sum, whatever the order of the additions.
            let err = norm_rel(got, &expected_values);
            assert!(
                err <= 1e-5,
                "{peers} peers, peer {rank}: relative error {err}"
            );
        }
        assert_eq!(grads[0], grads[peers - 1], "every peer holds the same mean");
    }
}

/// A model whose two hidden layers are one layer (tied weights: the same parameters, used
/// twice in the forward pass).
#[derive(Module, Debug)]
struct Tied<B: Backend> {
    first: Linear<B>,
    second: Linear<B>,
    out: Linear<B>,
}

impl<B: Backend> Tied<B> {
    fn new(device: &B::Device) -> Self {
        let shared = LinearConfig::new(6, 6).init(device);
        // Draw before copying: a copy of a lazy parameter draws values of its own.
        burn_memory::draw_params(&shared);
        Self {
            first: shared.clone(),
            second: shared,
            out: LinearConfig::new(6, 1).init(device),
        }
    }

    fn loss(&self, batch: Rows<B>) -> Tensor<B, 1> {
        let hidden = burn::tensor::activation::tanh(self.first.forward(batch.x));
        let hidden = burn::tensor::activation::tanh(self.second.forward(hidden));
        MseLoss::new().forward(self.out.forward(hidden), batch.y, Reduction::Mean)
    }
}

/// Tied weights: the layer used twice has one gradient (the sum over both uses), on one
/// device and after the peers' mean alike.
#[test]
fn tied_weights_get_the_whole_batch_gradients() {
    let _lock = exclusive();
    let device = Default::default();
    let model = Tied::<B>::new(&device);
    let _ = weights(&model);
    let data = rows(16);
    let grads_of = |grads: &GradientsParams| -> Vec<Vec<f32>> {
        struct Collect<'a>(&'a GradientsParams, Vec<Vec<f32>>);
        impl<Bk: AutodiffBackend> ModuleVisitor<Bk> for Collect<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
                let grad = self
                    .0
                    .get::<Bk::InnerBackend, D>(param.id)
                    .expect("a gradient");
                self.1
                    .push(grad.into_data().convert::<f32>().into_vec().unwrap());
            }
        }
        let mut collect = Collect(grads, Vec::new());
        model.visit(&mut collect);
        collect.1
    };
    let whole = GradientsParams::from_grads(
        model
            .loss(RowBatcher.batch(data.clone(), &device))
            .backward(),
        &model,
    );
    assert_eq!(whole.len(), 4, "one weight and one bias per distinct layer");
    let expected = grads_of(&whole);
    let grads = on_peers(2, |rank| {
        // The peer's replica keeps the tie: one forked layer, used twice.
        let shared = replica(&model.first, &device);
        let model = Tied {
            first: shared.clone(),
            second: shared,
            out: replica(&model.out, &device),
        };
        let peer = Peer::<Flex>::join(rank, 2, device, &config(20_000)).unwrap();
        peer.check_replicas(&model).unwrap();
        let batch: Rows<B> = RowBatcher.batch(data[rank * 8..(rank + 1) * 8].to_vec(), &device);
        let grads = GradientsParams::from_grads(model.loss(batch).backward(), &model);
        let (mean, _) = peer.mean_gradients(&model, grads, false).unwrap();
        peer.leave().unwrap();
        assert_eq!(
            mean.len(),
            4,
            "peer {rank}: one gradient per distinct parameter"
        );
        grads_of(&mean)
    });
    for (rank, got) in grads.iter().enumerate() {
        let err = norm_rel(got, &expected);
        assert!(err <= 1e-5, "peer {rank}: relative error {err}");
    }
}

/// A model whose training forward differs from its inference one: BatchNorm normalises each
/// batch with its own statistics and keeps running ones, which are parameters without
/// gradients.
#[derive(Module, Debug)]
pub(crate) struct Normed<B: Backend> {
    pub(crate) hidden: Linear<B>,
    pub(crate) norm: burn::nn::BatchNorm<B>,
    pub(crate) out: Linear<B>,
}

impl<B: Backend> Normed<B> {
    pub(crate) fn loss(&self, batch: Rows<B>) -> Tensor<B, 1> {
        let hidden = self.norm.forward(self.hidden.forward(batch.x));
        let output = self.out.forward(burn::tensor::activation::relu(hidden));
        MseLoss::new().forward(output, batch.y, Reduction::Mean)
    }
}

/// BatchNorm on peers: each peer normalises its own shard, as PyTorch's DDP does without
/// `SyncBatchNorm`, so the mean gradients are the mean of one device's gradients over each
/// shard separately, not those of the whole batch. The running statistics (parameters without
/// gradients) pass the replica check and the all-reduce.
#[test]
fn batch_norm_peers_average_their_shards_gradients() {
    let _lock = exclusive();
    let device = Default::default();
    let case = BatchNormCase::new(&device);
    let peers_model = case.copy();
    let results = on_peers(2, |rank| {
        let replica = replica(&peers_model, &device);
        let peer = Peer::<Flex>::join(rank, 2, device, &config(20_000)).unwrap();
        let mean = case.peer_mean(&peer, &replica, rank);
        peer.leave().unwrap();
        mean
    });
    for (rank, got) in results.iter().enumerate() {
        let err = norm_rel(got, &case.expected);
        assert!(err <= 1e-5, "peer {rank}: relative error {err}");
    }
}

/// The BatchNorm case of two shards of 8 rows: the model, and the mean of one device's
/// gradients over each shard (not the whole batch's, which the case checks differ).
pub(crate) struct BatchNormCase {
    pub(crate) model: Normed<B>,
    pub(crate) data: Vec<Row>,
    pub(crate) expected: Vec<Vec<f32>>,
}

impl BatchNormCase {
    pub(crate) fn new(device: &burn::tensor::Device<B>) -> Self {
        let model = Self::fresh(device);
        let _ = weights(&model);
        let data = rows(16);
        let mut case = Self {
            model,
            data,
            expected: Vec::new(),
        };
        let of = |batch: Rows<B>| {
            let model = case.copy();
            case.values(&GradientsParams::from_grads(
                model.loss(batch).backward(),
                &model,
            ))
        };
        let (first, second) = (of(case.shard(0)), of(case.shard(1)));
        let whole = of(RowBatcher.batch(case.data.clone(), device));
        let expected: Vec<Vec<f32>> = first
            .iter()
            .zip(&second)
            .map(|(a, b)| a.iter().zip(b).map(|(a, b)| (a + b) / 2.0).collect())
            .collect();
        assert!(
            norm_rel(&expected, &whole) > 1e-3,
            "the whole batch's statistics give other gradients"
        );
        case.expected = expected;
        case
    }

    pub(crate) fn fresh(device: &burn::tensor::Device<B>) -> Normed<B> {
        Normed::<B> {
            hidden: LinearConfig::new(6, 8).init(device),
            norm: burn::nn::BatchNormConfig::new(8).init(device),
            out: LinearConfig::new(8, 1).init(device),
        }
    }

    /// A copy with running statistics of its own (a clone would share them).
    pub(crate) fn copy(&self) -> Normed<B> {
        Self::fresh(&Default::default()).load_record(self.model.clone().into_record())
    }

    pub(crate) fn shard(&self, rank: usize) -> Rows<B> {
        RowBatcher.batch(
            self.data[rank * 8..(rank + 1) * 8].to_vec(),
            &Default::default(),
        )
    }

    pub(crate) fn values(&self, grads: &GradientsParams) -> Vec<Vec<f32>> {
        let two = |id| grads.get::<Flex, 2>(id).expect("a gradient").into_data();
        let one = |id| grads.get::<Flex, 1>(id).expect("a gradient").into_data();
        [
            two(self.model.hidden.weight.id),
            one(self.model.norm.gamma.id),
            one(self.model.norm.beta.id),
            two(self.model.out.weight.id),
        ]
        .into_iter()
        .map(|data| data.convert::<f32>().into_vec().unwrap())
        .collect()
    }

    /// Peer `rank`'s mean gradients of `replica` on its shard.
    pub(crate) fn peer_mean(
        &self,
        peer: &Peer<Flex>,
        replica: &Normed<B>,
        rank: usize,
    ) -> Vec<Vec<f32>> {
        peer.check_replicas(replica).unwrap();
        let grads = GradientsParams::from_grads(replica.loss(self.shard(rank)).backward(), replica);
        let (mean, _) = peer.mean_gradients(replica, grads, false).unwrap();
        self.values(&mean)
    }
}

/// Replicas that differ in a fixed parameter (another seed for the sketches) are refused at
/// the start, on every peer, naming the parameter.
#[test]
fn replicas_that_differ_are_refused() {
    let _lock = exclusive();
    let device = Default::default();
    let results = on_peers(2, |rank| {
        let model = Net::<B>::new(&device); // each thread draws its own fixed projection
        let peer = Peer::<Flex>::join(rank, 2, device, &config(20_000)).unwrap();
        let result = peer.check_replicas(&model);
        let _ = model;
        peer.leave().unwrap();
        result
    });
    for result in results {
        match result {
            Err(DistributedError::ReplicasDiffer { parameters }) => {
                assert!(parameters.contains(&"fixed".to_string()), "{parameters:?}")
            }
            other => panic!("expected ReplicasDiffer, got {other:?}"),
        }
    }
}
