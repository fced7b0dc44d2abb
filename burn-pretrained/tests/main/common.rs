//! The fixture, transformers' expected results, checkpoint rewriting and comparisons shared
//! by the modules.

use std::path::{Path, PathBuf};

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn_pretrained::{Pretrained, load_hf, mean_pool, normalize};
use burn_sketch::SketchBackend;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

/// The fixture's directory: config.json, model.safetensors, tokenizer.json, expected.json.
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-bert")
}

/// `expected.json`: what transformers computes with the fixture.
#[derive(serde::Deserialize)]
pub struct Expected {
    pub max_length: usize,
    pub hidden_size: usize,
    pub odd_texts: Vec<OddText>,
    pub batch: Batch,
    pub pair: Pair,
    /// Each feed-forward weight's singular values (Hugging Face key to values, largest first).
    pub ffn_singular_values: std::collections::BTreeMap<String, Vec<f64>>,
}

#[derive(serde::Deserialize)]
pub struct OddText {
    pub text: String,
    pub ids: Vec<i64>,
}

/// A padded batch: ids `[batch, seq]`, and per text the last hidden state of its real
/// positions (`[length, hidden]`, row-major) and its unit mean-pooled embedding.
#[derive(serde::Deserialize)]
pub struct Batch {
    pub texts: Vec<String>,
    pub ids: Vec<Vec<i64>>,
    pub lengths: Vec<usize>,
    pub last_hidden_state: Vec<Vec<f32>>,
    pub embeddings: Vec<Vec<f32>>,
}

/// A sentence pair (token types 1 on the second sentence) and its last hidden state.
#[derive(serde::Deserialize)]
pub struct Pair {
    pub ids: Vec<i64>,
    pub type_ids: Vec<i64>,
    pub last_hidden_state: Vec<f32>,
}

pub fn expected() -> Expected {
    let text = std::fs::read_to_string(fixture_dir().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The fixture loaded on `B`.
pub fn load<B: Backend>(device: &B::Device) -> Pretrained<B> {
    load_hf::<B>(fixture_dir(), device).unwrap_or_else(|err| panic!("loading the fixture: {err}"))
}

/// Unit mean-pooled embeddings of `texts`, and the last hidden state, as rows of `f32`.
pub fn embed<B: SketchBackend>(
    model: &Pretrained<B>,
    texts: &[&str],
    device: &B::Device,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let batch = model.tokenizer.encode(texts).unwrap();
    let input = batch.to_input::<B>(device);
    let states = model.encoder.forward(&input);
    let embeddings = normalize(mean_pool(states.clone(), input.mask_pad));
    (rows(embeddings), values(states))
}

/// A matrix's rows as `f32`.
pub fn rows<B: Backend>(t: Tensor<B, 2>) -> Vec<Vec<f32>> {
    let [_, width] = t.dims();
    values(t).chunks(width).map(<[f32]>::to_vec).collect()
}

pub fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// A tensor of a checkpoint, owned, to rewrite.
pub struct Entry {
    pub key: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Entry {
    /// An `f32` tensor of `shape`, filled with `value`.
    pub fn f32(key: &str, shape: Vec<usize>, value: f32) -> Self {
        let n: usize = shape.iter().product();
        Self {
            key: key.into(),
            dtype: Dtype::F32,
            shape,
            data: std::iter::repeat_n(value.to_le_bytes(), n)
                .flatten()
                .collect(),
        }
    }
}

/// The fixture's checkpoint as owned entries.
pub fn checkpoint() -> Vec<Entry> {
    let bytes = std::fs::read(fixture_dir().join("model.safetensors")).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(key, view)| Entry {
            key,
            dtype: view.dtype(),
            shape: view.shape().to_vec(),
            data: view.data().to_vec(),
        })
        .collect()
}

/// A model directory in a fresh temporary directory: the fixture's files, with `entries` as
/// the checkpoint and `config` (if given) as config.json.
pub fn model_dir(entries: &[Entry], config: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in ["config.json", "tokenizer.json"] {
        std::fs::copy(fixture_dir().join(name), dir.path().join(name)).unwrap();
    }
    if let Some(config) = config {
        std::fs::write(dir.path().join("config.json"), config).unwrap();
    }
    let views = entries.iter().map(|e| {
        (
            e.key.clone(),
            TensorView::new(e.dtype, e.shape.clone(), &e.data).unwrap(),
        )
    });
    let metadata = [("format".to_string(), "pt".to_string())].into();
    let bytes = safetensors::serialize(views, Some(metadata)).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), bytes).unwrap();
    dir
}

/// The fixture's config.json with `edit` applied.
pub fn config_with(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let text = std::fs::read_to_string(fixture_dir().join("config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut json);
    json.to_string()
}
