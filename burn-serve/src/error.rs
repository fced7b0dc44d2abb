//! The error type of the crate.

/// Why a request or a server operation failed. Each variant maps to one HTTP status
/// ([`ServeError::status`]): the client's mistakes are 4xx, the server's state 5xx.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The request is malformed: bad JSON, a missing or unknown field, a wrong shape or data
    /// type, data that does not fill its shape.
    #[error("{0}")]
    BadRequest(String),
    /// No model of that name (or version) is served.
    #[error("unknown model '{0}'")]
    UnknownModel(String),
    /// The request holds more rows than one batch may.
    #[error("the request holds {rows} rows; this model takes at most {max} per request")]
    TooLarge {
        /// Rows in the request.
        rows: usize,
        /// The model's `max_batch_size`.
        max: usize,
    },
    /// The request holds more tokens than one batch may (`max_batch_tokens`).
    #[error("the request holds {tokens} tokens; this model takes at most {max} per batch")]
    TooManyTokens {
        /// Tokens in the request.
        tokens: usize,
        /// The model's `max_batch_tokens`.
        max: usize,
    },
    /// A text is longer than the model takes, and the request asked not to truncate it.
    #[error("input {index} has more than {max} tokens; send `truncate: true` to cut it to {max}")]
    InputTooLong {
        /// The text's place in the request.
        index: usize,
        /// The most tokens a text may have.
        max: usize,
    },
    /// A missing or wrong API key.
    #[error("{0}")]
    Unauthorized(String),
    /// The queue is full: the server is overloaded; retry later.
    #[error("the model's queue is full ({capacity} requests waiting): retry later")]
    Overloaded {
        /// The queue's capacity, in requests.
        capacity: usize,
    },
    /// The request's deadline passed before its batch ran.
    #[error("the request's deadline passed after {waited_ms:.1} ms in the queue")]
    DeadlineExceeded {
        /// How long it waited.
        waited_ms: f64,
    },
    /// The batch would pass the replica's memory cap ([`crate::BurnModel::with_memory_cap`]).
    #[error("not enough device memory for this batch: {0}")]
    MemoryLimit(String),
    /// The server is shutting down and accepts no new requests.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The model failed on a batch (its message), or produced an output of the wrong shape.
    #[error("the model failed: {0}")]
    Model(String),
    /// An invalid setting (zero batch size, no replica).
    #[error("invalid {name}: {message}")]
    Invalid {
        /// The setting.
        name: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// A network error (binding the port, a client's connection).
    #[error("network: {0}")]
    Io(String),
}

impl ServeError {
    /// The HTTP status of the error: 400 for a bad request, 401 without the API key, 404 for
    /// an unknown model, 413 for a request over the batch size or token budget or a text over
    /// the input length, 503 when overloaded, over the memory cap or shutting down, 504
    /// past the deadline,
    /// 500 when the model failed.
    pub fn status(&self) -> u16 {
        match self {
            Self::BadRequest(_) | Self::Invalid { .. } => 400,
            Self::UnknownModel(_) => 404,
            Self::Unauthorized(_) => 401,
            Self::TooLarge { .. } | Self::TooManyTokens { .. } | Self::InputTooLong { .. } => 413,
            Self::Overloaded { .. } | Self::MemoryLimit(_) | Self::ShuttingDown => 503,
            Self::DeadlineExceeded { .. } => 504,
            Self::Model(_) | Self::Io(_) => 500,
        }
    }

    pub(crate) fn bad(message: impl Into<String>) -> Self {
        Self::BadRequest(message.into())
    }

    pub(crate) fn invalid(name: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            name,
            message: message.into(),
        }
    }
}
