//! The crate's error type.

use std::path::PathBuf;

/// A checkpoint tensor whose shape is not the one the configuration implies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Misshapen {
    /// The key, in the checkpoint's own (Hugging Face) naming.
    pub key: String,
    /// The shape the configuration implies.
    pub expected: Vec<usize>,
    /// The shape in the checkpoint.
    pub found: Vec<usize>,
}

impl std::fmt::Display for Misshapen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {:?}, expected {:?}",
            self.key, self.found, self.expected
        )
    }
}

/// What loading, tokenizing or embedding cannot do with its input: returned instead of a
/// panic, naming the file, key or value at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PretrainedError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },

    /// `config.json` is not a BERT-family configuration this crate can build.
    #[error("{path}: {reason}")]
    Config {
        /// The configuration file (or `<memory>`).
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },

    /// The checkpoint does not fit the configuration: keys it lacks, tensors of another shape
    /// or element type. Keys are the checkpoint's own (Hugging Face) names.
    #[error(
        "{path} does not fit the configuration:{}{}{}",
        list(" missing ", missing),
        list(" misshapen ", &misshapen.iter().map(ToString::to_string).collect::<Vec<_>>()),
        list(" not floating point ", not_float)
    )]
    Checkpoint {
        /// The checkpoint.
        path: PathBuf,
        /// Keys the model needs that the checkpoint lacks.
        missing: Vec<String>,
        /// Keys whose shape differs.
        misshapen: Vec<Misshapen>,
        /// Keys whose element type is not a float.
        not_float: Vec<String>,
    },

    /// burn-store could not apply the checkpoint (after the checks above passed).
    #[error("{path}: {reason}")]
    Store {
        /// The checkpoint.
        path: PathBuf,
        /// burn-store's message.
        reason: String,
    },

    /// The tokenizer could not be read or could not encode a text.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// An input the model cannot take (a sequence longer than its positions, an empty batch,
    /// a token id outside the vocabulary).
    #[error("invalid input: {0}")]
    Input(String),

    /// Converting the encoder's layers failed.
    #[error(transparent)]
    Compress(#[from] burn_compress::CompressError),
}

fn list(label: &str, items: &[String]) -> String {
    if items.is_empty() {
        return String::new();
    }
    const SHOWN: usize = 8;
    let mut text = format!(
        "{label}({}): {}",
        items.len(),
        items[..items.len().min(SHOWN)].join(", ")
    );
    if items.len() > SHOWN {
        text.push_str(", …");
    }
    text.push(';');
    text
}
