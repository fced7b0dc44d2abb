//! The disk tier: one safetensors file per module in a cache directory, optionally
//! zstd-compressed, memory-mapped to load, and checked against the length and CRC-32 written.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::{AllocationProperty, DType};
use safetensors::tensor::{Dtype, TensorView};

use super::host::HostTensor;
use crate::MemoryError;

/// A module's parameters as written to the cache.
#[derive(Clone, Debug)]
pub(crate) struct DiskFile {
    pub(crate) path: PathBuf,
    /// Bytes on disk.
    pub(crate) len: u64,
    /// Bytes of the safetensors file before compression.
    pub(crate) raw_len: u64,
    pub(crate) crc: u32,
    pub(crate) compressed: bool,
}

/// The cache directory, created by the manager and removed by it (or only its files, when
/// the directory was there before).
#[derive(Debug)]
pub(crate) struct CacheDir {
    path: PathBuf,
    created: bool,
}

#[cfg(feature = "compress")]
/// zstd's fastest level: higher levels gained under 0.1 % on float weights and halved the speed.
const ZSTD_LEVEL: i32 = 1;

impl CacheDir {
    /// Creates the directory (a fresh one under the temporary directory without `path`) and
    /// checks that a file can be written in it.
    pub(crate) fn open(path: Option<&Path>) -> Result<Self, MemoryError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = match path {
            Some(path) => path.to_path_buf(),
            None => std::env::temp_dir().join(format!(
                "burn-memory-offload-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            )),
        };
        let created = !path.exists();
        fs::create_dir_all(&path).map_err(|source| MemoryError::Io {
            path: path.clone(),
            source,
        })?;
        let probe = path.join(".write-probe");
        let written = File::create(&probe).and_then(|mut file| file.write_all(b"probe"));
        let _ = fs::remove_file(&probe);
        if let Err(source) = written {
            if created {
                let _ = fs::remove_dir_all(&path);
            }
            return Err(MemoryError::Io {
                path: probe,
                source,
            });
        }
        Ok(Self { path, created })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `tensors` as `name.safetensors` (`.safetensors.zst` compressed).
    pub(crate) fn write(
        &self,
        name: &str,
        tensors: &[HostTensor],
        compress: bool,
    ) -> Result<DiskFile, MemoryError> {
        let path = self.path.join(if compress {
            format!("{name}.safetensors.zst")
        } else {
            format!("{name}.safetensors")
        });
        let fail = |message: String| MemoryError::OffloadCache {
            path: path.clone(),
            message,
        };
        let views = tensors
            .iter()
            .enumerate()
            .map(|(index, data)| {
                let view = TensorView::new(
                    to_safetensors(data.dtype).ok_or_else(|| {
                        fail(format!(
                            "{:?} parameters cannot be offloaded to disk",
                            data.dtype
                        ))
                    })?,
                    data.shape.to_vec(),
                    &data.bytes,
                )
                .map_err(|error| fail(error.to_string()))?;
                Ok((index.to_string(), view))
            })
            .collect::<Result<Vec<_>, MemoryError>>()?;
        let raw = safetensors::serialize(views, None).map_err(|error| fail(error.to_string()))?;
        let raw_len = raw.len() as u64;
        let bytes = if compress {
            compress_bytes(&raw).map_err(fail)?
        } else {
            raw
        };
        fs::write(&path, &bytes).map_err(|source| MemoryError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(DiskFile {
            len: bytes.len() as u64,
            raw_len,
            crc: crc32fast::hash(&bytes),
            compressed: compress,
            path,
        })
    }

    /// Reads a module back: the file is memory-mapped (pages loaded at once), its length and
    /// CRC-32 checked, and decompressed where it was compressed; each tensor is a slice of
    /// the mapping (or of the decompressed buffer), not a copy.
    pub(crate) fn read(&self, file: &DiskFile) -> Result<Vec<HostTensor>, MemoryError> {
        let fail = |message: String| MemoryError::OffloadCache {
            path: file.path.clone(),
            message,
        };
        let handle = File::open(&file.path).map_err(|error| fail(error.to_string()))?;
        let len = handle
            .metadata()
            .map_err(|error| fail(error.to_string()))?
            .len();
        if len != file.len {
            return Err(fail(format!("{len} bytes, {} written", file.len)));
        }
        // SAFETY: the file is the manager's own; a change behind its back before this point
        // is caught by the checksum below, before any byte is used. (One while the mapping is
        // in use is not: the cache directory is the manager's alone.)
        let map = unsafe { memmap2::MmapOptions::new().populate().map(&handle) }
            .map_err(|error| fail(error.to_string()))?;
        let crc = crc32fast::hash(&map);
        if crc != file.crc {
            return Err(fail(format!(
                "CRC-32 {crc:08x}, {:08x} written: the file was changed",
                file.crc
            )));
        }
        let (raw, property) = if file.compressed {
            let decompressed = decompress_bytes(&map, file.raw_len as usize).map_err(fail)?;
            (bytes::Bytes::from(decompressed), AllocationProperty::Native)
        } else {
            (bytes::Bytes::from_owner(map), AllocationProperty::File)
        };
        let mut tensors = HostTensor::all_in_safetensors(&raw, property).map_err(fail)?;
        // Written as "0", "1", ...: back in that order.
        tensors.sort_by_key(|(name, _)| name.parse::<usize>().unwrap_or(usize::MAX));
        Ok(tensors.into_iter().map(|(_, tensor)| tensor).collect())
    }

    /// Removes one file (a module coming back to the host, or cleanup).
    pub(crate) fn remove(&self, file: &DiskFile) {
        if let Err(error) = fs::remove_file(&file.path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("cannot remove {}: {error}", file.path.display());
        }
    }

    /// Removes the directory if the manager created it (its files are removed one by one
    /// before).
    pub(crate) fn remove_dir(&self) {
        if self.created
            && let Err(error) = fs::remove_dir_all(&self.path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("cannot remove {}: {error}", self.path.display());
        }
    }
}

fn to_safetensors(dtype: DType) -> Option<Dtype> {
    Some(match dtype {
        DType::F64 => Dtype::F64,
        DType::F32 | DType::Flex32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        _ => return None,
    })
}

/// `raw` compressed with zstd.
#[cfg(feature = "compress")]
fn compress_bytes(raw: &[u8]) -> Result<Vec<u8>, String> {
    zstd::bulk::compress(raw, ZSTD_LEVEL).map_err(|error| error.to_string())
}

/// `compressed` (zstd) back to its `len` bytes.
#[cfg(feature = "compress")]
fn decompress_bytes(compressed: &[u8], len: usize) -> Result<Vec<u8>, String> {
    zstd::bulk::decompress(compressed, len).map_err(|error| error.to_string())
}

/// Without the `compress` feature, `OffloadConfig::validate` refuses compression.
#[cfg(not(feature = "compress"))]
fn compress_bytes(_raw: &[u8]) -> Result<Vec<u8>, String> {
    Err("compression needs burn-memory's `compress` feature".into())
}

/// Without the `compress` feature no file of this cache is compressed.
#[cfg(not(feature = "compress"))]
fn decompress_bytes(_compressed: &[u8], _len: usize) -> Result<Vec<u8>, String> {
    Err("compression needs burn-memory's `compress` feature".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    use burn::tensor::TensorData;

    fn data() -> Vec<TensorData> {
        vec![
            TensorData::new(
                (0..600).map(|i| (i as f32).sin()).collect::<Vec<_>>(),
                [20, 30],
            ),
            TensorData::new(vec![1.5f32, -2.0, 3.25], [3]),
        ]
    }

    fn sample() -> Vec<HostTensor> {
        data().into_iter().map(HostTensor::from_data).collect()
    }

    #[test]
    fn files_round_trip_compressed_or_not() {
        let dir = CacheDir::open(None).unwrap();
        for compress in [false, true] {
            let file = dir.write("m0", &sample(), compress).unwrap();
            assert_eq!(file.compressed, compress);
            let back: Vec<TensorData> = dir
                .read(&file)
                .unwrap()
                .iter()
                .map(HostTensor::to_data)
                .collect();
            assert_eq!(back, data());
            dir.remove(&file);
            assert!(!file.path.exists());
        }
        let path = dir.path().to_path_buf();
        dir.remove_dir();
        assert!(!path.exists());
    }

    #[test]
    fn a_changed_file_is_an_error_never_data() {
        let dir = CacheDir::open(None).unwrap();
        for compress in [false, true] {
            let file = dir.write("m1", &sample(), compress).unwrap();
            // One flipped byte, same length: the checksum catches it.
            let mut bytes = fs::read(&file.path).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
            fs::write(&file.path, &bytes).unwrap();
            let error = dir.read(&file).unwrap_err();
            assert!(error.to_string().contains("CRC-32"), "{error}");
            // Truncated: the length catches it.
            fs::write(&file.path, &bytes[..middle]).unwrap();
            let error = dir.read(&file).unwrap_err();
            assert!(error.to_string().contains("written"), "{error}");
            // Deleted.
            fs::remove_file(&file.path).unwrap();
            assert!(matches!(
                dir.read(&file),
                Err(MemoryError::OffloadCache { .. })
            ));
        }
        dir.remove_dir();
    }
}
