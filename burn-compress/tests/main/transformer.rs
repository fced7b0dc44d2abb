//! The transformer pieces of `burn_sketch::nn`: attention against a naive reference (outputs
//! and gradients), causality and padding, Burn's own attention as a reference, blocks, and
//! converting a trained dense model (bit-exact where untouched, within the sketch's stated
//! error where sketched, dense checkpoints loaded first).

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::attention::{MhaInput, MultiHeadAttentionConfig as BurnMhaConfig};
use burn::record::{BinFileRecorder, FullPrecisionSettings};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Distribution, ElementConversion, Tensor, TensorData};
use burn_compress::CompressError;
use burn_compress::{
    AnyLinear, AnyLinearConfig, AnyMultiHeadAttention, AnyMultiHeadAttentionConfig, BlockAttention,
    Converter, LinearKind, LinearLayer, Mlp, MlpConfig, Selection, TransformerBlock,
    TransformerBlockConfig,
};
use burn_memory::draw_params;
use burn_randnla::LinalgError;
use burn_sketch::{SkLinear, SketchBackend, SketchError};

use crate::close::{assert_close, assert_close_within, serial};

type F = Flex;
type AF = Autodiff<Flex>;

/// Attention computed the long way: every head sliced out, scores masked with an explicit
/// matrix built on the host, softmax as `exp / Σ exp`, heads concatenated.
fn naive_attention<B: SketchBackend>(
    mha: &AnyMultiHeadAttention<B>,
    x: Tensor<B, 3>,
    pad: Option<&[Vec<bool>]>,
) -> Tensor<B, 3> {
    let [batch, seq, d_model] = x.dims();
    let heads = mha.n_heads;
    let d_k = d_model / heads;
    let device = x.device();
    let project = |layer: &AnyLinear<B>, x: Tensor<B, 3>| layer.forward(x);
    let (q, k, v) = (
        project(&mha.query, x.clone()),
        project(&mha.key, x.clone()),
        project(&mha.value, x),
    );
    let mut outputs = Vec::new();
    for b in 0..batch {
        let mut mask = vec![0.0f32; seq * seq];
        for i in 0..seq {
            for j in 0..seq {
                let future = mha.causal && j > i;
                let padded = pad.is_some_and(|p| p[b][j]);
                if future || padded {
                    mask[i * seq + j] = -1.0e4;
                }
            }
        }
        let mask = Tensor::<B, 2>::from_data(TensorData::new(mask, [seq, seq]), &device);
        let mut per_head = Vec::new();
        for h in 0..heads {
            let cols = h * d_k..(h + 1) * d_k;
            let slice = |t: &Tensor<B, 3>| {
                t.clone()
                    .slice([b..b + 1, 0..seq, cols.clone()])
                    .reshape([seq, d_k])
            };
            let scores = slice(&q)
                .matmul(slice(&k).transpose())
                .div_scalar((d_k as f64).sqrt())
                + mask.clone();
            let exp = (scores.clone() - scores.max_dim(1)).exp();
            let weights = exp.clone() / exp.sum_dim(1);
            per_head.push(weights.matmul(slice(&v)));
        }
        outputs.push(Tensor::cat(per_head, 1).reshape([1, seq, d_model]));
    }
    mha.output.forward(Tensor::cat(outputs, 0))
}

fn kinds() -> [LinearKind; 3] {
    [
        LinearKind::Dense,
        LinearKind::Sketched {
            num_terms: 2,
            low_rank: 3,
        },
        LinearKind::LowRank { rank: 5 },
    ]
}

