//! A reader for MNIST in the IDX format, and the 10,000-digit sample embedded in this crate.
//!
//! IDX is big-endian: a magic number (2051 for images, 2049 for labels), the item count, for
//! images the row and column counts, then one byte per pixel or label. Files may be gzipped,
//! as MNIST is distributed.

use std::io::Read;
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;

const IMAGES_MAGIC: u32 = 2051;
const LABELS_MAGIC: u32 = 2049;

/// Why an IDX file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IdxError {
    /// The file could not be opened or decompressed.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The magic number is not the one of the expected kind of file.
    #[error("{path}: magic number {found}, expected {expected}")]
    Magic {
        /// The file.
        path: PathBuf,
        /// The number found.
        found: u32,
        /// The number expected.
        expected: u32,
    },
    /// The file ends before the data its header announces.
    #[error("{path}: truncated, header announces {expected} bytes of data, found {found}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Bytes announced.
        expected: usize,
        /// Bytes present.
        found: usize,
    },
    /// Images and labels files disagree on the number of items.
    #[error("{images} images but {labels} labels")]
    CountMismatch {
        /// Number of images.
        images: usize,
        /// Number of labels.
        labels: usize,
    },
}

/// A set of 28×28 greyscale digits with their labels.
#[derive(Debug, Clone)]
pub struct Mnist {
    /// Pixels, `len × rows × cols` bytes, row-major.
    pub images: Vec<u8>,
    /// Labels 0-9, one per image.
    pub labels: Vec<u8>,
    /// Image height.
    pub rows: usize,
    /// Image width.
    pub cols: usize,
}

impl Mnist {
    /// Reads `{prefix}-images-idx3-ubyte[.gz]` and `{prefix}-labels-idx1-ubyte[.gz]` from
    /// `dir`, where `prefix` is `train` or `t10k`.
    pub fn read(dir: &Path, prefix: &str) -> Result<Self, IdxError> {
        let images = read_file(dir, &format!("{prefix}-images-idx3-ubyte"))?;
        let labels = read_file(dir, &format!("{prefix}-labels-idx1-ubyte"))?;
        let (images, rows, cols) = parse_images(&images.1, &images.0)?;
        let labels_data = parse_labels(&labels.1, &labels.0)?;
        let count = images.len() / (rows * cols);
        if count != labels_data.len() {
            return Err(IdxError::CountMismatch {
                images: count,
                labels: labels_data.len(),
            });
        }
        Ok(Self {
            images,
            labels: labels_data,
            rows,
            cols,
        })
    }

    /// The sample of 8,000 training and 2,000 test digits shipped in `data/mnist10k`.
    pub fn embedded_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist10k")
    }

    /// The number of digits.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The first `n` digits (all of them if there are fewer).
    pub fn truncate(mut self, n: usize) -> Self {
        let n = n.min(self.len());
        self.labels.truncate(n);
        self.images.truncate(n * self.rows * self.cols);
        self
    }
}

/// Reads `name.gz` if present, else `name`; returns the path read and its (inflated) bytes.
fn read_file(dir: &Path, name: &str) -> Result<(PathBuf, Vec<u8>), IdxError> {
    let gz = dir.join(format!("{name}.gz"));
    let (path, gzipped) = if gz.exists() {
        (gz, true)
    } else {
        (dir.join(name), false)
    };
    let io = |source| IdxError::Io {
        path: path.clone(),
        source,
    };
    let raw = std::fs::read(&path).map_err(io)?;
    let bytes = if gzipped {
        let mut out = Vec::new();
        GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(io)?;
        out
    } else {
        raw
    };
    Ok((path, bytes))
}

