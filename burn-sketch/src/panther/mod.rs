//! Checkpoint interchange with Panther, the PyTorch library `SkLinear` follows.
//!
//! Panther's `SKLinear` state dict holds `S1s`, `S2s`, `U1s`, `U2s` and an optional `bias`,
//! with exactly the layouts of [`SkLinear`]'s fields. These functions read and write that
//! state dict as a safetensors file (`safetensors.torch.save_file(model.state_dict(), path)`
//! on the Python side), so trained weights move both ways; [`load_sklinear`] also reads
//! PyTorch's own `torch.save` files. A whole Panther model's file holds
//! one such group per layer, each under its module path (`"encoder.0."`): pass it as `prefix`.
//! [`load_skconv2d`] / [`save_skconv2d`] do the same for its `SKConv2d`; burn-compress reads
//! its `RandMultiHeadAttention` through the same [`read_state_dict`] and [`StateDict`].

mod conv2d;
mod pickle;
mod torch;

use std::collections::HashMap;
use std::path::Path;

use burn::module::Param;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use crate::{FixedSketch, SkLinear, SketchError};
pub use conv2d::{load_skconv2d, save_skconv2d};
use torch::TorchFile;

const S1S: &str = "S1s";
const S2S: &str = "S2s";
const U1S: &str = "U1s";
const U2S: &str = "U2s";
const BIAS: &str = "bias";

/// Reads the `SKLinear` stored under `prefix` (e.g. `""` or `"layers.0."`) in a checkpoint
/// file: a safetensors file, or a PyTorch `torch.save` file of the state dict (`.pt`/`.pth`,
/// zip or pre-1.6 format, recognised by its content, read without PyTorch).
///
/// A checkpoint is outside input, so nothing in it is trusted before it is checked: a bad file
/// is a typed error ([`SketchError::ShapeMismatch`], [`SketchError::Corrupt`],
/// [`SketchError::OutOfRange`], ...), never a layer with wrong values. The book's "Panther
/// checkpoints" lists the checks. `f32`, `f64`, `f16` and `bf16` tensors are converted to
/// `f32`; strides are honoured; the sketches `U1s`/`U2s` load as fixed (untrained) state.
pub fn load_sklinear<B: Backend>(
    path: &Path,
    prefix: &str,
    device: &B::Device,
) -> Result<SkLinear<B>, SketchError> {
    read_sklinear(&read_file(path)?, path, prefix, device)
}