pub(crate) fn attention_matches_naive_reference<B: AutodiffBackend + SketchBackend>(
    device: &B::Device,
) {
    for kind in kinds() {
        for causal in [false, true] {
            let mha = AnyMultiHeadAttentionConfig::new(12, 3)
                .with_causal(causal)
                .with_projections(kind)
                .init::<B>(device);
            let x = Tensor::<B, 3>::random([2, 5, 12], Distribution::Normal(0.0, 1.0), device)
                .require_grad();
            let pad = vec![vec![false; 5], vec![false, false, false, true, true]];
            let mask =
                Tensor::<B, 2, Bool>::from_data(TensorData::new(pad.concat(), [2, 5]), device);
            let what = format!("{kind} causal={causal}");
            let ours = mha.forward(x.clone(), Some(mask));
            let reference = naive_attention(&mha, x.clone(), Some(&pad));
            assert_close(
                ours.clone().into_data(),
                reference.clone().into_data(),
                &format!("attention output, {what}"),
            );
            // A weighted sum, so that every output element's gradient differs.
            let weights = Tensor::<B, 3>::random([2, 5, 12], Distribution::Default, device);
            let grads = (ours * weights.clone()).sum().backward();
            let grads_ref = (reference * weights).sum().backward();
            assert_close(
                x.grad(&grads).unwrap().into_data(),
                x.grad(&grads_ref).unwrap().into_data(),
                &format!("input gradient, {what}"),
            );
            assert_close(
                first_weight_grad(&mha.query, &grads),
                first_weight_grad(&mha.query, &grads_ref),
                &format!("query weight gradient, {what}"),
            );
        }
    }
}

#[test]
fn attention_matches_naive_reference_flex() {
    let _serial = serial();
    attention_matches_naive_reference::<AF>(&Default::default());
}

#[test]
fn attention_matches_naive_reference_ndarray() {
    let _serial = serial();
    attention_matches_naive_reference::<Autodiff<NdArray>>(&Default::default());
}

#[test]
fn causal_attention_ignores_the_future() {
    let device = Default::default();
    for kind in kinds() {
        let mha = AnyMultiHeadAttentionConfig::new(8, 2)
            .with_causal(true)
            .with_projections(kind)
            .init::<F>(&device);
        let x = Tensor::<F, 3>::random([1, 6, 8], Distribution::Normal(0.0, 1.0), &device);
        let changed = x.clone().slice_assign(
            [0..1, 4..6, 0..8],
            Tensor::random([1, 2, 8], Distribution::Normal(3.0, 1.0), &device),
        );
        let (a, b) = (mha.forward(x, None), mha.forward(changed, None));
        assert_eq!(
            a.clone().slice([0..1, 0..4, 0..8]).into_data(),
            b.clone().slice([0..1, 0..4, 0..8]).into_data(),
            "{kind}: changing positions 4 and 5 moved an earlier output"
        );
        let later = (a.slice([0..1, 4..6, 0..8]) - b.slice([0..1, 4..6, 0..8]))
            .abs()
            .max()
            .into_scalar();
        assert!(
            later > 1e-3,
            "{kind}: the changed positions' outputs did not change"
        );
    }
}

#[test]
fn padded_positions_are_not_attended() {
    let device = Default::default();
    let mha = AnyMultiHeadAttentionConfig::new(8, 4).init::<F>(&device);
    let x = Tensor::<F, 3>::random([2, 5, 8], Distribution::Normal(0.0, 1.0), &device);
    let pad = Tensor::<F, 2, Bool>::from_data(
        TensorData::new(
            vec![
                false, false, false, false, true, false, false, true, true, true,
            ],
            [2, 5],
        ),
        &device,
    );
    let changed = x.clone().slice_assign(
        [1..2, 2..5, 0..8],
        Tensor::random([1, 3, 8], Distribution::Normal(5.0, 1.0), &device),
    );
    let (a, b) = (
        mha.forward(x.clone(), Some(pad.clone())),
        mha.forward(changed, Some(pad.clone())),
    );
    assert_close(
        a.clone().slice([1..2, 0..2, 0..8]).into_data(),
        b.slice([1..2, 0..2, 0..8]).into_data(),
        "outputs of unpadded positions when padded inputs change",
    );
    let unmasked = mha.forward(x, None);
    let moved = (a.slice([1..2, 0..2, 0..8]) - unmasked.slice([1..2, 0..2, 0..8]))
        .abs()
        .max()
        .into_scalar();
    assert!(moved > 1e-4, "the padding mask had no effect");
}

#[test]
fn matches_burns_multi_head_attention() {
    let device = Default::default();
    let burn_mha = BurnMhaConfig::new(16, 4)
        .with_dropout(0.0)
        .init::<F>(&device);
    let ours = AnyMultiHeadAttention::from_burn(&burn_mha, false);
    let x = Tensor::<F, 3>::random([3, 7, 16], Distribution::Normal(0.0, 1.0), &device);
    let expected = burn_mha.forward(MhaInput::self_attn(x.clone())).context;
    assert_close(
        ours.forward(x, None).into_data(),
        expected.into_data(),
        "ours against Burn's MultiHeadAttention",
    );
}