fn header(bytes: &[u8], path: &Path, magic: u32, words: usize) -> Result<Vec<usize>, IdxError> {
    let truncated = |expected: usize| IdxError::Truncated {
        path: path.to_path_buf(),
        expected,
        found: bytes.len(),
    };
    // The magic number says which kind of file this is, so it is checked before the
    // header length: a labels file handed to the images parser is a wrong file, not a
    // truncated one.
    let found = u32::from_be_bytes(bytes.get(..4).ok_or(truncated(4))?.try_into().unwrap());
    if found != magic {
        return Err(IdxError::Magic {
            path: path.to_path_buf(),
            found,
            expected: magic,
        });
    }
    let fields = bytes.get(4..4 * words).ok_or(truncated(4 * words))?;
    Ok(fields
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect())
}

fn body(bytes: &[u8], path: &Path, offset: usize, len: usize) -> Result<Vec<u8>, IdxError> {
    let data = &bytes[offset..];
    if data.len() < len {
        return Err(IdxError::Truncated {
            path: path.to_path_buf(),
            expected: len,
            found: data.len(),
        });
    }
    Ok(data[..len].to_vec())
}

/// Parses an IDX3 images file: returns the pixels and the image size.
pub fn parse_images(bytes: &[u8], path: &Path) -> Result<(Vec<u8>, usize, usize), IdxError> {
    let dims = header(bytes, path, IMAGES_MAGIC, 4)?;
    let (count, rows, cols) = (dims[0], dims[1], dims[2]);
    Ok((body(bytes, path, 16, count * rows * cols)?, rows, cols))
}

/// Parses an IDX1 labels file.
pub fn parse_labels(bytes: &[u8], path: &Path) -> Result<Vec<u8>, IdxError> {
    let count = header(bytes, path, LABELS_MAGIC, 2)?[0];
    body(bytes, path, 8, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels_file(count: u32, labels: &[u8]) -> Vec<u8> {
        let mut bytes = LABELS_MAGIC.to_be_bytes().to_vec();
        bytes.extend(count.to_be_bytes());
        bytes.extend(labels);
        bytes
    }

    #[test]
    fn embedded_sample_reads() {
        let train = Mnist::read(&Mnist::embedded_dir(), "train").unwrap();
        let test = Mnist::read(&Mnist::embedded_dir(), "t10k").unwrap();
        assert_eq!((train.len(), test.len()), (8000, 2000));
        assert_eq!((train.rows, train.cols), (28, 28));
        assert!(train.labels.iter().all(|&l| l < 10));
        // Real digits: every class occurs, and pixels span the full greyscale range.
        for digit in 0..10 {
            assert!(train.labels.contains(&digit));
        }
        assert_eq!(train.images.iter().max(), Some(&255));
    }

    #[test]
    fn wrong_magic_is_rejected() {
        let mut bytes = labels_file(2, &[1, 2]);
        bytes[3] = 0x03;
        let err = parse_labels(&bytes, Path::new("x")).unwrap_err();
        assert!(matches!(err, IdxError::Magic { found: 2051, .. }), "{err}");
        let err = parse_images(&labels_file(2, &[1, 2]), Path::new("x")).unwrap_err();
        assert!(matches!(err, IdxError::Magic { found: 2049, .. }), "{err}");
    }

    #[test]
    fn truncated_files_are_rejected() {
        let err = parse_labels(&labels_file(5, &[1, 2, 3]), Path::new("x")).unwrap_err();
        assert!(
            matches!(
                err,
                IdxError::Truncated {
                    expected: 5,
                    found: 3,
                    ..
                }
            ),
            "{err}"
        );
        let err = parse_labels(&[0, 0, 8], Path::new("x")).unwrap_err();
        assert!(matches!(err, IdxError::Truncated { .. }), "{err}");
        let mut images = IMAGES_MAGIC.to_be_bytes().to_vec();
        for v in [2u32, 28, 28] {
            images.extend(v.to_be_bytes());
        }
        images.extend([0u8; 28 * 28]);
        let err = parse_images(&images, Path::new("x")).unwrap_err();
        assert!(matches!(err, IdxError::Truncated { .. }), "{err}");
    }

    #[test]
    fn labels_parse() {
        assert_eq!(
            parse_labels(&labels_file(3, &[7, 0, 9]), Path::new("x")).unwrap(),
            vec![7, 0, 9]
        );
    }
}
