//! Distilling the fixture encoder after its feed-forward layers are made low-rank at half
//! their parameters: the loss falls, and the sentence embeddings of texts the training never
//! saw move back toward the dense encoder's.

use std::ops::ControlFlow;

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use burn_compress::{Converter, DistilConfig, LinearKind, Selection, distil};
use burn_pretrained::{BertEncoder, EncoderInput, Tokenizer, load_hf, mean_pool, normalize};

use crate::close::serial;
use crate::common::{cosine, fixture_dir, rows};

type A = Autodiff<Flex>;

/// Words of the fixture's vocabulary, strung into sentences by a fixed generator: unlabeled
/// text, as much as needed.
fn sentences(count: usize, mut state: u64) -> Vec<String> {
    const WORDS: [&str; 32] = [
        "the", "children", "play", "music", "in", "morning", "dog", "water", "is", "most",
        "common", "thing", "on", "earth", "and", "sea", "its", "home", "river", "town", "city",
        "love", "world", "people", "old", "man", "great", "small", "time", "day", "new", "work",
    ];
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = 3 + (state >> 60) as usize % 10;
            (0..len)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    WORDS[(state >> 40) as usize % WORDS.len()]
                })
                .collect::<Vec<_>>()
                .join(" ")
                + "."
        })
        .collect()
}

fn embeddings(
    encoder: &BertEncoder<Flex>,
    tokenizer: &Tokenizer,
    texts: &[String],
) -> Vec<Vec<f32>> {
    let input = tokenizer
        .encode(texts)
        .unwrap()
        .to_input::<Flex>(&Default::default());
    rows(normalize(mean_pool(
        encoder.forward(&input),
        input.mask_pad,
    )))
}

fn mean_cosine(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    a.iter().zip(b).map(|(x, y)| cosine(x, y)).sum::<f64>() / a.len() as f64
}

#[test]
fn distillation_brings_a_half_size_feed_forward_back_toward_the_original() {
    let _serial = serial();
    let device = Default::default();
    let model = load_hf::<A>(fixture_dir(), &device).unwrap();
    let (hidden, inner) = (model.config.hidden_size, model.config.intermediate_size);
    // Half of each feed-forward layer's weights: r·(h + f) ≤ h·f / 2.
    let rank = hidden * inner / (2 * (hidden + inner));
    let encoder = model.encoder.with_dropout(0.0);
    let teacher = encoder.valid();
    let (student, report) = Converter::new()
        .rule(
            Selection::paths(["layers.*.intermediate", "layers.*.output"]),
            LinearKind::LowRank { rank },
        )
        .apply(encoder)
        .unwrap();
    let (dense, converted) = report.trainable();
    assert_eq!(report.layers.len(), 4);
    assert!(converted < dense, "{converted} of {dense}");

    let tokenizer = &model.tokenizer;
    let train: Vec<EncoderInput<A>> = sentences(64, 1)
        .chunks(8)
        .map(|chunk| tokenizer.encode(chunk).unwrap().to_input::<A>(&device))
        .collect();
    let held_out = sentences(24, 2);
    let original = embeddings(&teacher, tokenizer, &held_out);
    let before = mean_cosine(
        &original,
        &embeddings(&student.valid(), tokenizer, &held_out),
    );

    Flex::seed(&device, 3);
    let config = DistilConfig::new()
        .with_learning_rate(3e-3)
        .with_warmup_steps(5)
        .with_max_steps(Some(120));
    let (student, run) = distil(
        &teacher,
        student,
        &config,
        |step| train[step % train.len()].clone(),
        |_, _| ControlFlow::Continue(()),
    )
    .unwrap();
    let after = mean_cosine(
        &original,
        &embeddings(&student.valid(), tokenizer, &held_out),
    );

    assert_eq!(run.steps, 120);
    let (first, last) = run.first_last(10).unwrap();
    assert!(last < 0.5 * first, "loss {first} -> {last}");
    assert!(
        after > before && 1.0 - after < 0.5 * (1.0 - before),
        "held-out embedding cosine {before} -> {after}"
    );
}