#[test]
fn invalid_heads_are_typed_errors() {
    let device = Default::default();
    for heads in [0, 5] {
        let err = AnyMultiHeadAttentionConfig::new(12, heads)
            .try_init::<F>(&device)
            .unwrap_err();
        assert!(
            matches!(err, CompressError::InvalidConfig { name: "n_heads", value, .. } if value == heads),
            "{err}"
        );
    }
    let err = AnyLinearConfig::new(8, 8)
        .with_kind(LinearKind::Sketched {
            num_terms: 1,
            low_rank: 0,
        })
        .try_init::<F>(&device)
        .unwrap_err();
    assert!(
        matches!(
            err,
            CompressError::Sketch(SketchError::InvalidConfig {
                name: "low_rank",
                ..
            })
        ),
        "{err}"
    );
}

/// A two-block model: what a user builds from the pieces.
#[derive(Module, Debug)]
struct Model<B: Backend> {
    blocks: Vec<TransformerBlock<B>>,
    head: AnyLinear<B>,
}

fn model<B: Backend>(device: &B::Device) -> Model<B> {
    let block = TransformerBlockConfig::new(32, 4, 64).with_dropout(0.0);
    Model {
        blocks: (0..2).map(|_| block.init(device)).collect(),
        head: AnyLinearConfig::new(32, 10).init(device),
    }
}

/// Every float tensor of a module by parameter path (`Param` ids change on conversion).
struct Tensors {
    path: Vec<String>,
    found: Vec<(String, TensorData)>,
}

impl<B: Backend> ModuleVisitor<B> for Tensors {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.push(name.into());
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.found
            .push((self.path.join("."), param.val().into_data()));
    }
}

fn tensors<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, TensorData)> {
    let mut visitor = Tensors {
        path: Vec::new(),
        found: Vec::new(),
    };
    module.visit(&mut visitor);
    visitor.found
}

#[test]
fn conversion_keeps_untouched_layers_bit_exact_flex() {
    let _serial = serial();
    conversion_keeps_untouched_layers_bit_exact::<F>(&Default::default());
}

/// Sketching the MLPs of a two-block model on `B`, or making them low-rank, converts exactly
/// those four layers and leaves every other tensor bit-for-bit as it was.
pub(crate) fn conversion_keeps_untouched_layers_bit_exact<B: Backend>(device: &B::Device) {
    for kind in [
        LinearKind::Sketched {
            num_terms: 1,
            low_rank: 4,
        },
        LinearKind::LowRank { rank: 4 },
    ] {
        converts_only_the_picked_layers::<B>(kind, device);
    }
}

fn converts_only_the_picked_layers<B: Backend>(kind: LinearKind, device: &B::Device) {
    let dense = model::<B>(device);
    let before = tensors(&dense);
    let (converted, report) = Converter::new()
        .rule(Selection::types(["Mlp"]), kind)
        .apply(dense)
        .unwrap();
    let paths: Vec<&str> = report.layers.iter().map(|l| l.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "blocks.0.mlp.fc1",
            "blocks.0.mlp.fc2",
            "blocks.1.mlp.fc1",
            "blocks.1.mlp.fc2"
        ]
    );
    let after = tensors(&converted);
    let untouched: Vec<_> = before
        .iter()
        .filter(|(p, _)| !p.contains(".mlp."))
        .collect();
    assert!(
        untouched.len() > 20,
        "{} untouched tensors",
        untouched.len()
    );
    for (path, data) in untouched {
        let (_, now) = after
            .iter()
            .find(|(p, _)| p == path)
            .unwrap_or_else(|| panic!("{path} is gone"));
        assert_eq!(now, data, "{path} changed");
    }
    for block in &converted.blocks {
        assert_eq!(block.mlp.fc1.kind(), kind);
        let BlockAttention::Softmax(attention) = &block.attention else {
            panic!("softmax attention")
        };
        assert_eq!(attention.query.kind(), LinearKind::Dense);
    }
    let listed = Converter::layers::<B, _>(&converted);
    assert_eq!(listed.len(), 2 * 6 + 1);
    assert_eq!(
        listed
            .iter()
            .filter(|l| l.kind == kind)
            .map(|l| l.trainable)
            .sum::<usize>(),
        report.trainable().1
    );
    // The display names the kinds.
    let shown = format!("{converted}");
    let name = match kind {
        LinearKind::LowRank { .. } => "LowRank",
        _ => "Sketched",
    };
    assert!(shown.contains(name) && shown.contains("Dense"), "{shown}");
}

