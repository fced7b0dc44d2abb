//! A small causal model trained 50 steps on the fused operations and on the decomposition:
//! the same loss curve within tolerance.

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn_fast_cpu::FastFlex;
use burn_fused::{
    AttentionOptions, FusedBackend, composed, fused_attention, fused_cross_entropy,
    fused_layer_norm_module,
};

use super::common::seeded;

#[derive(Module, Debug)]
struct Tiny<B: Backend> {
    embed: Param<Tensor<B, 2>>,
    norm: LayerNorm<B>,
    qkv: Linear<B>,
    head: Linear<B>,
}

const VOCAB: usize = 11;
const D: usize = 16;
const HEADS: usize = 2;
const SEQ: usize = 9;
const BATCH: usize = 3;

impl<B: FusedBackend> Tiny<B> {
    fn init(device: &B::Device) -> Self {
        Self {
            embed: Param::from_tensor(seeded([VOCAB, D], 31, 1.0, device)),
            norm: LayerNormConfig::new(D).init(device),
            qkv: LinearConfig::new(D, 3 * D).init(device),
            head: LinearConfig::new(D, VOCAB).init(device),
        }
    }

    fn loss(
        &self,
        tokens: Tensor<B, 2, Int>,
        targets: Tensor<B, 1, Int>,
        fused: bool,
    ) -> Tensor<B, 1> {
        let x = self
            .embed
            .val()
            .select(0, tokens.reshape([BATCH * SEQ]))
            .reshape([BATCH, SEQ, D]);
        let x = if fused {
            fused_layer_norm_module(&self.norm, x)
        } else {
            self.norm.forward(x)
        };
        let heads = |t: Tensor<B, 3>| t.reshape([BATCH, SEQ, HEADS, D / HEADS]).swap_dims(1, 2);
        let mut parts = self
            .qkv
            .forward(x.clone())
            .chunk(3, 2)
            .into_iter()
            .map(heads);
        let (q, k, v) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        let options = AttentionOptions {
            causal: true,
            ..Default::default()
        };
        let context = if fused {
            fused_attention(q, k, v, None, options)
        } else {
            composed::attention_forward(q, k, v, None, options).output
        };
        let x = x + context.swap_dims(1, 2).reshape([BATCH, SEQ, D]);
        let logits = self.head.forward(x).reshape([BATCH * SEQ, VOCAB]);
        if fused {
            fused_cross_entropy(logits, targets, None)
        } else {
            composed::cross_entropy_forward(logits, targets, None).loss
        }
    }
}

fn curve<B: AutodiffBackend + FusedBackend>(fused: bool) -> Vec<f32> {
    let device = Default::default();
    B::seed(&device, 5);
    let mut model = Tiny::<B>::init(&device);
    let mut optim = AdamConfig::new().init();
    (0..50)
        .map(|step| {
            let ids: Vec<i64> = (0..BATCH * SEQ)
                .map(|i| ((i * 5 + step * 3) % VOCAB) as i64)
                .collect();
            let next: Vec<i64> = ids.iter().map(|t| (t + 1) % VOCAB as i64).collect();
            let tokens = Tensor::from_data(TensorData::new(ids, [BATCH, SEQ]), &device);
            let targets = Tensor::from_data(TensorData::new(next, [BATCH * SEQ]), &device);
            let loss = model.loss(tokens, targets, fused);
            let value: f32 = loss.clone().into_scalar().elem();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-2, model.clone(), grads);
            value
        })
        .collect()
}

fn same_curve<B: AutodiffBackend + FusedBackend>() {
    let (fused, decomposed) = (curve::<B>(true), curve::<B>(false));
    assert!(
        decomposed[49] < decomposed[0] * 0.5,
        "the model learns: {decomposed:?}"
    );
    for (step, (a, b)) in fused.iter().zip(&decomposed).enumerate() {
        assert!(
            (a - b).abs() <= 2e-3 * b.abs(),
            "step {step}: fused {a}, decomposed {b}"
        );
    }
}

#[test]
fn flex_trains_as_the_decomposition() {
    same_curve::<Autodiff<Flex>>();
}

#[test]
fn fast_flex_trains_as_the_decomposition() {
    same_curve::<Autodiff<FastFlex>>();
}
