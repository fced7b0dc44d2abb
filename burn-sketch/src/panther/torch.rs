//! PyTorch's `torch.save` files: the zip archive of PyTorch ≥ 1.6 and the bare pickle stream
//! before it, read without PyTorch.
//!
//! Every tensor is checked against its storage before any of its values are allocated: the
//! last element its offset, shape and strides reach must lie inside the storage the pickle
//! declares, and the storage must be present, in full, in the file. A damaged checkpoint is an
//! error that names the tensor, never a layer with zeros where weights were. Strides are
//! honoured, so a tensor saved as a view (a transpose, a slice) loads with the values PyTorch
//! shows for it; views that repeat elements (broadcasts) are refused, so that the memory a
//! file can ask for is bounded by its size.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{Cursor, Read};

use burn::tensor::TensorData;

use super::FloatKind;
use super::pickle::{TensorEntry, Unpickler};
use crate::SketchError;

/// The tensors of a `torch.save` file and the bytes of their storages.
pub(super) struct TorchFile<'a> {
    tensors: HashMap<String, TensorEntry>,
    storages: Storages<'a>,
}

enum Storages<'a> {
    /// PyTorch ≥ 1.6: one archive member per storage, `<dir>/data/<key>`.
    Zip {
        archive: RefCell<zip::ZipArchive<Cursor<&'a [u8]>>>,
        dir: String,
    },
    /// Before 1.6: the storages follow the pickles, each as its element count and its bytes;
    /// here, the bytes found for each key (fewer than declared if the file is cut short).
    Legacy(HashMap<String, &'a [u8]>),
}