#[test]
fn converted_attention_is_within_the_sketch_error() {
    let _serial = serial();
    let device = Default::default();
    F::seed(&device, 7);
    let dense = AnyMultiHeadAttentionConfig::new(64, 4).init::<F>(&device);
    draw_params(&dense); // so that the clone below holds the same weights
    let (t, k) = (1, 16);
    let expected = SkLinear::<F>::expected_relative_error(64, 64, t, k);
    let (sketched, _) = Converter::new()
        .rule(
            Selection::All,
            LinearKind::Sketched {
                num_terms: t,
                low_rank: k,
            },
        )
        .apply(dense.clone())
        .unwrap();
    for (name, a, b) in [
        ("query", &dense.query, &sketched.query),
        ("key", &dense.key, &sketched.key),
        ("value", &dense.value, &sketched.value),
        ("output", &dense.output, &sketched.output),
    ] {
        let w = a.to_dense_weight();
        let error = (b.to_dense_weight() - w.clone())
            .powf_scalar(2.0)
            .sum()
            .sqrt()
            .into_scalar() as f64
            / w.powf_scalar(2.0).sum().sqrt().into_scalar() as f64;
        assert!(
            (error / expected - 1.0).abs() < 0.25,
            "{name}: relative weight error {error}, stated {expected}"
        );
    }
}

#[test]
fn bad_conversions_are_typed_errors() {
    let device = Default::default();
    let sketched = LinearKind::Sketched {
        num_terms: 1,
        low_rank: 4,
    };
    let err = Converter::new()
        .rule(Selection::paths(["blocks.0.mlp.fc3"]), sketched)
        .apply(model::<F>(&device))
        .unwrap_err();
    assert!(
        matches!(&err, CompressError::NoMatch { pattern, layers } if pattern == "blocks.0.mlp.fc3" && layers.len() == 13),
        "{err}"
    );
    let err = Converter::new()
        .rule(Selection::types(["Attention"]), sketched)
        .apply(model::<F>(&device))
        .unwrap_err();
    assert!(matches!(err, CompressError::NoMatch { .. }), "{err}");
    let err = Converter::new()
        .rule(
            Selection::All,
            LinearKind::Sketched {
                num_terms: 1,
                low_rank: 0,
            },
        )
        .apply(model::<F>(&device))
        .unwrap_err();
    assert!(
        matches!(
            err,
            CompressError::Sketch(SketchError::InvalidConfig {
                name: "low_rank",
                ..
            })
        ),
        "{err}"
    );
    let err = Converter::new()
        .rule(Selection::paths(["head"]), LinearKind::LowRank { rank: 0 })
        .apply(model::<F>(&device))
        .unwrap_err();
    assert!(
        matches!(
            err,
            CompressError::Linalg(LinalgError::InvalidConfig { name: "rank", .. })
        ),
        "{err}"
    );
}

