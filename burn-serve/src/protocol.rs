//! The Open Inference Protocol's (KServe v2, Triton) JSON messages, and their conversion to
//! and from [`HostTensor`]s.
//!
//! Tensor data may be flat (row-major) or nested as the shape; the server answers flat, as
//! the protocol's examples do. The binary tensor data extension (Triton's and KServe's, which
//! Triton's clients use by default) is supported too: a tensor whose parameters hold
//! `binary_data_size` has no `data`, and its little-endian bytes follow the JSON part of the
//! body, whose length the `Inference-Header-Content-Length` header gives.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{DataType, HostData, HostTensor, ModelSpec, ServeError, TensorSpec};

/// A tensor as the protocol writes it in requests (`inputs`) and responses (`outputs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JsonTensor {
    /// The tensor's name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its element type's name (`FP32`, `INT64`, …).
    pub datatype: String,
    /// Optional parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// The elements, flat in row-major order or nested as the shape; absent (`null`) when they
    /// travel as binary data.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub data: Value,
}

/// HTTP methods, for [`crate::Client::send`].
pub use hyper::Method;

/// The header giving the JSON part's length in a body with binary tensor data.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// The JSON part and the binary part of a body; without the header, all of it is JSON.
pub fn split_body(body: &[u8], header_length: Option<usize>) -> Result<(&[u8], &[u8]), ServeError> {
    match header_length {
        None => Ok((body, &[])),
        Some(length) if length <= body.len() => Ok(body.split_at(length)),
        Some(length) => Err(ServeError::bad(format!(
            "{HEADER_LENGTH} is {length}, but the body has {} bytes",
            body.len()
        ))),
    }
}

/// A body with binary tensor data: `header` as JSON, then `blobs` in order. Returns the body
/// and the JSON part's length, for the [`HEADER_LENGTH`] header.
pub fn binary_body<T: Serialize>(header: &T, blobs: &[Vec<u8>]) -> (Vec<u8>, usize) {
    let mut body = serde_json::to_vec(header).expect("protocol messages serialize");
    let length = body.len();
    for blob in blobs {
        body.extend_from_slice(blob);
    }
    (body, length)
}

/// A tensor's elements as little-endian bytes; a `BYTES` element is its length (4 bytes,
/// little-endian) then its bytes, as Triton's clients write them.
pub fn to_bytes(tensor: &HostTensor) -> Vec<u8> {
    match tensor.data() {
        HostData::F32(values) => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        HostData::I64(values) => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        HostData::Bytes(values) => {
            let mut bytes = Vec::with_capacity(values.iter().map(|v| v.len() + 4).sum());
            for value in values {
                bytes.extend_from_slice(&(value.len() as u32).to_le_bytes());
                bytes.extend_from_slice(value);
            }
            bytes
        }
    }
}

/// `BYTES` elements from their binary form: each a 4-byte little-endian length, then as many
/// bytes.
fn byte_strings(name: &str, mut bytes: &[u8]) -> Result<Vec<Vec<u8>>, ServeError> {
    let mut values = Vec::new();
    while !bytes.is_empty() {
        let truncated = || {
            ServeError::bad(format!(
                "tensor '{name}': BYTES element {} is cut short",
                values.len()
            ))
        };
        let (length, rest) = bytes.split_first_chunk::<4>().ok_or_else(truncated)?;
        let length = u32::from_le_bytes(*length) as usize;
        if rest.len() < length {
            return Err(truncated());
        }
        let (value, rest) = rest.split_at(length);
        values.push(value.to_vec());
        bytes = rest;
    }
    Ok(values)
}

