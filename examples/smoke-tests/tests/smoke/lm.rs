//! The language-model study's model: segment checkpointing with dropout gives a plain
//! backward's gradients with the same masks, sketched and low-rank arms train, the corpus
//! splits deterministically, and `--profile`'s steps are recorded with their scopes.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_compress::{AttentionKind, FeatureMap, LinearKind};
use burn_memory::Segments;
use burn_profiler::{Profiled, Profiler, ProfilerConfig, StepProfiler};
use burn_sketch::SketchBackend;
use examples::lm::profile::{ProfiledTraining, train_profiled};
use examples::lm::{Corpus, Positions, TransformerLmConfig, batch, max_rel_diff};

const TEXT: &str = "The quick brown fox jumps over the lazy dog. \
    Pack my box with five dozen liquor jugs. \
    How vexingly quick daft zebras jump! \
    Sphinx of black quartz, judge my vow.";

fn documents() -> Vec<String> {
    (0..40).map(|i| format!("{i}: {TEXT}\n")).collect()
}

fn small(attention: AttentionKind, kind: LinearKind) -> TransformerLmConfig {
    TransformerLmConfig::new()
        .with_context(16)
        .with_d_model(32)
        .with_n_heads(2)
        .with_n_blocks(4)
        .with_d_ff(64)
        .with_dropout(0.2)
        .with_attention(attention)
        .with_projections(kind)
        .with_mlp(kind)
}

/// `tolerance`: the largest relative gradient difference accepted. Flex computes the same
/// products in the same order in both passes (0 measured); NdArray's threads may add partial
/// sums in another order from run to run, and its plain backward against itself differed by up
/// to 6.5e-5 here (0 in most runs).
fn segmented_matches_replayed<B: AutodiffBackend + SketchBackend>(
    device: &B::Device,
    tolerance: f64,
) {
    let corpus = Corpus::split(&documents(), 10, 64).unwrap();
    let starts = Positions::new(3).starts(4, corpus.train.len(), 16);
    let data = batch::<B>(&corpus.train, &starts, 16, device);
    let sketched = LinearKind::Sketched {
        num_terms: 1,
        low_rank: 4,
    };
    for kind in [LinearKind::Dense, sketched] {
        B::seed(device, 11);
        let model = small(AttentionKind::Softmax, kind).init::<B>(device);
        for segments in [Segments::Count(2), Segments::Count(4)] {
            B::seed(device, 5);
            let checked = model.segmented_grads(&data, &segments).unwrap();
            B::seed(device, 5);
            let replayed = model.replayed_grads(&data, &segments).unwrap();
            let diff = max_rel_diff(&model, &replayed, &checked);
            assert!(
                diff <= tolerance,
                "{kind} {segments:?}: gradients differ by {diff:e}"
            );
            // Other masks give other gradients: the comparison above is not vacuous.
            B::seed(device, 6);
            let other = model.replayed_grads(&data, &segments).unwrap();
            let moved = max_rel_diff(&model, &replayed, &other);
            assert!(
                moved > 1e-3,
                "{kind}: dropout masks changed nothing ({moved:e})"
            );
        }
    }
}

#[test]
fn lm_segmented_gradients_match_a_plain_backward_with_the_same_masks_flex() {
    let _serial = crate::serial();
    segmented_matches_replayed::<Autodiff<Flex>>(&Default::default(), 1e-5);
}

#[test]
fn lm_segmented_gradients_match_a_plain_backward_with_the_same_masks_ndarray() {
    let _serial = crate::serial();
    segmented_matches_replayed::<Autodiff<NdArray>>(&Default::default(), 5e-4);
}

#[test]
fn every_arm_trains() {
    let _serial = crate::serial();
    type B = Autodiff<Flex>;
    let device = Default::default();
    let corpus = Corpus::split(&documents(), 10, 64).unwrap();
    let valid_starts = Positions::new(1).starts(8, corpus.valid.len(), 16);
    let valid =
        batch::<<B as AutodiffBackend>::InnerBackend>(&corpus.valid, &valid_starts, 16, &device);
    let arms = [
        (AttentionKind::Softmax, LinearKind::Dense),
        (
            AttentionKind::Softmax,
            LinearKind::Sketched {
                num_terms: 1,
                low_rank: 4,
            },
        ),
        (AttentionKind::Softmax, LinearKind::LowRank { rank: 4 }),
        (
            AttentionKind::Performer {
                num_features: 16,
                feature_map: FeatureMap::Softmax,
            },
            LinearKind::Dense,
        ),
    ];
    for (attention, kind) in arms {
        B::seed(&device, 2);
        let mut model = small(attention, kind).with_dropout(0.0).init::<B>(&device);
        let before = model
            .valid()
            .forward_loss(&valid)
            .into_scalar()
            .elem::<f64>();
        let mut optim = AdamConfig::new().init();
        let mut positions = Positions::new(4);
        for _ in 0..40 {
            let starts = positions.starts(8, corpus.train.len(), 16);
            let data = batch::<B>(&corpus.train, &starts, 16, &device);
            let grads = GradientsParams::from_grads(model.forward_loss(&data).backward(), &model);
            model = optim.step(3e-3, model, grads);
        }
        let after = model
            .valid()
            .forward_loss(&valid)
            .into_scalar()
            .elem::<f64>();
        assert!(
            after < 0.8 * before,
            "{attention:?} {kind}: validation loss {before:.3} -> {after:.3}"
        );
    }
}