/// A dense layer converted to rank `r` through the randomized SVD: its weight error is within
/// 1.1× of the truncated SVD's (the best any rank-`r` layer can do, from the exact singular
/// values), at full rank the layer is the dense one, and the bias is copied. The weight is one
/// trained for a few steps (a random one's flat spectrum is the easy case for the error ratio
/// but says nothing of a real layer), and odd sizes.
#[test]
fn low_rank_conversion_is_the_truncated_svd() {
    use burn::nn::LinearConfig;
    use burn_randnla as linalg;

    let device = Default::default();
    for (d_in, d_out, rank) in [(37, 23, 5), (64, 96, 1), (40, 13, 13)] {
        let linear = LinearConfig::new(d_in, d_out).init::<F>(&device);
        // A spectrum that decays, as trained layers' do: the weight times a graded diagonal.
        let graded: Vec<f32> = (0..d_out).map(|j| 0.9f32.powi(j as i32)).collect();
        let weight = linear.weight.val()
            * Tensor::<F, 1>::from_floats(graded.as_slice(), &device).unsqueeze_dim(0);
        let linear = burn::nn::Linear {
            weight: burn::module::Param::from_tensor(weight.clone()),
            // Drawn now: a clone of a parameter not yet drawn draws values of its own.
            bias: linear
                .bias
                .map(|bias| burn::module::Param::from_tensor(bias.val())),
        };
        let converted = AnyLinear::from(linear.clone())
            .try_convert(LinearKind::LowRank { rank })
            .unwrap();
        assert_eq!(converted.kind(), LinearKind::LowRank { rank });
        let LinearLayer::LowRank(layer) = converted.layer() else {
            panic!("a low-rank layer")
        };
        let product = layer.a.val().matmul(layer.b.val());
        let error: f64 = (product - weight.clone())
            .powi_scalar(2)
            .sum()
            .sqrt()
            .into_scalar()
            .into();
        let sigma = linalg::singular_values(weight).unwrap();
        let optimal = sigma.iter().skip(rank).map(|s| s * s).sum::<f64>().sqrt();
        assert!(
            error <= 1.1 * optimal + 1e-5,
            "{d_in}×{d_out}, rank {rank}: error {error} against optimal {optimal}"
        );
        assert_eq!(
            layer.bias.as_ref().unwrap().val().into_data(),
            linear.bias.as_ref().unwrap().val().into_data()
        );
        let x = Tensor::<F, 2>::random([3, d_in], burn::tensor::Distribution::Default, &device);
        let dense_out = linear.forward(x.clone());
        let low_out = converted.forward(x);
        if rank == d_in.min(d_out) {
            let gap: f32 = (dense_out - low_out).abs().max().into_scalar();
            assert!(gap < 1e-4, "full rank differs by {gap}");
        }
    }
}

#[test]
fn a_dense_checkpoint_loads_then_converts() {
    let device = Default::default();
    let trained = model::<F>(&device);
    draw_params(&trained);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dense");
    trained
        .clone()
        .save_file(&file, &BinFileRecorder::<FullPrecisionSettings>::new())
        .unwrap();
    // A fresh model with the checkpoint's (dense) layout, its weights loaded, then sketched.
    let loaded = model::<F>(&device)
        .load_file(
            &file,
            &BinFileRecorder::<FullPrecisionSettings>::new(),
            &device,
        )
        .unwrap();
    assert_eq!(tensors(&loaded), tensors(&trained));
    let (converted, _) = Converter::new()
        .rule(
            Selection::paths(["blocks.*.attention"]),
            LinearKind::Sketched {
                num_terms: 2,
                low_rank: 8,
            },
        )
        .apply(loaded)
        .unwrap();
    let x = Tensor::<F, 3>::random([2, 4, 32], Distribution::Default, &device);
    let run = |m: &Model<F>| {
        let h = m.blocks.iter().fold(x.clone(), |h, b| b.forward(h, None));
        m.head.forward(h)
    };
    assert_eq!(run(&converted).dims(), [2, 4, 10]);
    let BlockAttention::Softmax(attention) = &converted.blocks[1].attention else {
        panic!("softmax attention")
    };
    assert_eq!(
        attention.key.kind(),
        LinearKind::Sketched {
            num_terms: 2,
            low_rank: 8
        }
    );
    assert_eq!(converted.blocks[1].mlp.fc1.kind(), LinearKind::Dense);
    // The converted model saves and loads as itself.
    let file = dir.path().join("sketched");
    converted
        .clone()
        .save_file(&file, &BinFileRecorder::<FullPrecisionSettings>::new())
        .unwrap();
    let (like, _) = Converter::new()
        .rule(
            Selection::paths(["blocks.*.attention"]),
            LinearKind::Sketched {
                num_terms: 2,
                low_rank: 8,
            },
        )
        .apply(model::<F>(&device))
        .unwrap();
    let reloaded = like
        .load_file(
            &file,
            &BinFileRecorder::<FullPrecisionSettings>::new(),
            &device,
        )
        .unwrap();
    assert_eq!(run(&reloaded).into_data(), run(&converted).into_data());
}

#[test]
fn block_and_mlp_run_every_kind_and_train_flex() {
    let _serial = serial();
    // Burn's default `gelu_backward` (NdArray's, CubeCL's) is the derivative of GELU's tanh
    // approximation (up to 8.7e-4 from the exact one); Flex's is the exact erf form. So Flex's
    // gradients through the MLP differ from NdArray's by more than rounding (2e-4 of their
    // scale measured): they are held to 2e-3.
    block_and_mlp_run_every_kind_and_train::<AF>(&Default::default(), Some(2e-3));
}