/// Takes the tensors of `tensors` that hold binary data from `binary`, in order: each gets its
/// `binary_data_size` bytes as its data; the bytes must be used up exactly.
pub fn host_tensors(tensors: &[JsonTensor], binary: &[u8]) -> Result<Vec<HostTensor>, ServeError> {
    let mut rest = binary;
    let tensors = tensors
        .iter()
        .map(|tensor| match tensor.binary_size()? {
            None => tensor.to_host(),
            Some(size) if size <= rest.len() => {
                let (bytes, after) = rest.split_at(size);
                rest = after;
                tensor.from_bytes(bytes)
            }
            Some(size) => Err(ServeError::bad(format!(
                "tensor '{}' declares {size} bytes of binary data; {} are left",
                tensor.name,
                rest.len()
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !rest.is_empty() {
        return Err(ServeError::bad(format!(
            "{} bytes of binary data belong to no tensor",
            rest.len()
        )));
    }
    Ok(tensors)
}

/// `POST /v2/models/{name}/infer`'s body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InferRequest {
    /// An identifier the response repeats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Optional parameters; `timeout` (microseconds, Triton's name) sets the request's
    /// deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// The input tensors.
    pub inputs: Vec<JsonTensor>,
    /// The outputs asked for (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<Vec<RequestedOutput>>,
}

/// An output a request asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestedOutput {
    /// The output's name.
    pub name: String,
    /// Optional parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
}

/// The answer to an inference request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InferResponse {
    /// The model that answered.
    pub model_name: String,
    /// Its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<String>,
    /// The request's identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Optional parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// The output tensors.
    pub outputs: Vec<JsonTensor>,
}

/// A tensor of a model's signature, in model metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataTensor {
    /// The tensor's name.
    pub name: String,
    /// Its element type's name.
    pub datatype: String,
    /// Its shape; `-1` for a dimension of any size.
    pub shape: Vec<i64>,
}

/// `GET /v2/models/{name}`'s answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelMetadata {
    /// The model's name.
    pub name: String,
    /// Its versions.
    pub versions: Vec<String>,
    /// What runs it.
    pub platform: String,
    /// Its inputs.
    pub inputs: Vec<MetadataTensor>,
    /// Its outputs.
    pub outputs: Vec<MetadataTensor>,
}

/// `GET /v2`'s answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerMetadata {
    /// The server's name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// The protocol extensions it supports (none).
    pub extensions: Vec<String>,
}

/// The body of every error answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// What went wrong.
    pub error: String,
}

impl From<&TensorSpec> for MetadataTensor {
    fn from(spec: &TensorSpec) -> Self {
        Self {
            name: spec.name.clone(),
            datatype: spec.datatype.name().to_string(),
            shape: spec.shape.clone(),
        }
    }
}

impl From<&ModelSpec> for ModelMetadata {
    fn from(spec: &ModelSpec) -> Self {
        Self {
            name: spec.name.clone(),
            versions: vec![spec.version.clone()],
            platform: spec.platform.clone(),
            inputs: vec![MetadataTensor::from(&spec.input)],
            outputs: vec![MetadataTensor::from(&spec.output)],
        }
    }
}

impl JsonTensor {
    /// The tensor named `name` holding `tensor`, with flat data.
    pub fn from_host(name: impl Into<String>, tensor: &HostTensor) -> Self {
        let data = match tensor.data() {
            HostData::F32(values) => {
                Value::Array(values.iter().map(|&v| Value::from(f64::from(v))).collect())
            }
            HostData::I64(values) => Value::Array(values.iter().map(|&v| Value::from(v)).collect()),
            HostData::Bytes(values) => Value::Array(
                values
                    .iter()
                    .map(|v| Value::from(String::from_utf8_lossy(v).into_owned()))
                    .collect(),
            ),
        };
        Self {
            name: name.into(),
            shape: tensor.shape().iter().map(|&dim| dim as u64).collect(),
            datatype: tensor.data_type().name().to_string(),
            parameters: None,
            data,
        }
    }

    /// The tensor named `name` holding `tensor` as binary data: its description and its bytes.
    pub fn binary_from_host(name: impl Into<String>, tensor: &HostTensor) -> (Self, Vec<u8>) {
        let bytes = to_bytes(tensor);
        let description = Self {
            name: name.into(),
            shape: tensor.shape().iter().map(|&dim| dim as u64).collect(),
            datatype: tensor.data_type().name().to_string(),
            parameters: Some(serde_json::json!({ "binary_data_size": bytes.len() })),
            data: Value::Null,
        };
        (description, bytes)
    }

