//! Layer normalisation as one training operation: [`fused_layer_norm`], and
//! [`fused_layer_norm_module`] for Burn's `LayerNorm` module (its parameters, this
//! operation).

use burn::module::{Content, DisplaySettings, ModuleDisplay};
use burn::nn::LayerNorm;
use burn::tensor::Tensor;

use crate::FusedBackend;

/// `(x − mean)/√(var + ε)·γ + β` over the last dimension, differentiable in `x`, `gamma`
/// and `beta` as one node that keeps each row's mean and inverse deviation.
///
/// # Shapes
/// - `x`: `[..., n]`; `gamma`, `beta`: `[n]`
/// - output: the shape of `x`
///
/// # Panics
/// If `gamma` or `beta` does not have `n` values.
pub fn fused_layer_norm<B: FusedBackend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    epsilon: f64,
) -> Tensor<B, D> {
    let shape = x.dims();
    let n = shape[D - 1];
    for (name, p) in [("gamma", Some(&gamma)), ("beta", beta.as_ref())] {
        if let Some(p) = p {
            assert_eq!(
                p.dims(),
                [n],
                "fused_layer_norm: {name} does not have {n} values"
            );
        }
    }
    let rows = shape[..D - 1].iter().product();
    let output = B::fused_layer_norm_forward(x.reshape([rows, n]), gamma, beta, epsilon).output;
    output.reshape(shape)
}

/// Burn's [`LayerNorm`] module computed by [`fused_layer_norm`]: the same parameters and
/// result, one graph node instead of Burn's decomposition.
///
/// # Panics
/// If the module does not report its epsilon (see [`layer_norm_epsilon`]).
pub fn fused_layer_norm_module<B: FusedBackend, const D: usize>(
    norm: &LayerNorm<B>,
    x: Tensor<B, D>,
) -> Tensor<B, D> {
    fused_layer_norm(
        x,
        norm.gamma.val(),
        norm.beta.as_ref().map(|beta| beta.val()),
        layer_norm_epsilon(norm),
    )
}

/// The epsilon of Burn's [`LayerNorm`], which burn-nn 0.21 keeps private and reports only
/// in the module's display: read from that attribute (Rust's shortest round-trip formatting
/// of an `f64`, so exact).
///
/// # Panics
/// If the display has no parsable `epsilon` attribute (a Burn other than 0.21).
pub fn layer_norm_epsilon<B: burn::tensor::backend::Backend>(norm: &LayerNorm<B>) -> f64 {
    let content = norm.custom_content(Content::new(DisplaySettings::new()));
    content
        .iter()
        .flat_map(|content| &content.attributes)
        .find(|attribute| attribute.name == "epsilon")
        .and_then(|attribute| attribute.value.trim().parse().ok())
        .unwrap_or_else(|| panic!("LayerNorm reports no epsilon in its display: {norm}"))
}
