//! `FastFlex`'s `attention`: Burn's scaled-dot-product attention op on
//! [`attention::forward`](burn_cpu_kernels::attention::forward), fused per block of queries
//! (scores, mask, softmax and the product with `V` without the `[batch, heads, seq, seq]`
//! scores), reading its operands through their strides (heads split from `[b, s, h, d]` by a
//! permutation arrive without a copy).

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape};
use burn_backend::ops::AttentionModuleOptions;
use half::bf16;

use burn_cpu_kernels::StoredFloat;
use burn_cpu_kernels::attention::{self, Options, View4};

/// The fused forward, or `None` where it does not apply (ranks other than 4, mixed or `f64`
/// types, a bool mask stored as `u32`): then Flex's own attention runs.
pub(super) fn forward(
    query: &FlexTensor,
    key: &FlexTensor,
    value: &FlexTensor,
    mask: Option<&FlexTensor>,
    bias: Option<&FlexTensor>,
    options: &AttentionModuleOptions,
) -> Option<FlexTensor> {
    let dtype = query.dtype();
    let same = [Some(key), Some(value), bias]
        .into_iter()
        .flatten()
        .all(|t| t.dtype() == dtype);
    let ranks = [Some(query), Some(key), Some(value), mask, bias]
        .into_iter()
        .flatten()
        .all(|t| t.layout().num_dims() == 4);
    let mask_bytes = mask.is_none_or(|m| {
        matches!(
            m.dtype(),
            DType::Bool(burn_backend::BoolStore::Native | burn_backend::BoolStore::U8)
        )
    });
    if !(same && ranks && mask_bytes) {
        return None;
    }
    let [b, h, sq, _] = dims(query);
    let dv = dims(value)[3];
    let options = Options {
        scale: options.scale.map(|s| s as f32),
        softcap: options.softcap.map(|s| s as f32),
        causal: options.is_causal,
    };
    let mask = mask.map(|m| view(m, m.bytes()));
    let shape = Shape::from(vec![b, h, sq, dv]);
    match dtype {
        DType::F32 => {
            let mut out = vec![0.0f32; b * h * sq * dv];
            run::<f32>(&mut out, query, key, value, mask, bias, options);
            Some(FlexTensor::new(
                Bytes::from_elems(out),
                Layout::contiguous(shape),
                dtype,
            ))
        }
        DType::BF16 => {
            let mut out = vec![bf16::ZERO; b * h * sq * dv];
            run::<bf16>(&mut out, query, key, value, mask, bias, options);
            Some(FlexTensor::new(
                Bytes::from_elems(out),
                Layout::contiguous(shape),
                dtype,
            ))
        }
        _ => None,
    }
}

fn run<E: StoredFloat + burn::tensor::Element + bytemuck::Pod>(
    out: &mut [E],
    query: &FlexTensor,
    key: &FlexTensor,
    value: &FlexTensor,
    mask: Option<View4<'_, u8>>,
    bias: Option<&FlexTensor>,
    options: Options,
) {
    let q = view(query, query.storage::<E>());
    let k = view(key, key.storage::<E>());
    let v = view(value, value.storage::<E>());
    let bias = bias.map(|t| view(t, t.storage::<E>()));
    attention::forward(out, q, k, v, mask, bias, options, true);
}

fn dims(tensor: &FlexTensor) -> [usize; 4] {
    let shape = tensor.layout().shape();
    [shape[0], shape[1], shape[2], shape[3]]
}

/// A rank-4 tensor's buffer through its layout.
fn view<'a, T: Copy>(tensor: &FlexTensor, data: &'a [T]) -> View4<'a, T> {
    let layout = tensor.layout();
    let s = layout.strides();
    View4::strided(
        data,
        layout.start_offset(),
        dims(tensor),
        [s[0], s[1], s[2], s[3]],
    )
}
