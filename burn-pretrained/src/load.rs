//! Loading a Hugging Face checkpoint into a [`BertEncoder`]: burn-store's
//! `SafetensorsStore` with its PyTorch adapter (linear weights transposed, layer norms'
//! `weight`/`bias` as `gamma`/`beta`) and a key remapping from Hugging Face's module names to
//! the encoder's, after a check of the file's header that names, in Hugging Face's terms,
//! every key that is missing or misshapen. Float tensors become `f32` parameters unless
//! [`ParamDType::Stored`] asks for the checkpoint's own type.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use burn::tensor::DType;
use burn::tensor::backend::Backend;
use burn_store::{
    KeyRemapper, ModuleAdapter, ModuleSnapshot, PyTorchToBurnAdapter, SafetensorsStore,
    TensorSnapshot,
};

use crate::{BertConfig, BertEncoder, Misshapen, Pooling, PretrainedError, Tokenizer};

/// Hugging Face's module names to the encoder's, in order. Variants of `AnyLinear` are
/// matched with burn-store's `skip_enum_variants`.
const KEY_MAP: [(&str, &str); 10] = [
    // BertFor… checkpoints nest the encoder under `bert.`.
    (r"^bert\.", ""),
    // Old checkpoints name the norms' parameters as TensorFlow did.
    (r"LayerNorm\.gamma$", "LayerNorm.weight"),
    (r"LayerNorm\.beta$", "LayerNorm.bias"),
    (r"^embeddings\.LayerNorm\.", "embeddings.layer_norm."),
    (
        r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.",
        "layers.$1.attention.$2.",
    ),
    (
        r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.",
        "layers.$1.attention.output.",
    ),
    (
        r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.",
        "layers.$1.attention_norm.",
    ),
    (
        r"^encoder\.layer\.(\d+)\.intermediate\.dense\.",
        "layers.$1.intermediate.",
    ),
    (
        r"^encoder\.layer\.(\d+)\.output\.dense\.",
        "layers.$1.output.",
    ),
    (
        r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.",
        "layers.$1.output_norm.",
    ),
];

/// The files of a Hugging Face model directory.
#[derive(Clone, Debug)]
pub struct HfFiles {
    /// `config.json`.
    pub config: PathBuf,
    /// `model.safetensors`.
    pub weights: PathBuf,
    /// `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// The longest input the model was trained for: `sentence_bert_config.json`'s
    /// `max_seq_length` if present, else `tokenizer.json`'s truncation, else `None` (the
    /// model's positions).
    pub max_length: Option<usize>,
}

impl HfFiles {
    /// The files of `dir`; an error names the first that is missing.
    pub fn in_dir(dir: impl AsRef<Path>) -> Result<Self, PretrainedError> {
        let dir = dir.as_ref();
        let file = |name: &str| {
            let path = dir.join(name);
            match path.is_file() {
                true => Ok(path),
                false => Err(PretrainedError::Io {
                    path,
                    source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
                }),
            }
        };
        let (config, weights, tokenizer) = (
            file("config.json")?,
            file("model.safetensors")?,
            file("tokenizer.json")?,
        );
        let max_length = read_json(&dir.join("sentence_bert_config.json"))
            .and_then(|v| v["max_seq_length"].as_u64())
            .or_else(|| read_json(&tokenizer).and_then(|v| v["truncation"]["max_length"].as_u64()))
            .map(|n| n as usize);
        Ok(Self {
            config,
            weights,
            tokenizer,
            max_length,
        })
    }
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// A Hugging Face encoder directory loaded: the encoder, its configuration and tokenizer.
#[derive(Debug)]
pub struct Pretrained<B: Backend> {
    /// The encoder, dense, with the checkpoint's weights.
    pub encoder: BertEncoder<B>,
    /// Its shapes.
    pub config: BertConfig,
    /// Its tokenizer, cut at the model's trained length (at most its positions).
    pub tokenizer: Tokenizer,
    /// How its sentence-transformers files pool token states into an embedding.
    pub pooling: Pooling,
}

/// The type a checkpoint's float tensors take as the encoder's parameters.
///
/// Many hub checkpoints are stored in `f16`; kept so, FastFlex would compute the whole encoder
/// in `f16` (far from what transformers gives, which loads into `f32` unless asked).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ParamDType {
    /// `f32`, whatever the checkpoint stores: an `f16` or `bf16` checkpoint computes as its
    /// values widened.
    #[default]
    F32,
    /// The checkpoint's own type (half precision stays half precision).
    Stored,
}

