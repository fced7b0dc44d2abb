//! Panther's `RandMultiHeadAttention` checkpoints, read into a [`PerformerAttention`].
//!
//! Its state dict holds the four projections as PyTorch stores a linear layer's weight,
//! `[out, in]`: `Wq`, `Wk`, `Wv`, `W0` (`[d_model, d_model]`), their biases `bq`, `bk`, `bv`,
//! `b0` (`[d_model]`, all four or none), and the random projection `projection_matrix`
//! (`[num_features, d_model / n_heads]`, a buffer).

use std::path::Path;

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use burn_sketch::SketchError;
use burn_sketch::panther::{StateDict, expect_shape, read_file, read_state_dict, shape_error};

use crate::CompressError;
use crate::{AnyLinear, LinearKind, PerformerAttention, PerformerAttentionConfig};

const WEIGHTS: [&str; 4] = ["Wq", "Wk", "Wv", "W0"];
const BIASES: [&str; 4] = ["bq", "bk", "bv", "b0"];
const PROJECTION: &str = "projection_matrix";

/// Reads the `RandMultiHeadAttention` stored under `prefix` (e.g. `""` or `"encoder.attn."`)
/// in a checkpoint file (safetensors, or a PyTorch `torch.save` of the state dict), with the
/// checks of burn-sketch's `panther::load_sklinear`. Panther keeps the number of heads, the
/// kernel and causality out of the state dict, so they come from `config`, and every shape is
/// checked against it before any tensor is built ([`SketchError::MissingKey`] and
/// [`SketchError::ShapeMismatch`], in [`CompressError::Sketch`]). Sketched `config.projections`
/// sketch the loaded dense weights. The random projection loads as fixed state, so the module
/// computes what Panther's does; the book's "Panther checkpoints" chapter has the details.
pub fn load_performer<B: Backend>(
    path: &Path,
    prefix: &str,
    config: &PerformerAttentionConfig,
    device: &B::Device,
) -> Result<PerformerAttention<B>, CompressError> {
    read_state_dict(&read_file(path)?, path, |dict| {
        from_state_dict(dict, prefix, config, device)
    })
}

/// [`load_performer`] on a checkpoint already in memory, with the same checks.
/// [`SketchError::Format`] names the file as `<memory>`.
pub fn load_performer_from_bytes<B: Backend>(
    bytes: &[u8],
    prefix: &str,
    config: &PerformerAttentionConfig,
    device: &B::Device,
) -> Result<PerformerAttention<B>, CompressError> {
    read_state_dict(bytes, Path::new("<memory>"), |dict| {
        from_state_dict(dict, prefix, config, device)
    })
}

fn from_state_dict<B: Backend>(
    dict: &dyn StateDict,
    prefix: &str,
    config: &PerformerAttentionConfig,
    device: &B::Device,
) -> Result<PerformerAttention<B>, CompressError> {
    config.validate()?;
    if let LinearKind::LowRank { .. } = config.projections {
        return Err(CompressError::Unsupported {
            what: format!(
                "loading a Panther attention with {} projections (a dense layer cannot be \
                 made low-rank without an SVD)",
                config.projections
            ),
        });
    }
    let key = |name: &str| format!("{prefix}{name}");
    let shape = |name: &str| {
        dict.shape(&key(name))
            .ok_or_else(|| SketchError::MissingKey { key: key(name) })
    };
    let d = config.d_model;
    let d_head = d / config.n_heads;

    for name in WEIGHTS {
        expect_shape(
            &key(name),
            &shape(name)?,
            &[d, d],
            "[d_model, d_model] with the configuration's d_model",
        )?;
    }
    let with_bias = BIASES.iter().any(|name| dict.shape(&key(name)).is_some());
    if with_bias {
        for name in BIASES {
            expect_shape(
                &key(name),
                &shape(name)?,
                &[d],
                "[d_model], like the weights",
            )?;
        }
    }
    let projection = shape(PROJECTION)?;
    if projection != [config.num_features, d_head] {
        return Err(CompressError::from(shape_error(
            &key(PROJECTION),
            &projection,
            &format!(
                "[{}, {d_head}] ([num_features, d_model / n_heads] of the configuration; \
                 modules with SRPE are not supported)",
                config.num_features
            ),
        )));
    }

    let layer = |weight: &str, bias: &str| -> Result<AnyLinear<B>, CompressError> {
        // PyTorch's `[out, in]` to Burn's `[in, out]`.
        let weight = Tensor::<B, 2>::from_data(dict.float_data(&key(weight))?, device).transpose();
        let bias = if with_bias {
            let data = dict.float_data(&key(bias))?;
            Some(Param::from_tensor(Tensor::<B, 1>::from_data(data, device)))
        } else {
            None
        };
        let dense = Linear {
            weight: Param::from_tensor(weight),
            bias,
        };
        AnyLinear::from(dense).try_convert(config.projections)
    };
    let [query, key_layer, value, output] = [0, 1, 2, 3].map(|i| layer(WEIGHTS[i], BIASES[i]));
    Ok(PerformerAttention {
        query: query?,
        key: key_layer?,
        value: value?,
        output: output?,
        projection: Param::from_tensor(Tensor::from_data(
            dict.float_data(&key(PROJECTION))?,
            device,
        ))
        .set_require_grad(false),
        n_heads: config.n_heads,
        feature_map: config.feature_map,
        causal: config.causal,
        kernel_epsilon: config.kernel_epsilon,
        chunk_size: config.chunk_size,
    })
}
