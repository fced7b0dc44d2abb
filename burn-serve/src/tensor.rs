//! Tensors on the host, as requests carry them and as the batcher concatenates them.

use serde::{Deserialize, Serialize};

use crate::ServeError;

/// The element types a served tensor may have, by their Open Inference Protocol names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DataType {
    /// 32-bit float (`FP32`): features, images, logits.
    #[serde(rename = "FP32")]
    Fp32,
    /// 64-bit signed integer (`INT64`): token ids, class indices.
    #[serde(rename = "INT64")]
    Int64,
    /// Byte strings (`BYTES`): texts, for a model with a tokenizer ([`crate::TextModel`]).
    #[serde(rename = "BYTES")]
    Bytes,
}

impl DataType {
    /// The protocol's name of the type (`FP32`, `INT64`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Fp32 => "FP32",
            Self::Int64 => "INT64",
            Self::Bytes => "BYTES",
        }
    }
}

/// The elements of a [`HostTensor`], row-major.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// `FP32` elements.
    F32(Vec<f32>),
    /// `INT64` elements.
    I64(Vec<i64>),
    /// `BYTES` elements, each a byte string (UTF-8 text, for a text model).
    Bytes(Vec<Vec<u8>>),
}

impl HostData {
    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(values) => values.len(),
            Self::I64(values) => values.len(),
            Self::Bytes(values) => values.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn data_type(&self) -> DataType {
        match self {
            Self::F32(_) => DataType::Fp32,
            Self::I64(_) => DataType::Int64,
            Self::Bytes(_) => DataType::Bytes,
        }
    }
}

/// A tensor in host memory whose first dimension is the batch: `shape = [rows, ...]`.
///
/// Requests arrive as host tensors; the batcher concatenates several along the rows into one
/// batch ([`HostTensor::concat`]) and splits the model's output back ([`HostTensor::split`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    shape: Vec<usize>,
    data: HostData,
}

impl HostTensor {
    /// A tensor of `shape` holding `data` row-major. Fails when the shape has no batch
    /// dimension or the element count is not the shape's product.
    pub fn new(shape: Vec<usize>, data: HostData) -> Result<Self, ServeError> {
        if shape.is_empty() {
            return Err(ServeError::bad(
                "a tensor needs a batch dimension: its shape is empty",
            ));
        }
        let elements = shape
            .iter()
            .try_fold(1usize, |product, &dim| product.checked_mul(dim))
            .ok_or_else(|| ServeError::bad(format!("shape {shape:?} overflows")))?;
        if elements != data.len() {
            return Err(ServeError::bad(format!(
                "shape {shape:?} holds {elements} elements, the data has {}",
                data.len()
            )));
        }
        Ok(Self { shape, data })
    }

    /// A `[rows, cols]` `FP32` tensor.
    pub fn f32(rows: usize, cols: usize, values: Vec<f32>) -> Result<Self, ServeError> {
        Self::new(vec![rows, cols], HostData::F32(values))
    }

    /// A `[texts]` `BYTES` tensor: one UTF-8 text per row, as a text model takes them.
    pub fn texts<S: Into<String>>(texts: impl IntoIterator<Item = S>) -> Self {
        let values: Vec<Vec<u8>> = texts
            .into_iter()
            .map(|text| text.into().into_bytes())
            .collect();
        Self {
            shape: vec![values.len()],
            data: HostData::Bytes(values),
        }
    }

    /// The shape, batch dimension first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of rows (the first dimension).
    pub fn rows(&self) -> usize {
        self.shape[0]
    }

    /// The shape of one row (the dimensions after the first).
    pub fn row_shape(&self) -> &[usize] {
        &self.shape[1..]
    }

    /// Elements per row.
    pub fn row_len(&self) -> usize {
        self.shape[1..].iter().product()
    }

    /// The elements.
    pub fn data(&self) -> &HostData {
        &self.data
    }

    /// The element type.
    pub fn data_type(&self) -> DataType {
        self.data.data_type()
    }

    /// The elements, taken.
    pub fn into_data(self) -> HostData {
        self.data
    }

    /// Rows `0..` of every part, in order, as one tensor. The parts must agree in row shape and
    /// element type (the batcher's parts do: the server checked them against the model).
    pub fn concat(parts: Vec<HostTensor>) -> Result<Self, ServeError> {
        let first = parts
            .first()
            .ok_or_else(|| ServeError::invalid("batch", "no parts to concatenate"))?;
        let row_shape = first.row_shape().to_vec();
        let data_type = first.data_type();
        if let Some(other) = parts
            .iter()
            .find(|part| part.row_shape() != row_shape || part.data_type() != data_type)
        {
            return Err(ServeError::invalid(
                "batch",
                format!(
                    "rows of {:?} {:?} and {:?} {:?} cannot be concatenated",
                    row_shape,
                    data_type,
                    other.row_shape(),
                    other.data_type()
                ),
            ));
        }
        if parts.len() == 1 {
            return Ok(parts.into_iter().next().expect("one part"));
        }
        let rows = parts.iter().map(HostTensor::rows).sum();
        let mut data = match data_type {
            DataType::Fp32 => HostData::F32(Vec::new()),
            DataType::Int64 => HostData::I64(Vec::new()),
            DataType::Bytes => HostData::Bytes(Vec::new()),
        };
        for part in parts {
            match (&mut data, part.data) {
                (HostData::F32(all), HostData::F32(values)) => all.extend(values),
                (HostData::I64(all), HostData::I64(values)) => all.extend(values),
                (HostData::Bytes(all), HostData::Bytes(values)) => all.extend(values),
                _ => unreachable!("checked above"),
            }
        }
        let mut shape = vec![rows];
        shape.extend(row_shape);
        Self::new(shape, data)
    }

    /// The rows split into consecutive parts of `sizes` rows (which must sum to the rows).
    pub fn split(self, sizes: &[usize]) -> Result<Vec<HostTensor>, ServeError> {
        let total: usize = sizes.iter().sum();
        if total != self.rows() {
            return Err(ServeError::Model(format!(
                "the output has {} rows for a batch of {total}",
                self.rows()
            )));
        }
        if sizes.len() == 1 {
            return Ok(vec![self]);
        }
        let row_len = self.row_len();
        let row_shape = self.row_shape().to_vec();
        let shape_of = |rows: usize| {
            let mut shape = vec![rows];
            shape.extend(&row_shape);
            shape
        };
        fn cut<T: Clone>(values: &[T], sizes: &[usize], row_len: usize) -> Vec<Vec<T>> {
            let mut start = 0;
            sizes
                .iter()
                .map(|&rows| {
                    let part = values[start..start + rows * row_len].to_vec();
                    start += rows * row_len;
                    part
                })
                .collect()
        }
        let parts: Vec<HostData> = match &self.data {
            HostData::F32(values) => cut(values, sizes, row_len)
                .into_iter()
                .map(HostData::F32)
                .collect(),
            HostData::I64(values) => cut(values, sizes, row_len)
                .into_iter()
                .map(HostData::I64)
                .collect(),
            HostData::Bytes(values) => cut(values, sizes, row_len)
                .into_iter()
                .map(HostData::Bytes)
                .collect(),
        };
        Ok(sizes
            .iter()
            .zip(parts)
            .map(|(&rows, data)| HostTensor {
                shape: shape_of(rows),
                data,
            })
            .collect())
    }
}
