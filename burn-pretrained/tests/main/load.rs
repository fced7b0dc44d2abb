//! `load_hf` on the fixture gives transformers' last hidden state and sentence embeddings, on
//! Flex and NdArray: every key lands on its parameter, every linear weight is transposed,
//! every norm keeps its scale and shift. Checkpoints of `BertFor…` models (`bert.` prefix) and
//! TensorFlow's norm names load to the same encoder.

use burn::backend::{Flex, NdArray};
use burn::tensor::{Int, Tensor, TensorData};
use burn_pretrained::{EncoderInput, SentenceEncoder, load_hf};
use burn_sketch::SketchBackend;

use crate::common::{checkpoint, cosine, embed, expected, load, max_abs, model_dir, rows, values};

/// The largest difference to transformers' `f32` results the tests accept: the same sums in
/// another order (measured: at most 1.5e-6 on Flex and NdArray).
const TOLERANCE: f32 = 1e-5;

fn matches_transformers<B: SketchBackend>(device: &B::Device) {
    let model = load::<B>(device);
    let expected = expected();
    assert_eq!(model.config.hidden_size, expected.hidden_size);
    assert_eq!(model.config.num_hidden_layers, 2);
    assert_eq!(model.tokenizer.max_length(), expected.max_length);

    let texts: Vec<&str> = expected.batch.texts.iter().map(String::as_str).collect();
    let batch = model.tokenizer.encode(&texts).unwrap();
    assert_eq!(batch.lengths, expected.batch.lengths);
    assert_eq!(
        batch.ids,
        expected.batch.ids.concat(),
        "the padded batch's ids"
    );

    let (embeddings, states) = embed(&model, &texts, device);
    let (seq, hidden) = (batch.seq, expected.hidden_size);
    for (i, (&length, want)) in expected
        .batch
        .lengths
        .iter()
        .zip(&expected.batch.last_hidden_state)
        .enumerate()
    {
        let got = &states[i * seq * hidden..(i * seq + length) * hidden];
        let gap = max_abs(got, want);
        assert!(
            gap <= TOLERANCE,
            "text {i}: last hidden state differs by {gap}"
        );
    }
    for (i, (got, want)) in embeddings
        .iter()
        .zip(&expected.batch.embeddings)
        .enumerate()
    {
        let gap = max_abs(got, want);
        let cos = cosine(got, want);
        assert!(
            gap <= TOLERANCE && cos >= 0.99999,
            "text {i}: embedding differs by {gap}, cosine {cos}"
        );
    }

    // `SentenceEncoder` gives the same embeddings, in one batch or in sorted batches of two.
    let encoder = SentenceEncoder::from_pretrained(model, device.clone());
    let direct = rows(encoder.embed(&texts).unwrap());
    let mut done = Vec::new();
    let batched = encoder.embed_all(&texts, 2, |n| done.push(n)).unwrap();
    assert_eq!(done, [2, 3]);
    for i in 0..texts.len() {
        assert!(max_abs(&direct[i], &expected.batch.embeddings[i]) <= TOLERANCE);
        assert!(
            max_abs(&batched[i], &expected.batch.embeddings[i]) <= TOLERANCE,
            "embed_all, text {i}"
        );
    }
}

/// A sentence pair: the second sentence's token types are 1, so the type embeddings count.
fn pair_matches_transformers<B: SketchBackend>(device: &B::Device) {
    let model = load::<B>(device);
    let pair = expected().pair;
    assert!(pair.type_ids.contains(&1));
    let n = pair.ids.len();
    let int =
        |v: &[i64]| Tensor::<B, 2, Int>::from_data(TensorData::new(v.to_vec(), [1, n]), device);
    let input = EncoderInput {
        ids: int(&pair.ids),
        type_ids: Some(int(&pair.type_ids)),
        mask_pad: None,
    };
    let states = values(model.encoder.forward(&input));
    let gap = max_abs(&states, &pair.last_hidden_state);
    assert!(gap <= TOLERANCE, "pair: last hidden state differs by {gap}");

    // The same ids with type 0 everywhere give other states: the type embeddings were loaded.
    let untyped = EncoderInput {
        type_ids: None,
        ..input
    };
    let other = values(model.encoder.forward(&untyped));
    assert!(max_abs(&other, &pair.last_hidden_state) > 1e-3);
}

#[test]
fn flex_matches_transformers() {
    matches_transformers::<Flex>(&Default::default());
    pair_matches_transformers::<Flex>(&Default::default());
}

#[test]
fn ndarray_matches_transformers() {
    matches_transformers::<NdArray>(&Default::default());
    pair_matches_transformers::<NdArray>(&Default::default());
}