    /// The size of its binary data, where its parameters declare one.
    pub fn binary_size(&self) -> Result<Option<usize>, ServeError> {
        match self
            .parameters
            .as_ref()
            .and_then(|p| p.get("binary_data_size"))
        {
            None => Ok(None),
            Some(size) => size.as_u64().map(|s| Some(s as usize)).ok_or_else(|| {
                ServeError::bad(format!(
                    "tensor '{}': binary_data_size is {size}, not a byte count",
                    self.name
                ))
            }),
        }
    }

    fn datatype_and_shape(&self) -> Result<(DataType, Vec<usize>), ServeError> {
        let name = &self.name;
        let datatype = match self.datatype.as_str() {
            "FP32" => DataType::Fp32,
            "INT64" => DataType::Int64,
            "BYTES" => DataType::Bytes,
            other => {
                return Err(ServeError::bad(format!(
                    "tensor '{name}' has datatype '{other}'; FP32, INT64 and BYTES are supported"
                )));
            }
        };
        let shape = self
            .shape
            .iter()
            .map(|&dim| usize::try_from(dim))
            .collect::<Result<_, _>>()
            .map_err(|_| ServeError::bad(format!("tensor '{name}': a dimension is too large")))?;
        Ok((datatype, shape))
    }

    /// The tensor with `bytes` (little-endian, row-major) as its elements.
    pub fn from_bytes(&self, bytes: &[u8]) -> Result<HostTensor, ServeError> {
        let (datatype, shape) = self.datatype_and_shape()?;
        let width = match datatype {
            DataType::Fp32 => 4,
            DataType::Int64 => 8,
            DataType::Bytes => {
                let values = byte_strings(&self.name, bytes)?;
                return HostTensor::new(shape, HostData::Bytes(values))
                    .map_err(|error| ServeError::bad(format!("tensor '{}': {error}", self.name)));
            }
        };
        if !bytes.len().is_multiple_of(width) {
            return Err(ServeError::bad(format!(
                "tensor '{}': {} bytes of binary data are not whole {} elements",
                self.name,
                bytes.len(),
                datatype.name()
            )));
        }
        let data = match datatype {
            DataType::Fp32 => HostData::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                    .collect(),
            ),
            DataType::Int64 => HostData::I64(
                bytes
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                    .collect(),
            ),
            DataType::Bytes => unreachable!("returned above"),
        };
        HostTensor::new(shape, data)
            .map_err(|error| ServeError::bad(format!("tensor '{}': {error}", self.name)))
    }

    /// The tensor's elements, checked against its own shape and data type: flat or nested data,
    /// numbers of the data type only.
    pub fn to_host(&self) -> Result<HostTensor, ServeError> {
        let name = &self.name;
        let (datatype, shape) = self.datatype_and_shape()?;
        let mut leaves = Vec::new();
        flatten(&self.data, &mut leaves, 0)
            .map_err(|message| ServeError::bad(format!("tensor '{name}': {message}")))?;
        let element = |index: usize, value: &Value| {
            let want = match (datatype, value) {
                // A string among numbers.
                (DataType::Fp32 | DataType::Int64, Value::String(_)) => "a number".to_string(),
                _ => datatype.name().to_string(),
            };
            ServeError::bad(format!(
                "tensor '{name}': element {index} is {value}, not {want}"
            ))
        };
        let data = match datatype {
            DataType::Fp32 => HostData::F32(
                leaves
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        v.as_f64()
                            .filter(|x| x.abs() <= f64::from(f32::MAX))
                            .map(|x| x as f32)
                            .ok_or_else(|| element(i, v))
                    })
                    .collect::<Result<_, _>>()?,
            ),
            DataType::Int64 => HostData::I64(
                leaves
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v.as_i64().ok_or_else(|| element(i, v)))
                    .collect::<Result<_, _>>()?,
            ),
            DataType::Bytes => HostData::Bytes(
                leaves
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        v.as_str()
                            .map(|text| text.as_bytes().to_vec())
                            .ok_or_else(|| element(i, v))
                    })
                    .collect::<Result<_, _>>()?,
            ),
        };
        HostTensor::new(shape, data)
            .map_err(|error| ServeError::bad(format!("tensor '{name}': {error}")))
    }

    /// Checks the tensor's name, data type and row shape against the model's input.
    pub fn check_input(&self, spec: &TensorSpec) -> Result<(), ServeError> {
        if self.name != spec.name {
            return Err(ServeError::bad(format!(
                "unknown input '{}': the model's input is '{}'",
                self.name, spec.name
            )));
        }
        if self.datatype != spec.datatype.name() {
            return Err(ServeError::bad(format!(
                "input '{}' has datatype {}; the model takes {}",
                self.name,
                self.datatype,
                spec.datatype.name()
            )));
        }
        let row_shape = spec.row_shape();
        if self.shape.len() != spec.shape.len()
            || self.shape[1..]
                .iter()
                .zip(&row_shape)
                .any(|(&got, &want)| got != want as u64)
        {
            return Err(ServeError::bad(format!(
                "input '{}' has shape {:?}; the model takes {:?}",
                self.name, self.shape, spec.shape
            )));
        }
        Ok(())
    }
}

