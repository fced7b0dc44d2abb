//! The sketched layer in plain Rust, in `f64`, term by term as the maths is written: the
//! independent reference the kernels are tested against.
//!
//! Nothing here shares code with the kernels (no layouts, no tiles), so an indexing mistake
//! in one is not repeated in the other. It is O(n·d·Tk) with no blocking: for tests only.

use crate::Activation;

/// A sketched layer's sizes and factors, as contiguous row-major `f32` slices.
#[derive(Debug, Clone, Copy)]
pub struct HostLayer<'a> {
    /// `T`.
    pub terms: usize,
    /// `d_in`.
    pub d_in: usize,
    /// `k`.
    pub low_rank: usize,
    /// `d_out`.
    pub d_out: usize,
    /// `[T, d_in, k]`.
    pub s1s: &'a [f32],
    /// `[T, k, d_out]`.
    pub s2s: &'a [f32],
    /// `[T, k, d_out]`.
    pub u1s: &'a [f32],
    /// `[T, d_in, k]`.
    pub u2s: &'a [f32],
}

/// All gradients of the layer, row-major, in the shapes of their inputs.
#[derive(Debug, Clone)]
pub struct HostGradients {
    /// `[n, d_in]`.
    pub x: Vec<f32>,
    /// `[T, d_in, k]`.
    pub s1s: Vec<f32>,
    /// `[T, k, d_out]`.
    pub s2s: Vec<f32>,
    /// `[T, k, d_out]`.
    pub u1s: Vec<f32>,
    /// `[T, d_in, k]`.
    pub u2s: Vec<f32>,
}

impl HostLayer<'_> {
    fn alpha(&self) -> f64 {
        1.0 / (2.0 * self.terms as f64)
    }

    fn input_index(&self, t: usize, m: usize, c: usize) -> usize {
        (t * self.d_in + m) * self.low_rank + c
    }

    fn output_index(&self, t: usize, c: usize, o: usize) -> usize {
        (t * self.low_rank + c) * self.d_out + o
    }

    /// `x·F` for an input-side factor: `[n][T][k]`.
    fn project(&self, x: &[f32], rows: usize, factor: &[f32]) -> Vec<f64> {
        let mut p = vec![0.0; rows * self.terms * self.low_rank];
        for i in 0..rows {
            for t in 0..self.terms {
                for c in 0..self.low_rank {
                    p[(i * self.terms + t) * self.low_rank + c] = (0..self.d_in)
                        .map(|m| {
                            x[i * self.d_in + m] as f64 * factor[self.input_index(t, m, c)] as f64
                        })
                        .sum();
                }
            }
        }
        p
    }

    /// `α·∂y·Gᵀ` for an output-side factor: `[n][T][k]`.
    fn grad_projection(&self, grad_output: &[f32], rows: usize, factor: &[f32]) -> Vec<f64> {
        let mut p = vec![0.0; rows * self.terms * self.low_rank];
        for i in 0..rows {
            for t in 0..self.terms {
                for c in 0..self.low_rank {
                    let dot: f64 = (0..self.d_out)
                        .map(|o| {
                            grad_output[i * self.d_out + o] as f64
                                * factor[self.output_index(t, c, o)] as f64
                        })
                        .sum();
                    p[(i * self.terms + t) * self.low_rank + c] = self.alpha() * dot;
                }
            }
        }
        p
    }

    /// `y = f(α·Σ_t (x·S1_t·U1_t + x·U2_t·S2_t) + bias)` for `x` of shape `[rows, d_in]`, with
    /// `f` the [`Activation`] in `f64` ([`apply_f64`](Activation::apply_f64)).
    pub fn forward(
        &self,
        x: &[f32],
        rows: usize,
        bias: Option<&[f32]>,
        activation: Activation,
    ) -> Vec<f32> {
        let p1 = self.project(x, rows, self.s1s);
        let p2 = self.project(x, rows, self.u2s);
        let mut y = vec![0.0f32; rows * self.d_out];
        for i in 0..rows {
            for o in 0..self.d_out {
                let mut sum = 0.0f64;
                for t in 0..self.terms {
                    for c in 0..self.low_rank {
                        let p = (i * self.terms + t) * self.low_rank + c;
                        sum += p1[p] * self.u1s[self.output_index(t, c, o)] as f64
                            + p2[p] * self.s2s[self.output_index(t, c, o)] as f64;
                    }
                }
                let b = bias.map_or(0.0, |bias| bias[o] as f64);
                y[i * self.d_out + o] = activation.apply_f64(self.alpha() * sum + b) as f32;
            }
        }
        y
    }

    /// Every gradient of [`forward`](Self::forward) given `∂y` (`[rows, d_out]`).
    pub fn backward(&self, x: &[f32], rows: usize, grad_output: &[f32]) -> HostGradients {
        let (terms, d_in, rank, d_out) = (self.terms, self.d_in, self.low_rank, self.d_out);
        let grad_p1 = self.grad_projection(grad_output, rows, self.u1s);
        let grad_p2 = self.grad_projection(grad_output, rows, self.s2s);
        let p1 = self.project(x, rows, self.s1s);
        let p2 = self.project(x, rows, self.u2s);
        let p_index = |i: usize, t: usize, c: usize| (i * terms + t) * rank + c;

        let mut grad_x = vec![0.0f32; rows * d_in];
        for i in 0..rows {
            for m in 0..d_in {
                let mut sum = 0.0f64;
                for t in 0..terms {
                    for c in 0..rank {
                        sum += grad_p1[p_index(i, t, c)]
                            * self.s1s[self.input_index(t, m, c)] as f64
                            + grad_p2[p_index(i, t, c)]
                                * self.u2s[self.input_index(t, m, c)] as f64;
                    }
                }
                grad_x[i * d_in + m] = sum as f32;
            }
        }

        let input_grad = |grad_p: &[f64]| {
            let mut grad = vec![0.0f32; terms * d_in * rank];
            for t in 0..terms {
                for m in 0..d_in {
                    for c in 0..rank {
                        grad[self.input_index(t, m, c)] = (0..rows)
                            .map(|i| x[i * d_in + m] as f64 * grad_p[p_index(i, t, c)])
                            .sum::<f64>()
                            as f32;
                    }
                }
            }
            grad
        };
        let output_grad = |p: &[f64]| {
            let mut grad = vec![0.0f32; terms * rank * d_out];
            for t in 0..terms {
                for c in 0..rank {
                    for o in 0..d_out {
                        let sum: f64 = (0..rows)
                            .map(|i| p[p_index(i, t, c)] * grad_output[i * d_out + o] as f64)
                            .sum();
                        grad[self.output_index(t, c, o)] = (self.alpha() * sum) as f32;
                    }
                }
            }
            grad
        };

        HostGradients {
            x: grad_x,
            s1s: input_grad(&grad_p1),
            s2s: output_grad(&p2),
            u1s: output_grad(&p1),
            u2s: input_grad(&grad_p2),
        }
    }
}