/// The file's bytes, or [`SketchError::Io`] naming it.
pub fn read_file(path: &Path) -> Result<Vec<u8>, SketchError> {
    std::fs::read(path).map_err(|source| SketchError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// [`load_sklinear`] on a checkpoint already in memory (downloaded, embedded, or received over
/// a channel), with the same checks. [`SketchError::Format`] names the file as `<memory>`.
pub fn load_sklinear_from_bytes<B: Backend>(
    bytes: &[u8],
    prefix: &str,
    device: &B::Device,
) -> Result<SkLinear<B>, SketchError> {
    read_sklinear(bytes, Path::new("<memory>"), prefix, device)
}

fn read_sklinear<B: Backend>(
    bytes: &[u8],
    path: &Path,
    prefix: &str,
    device: &B::Device,
) -> Result<SkLinear<B>, SketchError> {
    read_state_dict(bytes, path, |dict| from_state_dict(dict, prefix, device))
}

/// Parses a checkpoint (safetensors, or PyTorch's `torch.save`) and hands its state dict to
/// `read`; `path` names the file in [`SketchError::Format`].
pub fn read_state_dict<T, E: From<SketchError>>(
    bytes: &[u8],
    path: &Path,
    read: impl FnOnce(&dyn StateDict) -> Result<T, E>,
) -> Result<T, E> {
    let format_error = |message: String| SketchError::Format {
        path: path.to_path_buf(),
        message,
    };
    // `torch.save` writes a zip archive (PyTorch ≥ 1.6) or, before that, a bare pickle, which
    // starts with the PROTO opcode 0x80. A safetensors file starts with its header's length
    // (8 bytes, little-endian), whose first byte may be 0x80 too: it is recognised by the JSON
    // header that follows.
    let safetensors = bytes.len() > 8 && bytes[8] == b'{';
    if !safetensors && (bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(&[0x80])) {
        let file = TorchFile::parse(bytes).map_err(format_error)?;
        read(&file)
    } else {
        let file = SafeTensors::deserialize(bytes).map_err(|err| format_error(err.to_string()))?;
        read(&file)
    }
}

/// What loading needs of a checkpoint format: the shape of a named tensor without decoding
/// it, then its values as floats.
pub trait StateDict {
    /// The shape of the tensor stored under `key`, if there is one.
    fn shape(&self, key: &str) -> Option<Vec<usize>>;
    /// The values of the tensor under `key` as `f32`, checked as [`load_sklinear`] documents.
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

impl StateDict for TorchFile<'_> {
    fn shape(&self, key: &str) -> Option<Vec<usize>> {
        TorchFile::shape(self, key)
    }

    fn float_data(&self, key: &str) -> Result<TensorData, SketchError> {
        TorchFile::float_data(self, key)
    }
}

/// The float element types a checkpoint may store, read as little-endian bytes.
#[derive(Clone, Copy, Debug)]
enum FloatKind {
    F32,
    F64,
    F16,
    Bf16,
}

impl FloatKind {
    fn from_torch(storage_type: &str) -> Option<Self> {
        Some(match storage_type {
            "FloatStorage" => Self::F32,
            "DoubleStorage" => Self::F64,
            "HalfStorage" => Self::F16,
            "BFloat16Storage" => Self::Bf16,
            _ => return None,
        })
    }

    fn from_safetensors(dtype: Dtype) -> Option<Self> {
        Some(match dtype {
            Dtype::F32 => Self::F32,
            Dtype::F64 => Self::F64,
            Dtype::F16 => Self::F16,
            Dtype::BF16 => Self::Bf16,
            _ => return None,
        })
    }

    fn size(self) -> usize {
        match self {
            Self::F64 => 8,
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }

    /// Element `index` of `bytes` as `f32`; `Err` with the value when a finite `f64` lies
    /// beyond `f32`'s range (it would become an infinity). Infinities and NaNs stay what they
    /// are, and values below `f32`'s smallest subnormal round to zero, as any narrowing does.
    fn read(self, bytes: &[u8], index: usize) -> Result<f32, f64> {
        let at = index * self.size();
        let b = &bytes[at..at + self.size()];
        Ok(match self {
            Self::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            Self::F64 => {
                let value = f64::from_le_bytes(b.try_into().expect("8 bytes"));
                let narrow = value as f32;
                if value.is_finite() && !narrow.is_finite() {
                    return Err(value);
                }
                narrow
            }
            Self::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
            Self::Bf16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        })
    }
}

/// Checks the shapes of an `SKLinear`'s tensors under `prefix`, then builds the layer.
fn from_state_dict<B: Backend>(
    dict: &(impl StateDict + ?Sized),
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
        u1s: FixedSketch::new(tensor(U1S)?),
        u2s: FixedSketch::new(tensor(U2S)?),
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
/// `safetensors.torch.load_file`) or [`load_sklinear`] reads it back. The file is replaced
/// atomically: an existing checkpoint at `path` survives a crash during the write.
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

    write_safetensors(&entries, path)
}

/// Writes `(key, shape, f32 bytes)` entries as a safetensors file, atomically.
fn write_safetensors(
    entries: &[(String, Vec<usize>, Vec<u8>)],
    path: &Path,
) -> Result<(), SketchError> {
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
    write_atomically(path, &bytes).map_err(|source| SketchError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `bytes` to a temporary file beside `path`, flushes it to disk, then renames it over
/// `path`: a reader sees the old file or the new one, never a half-written one, even if the
/// process dies mid-write.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    file.write_all(bytes)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|err| err.error)?;
    Ok(())
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

/// `Ok` when a checkpoint tensor's shape is `shape`, else [`SketchError::ShapeMismatch`]
/// naming `key` and saying `what` was expected.
pub fn expect_shape(
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

/// [`SketchError::ShapeMismatch`] for `key`.
pub fn shape_error(key: &str, found: &[usize], expected: &str) -> SketchError {
    SketchError::ShapeMismatch {
        key: key.to_string(),
        found: found.to_vec(),
        expected: expected.to_string(),
    }
}

/// Decodes a little-endian safetensors buffer of any float dtype into `f32` data.
fn to_f32(key: &str, view: &TensorView<'_>) -> Result<TensorData, SketchError> {
    let kind =
        FloatKind::from_safetensors(view.dtype()).ok_or_else(|| SketchError::UnsupportedDtype {
            key: key.to_string(),
            dtype: format!("{:?}", view.dtype()),
        })?;
    let bytes = view.data();
    let values = (0..bytes.len() / kind.size())
        .map(|i| kind.read(bytes, i))
        .collect::<Result<Vec<f32>, f64>>()
        .map_err(|value| SketchError::OutOfRange {
            key: key.to_string(),
            value,
        })?;
    Ok(TensorData::new(values, view.shape().to_vec()))
}