/// The gradient of the first weight of a linear layer of any kind (`S1s` when sketched, `A`
/// when low-rank).
fn first_weight_grad<B: AutodiffBackend>(layer: &AnyLinear<B>, grads: &B::Gradients) -> TensorData {
    match layer.layer() {
        LinearLayer::Dense(l) => l.weight.grad(grads).unwrap().into_data(),
        LinearLayer::Sketched(l) => l.s1s.grad(grads).unwrap().into_data(),
        LinearLayer::LowRank(l) => l.a.grad(grads).unwrap().into_data(),
        LinearLayer::Int8(_) => panic!("int8 layers have nothing to train"),
    }
}

/// A causal block and an MLP of every kind, forward and backward on `B` (dropout off): their
/// outputs and gradients (the input's, a layer norm's, the first MLP layer's) equal those of
/// the same modules on NdArray, copied across through a record. The gradients are held to
/// `gradient_tolerance` where given, else to [`assert_close`]'s.
pub(crate) fn block_and_mlp_run_every_kind_and_train<B: AutodiffBackend + SketchBackend>(
    device: &B::Device,
    gradient_tolerance: Option<f32>,
) {
    let assert_grad_close =
        |actual: TensorData, expected: TensorData, what: &str| match gradient_tolerance {
            Some(tolerance) => assert_close_within(actual, expected, tolerance, what),
            None => assert_close(actual, expected, what),
        };
    use burn::record::{BinBytesRecorder, Recorder};
    type R = Autodiff<NdArray>;
    let reference_device = Default::default();
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    // A module on the reference backend, and the same weights on `B`.
    macro_rules! copy {
        ($module:expr, $fresh:expr) => {{
            let bytes = recorder.record($module.clone().into_record(), ()).unwrap();
            $fresh.load_record(recorder.load(bytes, device).unwrap())
        }};
    }
    for kind in kinds() {
        let config = TransformerBlockConfig::new(16, 2, 32)
            .with_dropout(0.0)
            .with_projections(kind)
            .with_mlp(kind);
        let expected_block = config.init::<R>(&reference_device);
        draw_params(&expected_block); // so that the copy holds the same weights
        let block = copy!(expected_block, config.init::<B>(device));
        let x_ref = Tensor::<R, 3>::random([2, 3, 16], Distribution::Default, &reference_device);
        let weights = Tensor::<R, 3>::random([2, 3, 16], Distribution::Default, &reference_device);

        let x_ref = x_ref.require_grad();
        let y_ref = expected_block.forward(x_ref.clone(), None);
        let grads_ref = (y_ref.clone() * weights.clone()).sum().backward();

        let x = Tensor::<B, 3>::from_data(x_ref.to_data(), device).require_grad();
        let y = block.forward(x.clone(), None);
        assert_eq!(y.dims(), [2, 3, 16]);
        assert_close(
            y.to_data(),
            y_ref.to_data(),
            &format!("block output, {kind}"),
        );
        let grads = (y * Tensor::from_data(weights.to_data(), device))
            .sum()
            .backward();
        let g = block.norm_attention.gamma.grad(&grads).expect("a gradient");
        assert!(
            g.clone().abs().sum().into_scalar().elem::<f32>() > 0.0,
            "{kind}"
        );
        let g_ref = expected_block
            .norm_attention
            .gamma
            .grad(&grads_ref)
            .unwrap();
        assert_grad_close(g.into_data(), g_ref.into_data(), &format!("∂gamma, {kind}"));
        assert_grad_close(
            x.grad(&grads).unwrap().into_data(),
            x_ref.grad(&grads_ref).unwrap().into_data(),
            &format!("block ∂x, {kind}"),
        );
        assert_grad_close(
            first_weight_grad(&block.mlp.fc1, &grads),
            first_weight_grad(&expected_block.mlp.fc1, &grads_ref),
            &format!("block ∂fc1, {kind}"),
        );

        let mlp_config = MlpConfig::new(16, 8).with_dropout(0.0).with_kind(kind);
        let expected_mlp: Mlp<R> = mlp_config.init(&reference_device);
        draw_params(&expected_mlp);
        let mlp: Mlp<B> = copy!(expected_mlp, mlp_config.init::<B>(device));
        let x_ref = x_ref.detach();
        let y_ref = expected_mlp.forward(x_ref.clone());
        let grads_ref = (y_ref.clone() * weights.clone()).sum().backward();
        let y = mlp.forward(Tensor::from_data(x_ref.to_data(), device));
        assert_eq!(y.dims(), [2, 3, 16]);
        assert_close(y.to_data(), y_ref.to_data(), &format!("MLP output, {kind}"));
        let grads = (y * Tensor::from_data(weights.to_data(), device))
            .sum()
            .backward();
        assert_grad_close(
            first_weight_grad(&mlp.fc1, &grads),
            first_weight_grad(&expected_mlp.fc1, &grads_ref),
            &format!("MLP ∂fc1, {kind}"),
        );
    }
}