/// burn-store adapter: every float tensor of another type read as the given one (`None`:
/// as stored).
#[derive(Clone)]
struct CastFloats(Option<DType>);

impl ModuleAdapter for CastFloats {
    fn adapt(&self, snapshot: &TensorSnapshot) -> TensorSnapshot {
        let Some(dtype) = self.0 else {
            return snapshot.clone();
        };
        let float = matches!(
            snapshot.dtype,
            DType::F64 | DType::F32 | DType::F16 | DType::BF16
        );
        if !float || snapshot.dtype == dtype {
            return snapshot.clone();
        }
        let data = snapshot.clone_data_fn();
        TensorSnapshot::from_closure(
            Rc::new(move || Ok(data()?.convert_dtype(dtype))),
            dtype,
            snapshot.shape.clone(),
            snapshot.path_stack.clone().unwrap_or_default(),
            snapshot.container_stack.clone().unwrap_or_default(),
            snapshot.tensor_id.unwrap_or_default(),
        )
    }

    fn clone_box(&self) -> Box<dyn ModuleAdapter> {
        Box::new(self.clone())
    }
}

/// Loads a Hugging Face BERT-family model directory (`config.json`, `model.safetensors`,
/// `tokenizer.json`) onto `device`, with `f32` parameters ([`load_hf_with`] to keep the
/// checkpoint's type).
///
/// ```no_run
/// use burn::backend::Flex;
/// let model = burn_pretrained::load_hf::<Flex>("all-MiniLM-L6-v2", &Default::default())?;
/// let batch = model.tokenizer.encode(&["A sentence.", "Another, longer sentence."])?;
/// let states = model.encoder.forward(&batch.to_input(&Default::default()));
/// assert_eq!(states.dims(), [2, batch.seq, 384]);
/// # Ok::<(), burn_pretrained::PretrainedError>(())
/// ```
pub fn load_hf<B: Backend>(
    dir: impl AsRef<Path>,
    device: &B::Device,
) -> Result<Pretrained<B>, PretrainedError> {
    load_hf_with(dir, device, ParamDType::F32)
}

/// [`load_hf`] with the parameters' type chosen.
pub fn load_hf_with<B: Backend>(
    dir: impl AsRef<Path>,
    device: &B::Device,
    dtype: ParamDType,
) -> Result<Pretrained<B>, PretrainedError> {
    let dir = dir.as_ref();
    let files = HfFiles::in_dir(dir)?;
    let pooling = Pooling::from_dir(dir)?;
    let config = BertConfig::from_hf_file(&files.config)?;
    let mut encoder = config.try_init::<B>(device)?;
    load_weights_with(&mut encoder, &config, &files.weights, dtype)?;
    let max_length = files
        .max_length
        .unwrap_or(config.max_position_embeddings)
        .min(config.max_position_embeddings);
    let tokenizer = Tokenizer::from_file(&files.tokenizer, max_length)?;
    if tokenizer.vocab_size() > config.vocab_size {
        return Err(PretrainedError::Tokenizer(format!(
            "{}: {} tokens, but the model embeds {}",
            files.tokenizer.display(),
            tokenizer.vocab_size(),
            config.vocab_size
        )));
    }
    Ok(Pretrained {
        encoder,
        config,
        tokenizer,
        pooling,
    })
}

/// Fills a dense `encoder` built from `config` with the weights of a Hugging Face safetensors
/// checkpoint. Errors: [`PretrainedError::Checkpoint`] naming every missing, misshapen or
/// non-float key before anything is read; [`PretrainedError::Store`] if burn-store fails after.
/// The parameters are `f32` ([`load_weights_with`] to keep the checkpoint's type).
pub fn load_weights<B: Backend>(
    encoder: &mut BertEncoder<B>,
    config: &BertConfig,
    path: impl AsRef<Path>,
) -> Result<(), PretrainedError> {
    load_weights_with(encoder, config, path, ParamDType::F32)
}