impl<'a> TorchFile<'a> {
    /// Parses the file's pickles; reads no tensor data. `Err` carries the reason, for
    /// [`SketchError::Format`].
    pub(super) fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        if bytes.starts_with(b"PK\x03\x04") {
            Self::parse_zip(bytes)
        } else {
            Self::parse_legacy(bytes)
        }
    }

    fn parse_zip(bytes: &'a [u8]) -> Result<Self, String> {
        let mut archive = zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| e.to_string())?;
        let pickle_name = archive
            .file_names()
            .find(|name| name.ends_with("data.pkl"))
            .ok_or("archive has no data.pkl")?
            .to_string();
        let dir = pickle_name.trim_end_matches("data.pkl").to_string();
        if let Ok(mut order) = archive.by_name(&format!("{dir}byteorder")) {
            let mut text = String::new();
            order
                .by_ref()
                .take(16)
                .read_to_string(&mut text)
                .map_err(|e| e.to_string())?;
            if text.trim() != "little" {
                return Err(format!("byte order `{}` is not supported", text.trim()));
            }
        }
        let pickle = read_member(&mut archive, &pickle_name, u64::MAX)?;
        let tensors = Unpickler::new(&pickle).tensors()?;
        Ok(Self {
            tensors: tensors.into_iter().collect(),
            storages: Storages::Zip {
                archive: RefCell::new(archive),
                dir,
            },
        })
    }

    fn parse_legacy(bytes: &'a [u8]) -> Result<Self, String> {
        let mut unpickler = Unpickler::new(bytes);
        unpickler.legacy_header()?;
        let tensors: HashMap<_, _> = unpickler.tensors()?.into_iter().collect();
        let keys = unpickler.strings()?;
        let mut rest = unpickler.rest();
        let mut storages = HashMap::new();
        for key in keys {
            let Some(element_size) = tensors
                .values()
                .find(|entry| entry.storage == key)
                .and_then(|entry| element_size(&entry.storage_type))
            else {
                // A storage no tensor uses, or of an unknown class: its length is unknown, and
                // so is where the next one starts.
                break;
            };
            let Some((count, data)) = rest.split_first_chunk::<8>() else {
                break;
            };
            let len = u64::from_le_bytes(*count)
                .checked_mul(element_size)
                .and_then(|len| usize::try_from(len).ok())
                .unwrap_or(usize::MAX);
            let (storage, tail) = data.split_at(len.min(data.len()));
            storages.insert(key, storage);
            rest = tail;
        }
        Ok(Self {
            tensors,
            storages: Storages::Legacy(storages),
        })
    }

    pub(super) fn shape(&self, key: &str) -> Option<Vec<usize>> {
        let entry = self.tensors.get(key)?;
        // A dimension beyond `usize` gives `usize::MAX`: the layer's shape checks reject it.
        Some(
            entry
                .shape
                .iter()
                .map(|&d| usize::try_from(d).unwrap_or(usize::MAX))
                .collect(),
        )
    }

    /// The tensor's values as `f32`, after checking that its storage holds them.
    pub(super) fn float_data(&self, key: &str) -> Result<TensorData, SketchError> {
        let entry = self
            .tensors
            .get(key)
            .ok_or_else(|| SketchError::MissingKey { key: key.into() })?;
        let corrupt = |reason: String| SketchError::Corrupt {
            key: key.into(),
            reason,
        };
        let kind = FloatKind::from_torch(&entry.storage_type).ok_or_else(|| {
            SketchError::UnsupportedDtype {
                key: key.into(),
                dtype: entry.storage_type.clone(),
            }
        })?;
        let numel = entry
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .ok_or_else(|| corrupt(format!("shape {:?} overflows", entry.shape)))?;
        // The last storage element the tensor reads, plus one.
        let reach = if numel == 0 {
            0
        } else {
            entry
                .shape
                .iter()
                .zip(&entry.stride)
                .try_fold(entry.offset, |last, (&d, &s)| {
                    (d - 1)
                        .checked_mul(s)
                        .and_then(|step| last.checked_add(step))
                })
                .and_then(|last| last.checked_add(1))
                .ok_or_else(|| corrupt("offset and strides overflow".into()))?
        };
        if reach > entry.storage_numel {
            return Err(corrupt(format!(
                "offset {} with shape {:?} and strides {:?} reaches element {} of storage `{}`, \
                 which holds {}",
                entry.offset,
                entry.shape,
                entry.stride,
                reach - 1,
                entry.storage,
                entry.storage_numel
            )));
        }
        // A view whose elements overlap (a broadcast, stride 0) would expand a few stored
        // bytes into any number of values: a small file could ask for all of memory. Views
        // without overlap (transposes, slices) never hold more elements than they span.
        if numel > reach {
            return Err(corrupt(format!(
                "shape {:?} with strides {:?} repeats storage elements (a broadcast view); \
                 save a contiguous copy",
                entry.shape, entry.stride
            )));
        }
        let size = kind.size() as u64;
        let declared = entry.storage_numel.checked_mul(size);
        let needed = reach * size;
        let bytes = self.storage_bytes(&entry.storage, needed, declared, &corrupt)?;

        let shape: Vec<usize> = entry.shape.iter().map(|&d| d as usize).collect();
        let numel = usize::try_from(numel).map_err(|_| corrupt("too many elements".into()))?;
        let mut values = Vec::new();
        values.try_reserve_exact(numel).map_err(|_| {
            corrupt(format!(
                "cannot allocate {numel} values for shape {:?}",
                entry.shape
            ))
        })?;
        let strides: Vec<usize> = entry.stride.iter().map(|&s| s as usize).collect();
        let mut index = vec![0usize; shape.len()];
        let offset = entry.offset as usize;
        for _ in 0..numel {
            let at = offset
                + index
                    .iter()
                    .zip(&strides)
                    .map(|(i, s)| i * s)
                    .sum::<usize>();
            values.push(
                kind.read(&bytes, at)
                    .map_err(|value| SketchError::OutOfRange {
                        key: key.into(),
                        value,
                    })?,
            );
            // Row-major odometer over the shape.
            for dim in (0..shape.len()).rev() {
                index[dim] += 1;
                if index[dim] < shape[dim] {
                    break;
                }
                index[dim] = 0;
            }
        }
        Ok(TensorData::new(values, shape))
    }

    /// The first `needed` bytes of a storage, after checking that the file holds all of the
    /// `declared` bytes (`None`: the declared size overflows).
    fn storage_bytes(
        &self,
        storage: &str,
        needed: u64,
        declared: Option<u64>,
        corrupt: &dyn Fn(String) -> SketchError,
    ) -> Result<Vec<u8>, SketchError> {
        let declared =
            declared.ok_or_else(|| corrupt(format!("storage `{storage}`'s size overflows")))?;
        let short = |found: u64| {
            corrupt(format!(
                "storage `{storage}` declares {declared} bytes but the file holds {found}"
            ))
        };
        match &self.storages {
            Storages::Zip { archive, dir } => {
                let name = format!("{dir}data/{storage}");
                let mut archive = archive.borrow_mut();
                let size = match archive.by_name(&name) {
                    Ok(member) => member.size(),
                    Err(zip::result::ZipError::FileNotFound) => {
                        return Err(corrupt(format!("the archive has no `{name}`")));
                    }
                    Err(err) => return Err(corrupt(format!("cannot open `{name}`: {err}"))),
                };
                if size < declared {
                    return Err(short(size));
                }
                let bytes = read_member(&mut archive, &name, needed).map_err(&corrupt)?;
                if (bytes.len() as u64) < needed {
                    return Err(short(bytes.len() as u64));
                }
                Ok(bytes)
            }
            Storages::Legacy(storages) => {
                let bytes = storages.get(storage).ok_or_else(|| {
                    corrupt(format!("storage `{storage}` is missing from the file"))
                })?;
                if (bytes.len() as u64) < declared {
                    return Err(short(bytes.len() as u64));
                }
                Ok(bytes[..needed as usize].to_vec())
            }
        }
    }
}

/// At most `limit` bytes of an archive member, allocated as they arrive: a member whose
/// header claims more than the file holds costs no more memory than the file.
fn read_member(
    archive: &mut zip::ZipArchive<Cursor<&[u8]>>,
    name: &str,
    limit: u64,
) -> Result<Vec<u8>, String> {
    let member = archive
        .by_name(name)
        .map_err(|e| format!("`{name}`: {e}"))?;
    let mut bytes = Vec::new();
    member
        .take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("`{name}`: {e}"))?;
    Ok(bytes)
}

/// Bytes per element of a PyTorch storage class (non-float ones too: a legacy file's layout
/// needs every storage's length).
fn element_size(storage_type: &str) -> Option<u64> {
    Some(match storage_type {
        "ComplexDoubleStorage" => 16,
        "DoubleStorage" | "LongStorage" | "ComplexFloatStorage" => 8,
        "FloatStorage" | "IntStorage" => 4,
        "HalfStorage" | "BFloat16Storage" | "ShortStorage" => 2,
        "CharStorage" | "ByteStorage" | "BoolStorage" => 1,
        _ => return None,
    })
}
