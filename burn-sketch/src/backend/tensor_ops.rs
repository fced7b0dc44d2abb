//! The sketched product written with Burn tensor operations, valid on every backend.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::{SketchGradients, SketchWeights, WantedGradients};

/// The sketched linear layer as two products through the rank-`2Tk` intermediate:
/// `y = P·B / (2T) + bias`, with `P = [x·S1 | x·U2]` (`n × 2Tk`) and `B = [U1; S2]`
/// (`2Tk × d_out`), so that `P·B = Σ_t (x·S1_t·U1_t + x·U2_t·S2_t)`.
///
/// This form keeps the cost at `2·n·2Tk·(d_in + d_out)` FLOPs, writes the output once and
/// never copies the input-side factors (the book's "Backends and kernels" says why that
/// matters). The `1/(2T)` scale is applied to whichever of `P` and `B` is smaller.
pub fn sketched_linear<B: Backend>(
    x: Tensor<B, 2>,
    weights: SketchWeights<B>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, 2> {
    let [terms, _, k] = weights.s1s.dims();
    let d_output = weights.s2s.dims()[2];
    let rows = x.dims()[0];
    let scale = 1.0 / (2.0 * terms as f64);

    let p = Tensor::cat(vec![project(&x, weights.s1s), project(&x, weights.u2s)], 1);
    let b = Tensor::cat(
        vec![
            weights.u1s.reshape([terms * k, d_output]),
            weights.s2s.reshape([terms * k, d_output]),
        ],
        0,
    );
    let output = if rows <= d_output {
        p.mul_scalar(scale).matmul(b)
    } else {
        p.matmul(b.mul_scalar(scale))
    };
    match bias {
        Some(bias) => output + bias.unsqueeze_dim(0),
        None => output,
    }
}

/// `x` times an input-side factor (`[T, d_in, k]`): `[n, Tk]`, term-major columns.
fn project<B: Backend>(x: &Tensor<B, 2>, factor: Tensor<B, 3>) -> Tensor<B, 2> {
    let [terms, d_input, k] = factor.dims();
    let rows = x.dims()[0];
    if terms == 1 {
        x.clone().matmul(factor.reshape([d_input, k]))
    } else {
        x.clone()
            .unsqueeze::<3>()
            .matmul(factor)
            .swap_dims(0, 1)
            .reshape([rows, terms * k])
    }
}

/// The gradients of [`sketched_linear`] given `∂y` (`[n, d_out]`), by the closed forms
/// (`α = 1/(2T)`, `P₁ = x·S1`, `P₂ = x·U2`):
///
/// `∂P₁ = α·∂y·U1ᵀ`, `∂P₂ = α·∂y·S2ᵀ`, `∂x = ∂P₁·S1ᵀ + ∂P₂·U2ᵀ`, `∂S1 = xᵀ·∂P₁`,
/// `∂U2 = xᵀ·∂P₂`, `∂S2 = α·P₂ᵀ·∂y`, `∂U1 = α·P₁ᵀ·∂y`.
///
/// `P₁`/`P₂` are recomputed from `x` rather than kept from the forward pass, so a training
/// graph holds only the layer's input. Only the `wanted` gradients are computed.
pub fn sketched_linear_backward<B: Backend>(
    x: Tensor<B, 2>,
    weights: SketchWeights<B>,
    grad_output: Tensor<B, 2>,
    wanted: WantedGradients,
) -> SketchGradients<B> {
    let [terms, d_input, k] = weights.s1s.dims();
    let d_output = weights.s2s.dims()[2];
    let rows = x.dims()[0];
    let half = terms * k;
    let scale = 1.0 / (2.0 * terms as f64);
    // α is applied to the `[n, Tk]` and `[Tk, d_out]` products, never to the whole `∂y`.

    // α·∂y·Gᵀ for an output-side factor `[T, k, d_out]`: `[n, Tk]`.
    let grad_projection = |factor: &Tensor<B, 3>| {
        grad_output
            .clone()
            .matmul(factor.clone().reshape([half, d_output]).transpose())
            .mul_scalar(scale)
    };
    let grad_p1 = (wanted.x || wanted.s1s).then(|| grad_projection(&weights.u1s));
    let grad_p2 = (wanted.x || wanted.u2s).then(|| grad_projection(&weights.s2s));

    // ∂P·Fᵀ for an input-side factor `[T, d_in, k]`: `[n, d_in]`, summed over terms.
    let back_project = |grad_p: &Tensor<B, 2>, factor: &Tensor<B, 3>| {
        if terms == 1 {
            grad_p
                .clone()
                .matmul(factor.clone().reshape([d_input, k]).transpose())
        } else {
            grad_p
                .clone()
                .reshape([rows, terms, k])
                .swap_dims(0, 1)
                .matmul(factor.clone().swap_dims(1, 2))
                .sum_dim(0)
                .reshape([rows, d_input])
        }
    };
    let grad_x = match (&grad_p1, &grad_p2) {
        (Some(grad_p1), Some(grad_p2)) if wanted.x => {
            Some(back_project(grad_p1, &weights.s1s) + back_project(grad_p2, &weights.u2s))
        }
        _ => None,
    };

    // xᵀ·∂P as `[T, d_in, k]`.
    let input_factor_grad = |grad_p: &Tensor<B, 2>| {
        let grad = x.clone().transpose().matmul(grad_p.clone());
        if terms == 1 {
            grad.reshape([1, d_input, k])
        } else {
            grad.reshape([d_input, terms, k]).swap_dims(0, 1)
        }
    };
    // α·Pᵀ·∂y as `[T, k, d_out]`, `P` recomputed.
    let output_factor_grad = |factor: &Tensor<B, 3>| {
        project(&x, factor.clone())
            .transpose()
            .matmul(grad_output.clone())
            .mul_scalar(scale)
            .reshape([terms, k, d_output])
    };

    SketchGradients {
        s1s: grad_p1
            .as_ref()
            .filter(|_| wanted.s1s)
            .map(input_factor_grad),
        u2s: grad_p2
            .as_ref()
            .filter(|_| wanted.u2s)
            .map(input_factor_grad),
        s2s: wanted.s2s.then(|| output_factor_grad(&weights.u2s)),
        u1s: wanted.u1s.then(|| output_factor_grad(&weights.s1s)),
        x: grad_x,
    }
}