/// [`load_weights`] with the parameters' type chosen.
pub fn load_weights_with<B: Backend>(
    encoder: &mut BertEncoder<B>,
    config: &BertConfig,
    path: impl AsRef<Path>,
    dtype: ParamDType,
) -> Result<(), PretrainedError> {
    let path = path.as_ref();
    check_header(config, path)?;
    let store_err = |reason: String| PretrainedError::Store {
        path: path.into(),
        reason,
    };
    let rules: Vec<(String, String)> = KEY_MAP
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let remapper = KeyRemapper::from_patterns(rules).map_err(|err| store_err(err.to_string()))?;
    let target = match dtype {
        ParamDType::F32 => Some(DType::F32),
        ParamDType::Stored => None,
    };
    let adapter = PyTorchToBurnAdapter.chain(CastFloats(target));
    let mut store = SafetensorsStore::from_file(path)
        .with_from_adapter(adapter)
        .remap(remapper)
        .skip_enum_variants(true);
    let result = encoder
        .load_from(&mut store)
        .map_err(|err| store_err(err.to_string()))?;
    if !result.errors.is_empty() || !result.missing.is_empty() {
        return Err(store_err(format!("{result:?}")));
    }
    tracing::debug!(applied = result.applied.len(), unused = ?result.unused, "checkpoint loaded");
    Ok(())
}

/// Compares the checkpoint's header with the tensors `config` implies.
fn check_header(config: &BertConfig, path: &Path) -> Result<(), PretrainedError> {
    let header = read_header(path)?;
    let mut found: HashMap<String, (String, Vec<usize>)> = HashMap::new();
    for (key, info) in header.as_object().into_iter().flatten() {
        if key == "__metadata__" {
            continue;
        }
        let dtype = info["dtype"].as_str().unwrap_or("?").to_string();
        let shape = info["shape"]
            .as_array()
            .map(|dims| {
                dims.iter()
                    .filter_map(|d| d.as_u64().map(|d| d as usize))
                    .collect()
            })
            .unwrap_or_default();
        found.insert(hf_name(key), (dtype, shape));
    }
    let (mut missing, mut misshapen, mut not_float) = (Vec::new(), Vec::new(), Vec::new());
    for (key, expected) in config.hf_tensors() {
        match found.get(&key) {
            None => missing.push(key),
            Some((_, shape)) if *shape != expected => misshapen.push(Misshapen {
                key,
                expected,
                found: shape.clone(),
            }),
            Some((dtype, _)) if !matches!(dtype.as_str(), "F32" | "F16" | "BF16" | "F64") => {
                not_float.push(format!("{key} ({dtype})"))
            }
            Some(_) => {}
        }
    }
    if missing.is_empty() && misshapen.is_empty() && not_float.is_empty() {
        return Ok(());
    }
    Err(PretrainedError::Checkpoint {
        path: path.into(),
        missing,
        misshapen,
        not_float,
    })
}

/// A checkpoint key without the `bert.` prefix and with TensorFlow's norm names as PyTorch's.
fn hf_name(key: &str) -> String {
    let key = key.strip_prefix("bert.").unwrap_or(key);
    if let Some(stem) = key.strip_suffix("LayerNorm.gamma") {
        return format!("{stem}LayerNorm.weight");
    }
    if let Some(stem) = key.strip_suffix("LayerNorm.beta") {
        return format!("{stem}LayerNorm.bias");
    }
    key.to_string()
}

/// The JSON header of a safetensors file: an 8-byte little-endian length, then the JSON.
fn read_header(path: &Path) -> Result<serde_json::Value, PretrainedError> {
    let io = |source| PretrainedError::Io {
        path: path.into(),
        source,
    };
    let bad = |reason: String| PretrainedError::Store {
        path: path.into(),
        reason,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(io)?;
    let len = u64::from_le_bytes(len);
    let size = file.metadata().map_err(io)?.len();
    if len > size.saturating_sub(8) || len > 100 << 20 {
        return Err(bad(format!("not a safetensors file (header length {len})")));
    }
    let mut json = vec![0u8; len as usize];
    file.read_exact(&mut json).map_err(io)?;
    serde_json::from_slice(&json).map_err(|err| bad(format!("not a safetensors header: {err}")))
}