#[test]
fn dropout_is_on_in_training_only() {
    let device = Default::default();
    let block = TransformerBlockConfig::new(16, 2, 32)
        .with_dropout(0.5)
        .init::<AF>(&device);
    let x = Tensor::<AF, 3>::random([2, 3, 16], Distribution::Default, &device);
    let (a, b) = (
        block.forward(x.clone(), None),
        block.forward(x.clone(), None),
    );
    let diff = (a - b).abs().max().into_scalar();
    assert!(diff > 0.0, "two training forwards gave the same output");
    let inner = burn::module::AutodiffModule::valid(&block);
    let x = x.inner();
    assert_eq!(
        inner.forward(x.clone(), None).into_data(),
        inner.forward(x, None).into_data()
    );
}

/// `SketchInit::Fitted` gives the least-squares fit for the sketches drawn: a residual
/// `R = W − Ŵ` orthogonal to both sketch spaces (`R·U1ᵀ = 0`, `U2ᵀ·R = 0`: the optimality
/// conditions), a smaller weight error than Panther's unbiased estimate from the same
/// sketches, and an exact fit once `T·k` covers the output width. Odd sizes, several terms;
/// then through `Converter` on the MLPs of a model.
#[test]
fn fitted_sketched_conversion_is_the_least_squares_fit() {
    use burn::nn::LinearConfig;
    use burn_sketch::SketchInit;

    let _serial = serial();
    let device = Default::default();
    let norm = |t: Tensor<F, 2>| -> f64 { t.powi_scalar(2).sum().sqrt().into_scalar().into() };
    for (d_in, d_out, terms, k) in [(37, 23, 1, 4), (64, 96, 2, 5), (30, 20, 3, 8)] {
        let dense = LinearConfig::new(d_in, d_out).init::<F>(&device);
        let weight = dense.weight.val();
        let fitted = SkLinear::try_from_linear_with(&dense, terms, k, SketchInit::Fitted).unwrap();
        let scale = norm(weight.clone());
        let residual = weight.clone() - fitted.to_dense_weight();
        let u1 = fitted.u1s.val().reshape([terms * k, d_out]);
        let u2 = fitted.u2s.val().swap_dims(0, 1).reshape([d_in, terms * k]);
        let row_side = norm(residual.clone().matmul(u1.clone().transpose()));
        let column_side = norm(u2.clone().transpose().matmul(residual.clone()));
        assert!(
            row_side < 1e-4 * scale && column_side < 1e-4 * scale,
            "{d_in}×{d_out}: {row_side} {column_side}"
        );
        // Panther's estimate from the same sketches: (W·U1ᵀ·U1 + U2·U2ᵀ·W) / 2T.
        let estimate = (weight.clone().matmul(u1.clone().transpose()).matmul(u1)
            + u2.clone().matmul(u2.transpose()).matmul(weight.clone()))
        .div_scalar(2.0 * terms as f64);
        let (fit_error, unbiased_error) = (norm(residual), norm(weight - estimate));
        if terms * k >= d_out {
            assert!(
                fit_error < 1e-4 * scale,
                "{d_in}×{d_out}, T·k = {}: {fit_error}",
                terms * k
            );
        }
        assert!(fit_error < unbiased_error, "{fit_error} ≥ {unbiased_error}");
    }

    let sketched = LinearKind::Sketched {
        num_terms: 1,
        low_rank: 4,
    };
    let weight_error = |init: SketchInit| {
        F::seed(&device, 3);
        let dense = model::<F>(&device);
        draw_params(&dense);
        let before = dense.blocks[0].mlp.fc1.to_dense_weight();
        let (converted, _) = Converter::new()
            .sketch_init(init)
            .rule(Selection::types(["Mlp"]), sketched)
            .apply(dense)
            .unwrap();
        assert_eq!(converted.blocks[0].mlp.fc1.kind(), sketched);
        norm(converted.blocks[0].mlp.fc1.to_dense_weight() - before)
    };
    let (fitted, unbiased) = (
        weight_error(SketchInit::Fitted),
        weight_error(SketchInit::Unbiased),
    );
    assert!(
        fitted < unbiased,
        "Converter: fitted {fitted} against unbiased {unbiased}"
    );
}

