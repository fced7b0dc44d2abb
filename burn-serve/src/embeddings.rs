//! The embedding endpoints' messages, in the shapes clients already send: Hugging Face's
//! text-embeddings-inference (`/embed`, `/tokenize`, `/info`) and OpenAI's `/v1/embeddings`
//! (whose own Python client works against the server unchanged).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::text::Token;

/// What to embed: one text or several, or token ids already (OpenAI's `input` allows both).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Input {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One text's token ids, as the model's tokenizer gives them.
    Ids(Vec<i64>),
    /// Several texts' token ids.
    IdLists(Vec<Vec<i64>>),
}

/// `POST /embed` (TEI): the answer is one array of floats per input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EmbedRequest {
    /// The texts.
    pub inputs: Input,
    /// Cut texts over the input length instead of refusing them (the server's default when
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    /// Unit-length embeddings (the default).
    #[serde(default = "yes")]
    pub normalize: bool,
}

fn yes() -> bool {
    true
}

/// `POST /tokenize` (TEI): the answer is one list of [`Token`]s per input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TokenizeRequest {
    /// The texts.
    pub inputs: Input,
    /// Whether the model's special tokens are included (the default).
    #[serde(default = "yes")]
    pub add_special_tokens: bool,
}

/// `/tokenize`'s answer: each input's tokens.
pub type TokenizeResponse = Vec<Vec<Token>>;

/// How OpenAI's answer carries each embedding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EncodingFormat {
    /// An array of numbers.
    #[default]
    Float,
    /// Base64 of the little-endian `f32` bytes (what OpenAI's Python client asks for by
    /// default, and decodes).
    Base64,
}

/// `POST /v1/embeddings` (OpenAI).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpenAiRequest {
    /// The texts or token ids.
    pub input: Input,
    /// The model: a served text model's name, or anything when one text model is served.
    pub model: String,
    /// `float` (the default) or `base64`.
    #[serde(default)]
    pub encoding_format: EncodingFormat,
    /// The embedding's size: only the model's own is possible (no model served here was
    /// trained to be cut, Matryoshka-style).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<usize>,
    /// The end user, accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// One embedding of OpenAI's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpenAiEmbedding {
    /// Always `embedding`.
    pub object: String,
    /// An array of numbers, or a base64 string.
    pub embedding: Value,
    /// The input's place in the request.
    pub index: usize,
}

/// Tokens counted in OpenAI's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the inputs, special tokens included.
    pub prompt_tokens: usize,
    /// The same (embeddings generate nothing).
    pub total_tokens: usize,
}

/// `POST /v1/embeddings`' answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpenAiResponse {
    /// Always `list`.
    pub object: String,
    /// One embedding per input, in order.
    pub data: Vec<OpenAiEmbedding>,
    /// The model that answered.
    pub model: String,
    /// The tokens used.
    pub usage: Usage,
}

/// `GET /info` (TEI's fields that apply).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Info {
    /// The model's identity.
    pub model_id: String,
    /// How its weights are stored.
    pub model_dtype: String,
    /// `{"embedding": {"pooling": ...}}`.
    pub model_type: Value,
    /// Whether its output is unit-length already.
    pub normalized: bool,
    /// Requests that may wait (the batcher's queue).
    pub max_concurrent_requests: usize,
    /// The most tokens a text keeps.
    pub max_input_length: usize,
    /// The most tokens one batch holds, if bounded.
    pub max_batch_tokens: Option<usize>,
    /// The most rows one batch holds.
    pub max_batch_requests: usize,
    /// The most texts one request may hold.
    pub max_client_batch_size: usize,
    /// Whether long texts are cut by default.
    pub auto_truncate: bool,
    /// Requests tokenized at once.
    pub tokenization_workers: usize,
    /// burn-serve's version.
    pub version: String,
}

/// An error on TEI's endpoints: `{"error": ..., "error_type": ...}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TeiError {
    /// What went wrong.
    pub error: String,
    /// `validation`, `tokenizer`, `overloaded`, `backend`, `unhealthy`, `empty` or
    /// `unauthorized`.
    pub error_type: String,
}

/// An error on OpenAI's endpoints: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenAiError {
    /// The error.
    pub error: OpenAiErrorBody,
}

/// The body of an [`OpenAiError`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenAiErrorBody {
    /// What went wrong.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `rate_limit_error` or `server_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The offending parameter, where one is.
    pub param: Option<String>,
    /// The HTTP status, as a string.
    pub code: Option<String>,
}