/// Nesting deeper than this is refused (a shape has at most a few dimensions).
const MAX_DEPTH: usize = 32;

fn flatten<'a>(value: &'a Value, out: &mut Vec<&'a Value>, depth: usize) -> Result<(), String> {
    match value {
        Value::Array(items) if depth < MAX_DEPTH => {
            for item in items {
                flatten(item, out, depth + 1)?;
            }
            Ok(())
        }
        Value::Array(_) => Err(format!("data nested deeper than {MAX_DEPTH}")),
        Value::Number(_) | Value::String(_) if depth > 0 => {
            out.push(value);
            Ok(())
        }
        _ if depth == 0 => Err("data must be an array".to_string()),
        other => Err(format!("element {other} is not a number or a string")),
    }
}

impl InferRequest {
    /// The one input, checked against the model, its data in the JSON or in `binary` (the
    /// body's binary part, empty without one); the outputs asked for must be the model's.
    pub fn input_for(&self, spec: &ModelSpec, binary: &[u8]) -> Result<HostTensor, ServeError> {
        let [input] = self.inputs.as_slice() else {
            return Err(ServeError::bad(format!(
                "the request has {} inputs; model '{}' takes one, '{}'",
                self.inputs.len(),
                spec.name,
                spec.input.name
            )));
        };
        if let Some(unknown) = self
            .outputs
            .iter()
            .flatten()
            .find(|output| output.name != spec.output.name)
        {
            return Err(ServeError::bad(format!(
                "unknown output '{}': the model's output is '{}'",
                unknown.name, spec.output.name
            )));
        }
        input.check_input(&spec.input)?;
        let mut tensors = host_tensors(&self.inputs, binary)?;
        Ok(tensors.pop().expect("one input"))
    }

    /// Whether the answer's outputs are to be binary data: the request's `binary_data_output`
    /// parameter, or an output's `binary_data`.
    pub fn wants_binary_output(&self) -> bool {
        let flag = |parameters: &Option<Value>, key: &str| {
            parameters
                .as_ref()
                .and_then(|p| p.get(key))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        flag(&self.parameters, "binary_data_output")
            || self
                .outputs
                .iter()
                .flatten()
                .any(|output| flag(&output.parameters, "binary_data"))
    }

    /// The deadline the request asks for, in microseconds (`parameters.timeout`).
    pub fn timeout_micros(&self) -> Result<Option<u64>, ServeError> {
        match self.parameters.as_ref().and_then(|p| p.get("timeout")) {
            None => Ok(None),
            Some(value) => value.as_u64().map(Some).ok_or_else(|| {
                ServeError::bad(format!(
                    "parameter 'timeout' is {value}; it must be whole microseconds"
                ))
            }),
        }
    }
}
