//! Inference over inputs too large for one pass.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::MemoryError;

/// Runs `forward` over `input` in chunks of at most `chunk_size` rows (dimension 0) and returns
/// what one pass over the whole input would: row-wise models give identical results.
///
/// Peak memory is the input, the output and **one** chunk's activations, instead of every row's:
/// the output is allocated once, and each chunk's activations are freed before the next runs.
/// Fails with [`MemoryError::Invalid`] for a zero `chunk_size`, or when `forward` does not map
/// each chunk's rows to as many rows of one shape. Example: the book's chapter on chunked
/// inference.
pub fn chunked_forward<B, const D: usize, const D2: usize>(
    input: Tensor<B, D>,
    chunk_size: usize,
    mut forward: impl FnMut(Tensor<B, D>) -> Tensor<B, D2>,
) -> Result<Tensor<B, D2>, MemoryError>
where
    B: Backend,
{
    if chunk_size == 0 {
        return Err(MemoryError::invalid("chunk size", "0 rows"));
    }
    let rows = input.dims()[0];
    if rows <= chunk_size {
        return Ok(forward(input));
    }
    let device = input.device();
    let mut output: Option<Tensor<B, D2>> = None;
    for start in (0..rows).step_by(chunk_size) {
        let len = chunk_size.min(rows - start);
        let part = forward(input.clone().narrow(0, start, len));
        let part_rows = part.dims()[0];
        if part_rows != len {
            return Err(MemoryError::invalid(
                "forward",
                format!("returned {part_rows} rows for a chunk of {len}: it must map rows to rows"),
            ));
        }
        let out = match output.take() {
            Some(out) => {
                let expected = (&out.dims()[1..], out.dtype());
                let found = (&part.dims()[1..], part.dtype());
                if expected != found {
                    return Err(MemoryError::invalid(
                        "forward",
                        format!(
                            "returned rows of shape and type {found:?} for rows {start}.., \
                             {expected:?} before: every chunk's rows must have the same ones"
                        ),
                    ));
                }
                out
            }
            None => {
                let mut dims = part.dims();
                dims[0] = rows;
                Tensor::empty(dims, (&device, part.dtype()))
            }
        };
        // One range: the rows of this chunk along the first dimension, all of the others.
        #[allow(clippy::single_range_in_vec_init)]
        let rows_of_chunk = [start..start + len];
        output = Some(out.slice_assign(rows_of_chunk, part));
    }
    Ok(output.expect("at least one chunk ran"))
}