#[test]
fn the_corpus_splits_whole_documents_deterministically() {
    let docs = documents();
    let a = Corpus::split(&docs, 10, 64).unwrap();
    let b = Corpus::split(&docs, 10, 64).unwrap();
    assert_eq!(a.train, b.train);
    assert_eq!(a.valid, b.valid);
    let chars: usize = docs.iter().map(|d| d.chars().count()).sum();
    assert_eq!(a.train.len() + a.valid.len(), chars);
    let valid: usize = [9, 19, 29, 39]
        .iter()
        .map(|&i| docs[i].chars().count())
        .sum();
    assert_eq!(a.valid.len(), valid);
    let err = Corpus::split(&docs[..2], 10, 64).unwrap_err();
    assert!(err.to_string().contains("characters"), "{err}");
    let missing = Corpus::read_fortunes(std::path::Path::new("/nonexistent/fortunes")).unwrap_err();
    assert!(
        missing.to_string().contains("apt-get install fortunes"),
        "{missing}"
    );
    // Reading a text file: documents are separated by blank lines.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("text.txt");
    std::fs::write(&path, "one\ntwo\n\nthree\n\n\nfour").unwrap();
    assert_eq!(Corpus::read_text(&path).unwrap().len(), 3);
}

/// The backend generic: the batch helper puts windows and their shifted targets together.
#[test]
fn batches_shift_targets_by_one() {
    type B = Flex;
    let stream: Vec<u32> = (0..50).collect();
    let data = batch::<B>(&stream, &[3, 10], 4, &Default::default());
    let inputs = data
        .inputs
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .unwrap();
    let targets = data
        .targets
        .into_data()
        .convert::<i64>()
        .to_vec::<i64>()
        .unwrap();
    assert_eq!(inputs, [3, 4, 5, 6, 10, 11, 12, 13]);
    assert_eq!(targets, [4, 5, 6, 7, 11, 12, 13, 14]);
}

/// `language_model --profile`'s loop: of 4 steps, the profiler skips 1 and records 2 (a third
/// would be the last step), each with its forward, backward and optimizer scopes, and the
/// model's parts named inside the forward pass; the profile's files are written.
#[test]
fn lm_profile_records_the_window_with_its_scopes() {
    let _serial = crate::serial();
    type B = Autodiff<Profiled<Flex>>;
    let device = Default::default();
    let corpus = Corpus::split(&documents(), 10, 64).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sketched");
    let profiler = StepProfiler::new(&out, 1, 2, || {
        Profiler::start_with_memory::<Flex>(
            ProfilerConfig::new().with_record_shapes(true),
            &Default::default(),
        )
    })
    .unwrap();
    B::seed(&device, 2);
    let sketched = LinearKind::Sketched {
        num_terms: 1,
        low_rank: 4,
    };
    let model = small(AttentionKind::Softmax, sketched)
        .with_n_blocks(2)
        .init::<B>(&device);
    let training = ProfiledTraining {
        batch: 4,
        context: 16,
        lr: 3e-3,
        seed: 1,
        steps: 4,
    };
    let written = train_profiled(model, &corpus, &device, training, &profiler).unwrap();
    assert_eq!(written, out);
    for file in [
        "operations.txt",
        "operations.json",
        "trace.json",
        "viewer.html",
    ] {
        assert!(out.join(file).is_file(), "no {file}");
    }
    let table: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("operations.json")).unwrap())
            .unwrap();
    let calls = |name: &str| {
        table["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["name"] == name)
            .map_or(0, |row| row["calls"].as_u64().unwrap())
    };
    for scope in ["forward", "backward", "optimizer", "embedding", "head"] {
        assert_eq!(calls(scope), 2, "{scope}");
    }
    assert_eq!((calls("block 1"), calls("block 2")), (2, 2));
    assert_eq!(calls("block 3"), 0);
    // Each block's four attention projections and two MLP layers are sketched: one
    // operation each per forward, and one backward each.
    assert_eq!(calls("sketched_linear"), 2 * 2 * 6);
    assert_eq!(calls("sketched_linear_backward"), 2 * 2 * 6);
}
