//! How masks are chosen: the host-side ranking shared by every layer.
//!
//! Pruning runs once, so the ranking reads the weights (or the row norms) back to the host
//! and sorts them there: a stable sort on `(|w|, index)` makes ties deterministic (the earlier
//! index goes first) on every backend, which `topk` on a device does not promise.

use burn::module::{Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::Norm;
use crate::CompressError;

/// The values of `tensor` as `f32`s on the host.
pub(crate) fn host_values<B: Backend, const D: usize>(
    tensor: Tensor<B, D>,
) -> Result<Vec<f32>, CompressError> {
    tensor
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|err| CompressError::Unsupported {
            what: format!("reading weights back to rank them: {err:?}"),
        })
}

/// A keep-mask (`1` kept, `0` removed) over `scores`, removing the `remove` smallest ones;
/// ties go to the smaller index. NaN scores rank last and are kept.
pub(crate) fn keep_mask(scores: &[f32], remove: usize) -> Vec<f32> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    // Stable, so equal scores keep their index order.
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let mut mask = vec![1.0; scores.len()];
    for &index in order.iter().take(remove) {
        mask[index] = 0.0;
    }
    mask
}

/// The magnitude mask of `weight`, same shape: its `remove` entries of smallest `|w|` at 0.
pub(crate) fn magnitude_mask<B: Backend, const D: usize>(
    weight: Tensor<B, D>,
    remove: usize,
) -> Result<Tensor<B, D>, CompressError> {
    let device = weight.device();
    let shape = weight.shape();
    let scores: Vec<f32> = host_values(weight)?.into_iter().map(f32::abs).collect();
    let mask = keep_mask(&scores, remove);
    Ok(Tensor::from_data(TensorData::new(mask, shape), &device))
}

/// The keep-mask `[units]` of the rows of `matrix` (`[units, fan_in]`) by their `norm`,
/// removing `remove` of them.
pub(crate) fn unit_mask<B: Backend>(
    matrix: Tensor<B, 2>,
    norm: Norm,
    remove: usize,
) -> Result<Tensor<B, 1>, CompressError> {
    let device = matrix.device();
    let [units, _] = matrix.dims();
    let norms: Tensor<B, 2> = match norm {
        Norm::L1 => matrix.abs().sum_dim(1),
        Norm::L2 => matrix.square().sum_dim(1).sqrt(),
        Norm::Inf => matrix.abs().max_dim(1),
    };
    let scores = host_values(norms)?;
    let mask = keep_mask(&scores, remove);
    Ok(Tensor::from_data(TensorData::new(mask, [units]), &device))
}

/// The indices where a keep-mask is set.
pub(crate) fn kept_indices<B: Backend>(mask: Tensor<B, 1>) -> Result<Vec<usize>, CompressError> {
    Ok(host_values(mask)?
        .iter()
        .enumerate()
        .filter(|&(_, &m)| m != 0.0)
        .map(|(i, _)| i)
        .collect())
}

/// A mask as fixed module state: recorded with the layer (so a checkpoint of a masked model
/// keeps its masks), never given a gradient, so optimizers leave it alone.
pub(crate) fn mask_param<B: Backend, const D: usize>(mask: Tensor<B, D>) -> Param<Tensor<B, D>> {
    Param::initialized(ParamId::new(), mask.detach().set_require_grad(false))
}

/// A trainable parameter holding `value` as a fresh leaf (detached from any graph), keeping
/// `id` so that an optimizer's state for it still applies.
pub(crate) fn leaf<B: Backend, const D: usize>(
    id: ParamId,
    value: Tensor<B, D>,
    require_grad: bool,
) -> Param<Tensor<B, D>> {
    Param::initialized(id, value.detach().set_require_grad(require_grad))
}

/// An `Int` index tensor of `keep` on `device`.
pub(crate) fn index_tensor<B: Backend>(keep: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    let values: Vec<i64> = keep.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(values, [keep.len()]), device)
}