/// `BertForMaskedLM`-style keys (`bert.` prefix, a head outside the encoder) and TensorFlow's
/// `LayerNorm.gamma`/`beta` load to exactly the encoder the plain checkpoint gives.
#[test]
fn prefixed_and_tensorflow_names_load() {
    let device = Default::default();
    let mut entries = checkpoint();
    let mut renamed = 0;
    for entry in &mut entries {
        let key = entry
            .key
            .replace("LayerNorm.weight", "LayerNorm.gamma")
            .replace("LayerNorm.bias", "LayerNorm.beta");
        renamed += usize::from(key != entry.key);
        entry.key = format!("bert.{key}");
    }
    // 2 per norm: the embeddings' and two per layer.
    assert_eq!(renamed, 2 * (1 + 2 * 2));
    // A task head beside the encoder, as `BertForMaskedLM` has: not the encoder's, ignored.
    entries.push(crate::common::Entry::f32(
        "cls.predictions.bias",
        vec![7],
        0.5,
    ));
    let dir = model_dir(&entries, None);
    let renamed = load_hf::<Flex>(dir.path(), &device).unwrap_or_else(|err| panic!("{err}"));
    let plain = load::<Flex>(&device);

    let expected = expected();
    let texts: Vec<&str> = expected.batch.texts.iter().map(String::as_str).collect();
    let (got, got_states) = embed(&renamed, &texts, &device);
    let (want, want_states) = embed(&plain, &texts, &device);
    assert_eq!(got_states, want_states, "the renamed checkpoint's states");
    assert_eq!(got, want);
    for (got, want) in got.iter().zip(&expected.batch.embeddings) {
        assert!(max_abs(got, want) <= TOLERANCE);
    }
}

/// Every float parameter's type.
fn param_dtypes<B: burn::tensor::backend::Backend>(
    encoder: &burn_pretrained::BertEncoder<B>,
) -> Vec<burn::tensor::DType> {
    struct Types(Vec<burn::tensor::DType>);
    impl<B: burn::tensor::backend::Backend> burn::module::ModuleVisitor<B> for Types {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
            self.0.push(param.val().dtype());
        }
    }
    let mut types = Types(Vec::new());
    burn::module::Module::visit(encoder, &mut types);
    types.0
}

/// The fixture's checkpoint with every `f32` tensor rounded to `f16`: stored as `F16`
/// (`stored_f16`), or widened back and stored as `F32`.
fn rounded_to_f16(stored_f16: bool) -> Vec<crate::common::Entry> {
    let mut entries = checkpoint();
    for entry in &mut entries {
        if entry.dtype != safetensors::Dtype::F32 {
            continue;
        }
        let halves = entry
            .data
            .chunks(4)
            .map(|b| half::f16::from_f32(f32::from_le_bytes(b.try_into().unwrap())));
        entry.data = if stored_f16 {
            halves.flat_map(|h| h.to_le_bytes()).collect()
        } else {
            halves.flat_map(|h| h.to_f32().to_le_bytes()).collect()
        };
        if stored_f16 {
            entry.dtype = safetensors::Dtype::F16;
        }
    }
    entries
}

/// An `f16` checkpoint (as many hub models are stored) loads into `f32` parameters and
/// computes exactly what its values widened to `f32` compute; `ParamDType::Stored` keeps `f16`.
#[test]
fn f16_checkpoint_loads_as_f32() {
    let device = Default::default();
    let f16_dir = model_dir(&rounded_to_f16(true), None);
    let widened_dir = model_dir(&rounded_to_f16(false), None);
    let model = load_hf::<Flex>(f16_dir.path(), &device).unwrap_or_else(|err| panic!("{err}"));
    let types = param_dtypes(&model.encoder);
    assert!(!types.is_empty());
    assert!(
        types.iter().all(|&t| t == burn::tensor::DType::F32),
        "{types:?}"
    );
    let widened = load_hf::<Flex>(widened_dir.path(), &device).unwrap();
    let expected = expected();
    let texts: Vec<&str> = expected.batch.texts.iter().map(String::as_str).collect();
    let (got, got_states) = embed(&model, &texts, &device);
    let (want, want_states) = embed(&widened, &texts, &device);
    assert_eq!(got_states, want_states, "the f16 checkpoint's states");
    assert_eq!(got, want);
    // Rounding the weights to f16 moves the embeddings a little, not a lot.
    for (got, want) in got.iter().zip(&expected.batch.embeddings) {
        assert!(cosine(got, want) > 0.999, "cosine {}", cosine(got, want));
    }

    let stored = burn_pretrained::load_hf_with::<Flex>(
        f16_dir.path(),
        &device,
        burn_pretrained::ParamDType::Stored,
    )
    .unwrap();
    let types = param_dtypes(&stored.encoder);
    assert!(
        types.iter().all(|&t| t == burn::tensor::DType::F16),
        "{types:?}"
    );
}
