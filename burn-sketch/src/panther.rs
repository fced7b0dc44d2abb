//! Checkpoint interchange with Panther, the PyTorch library `SkLinear` follows.
//!
//! Panther's `SKLinear` state dict holds `S1s`, `S2s`, `U1s`, `U2s` and an optional `bias`,
//! with exactly the layouts of [`SkLinear`]'s fields. These functions read and write that
//! state dict as a safetensors file (`safetensors.torch.save_file(model.state_dict(), path)`
//! on the Python side), so trained weights move both ways; [`load_sklinear`] also reads
//! PyTorch's own `torch.save` files. A whole Panther model's file holds
//! one such group per layer, each under its module path (`"encoder.0."`): pass it as `prefix`.

use std::collections::HashMap;
use std::path::Path;

use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::linear::fixed;
use crate::{SkLinear, SketchError};

const S1S: &str = "S1s";
const S2S: &str = "S2s";
const U1S: &str = "U1s";
const U2S: &str = "U2s";
const BIAS: &str = "bias";

/// Reads the `SKLinear` stored under `prefix` (e.g. `""` or `"layers.0."`) in a checkpoint
/// file: a safetensors file, or a PyTorch `torch.save` file of the state dict (`.pt`/`.pth`,
/// recognised by its content, read without PyTorch through `burn-store`).
///
/// Every shape is checked against the others before any tensor is built: all four factors
/// must agree on `T` and `k`, `S1s`/`U2s` on `d_input`, `S2s`/`U1s`/`bias` on `d_output`.
/// `f32`, `f64`, `f16` and `bf16` tensors are accepted and converted to the backend's float
/// type. The sketches `U1s`/`U2s` are loaded as fixed (untrained) state.
pub fn load_sklinear<B: Backend>(
    path: &Path,
    prefix: &str,
    device: &B::Device,
) -> Result<SkLinear<B>, SketchError> {
    let bytes = std::fs::read(path).map_err(|source| SketchError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let format_error = |message: String| SketchError::Format {
        path: path.to_path_buf(),
        message,
    };
    // `torch.save` writes a zip archive (PyTorch ≥ 1.6) or, before that, a bare pickle.
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(&[0x80]) {
        let reader = burn_store::pytorch::PytorchReader::new(path)
            .map_err(|err| format_error(err.to_string()))?;
        from_state_dict(&reader, prefix, device)
    } else {
        let file = SafeTensors::deserialize(&bytes).map_err(|err| format_error(err.to_string()))?;
        from_state_dict(&file, prefix, device)
    }
}

/// What loading needs of a checkpoint format: the shape of a named tensor without decoding
/// it, then its values as floats.
trait StateDict {
    fn shape(&self, key: &str) -> Option<Vec<usize>>;
    fn float_data(&self, key: &str) -> Result<TensorData, SketchError>;
}

impl StateDict for SafeTensors<'_> {
    fn shape(&self, key: &str) -> Option<Vec<usize>> {
        self.tensor(key).ok().map(|view| view.shape().to_vec())
    }

    fn float_data(&self, key: &str) -> Result<TensorData, SketchError> {
        let view = self
            .tensor(key)
            .map_err(|_| SketchError::MissingKey { key: key.into() })?;
        to_f32(key, &view)
    }
}

impl StateDict for burn_store::pytorch::PytorchReader {
    fn shape(&self, key: &str) -> Option<Vec<usize>> {
        self.get(key).map(|snapshot| snapshot.shape.to_vec())
    }

    fn float_data(&self, key: &str) -> Result<TensorData, SketchError> {
        let snapshot = self
            .get(key)
            .ok_or_else(|| SketchError::MissingKey { key: key.into() })?;
        if !snapshot.dtype.is_float() {
            return Err(SketchError::UnsupportedDtype {
                key: key.into(),
                dtype: format!("{:?}", snapshot.dtype),
            });
        }
        let data = snapshot.to_data().map_err(|err| SketchError::Decode {
            key: key.into(),
            message: format!("{err:?}"),
        })?;
        Ok(data.convert::<f32>())
    }
}

