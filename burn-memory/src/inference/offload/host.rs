//! A parameter's bytes off the device, shared: loading one hands the same buffer to the
//! tensor instead of copying it.

use burn::tensor::{AllocationProperty, Bytes, DType, Shape, TensorData};

/// One parameter on the host tier or read from the disk cache: an immutable, reference-counted
/// buffer (heap memory, or a memory-mapped file) and what it holds.
#[derive(Clone, Debug)]
pub(crate) struct HostTensor {
    pub(crate) bytes: bytes::Bytes,
    pub(crate) shape: Shape,
    pub(crate) dtype: DType,
    /// Where the bytes live, which tells GPU backends how to stage the upload.
    pub(crate) property: AllocationProperty,
}

/// Lets a tensor's own allocation back a shared buffer without a copy.
struct Owned(Bytes);

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl HostTensor {
    /// Takes a tensor's data over (no copy).
    pub(crate) fn from_data(data: TensorData) -> Self {
        Self {
            bytes: bytes::Bytes::from_owner(Owned(data.bytes)),
            shape: data.shape,
            dtype: data.dtype,
            property: AllocationProperty::Native,
        }
    }

    /// Tensor data over the same bytes (no copy): a backend that writes to it copies first.
    pub(crate) fn to_data(&self) -> TensorData {
        TensorData::from_bytes(
            Bytes::from_shared(self.bytes.clone(), self.property),
            self.shape.clone(),
            self.dtype,
        )
    }

    pub(crate) fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// The tensors of a safetensors file held in `raw`, by name, each a slice of `raw`.
    pub(crate) fn all_in_safetensors(
        raw: &bytes::Bytes,
        property: AllocationProperty,
    ) -> Result<Vec<(String, HostTensor)>, String> {
        let tensors = safetensors::SafeTensors::deserialize(raw).map_err(|e| e.to_string())?;
        tensors
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                let dtype = match view.dtype() {
                    safetensors::Dtype::F64 => DType::F64,
                    safetensors::Dtype::F32 => DType::F32,
                    safetensors::Dtype::F16 => DType::F16,
                    safetensors::Dtype::BF16 => DType::BF16,
                    other => return Err(format!("`{name}` is {other:?}, not a float type")),
                };
                let start = view.data().as_ptr() as usize - raw.as_ptr() as usize;
                let tensor = HostTensor {
                    bytes: raw.slice(start..start + view.data().len()),
                    shape: view.shape().into(),
                    dtype,
                    property,
                };
                Ok((name, tensor))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_round_trips_without_a_copy() {
        let expected = TensorData::new(vec![1.0f32, -2.5, 3.0, 4.25], [2, 2]);
        let data = expected.clone();
        let pointer = data.as_bytes().as_ptr();
        let host = HostTensor::from_data(data);
        assert_eq!(host.len(), 16);
        assert_eq!(host.bytes.as_ptr(), pointer, "the tensor's own buffer");
        let back = host.to_data();
        assert_eq!(back, expected);
        assert_eq!(back.as_bytes().as_ptr(), pointer, "the same buffer again");
    }
}
