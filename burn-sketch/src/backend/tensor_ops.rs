//! The sketched product written with Burn tensor operations, valid on every backend.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::SketchWeights;

/// The sketched linear layer as two dense products through the rank-`2Tk` intermediate:
/// `y = (x·A)·B / (2T) + bias` with `A`, `B` from [`SketchWeights::factors`].
///
/// This is the form that keeps the cost at `2·n·2Tk·(d_in + d_out)` FLOPs in two large
/// products, rather than `4T` small ones and a sum. The `1/(2T)` scale is applied to whichever
/// of the intermediate `x·A` (`n × 2Tk`) and the factor `B` (`2Tk × d_out`) is smaller.
pub fn sketched_linear<B: Backend>(
    x: Tensor<B, 2>,
    weights: SketchWeights<B>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, 2> {
    let scale = 1.0 / (2.0 * weights.num_terms() as f64);
    let [rows, _] = x.dims();
    let (a, b) = weights.factors();
    let [_, d_output] = b.dims();

    let projected = x.matmul(a);
    let output = if rows <= d_output {
        projected.mul_scalar(scale).matmul(b)
    } else {
        projected.matmul(b.mul_scalar(scale))
    };
    match bias {
        Some(bias) => output + bias.unsqueeze_dim(0),
        None => output,
    }
}
