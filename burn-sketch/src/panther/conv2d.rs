//! Panther's `SKConv2d` checkpoints.
//!
//! Panther's state dict holds `S1s`, `S2s`, `U1s`, `U2s` and `bias` with [`SkConv2d`]'s
//! shapes (one group). Panther's forward averages the terms over `T` where ours averages over
//! `2T`, and adds its bias twice, so its layer is ours with `S1s`, `S2s` and `bias` doubled:
//! loading doubles them and saving halves them, and a loaded layer gives Panther's outputs.
//! The kernel size, stride, padding and dilation are not in the file: the configuration
//! passed in gives them, and the tensors' shapes are checked against it.

use std::path::Path;

use burn::module::Param;
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::{
    BIAS, S1S, S2S, StateDict, U1S, U2S, entry, expect_shape, read_file, read_state_dict,
    write_safetensors,
};
use crate::{FixedSketch, SkConv2d, SkConv2dConfig, SketchError};

/// Reads the `SKConv2d` stored under `prefix` in a safetensors or `torch.save` checkpoint, for
/// the layer `config` describes (its `num_terms`, `low_rank` and `bias` included), with the
/// checks of [`load_sklinear`](super::load_sklinear).
///
/// # Errors
/// [`SketchError::Unsupported`] for `groups > 1` (Panther has no groups), the errors of
/// [`load_sklinear`](super::load_sklinear) for a bad file, and
/// [`SketchError::ShapeMismatch`] for a tensor that does not fit `config`.
pub fn load_skconv2d<B: Backend>(
    path: &Path,
    prefix: &str,
    config: &SkConv2dConfig,
    device: &B::Device,
) -> Result<SkConv2d<B>, SketchError> {
    read_state_dict(&read_file(path)?, path, |dict| {
        from_state_dict(dict, prefix, config, device)
    })
}

fn from_state_dict<B: Backend>(
    dict: &(impl StateDict + ?Sized),
    prefix: &str,
    config: &SkConv2dConfig,
    device: &B::Device,
) -> Result<SkConv2d<B>, SketchError> {
    config.validate()?;
    if config.groups != 1 {
        return Err(SketchError::Unsupported {
            what: format!(
                "a Panther SKConv2d checkpoint with groups = {}",
                config.groups
            ),
        });
    }
    let key = |name: &str| format!("{prefix}{name}");
    let [c, o] = config.channels;
    let window = config.kernel_size[0] * config.kernel_size[1];
    let (t, k) = (config.num_terms, config.low_rank);
    let expected: [(&str, Vec<usize>, &str); 4] = [
        (S1S, vec![t, c * window, k], "[T, C·kh·kw, k]"),
        (S2S, vec![t, k * window, o], "[T, k·kh·kw, O]"),
        (U1S, vec![t, k, o], "[T, k, O]"),
        (
            U2S,
            vec![t, k * window, c * window],
            "[T, k·kh·kw, C·kh·kw]",
        ),
    ];
    for (name, shape, what) in &expected {
        let found = dict
            .shape(&key(name))
            .ok_or_else(|| SketchError::MissingKey { key: key(name) })?;
        expect_shape(&key(name), &found, shape, what)?;
    }
    let bias = match (config.bias, dict.shape(&key(BIAS))) {
        (false, _) => None,
        (true, None) => return Err(SketchError::MissingKey { key: key(BIAS) }),
        (true, Some(found)) => {
            expect_shape(&key(BIAS), &found, &[o], "[O]")?;
            let values = Tensor::<B, 1>::from_data(dict.float_data(&key(BIAS))?, device);
            Some(Param::from_tensor(values.mul_scalar(2.0)))
        }
    };
    let tensor = |name: &str| -> Result<Tensor<B, 3>, SketchError> {
        Ok(Tensor::from_data(dict.float_data(&key(name))?, device))
    };
    Ok(SkConv2d {
        s1s: Param::from_tensor(tensor(S1S)?.mul_scalar(2.0)),
        s2s: Param::from_tensor(tensor(S2S)?.mul_scalar(2.0)),
        u1s: FixedSketch::new(tensor(U1S)?),
        u2s: FixedSketch::new(tensor(U2S)?),
        bias,
        kernel_size: config.kernel_size,
        stride: config.stride,
        dilation: config.dilation,
        groups: 1,
        padding: config.padding.clone(),
    })
}

/// Writes `layer` as a safetensors file with Panther's `SKConv2d` keys under `prefix`, in
/// `f32` (`S1s`, `S2s` and `bias` halved for Panther's forward), atomically.
///
/// # Errors
/// [`SketchError::Unsupported`] for a layer with groups, [`SketchError::Io`].
pub fn save_skconv2d<B: Backend>(
    layer: &SkConv2d<B>,
    path: &Path,
    prefix: &str,
) -> Result<(), SketchError> {
    if layer.groups != 1 {
        return Err(SketchError::Unsupported {
            what: format!(
                "saving an SkConv2d with groups = {} for Panther",
                layer.groups
            ),
        });
    }
    let mut entries = vec![
        entry(prefix, S1S, layer.s1s.val().div_scalar(2.0)),
        entry(prefix, S2S, layer.s2s.val().div_scalar(2.0)),
        entry(prefix, U1S, layer.u1s.val()),
        entry(prefix, U2S, layer.u2s.val()),
    ];
    if let Some(bias) = &layer.bias {
        entries.push(entry(prefix, BIAS, bias.val().div_scalar(2.0)));
    }
    write_safetensors(&entries, path)
}