/// The activation-aware conversion: with inputs of every direction alike (`XᵀX = I`) it is the
/// truncated SVD; with inputs that use few directions strongly, its outputs on those inputs
/// are closer to the dense layer's than the SVD's, and no worse than the bound of the best
/// rank-`r` approximation of `X·W`.
#[test]
fn low_rank_on_inputs_fits_the_inputs_not_the_weight() {
    use burn::nn::LinearConfig;
    use burn_compress::LowRankLinear;
    use burn_randnla as linalg;

    let device = Default::default();
    let (d_in, d_out, rank, rows) = (24, 18, 4, 200);
    let linear = LinearConfig::new(d_in, d_out).init::<F>(&device);
    draw_params(&linear);
    let weight = linear.weight.val();
    let rank_error = |layer: &LowRankLinear<F>, x: &Tensor<F, 2>| -> f64 {
        let want = x.clone().matmul(weight.clone());
        let got = x.clone().matmul(layer.a.val().matmul(layer.b.val()));
        (got - want)
            .powi_scalar(2)
            .sum()
            .sqrt()
            .into_scalar()
            .elem()
    };

    // XᵀX = I: the weight's own truncated SVD, so the error is the optimal one.
    let identity = Tensor::<F, 2>::eye(d_in, &device);
    let layer = LowRankLinear::try_from_linear_on_inputs(&linear, rank, identity.clone()).unwrap();
    let sigma = linalg::singular_values(weight.clone()).unwrap();
    let optimal = sigma.iter().skip(rank).map(|s| s * s).sum::<f64>().sqrt();
    let error = rank_error(&layer, &identity);
    assert!(
        (error - optimal).abs() <= 1e-4 * optimal,
        "{error} against {optimal}"
    );
    assert_eq!(
        layer.bias.as_ref().unwrap().val().into_data(),
        linear.bias.as_ref().unwrap().val().into_data()
    );

    // Inputs whose scale falls off by 0.7 per direction.
    let scales: Vec<f32> = (0..d_in).map(|i| 0.7f32.powi(i as i32)).collect();
    let x = Tensor::<F, 2>::random([rows, d_in], Distribution::Normal(0.0, 1.0), &device)
        * Tensor::<F, 1>::from_floats(scales.as_slice(), &device).unsqueeze_dim(0);
    let gram = x.clone().transpose().matmul(x.clone());
    let aware = LowRankLinear::try_from_linear_on_inputs(&linear, rank, gram).unwrap();
    let plain = LowRankLinear::try_from_linear(&linear, rank).unwrap();
    let (aware_error, plain_error) = (rank_error(&aware, &x), rank_error(&plain, &x));
    let best = linalg::singular_values(x.clone().matmul(weight.clone()))
        .unwrap()
        .iter()
        .skip(rank)
        .map(|s| s * s)
        .sum::<f64>()
        .sqrt();
    assert!(
        aware_error < 0.8 * plain_error,
        "aware {aware_error}, plain {plain_error}"
    );
    assert!(
        aware_error <= best * (1.0 + 1e-3) + 1e-5,
        "aware {aware_error}, best {best}"
    );

    // Bad sizes are typed errors.
    let wrong = Tensor::<F, 2>::eye(d_in + 1, &device);
    assert!(matches!(
        LowRankLinear::try_from_linear_on_inputs(&linear, rank, wrong),
        Err(CompressError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        LowRankLinear::try_from_linear_on_inputs(&linear, 0, identity),
        Err(CompressError::InvalidConfig { name: "rank", .. })
    ));
}