/// Checks the shapes of an `SKLinear`'s tensors under `prefix`, then builds the layer.
fn from_state_dict<B: Backend>(
    dict: &impl StateDict,
    prefix: &str,
    device: &B::Device,
) -> Result<SkLinear<B>, SketchError> {
    let key = |name: &str| format!("{prefix}{name}");
    let shape = |name: &str| {
        dict.shape(&key(name))
            .ok_or_else(|| SketchError::MissingKey { key: key(name) })
    };
    let s1s = shape(S1S)?;
    let s2s = shape(S2S)?;
    let u1s = shape(U1S)?;
    let u2s = shape(U2S)?;
    let bias = dict.shape(&key(BIAS));

    let [t, d_input, k] = rank3(&key(S1S), &s1s)?;
    let [_, _, d_output] = rank3(&key(S2S), &s2s)?;
    if t == 0 || d_input == 0 || k == 0 {
        return Err(shape_error(
            &key(S1S),
            &s1s,
            "[T, d_input, k], all non-zero",
        ));
    }
    if d_output == 0 {
        return Err(shape_error(
            &key(S2S),
            &s2s,
            "[T, k, d_output], all non-zero",
        ));
    }
    expect_shape(
        &key(S2S),
        &s2s,
        &[t, k, d_output],
        "[T, k, d_output] with T, k of S1s",
    )?;
    expect_shape(
        &key(U1S),
        &u1s,
        &[t, k, d_output],
        "[T, k, d_output] like S2s",
    )?;
    expect_shape(
        &key(U2S),
        &u2s,
        &[t, d_input, k],
        "[T, d_input, k] like S1s",
    )?;
    if let Some(bias) = &bias {
        expect_shape(&key(BIAS), bias, &[d_output], "[d_output] of S2s")?;
    }

    let tensor = |name: &str| -> Result<Tensor<B, 3>, SketchError> {
        Ok(Tensor::from_data(dict.float_data(&key(name))?, device))
    };
    Ok(SkLinear {
        s1s: Param::from_tensor(tensor(S1S)?),
        s2s: Param::from_tensor(tensor(S2S)?),
        u1s: fixed(tensor(U1S)?),
        u2s: fixed(tensor(U2S)?),
        bias: match bias {
            Some(_) => Some(Param::from_tensor(Tensor::from_data(
                dict.float_data(&key(BIAS))?,
                device,
            ))),
            None => None,
        },
        strategy: crate::backend::KernelStrategy::default(),
    })
}

/// Writes `layer` as a safetensors file with Panther's state-dict keys under `prefix`, in
/// `f32`, so that Panther's `SKLinear.load_state_dict` (after
/// `safetensors.torch.load_file`) or [`load_sklinear`] reads it back.
pub fn save_sklinear<B: Backend>(
    layer: &SkLinear<B>,
    path: &Path,
    prefix: &str,
) -> Result<(), SketchError> {
    let mut entries: Vec<(String, Vec<usize>, Vec<u8>)> = vec![
        entry(prefix, S1S, layer.s1s.val()),
        entry(prefix, S2S, layer.s2s.val()),
        entry(prefix, U1S, layer.u1s.val()),
        entry(prefix, U2S, layer.u2s.val()),
    ];
    if let Some(bias) = &layer.bias {
        entries.push(entry(prefix, BIAS, bias.val()));
    }

    let views = entries
        .iter()
        .map(|(name, shape, bytes)| {
            let view = TensorView::new(Dtype::F32, shape.clone(), bytes)
                .expect("an f32 tensor's byte length matches its shape");
            (name.clone(), view)
        })
        .collect::<Vec<_>>();
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes =
        safetensors::serialize(views, Some(metadata)).map_err(|err| SketchError::Format {
            path: path.to_path_buf(),
            message: err.to_string(),
        })?;
    std::fs::write(path, bytes).map_err(|source| SketchError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn entry<B: Backend, const D: usize>(
    prefix: &str,
    name: &str,
    tensor: Tensor<B, D>,
) -> (String, Vec<usize>, Vec<u8>) {
    let (shape, bytes) = f32_data(tensor);
    (format!("{prefix}{name}"), shape, bytes)
}

/// A tensor's shape and its values as little-endian `f32` bytes, as safetensors stores them.
fn f32_data<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> (Vec<usize>, Vec<u8>) {
    let shape = tensor.dims().to_vec();
    let values = tensor
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("converted to f32 just above");
    (shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
}

fn rank3(key: &str, shape: &[usize]) -> Result<[usize; 3], SketchError> {
    <[usize; 3]>::try_from(shape).map_err(|_| shape_error(key, shape, "a rank-3 tensor"))
}

fn expect_shape(
    key: &str,
    found: &[usize],
    shape: &[usize],
    what: &str,
) -> Result<(), SketchError> {
    if found == shape {
        Ok(())
    } else {
        Err(shape_error(key, found, &format!("{shape:?} ({what})")))
    }
}

fn shape_error(key: &str, found: &[usize], expected: &str) -> SketchError {
    SketchError::ShapeMismatch {
        key: key.to_string(),
        found: found.to_vec(),
        expected: expected.to_string(),
    }
}

/// Decodes a little-endian safetensors buffer of any float dtype into `f32` data.
fn to_f32(key: &str, view: &TensorView<'_>) -> Result<TensorData, SketchError> {
    let bytes = view.data();
    let values: Vec<f32> = match view.dtype() {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8-byte chunk")) as f32)
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => {
            return Err(SketchError::UnsupportedDtype {
                key: key.to_string(),
                dtype: format!("{other:?}"),
            });
        }
    };
    Ok(TensorData::new(values, view.shape().to_vec()))
}
