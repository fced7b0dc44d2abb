//! The sketched product written with Burn tensor operations, valid on every backend.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::SketchWeights;

/// The sketched linear layer as two products through the rank-`2Tk` intermediate:
///
/// `y = P·B / (2T) + bias`, with `P = [x·S1 | x·U2]` (`n × 2Tk`) and `B = [U1; S2]`
/// (`2Tk × d_out`), where `x·S1 = [x·S1_1 | … | x·S1_T]` and `U1 = [U1_1; …; U1_T]`, likewise
/// for the second half. Then `P·B = Σ_t (x·S1_t·U1_t + x·U2_t·S2_t)`.
///
/// Why this form: the cost stays at `2·n·2Tk·(d_in + d_out)` FLOPs, the `n × d_out` output is
/// written once by a single product, and the only copies are of `P` (small) and of `B`, which
/// is two contiguous blocks because `U1s`/`S2s` are `[T, k, d_out]`. The input-side factors
/// `S1s`/`U2s` (`[T, d_in, k]`) are never copied: for `T > 1`, `x` meets them in a broadcast
/// batched product and only its small `[T, n, k]` results are reordered. Interleaving them
/// into one `[d_in, 2Tk]` factor instead would copy both weights on every call, which on CPU
/// costs about as much as the products themselves.
///
/// The `1/(2T)` scale is applied to whichever of `P` and `B` is smaller.
pub fn sketched_linear<B: Backend>(
    x: Tensor<B, 2>,
    weights: SketchWeights<B>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, 2> {
    let [terms, d_input, k] = weights.s1s.dims();
    let d_output = weights.s2s.dims()[2];
    let [rows, _] = x.dims();
    let scale = 1.0 / (2.0 * terms as f64);

    // `x` times an input-side factor: `[n, Tk]`, term-major columns.
    let project = |factor: Tensor<B, 3>| -> Tensor<B, 2> {
        if terms == 1 {
            x.clone().matmul(factor.reshape([d_input, k]))
        } else {
            x.clone()
                .unsqueeze::<3>()
                .matmul(factor)
                .swap_dims(0, 1)
                .reshape([rows, terms * k])
        }
    };
    let p = Tensor::cat(vec![project(weights.s1s), project(weights.u2s)], 1);
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
