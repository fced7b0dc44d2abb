//! Converting the loaded encoder's layers moves its embeddings in the stated direction: a
//! low-rank feed-forward block's weights are as close as the truncated SVD's at every rank, its
//! embeddings are further from the dense ones the lower its rank, full rank is the dense layer
//! again, and `int8` everywhere stays close.

use burn::backend::Flex;
use burn_compress::{AnyLinear, Converter, LinearKind, Selection};
use burn_pretrained::{BertEncoder, Pretrained, mean_pool, normalize};

use crate::common::{cosine, expected, load, rows};

/// Texts of several lengths (the fixture's batch and odd texts): the comparison's inputs.
fn texts() -> Vec<String> {
    let expected = expected();
    let mut texts = expected.batch.texts;
    texts.extend(
        expected
            .odd_texts
            .into_iter()
            .map(|o| o.text)
            .filter(|t| !t.trim().is_empty()),
    );
    texts
}

fn embeddings(
    model: &Pretrained<Flex>,
    encoder: &BertEncoder<Flex>,
    texts: &[String],
) -> Vec<Vec<f32>> {
    let batch = model.tokenizer.encode(texts).unwrap();
    let input = batch.to_input::<Flex>(&Default::default());
    rows(normalize(mean_pool(
        encoder.forward(&input),
        input.mask_pad,
    )))
}

/// The smallest and the mean cosine between `converted`'s embeddings and `dense`'s.
fn closeness(dense: &[Vec<f32>], converted: &[Vec<f32>]) -> (f64, f64) {
    let cosines: Vec<f64> = dense
        .iter()
        .zip(converted)
        .map(|(a, b)| cosine(a, b))
        .collect();
    let min = cosines.iter().copied().fold(f64::INFINITY, f64::min);
    (min, cosines.iter().sum::<f64>() / cosines.len() as f64)
}

/// `‖W − W'‖²_F` between two layers' dense weights.
fn squared_error(a: &AnyLinear<Flex>, b: &AnyLinear<Flex>) -> f64 {
    let diff: f32 = (a.to_dense_weight() - b.to_dense_weight())
        .powi_scalar(2)
        .sum()
        .into_scalar();
    diff as f64
}

#[test]
fn low_rank_feed_forward_is_closer_at_higher_rank() {
    let device = Default::default();
    let model = load::<Flex>(&device);
    let expected = expected();
    // The randomized SVD's test matrix comes from its own seed: the result is reproducible.
    let texts = texts();
    let dense = embeddings(&model, &model.encoder, &texts);
    let ffn = || Selection::paths(["layers.*.intermediate", "layers.*.output"]);
    // The feed-forward layers are 32 → 64 and 64 → 32: rank 32 is full.
    let full = model.config.hidden_size.min(model.config.intermediate_size);
    let mut previous: Option<(usize, f64)> = None;
    for rank in [1, 2, 4, 8, 16, 24, full] {
        let (encoder, report) = Converter::new()
            .rule(ffn(), LinearKind::LowRank { rank })
            .apply::<Flex, _>(model.encoder.clone())
            .unwrap();
        assert_eq!(
            report.layers.len(),
            2 * model.config.num_hidden_layers,
            "rank {rank}"
        );
        assert!(
            report
                .layers
                .iter()
                .all(|l| l.to == LinearKind::LowRank { rank })
        );

        // Each weight is within 2% of the best rank-r error (Eckart–Young: the energy of the
        // singular values past the r-th, from NumPy's SVD of the same weight).
        for (i, (converted, original)) in
            encoder.layers.iter().zip(&model.encoder.layers).enumerate()
        {
            for (name, a, b) in [
                (
                    "intermediate",
                    &converted.intermediate,
                    &original.intermediate,
                ),
                ("output", &converted.output, &original.output),
            ] {
                let sigma = &expected.ffn_singular_values
                    [&format!("encoder.layer.{i}.{name}.dense.weight")];
                let best: f64 = sigma[rank..].iter().map(|s| s * s).sum();
                let error = squared_error(a, b);
                let total: f64 = sigma.iter().map(|s| s * s).sum();
                assert!(
                    error <= best * 1.02 + 1e-6 * total,
                    "rank {rank}, layer {i} {name}: squared error {error}, the best {best}"
                );
            }
        }

        let (min, mean) = closeness(&dense, &embeddings(&model, &encoder, &texts));
        if rank == full {
            assert!(min > 0.9999, "full rank: cosine {min}");
        } else {
            assert!(
                mean < 0.9999,
                "rank {rank}: cosine {mean}, the conversion changed nothing"
            );
        }
        // A higher rank keeps more of each weight, and from rank 4 its embeddings are as close
        // or closer. Below, more than half of each weight's energy is gone, the embeddings are
        // far off and their order is noise (measured: mean cosine 0.850 at rank 1, 0.838 at 2,
        // 0.817 at 3, then 0.872 at 4, 0.928 at 8, 0.993 at 16, 0.9988 at 24).
        if rank < 4 {
            assert!(mean < 0.9, "rank {rank}: cosine {mean}");
            continue;
        }
        if let Some((lower, lower_mean)) = previous {
            assert!(
                mean >= lower_mean - 1e-6,
                "rank {rank}: cosine {mean} < rank {lower}'s {lower_mean}"
            );
        }
        previous = Some((rank, mean));
    }
}

#[test]
fn int8_everywhere_stays_close() {
    let device = Default::default();
    let model = load::<Flex>(&device);
    let texts = texts();
    let dense = embeddings(&model, &model.encoder, &texts);
    let (encoder, report) = Converter::new()
        .rule(Selection::All, LinearKind::Int8)
        .apply::<Flex, _>(model.encoder.clone())
        .unwrap();
    // Four attention projections and two feed-forward layers per layer.
    assert_eq!(report.layers.len(), 6 * model.config.num_hidden_layers);
    let (before, after) = report.bytes();
    assert!(after * 3 < before, "int8 holds {after} bytes of {before}");
    let (min, mean) = closeness(&dense, &embeddings(&model, &encoder, &texts));
    assert!(min >= 0.99, "int8: smallest cosine {min}");
    assert!(
        mean < 1.0 - 1e-7,
        "int8: cosine {mean}, the conversion changed nothing"
    );
}
