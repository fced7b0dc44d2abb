//! `FastFlex`'s `attention`: Burn's scaled-dot-product attention op on
//! [`attention::forward`](burn_cpu_kernels::attention::forward), fused per block of queries
//! (scores, mask, softmax and the product with `V` without the `[batch, heads, seq, seq]`
//! scores), reading its operands through their strides (heads split from `[b, s, h, d]` by a
//! permutation arrive without a copy).

use burn::backend::flex::FlexTensor;
use burn::tensor::DType;
use burn_backend::ops::AttentionModuleOptions;
use half::bf16;

use burn_cpu_kernels::StoredFloat;
use burn_cpu_kernels::View4;
use burn_cpu_kernels::attention::{self, Options};

use super::FastPath;
use crate::flex_view::{self, FlexFloat};

/// Attention's operands: query, key, value, the optional bool mask and the optional bias.
pub(super) type Operands = (
    FlexTensor,
    FlexTensor,
    FlexTensor,
    Option<FlexTensor>,
    Option<FlexTensor>,
);

/// The fused forward in `f32` or `bf16`; where it does not apply (ranks other than 4, mixed,
/// `f16` or `f64` types, a bool mask stored as `u32`) the operands come back as the `Err`.
pub(super) fn forward(operands: Operands, options: &AttentionModuleOptions) -> FastPath<Operands> {
    let (query, key, value, mask, bias) = &operands;
    let dtype = query.dtype();
    let same = [Some(key), Some(value), bias.as_ref()]
        .into_iter()
        .flatten()
        .all(|t| t.dtype() == dtype);
    let ranks = [
        Some(query),
        Some(key),
        Some(value),
        mask.as_ref(),
        bias.as_ref(),
    ]
    .into_iter()
    .flatten()
    .all(|t| t.layout().num_dims() == 4);
    let mask_bytes = mask.as_ref().is_none_or(flex_view::is_byte_mask);
    if !(same && ranks && mask_bytes && matches!(dtype, DType::F32 | DType::BF16)) {
        return Err(operands);
    }
    let options = Options {
        scale: options.scale.map(|s| s as f32),
        softcap: options.softcap.map(|s| s as f32),
        causal: options.is_causal,
        dropout: None,
    };
    let mask = mask.as_ref().map(flex_view::mask4);
    let bias = bias.as_ref();
    Ok(match dtype {
        DType::F32 => run::<f32>(query, key, value, mask, bias, options),
        _ => run::<bf16>(query, key, value, mask, bias, options),
    })
}

fn run<E: StoredFloat + FlexFloat>(
    query: &FlexTensor,
    key: &FlexTensor,
    value: &FlexTensor,
    mask: Option<View4<'_, u8>>,
    bias: Option<&FlexTensor>,
    options: Options,
) -> FlexTensor {
    let (q, k, v) = (
        flex_view::view4::<E>(query),
        flex_view::view4::<E>(key),
        flex_view::view4::<E>(value),
    );
    let ([b, h, sq, _], dv) = (q.shape(), v.shape()[3]);
    let mut out = vec![E::default(); b * h * sq * dv];
    let bias = bias.map(flex_view::view4::<E>);
    attention::forward(&mut out, q, k, v, mask, bias, options, true);
    flex_view::tensor(out, [b, h, sq, dv])
}
