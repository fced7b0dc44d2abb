//! Sentence embeddings from token states, as sentence-transformers computes them: a pooling
//! (the mean over real tokens, the first token, or the maximum), then unit length where the
//! model's pipeline says so ([`Pooling`]).

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

/// The mean of each sequence's states over its real tokens.
///
/// # Shapes
/// - hidden: `[batch, seq, hidden]`
/// - mask_pad: `[batch, seq]`, `true` at padding (`None`: every token is real)
/// - output: `[batch, hidden]`
pub fn mean_pool<B: Backend>(
    hidden: Tensor<B, 3>,
    mask_pad: Option<Tensor<B, 2, Bool>>,
) -> Tensor<B, 2> {
    let [batch, seq, width] = hidden.dims();
    match mask_pad {
        None => hidden.mean_dim(1).reshape([batch, width]),
        Some(pad) => {
            let real = pad.bool_not().float().reshape([batch, seq, 1]);
            // sentence-transformers clamps the count at 1e-9, so an all-padding row gives 0.
            let count = real.clone().sum_dim(1).clamp_min(1e-9);
            (hidden * real)
                .sum_dim(1)
                .div(count)
                .reshape([batch, width])
        }
    }
}

/// Each row divided by its Euclidean norm (at least 10⁻¹², as PyTorch's `normalize`).
///
/// # Shapes
/// - x, output: `[batch, hidden]`
pub fn normalize<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let norm = x.clone().powi_scalar(2).sum_dim(1).sqrt().clamp_min(1e-12);
    x.div(norm)
}

/// How token states become one embedding: sentence-transformers' `Pooling` module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolingMode {
    /// The mean over real tokens ([`mean_pool`]).
    Mean,
    /// The first token's state (`[CLS]`).
    Cls,
    /// The largest value over real tokens, per feature.
    Max,
}

impl PoolingMode {
    /// The lower-case name (`mean`, `cls`, `max`), as TEI's `/info` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mean => "mean",
            Self::Cls => "cls",
            Self::Max => "max",
        }
    }
}

/// A sentence-transformers directory's way to an embedding: its pooling, then unit length if
/// its pipeline ends in `Normalize`. Read with [`Pooling::from_dir`]; a directory without
/// those files pools as sentence-transformers does for a plain model (mean, unnormalized).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Pooling {
    /// The pooling.
    pub mode: PoolingMode,
    /// Whether the embedding is scaled to unit length.
    pub normalize: bool,
}

impl Default for Pooling {
    /// Mean, unnormalized: sentence-transformers' choice for a directory it knows nothing of.
    fn default() -> Self {
        Self {
            mode: PoolingMode::Mean,
            normalize: false,
        }
    }
}

impl Pooling {
    /// Mean then unit length: all-MiniLM-L6-v2's pipeline.
    pub const MEAN_NORMALIZED: Self = Self {
        mode: PoolingMode::Mean,
        normalize: true,
    };

    /// The pooling `dir`'s `modules.json` names (its `Pooling` module's `config.json`, as
    /// `1_Pooling/config.json`) and whether a `Normalize` module follows. Without
    /// `modules.json`, the [`default`](Self::default). A pooling this crate does not compute
    /// (weighted mean, last token, several at once) is an error naming it.
    pub fn from_dir(dir: impl AsRef<std::path::Path>) -> Result<Self, crate::PretrainedError> {
        let dir = dir.as_ref();
        let read = |path: std::path::PathBuf| -> Result<serde_json::Value, crate::PretrainedError> {
            let text =
                std::fs::read_to_string(&path).map_err(|source| crate::PretrainedError::Io {
                    path: path.clone(),
                    source,
                })?;
            serde_json::from_str(&text).map_err(|err| crate::PretrainedError::Config {
                path: path.clone(),
                reason: err.to_string(),
            })
        };
        let modules_path = dir.join("modules.json");
        if !modules_path.is_file() {
            return Ok(Self::default());
        }
        let modules = read(modules_path)?;
        let modules = modules.as_array().cloned().unwrap_or_default();
        let kind = |module: &serde_json::Value| module["type"].as_str().unwrap_or("").to_string();
        let normalize = modules.iter().any(|m| kind(m).ends_with(".Normalize"));
        let Some(pooling) = modules.iter().find(|m| kind(m).ends_with(".Pooling")) else {
            return Ok(Self {
                mode: PoolingMode::Mean,
                normalize,
            });
        };
        let config = read(
            dir.join(pooling["path"].as_str().unwrap_or("1_Pooling"))
                .join("config.json"),
        )?;
        let on = |key: &str| config[key].as_bool().unwrap_or(false);
        let modes: Vec<PoolingMode> = [
            ("pooling_mode_mean_tokens", PoolingMode::Mean),
            ("pooling_mode_cls_token", PoolingMode::Cls),
            ("pooling_mode_max_tokens", PoolingMode::Max),
        ]
        .into_iter()
        .filter(|(key, _)| on(key))
        .map(|(_, mode)| mode)
        .collect();
        let unsupported = [
            "pooling_mode_mean_sqrt_len_tokens",
            "pooling_mode_weightedmean_tokens",
            "pooling_mode_lasttoken",
        ]
        .into_iter()
        .find(|key| on(key));
        match (modes.as_slice(), unsupported) {
            ([mode], None) => Ok(Self {
                mode: *mode,
                normalize,
            }),
            (_, Some(key)) => Err(crate::PretrainedError::Config {
                path: dir.join("modules.json"),
                reason: format!("its pooling uses {key}; mean, cls and max are computed here"),
            }),
            (modes, None) => Err(crate::PretrainedError::Config {
                path: dir.join("modules.json"),
                reason: format!(
                    "{} pooling modes are on; one of mean, cls and max is computed here",
                    modes.len()
                ),
            }),
        }
    }

    /// The embeddings of `hidden`'s sequences.
    ///
    /// # Shapes
    /// - hidden: `[batch, seq, hidden]`
    /// - mask_pad: `[batch, seq]`, `true` at padding (`None`: every token is real)
    /// - output: `[batch, hidden]`
    pub fn apply<B: Backend>(
        &self,
        hidden: Tensor<B, 3>,
        mask_pad: Option<Tensor<B, 2, Bool>>,
    ) -> Tensor<B, 2> {
        let [batch, seq, width] = hidden.dims();
        let pooled = match self.mode {
            PoolingMode::Mean => mean_pool(hidden, mask_pad),
            PoolingMode::Cls => hidden
                .slice([0..batch, 0..1, 0..width])
                .reshape([batch, width]),
            PoolingMode::Max => {
                let hidden = match mask_pad {
                    // sentence-transformers sets padding to -1e9 before the maximum.
                    Some(pad) => hidden.mask_fill(
                        pad.reshape([batch, seq, 1]).expand([batch, seq, width]),
                        -1e9,
                    ),
                    None => hidden,
                };
                hidden.max_dim(1).reshape([batch, width])
            }
        };
        if self.normalize {
            normalize(pooled)
        } else {
            pooled
        }
    }
}
