//! Layer normalisation over contiguous rows of `f32` and its backward, vectorised, rows
//! shared among rayon's threads.
//!
//! Burn's `LayerNorm` is a composition (`var_mean_bias`, a subtraction, a square root, a
//! division, a product with `gamma`, a sum with `beta`): six or more passes over the whole
//! activation through memory. Here a row (a BERT-base row of 768 values is 3 KiB) is read
//! from memory once and stays in L1 for the three passes over it: the mean, the biased
//! variance as `Σ (x − mean)²/n` (two passes: no cancellation, unlike `E[x²] − mean²`; the
//! second also corrects the mean), and the output. Sums run in sixteen `f32` lanes, so
//! each lane adds `n/16` values: for rows of thousands the error stays near an ulp of the
//! result. The backward's `gamma`/`beta` gradients are summed per fixed block of rows and
//! the blocks' sums added in order, so they do not depend on the number of threads.
//!
//! The `_on` forms take an [`Isa`] that tests and benchmarks use to force the portable path;
//! `BURN_SKETCH_PORTABLE=1` forces it for all.

use crate::Isa;
use crate::math::{PARALLEL_MIN, mul_add};

/// Lanes of the per-row accumulators.
const LANES: usize = 16;

/// Elements per rayon task in the forward.
const TASK: usize = 1 << 13;

/// Elements per block of the backward: each block sums its own `gamma`/`beta` gradients,
/// and the blocks' sums are added in order at the end, so the result does not depend on the
/// number of threads.
const BACKWARD_BLOCK: usize = 1 << 15;

/// Where the forward writes each row's mean and `1/√(var + eps)`, for the backward.
#[derive(Debug)]
pub struct RowStats<'a> {
    /// One mean per row.
    pub mean: &'a mut [f32],
    /// One reciprocal standard deviation per row.
    pub rstd: &'a mut [f32],
}

/// `y = (x − mean)/√(var + eps)·gamma + beta` over each row of `n` values of `x`, with the
/// row's mean and biased variance (Burn's and PyTorch's `LayerNorm`); the rows' means and
/// reciprocal standard deviations go to `stats` when given.
///
/// # Panics
/// If `x` and `y` differ in length or are not whole rows of `n`, if `gamma` (or `beta`) is
/// not `n` long, or if `stats` does not have one value per row.
pub fn layer_norm_rows(
    x: &[f32],
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    y: &mut [f32],
    n: usize,
    stats: Option<RowStats<'_>>,
) {
    layer_norm_rows_on(Isa::detected(), x, gamma, beta, eps, y, n, stats);
}

/// [`layer_norm_rows`] on the path `isa` picks.
///
/// # Panics
/// As [`layer_norm_rows`].
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_rows_on(
    isa: Isa,
    x: &[f32],
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    y: &mut [f32],
    n: usize,
    stats: Option<RowStats<'_>>,
) {
    assert_eq!(x.len(), y.len(), "one output per input");
    let rows = check_rows(x.len(), n);
    assert_eq!(gamma.len(), n, "one gamma per column");
    if let Some(beta) = beta {
        assert_eq!(beta.len(), n, "one beta per column");
    }
    let (mean, rstd) = match stats {
        Some(RowStats { mean, rstd }) => {
            assert!(
                mean.len() == rows && rstd.len() == rows,
                "one mean and rstd per row"
            );
            (Some(mean), Some(rstd))
        }
        None => (None, None),
    };
    if rows == 0 {
        return;
    }
    let avx512 = isa.avx512();
    let parallel = x.len() >= PARALLEL_MIN && rows > 1 && rayon::current_num_threads() > 1;
    let per = if parallel { (TASK / n).max(1) } else { rows };
    // The blocks, each with its rows' outputs and statistics.
    let mut blocks = Vec::with_capacity(rows.div_ceil(per));
    let mut means = mean.map(|m| m.chunks_mut(per));
    let mut rstds = rstd.map(|r| r.chunks_mut(per));
    for (i, y) in y.chunks_mut(per * n).enumerate() {
        let mean = means.as_mut().and_then(Iterator::next);
        let rstd = rstds.as_mut().and_then(Iterator::next);
        blocks.push((i * per, y, mean, rstd));
    }
    let run = |(first, y, mean, rstd): ForwardBlock<'_>| {
        let x = &x[first * n..first * n + y.len()];
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: `avx512` is true only where AVX-512F and FMA were detected.
            unsafe { forward_avx512(x, gamma, beta, eps, y, n, mean, rstd) };
            return;
        }
        let _ = avx512;
        forward_block::<false>(x, gamma, beta, eps, y, n, mean, rstd);
    };
    if parallel {
        use rayon::prelude::*;
        blocks.into_par_iter().for_each(run);
    } else {
        blocks.into_iter().for_each(run);
    }
}

/// A forward block: its first row, its outputs, and where its rows' statistics go.
type ForwardBlock<'a> = (
    usize,
    &'a mut [f32],
    Option<&'a mut [f32]>,
    Option<&'a mut [f32]>,
);

/// The rows `len` values make, or a panic if they are not whole rows of `n`.
fn check_rows(len: usize, n: usize) -> usize {
    assert!(
        n > 0 && len.is_multiple_of(n) || len == 0,
        "{len} values are not whole rows of {n}"
    );
    len.checked_div(n).unwrap_or(0)
}

/// [`forward_block`] compiled for AVX-512 with fused multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
#[allow(clippy::too_many_arguments)]
fn forward_avx512(
    x: &[f32],
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    y: &mut [f32],
    n: usize,
    mean: Option<&mut [f32]>,
    rstd: Option<&mut [f32]>,
) {
    forward_block::<true>(x, gamma, beta, eps, y, n, mean, rstd);
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn forward_block<const FMA: bool>(
    x: &[f32],
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    y: &mut [f32],
    n: usize,
    mut mean_out: Option<&mut [f32]>,
    mut rstd_out: Option<&mut [f32]>,
) {
    for (r, (x, y)) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)).enumerate() {
        // The corrected two-pass algorithm (Chan, Golub and LeVeque): the second pass also
        // sums the deviations, which corrects the mean's rounding and the variance with it.
        let rough = sum(x) / n as f32;
        let (deviations, squares) = deviations::<FMA>(x, rough);
        let correction = deviations / n as f32;
        let mean = rough + correction;
        let var = (squares / n as f32 - correction * correction).max(0.0);
        let rstd = 1.0 / (var + eps).sqrt();
        match beta {
            Some(beta) => {
                for (((y, &x), &g), &b) in y.iter_mut().zip(x).zip(gamma).zip(beta) {
                    *y = mul_add::<FMA>((x - mean) * rstd, g, b);
                }
            }
            None => {
                for ((y, &x), &g) in y.iter_mut().zip(x).zip(gamma) {
                    *y = (x - mean) * rstd * g;
                }
            }
        }
        if let Some(m) = mean_out.as_deref_mut() {
            m[r] = mean;
        }
        if let Some(s) = rstd_out.as_deref_mut() {
            s[r] = rstd;
        }
    }
}

/// `Σ x`, by lanes.
#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let body = x.len() / LANES * LANES;
    let mut acc = [0.0f32; LANES];
    for c in x[..body].chunks_exact(LANES) {
        acc.iter_mut().zip(c).for_each(|(s, &x)| *s += x);
    }
    x[body..].iter().fold(lane_sum(acc), |s, &x| s + x)
}

/// `(Σ (x − mean), Σ (x − mean)²)`, in one pass.
#[inline(always)]
fn deviations<const FMA: bool>(x: &[f32], mean: f32) -> (f32, f32) {
    let body = x.len() / LANES * LANES;
    let (mut acc_d, mut acc_s) = ([0.0f32; LANES], [0.0f32; LANES]);
    for c in x[..body].chunks_exact(LANES) {
        for ((d, s), &x) in acc_d.iter_mut().zip(&mut acc_s).zip(c) {
            let v = x - mean;
            *d += v;
            *s = mul_add::<FMA>(v, v, *s);
        }
    }
    let (mut d, mut s) = (lane_sum(acc_d), lane_sum(acc_s));
    for &x in &x[body..] {
        let v = x - mean;
        d += v;
        s = mul_add::<FMA>(v, v, s);
    }
    (d, s)
}

/// The backward of [`layer_norm_rows`] from the input `x`, the output's gradient `dy`,
/// `gamma` and the forward's [`RowStats`]: with `x̂ = (x − mean)·rstd` and `g = dy·gamma`,
/// `dx = rstd·(g − mean(g) − x̂·mean(g·x̂))` per row; `dgamma += Σ_rows dy·x̂` and
/// `dbeta += Σ_rows dy` when given (added to what they hold, so that calls accumulate).
///
/// # Panics
/// If `x`, `dy` and `dx` differ in length or are not whole rows of `n`, if `gamma`,
/// `dgamma` or `dbeta` is not `n` long, or if `mean` and `rstd` do not have one value per
/// row.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward_rows(
    x: &[f32],
    dy: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dx: &mut [f32],
    dgamma: Option<&mut [f32]>,
    dbeta: Option<&mut [f32]>,
    n: usize,
) {
    layer_norm_backward_rows_on(
        Isa::detected(),
        x,
        dy,
        gamma,
        mean,
        rstd,
        dx,
        dgamma,
        dbeta,
        n,
    );
}

/// [`layer_norm_backward_rows`] on the path `isa` picks.
///
/// # Panics
/// As [`layer_norm_backward_rows`].
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward_rows_on(
    isa: Isa,
    x: &[f32],
    dy: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dx: &mut [f32],
    dgamma: Option<&mut [f32]>,
    dbeta: Option<&mut [f32]>,
    n: usize,
) {
    assert!(
        x.len() == dx.len() && dy.len() == dx.len(),
        "one gradient per input"
    );
    let rows = check_rows(x.len(), n);
    assert_eq!(gamma.len(), n, "one gamma per column");
    assert!(
        mean.len() == rows && rstd.len() == rows,
        "one mean and rstd per row"
    );
    for acc in [dgamma.as_deref(), dbeta.as_deref()].into_iter().flatten() {
        assert_eq!(acc.len(), n, "one gamma and beta gradient per column");
    }
    if rows == 0 {
        return;
    }
    let avx512 = isa.avx512();
    let (want_gamma, want_beta) = (dgamma.is_some(), dbeta.is_some());
    let per = (BACKWARD_BLOCK / n).max(1);
    let run = |(i, dx): (usize, &mut [f32])| -> [Option<Vec<f32>>; 2] {
        let first = i * per;
        let rows = first..first + dx.len() / n;
        let span = first * n..first * n + dx.len();
        let mut partial_gamma = want_gamma.then(|| vec![0.0f32; n]);
        let mut partial_beta = want_beta.then(|| vec![0.0f32; n]);
        let args = BackwardBlock {
            x: &x[span.clone()],
            dy: &dy[span],
            gamma,
            mean: &mean[rows.clone()],
            rstd: &rstd[rows],
            n,
        };
        let (pg, pb) = (partial_gamma.as_deref_mut(), partial_beta.as_deref_mut());
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: `avx512` is true only where AVX-512F and FMA were detected.
            unsafe { backward_avx512(&args, dx, pg, pb) };
            return [partial_gamma, partial_beta];
        }
        let _ = avx512;
        backward_block::<false>(&args, dx, pg, pb);
        [partial_gamma, partial_beta]
    };
    let partials: Vec<[Option<Vec<f32>>; 2]> =
        if x.len() >= PARALLEL_MIN && rows > per && rayon::current_num_threads() > 1 {
            use rayon::prelude::*;
            dx.par_chunks_mut(per * n).enumerate().map(run).collect()
        } else {
            dx.chunks_mut(per * n).enumerate().map(run).collect()
        };
    // The blocks' sums, in block order whatever the threads.
    for (k, acc) in [dgamma, dbeta].into_iter().enumerate() {
        if let Some(acc) = acc {
            let mut total = vec![0.0f32; n];
            for p in &partials {
                let p = p[k].as_deref().expect("a partial per block");
                total.iter_mut().zip(p).for_each(|(t, &v)| *t += v);
            }
            acc.iter_mut().zip(&total).for_each(|(a, &t)| *a += t);
        }
    }
}

/// One block's read-only inputs for the backward.
struct BackwardBlock<'a> {
    x: &'a [f32],
    dy: &'a [f32],
    gamma: &'a [f32],
    mean: &'a [f32],
    rstd: &'a [f32],
    n: usize,
}

/// [`backward_block`] compiled for AVX-512 with fused multiply-adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
fn backward_avx512(
    args: &BackwardBlock<'_>,
    dx: &mut [f32],
    dgamma: Option<&mut [f32]>,
    dbeta: Option<&mut [f32]>,
) {
    backward_block::<true>(args, dx, dgamma, dbeta);
}

/// The rows of one block: `dx`, and the block's own `gamma`/`beta` gradients.
#[inline(always)]
fn backward_block<const FMA: bool>(
    args: &BackwardBlock<'_>,
    dx: &mut [f32],
    mut dgamma: Option<&mut [f32]>,
    mut dbeta: Option<&mut [f32]>,
) {
    let BackwardBlock {
        x,
        dy,
        gamma,
        mean,
        rstd,
        n,
    } = *args;
    let rows = x
        .chunks_exact(n)
        .zip(dy.chunks_exact(n))
        .zip(dx.chunks_exact_mut(n));
    for (r, ((x, dy), dx)) in rows.enumerate() {
        let (mean, rstd) = (mean[r], rstd[r]);
        // Σ g and Σ g·x̂ in one pass, with g = dy·gamma.
        let body = n / LANES * LANES;
        let (mut acc_g, mut acc_gx) = ([0.0f32; LANES], [0.0f32; LANES]);
        for start in (0..body).step_by(LANES) {
            for l in 0..LANES {
                let j = start + l;
                let g = dy[j] * gamma[j];
                let xhat = (x[j] - mean) * rstd;
                acc_g[l] += g;
                acc_gx[l] = mul_add::<FMA>(g, xhat, acc_gx[l]);
            }
        }
        let (mut sum_g, mut sum_gx) = (lane_sum(acc_g), lane_sum(acc_gx));
        for j in body..n {
            let g = dy[j] * gamma[j];
            sum_g += g;
            sum_gx = mul_add::<FMA>(g, (x[j] - mean) * rstd, sum_gx);
        }
        let (a, b) = (sum_g / n as f32, sum_gx / n as f32);
        for (((dx, &x), &dy), &gamma) in dx.iter_mut().zip(x).zip(dy).zip(gamma) {
            let xhat = (x - mean) * rstd;
            *dx = rstd * (dy * gamma - a - xhat * b);
        }
        if let Some(dgamma) = dgamma.as_deref_mut() {
            for ((acc, &x), &dy) in dgamma.iter_mut().zip(x).zip(dy) {
                *acc = mul_add::<FMA>(dy, (x - mean) * rstd, *acc);
            }
        }
        if let Some(dbeta) = dbeta.as_deref_mut() {
            dbeta.iter_mut().zip(dy).for_each(|(acc, &dy)| *acc += dy);
        }
    }
}

/// The lanes' sum, pairwise.
#[inline(always)]
fn lane_sum(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u64, offset: f32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0 + offset
            })
            .collect()
    }

    /// `(y, mean, rstd)` of one row in `f64`.
    fn reference(x: &[f32], gamma: &[f32], beta: Option<&[f32]>, eps: f64) -> (Vec<f64>, f64, f64) {
        let n = x.len() as f64;
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        let rstd = 1.0 / (var + eps).sqrt();
        let y = x
            .iter()
            .enumerate()
            .map(|(j, &v)| {
                (v as f64 - mean) * rstd * gamma[j] as f64 + beta.map_or(0.0, |b| b[j] as f64)
            })
            .collect();
        (y, mean, rstd)
    }

    /// Odd row lengths, few rows (serial) and many (parallel), with and without `beta`, on
    /// both paths, and rows offset far from zero (where `E[x²] − mean²` would cancel).
    #[test]
    fn the_forward_follows_f64() {
        for n in [1usize, 3, 17, 384, 1000] {
            for rows in [3usize, PARALLEL_MIN / n + 5] {
                for offset in [0.0f32, 1000.0] {
                    let x = values(rows * n, n as u64, offset);
                    let gamma = values(n, 3, 1.0);
                    let beta = values(n, 4, 0.0);
                    for beta in [None, Some(&beta[..])] {
                        for isa in [Isa::PORTABLE, Isa::detected()] {
                            let mut y = vec![0.0; x.len()];
                            let (mut mean, mut rstd) = (vec![0.0; rows], vec![0.0; rows]);
                            let stats = RowStats {
                                mean: &mut mean,
                                rstd: &mut rstd,
                            };
                            layer_norm_rows_on(isa, &x, &gamma, beta, 1e-5, &mut y, n, Some(stats));
                            let mut y2 = vec![0.0; x.len()];
                            layer_norm_rows_on(isa, &x, &gamma, beta, 1e-5, &mut y2, n, None);
                            assert_eq!(y, y2);
                            for r in 0..rows {
                                let row = r * n..(r + 1) * n;
                                let (want, m, s) = reference(&x[row.clone()], &gamma, beta, 1e-5);
                                // x − mean carries the rounding of x itself (an ulp of
                                // max |x|), magnified by rstd: rows near 1000, or of close
                                // values, lose digits in any f32 layer norm.
                                let max_x = x[row.clone()]
                                    .iter()
                                    .fold(0.0f64, |m, &v| m.max(v.abs() as f64));
                                let tol = 4.0 * f32::EPSILON as f64 * max_x * s + 2e-6;
                                assert!((mean[r] as f64 - m).abs() <= 1e-6 * m.abs().max(1.0));
                                assert!(
                                    (rstd[r] as f64 - s).abs() <= 1e-5 * s,
                                    "{isa:?} {n}: rstd {} vs {s}",
                                    rstd[r]
                                );
                                for (j, (&g, &w)) in y[row].iter().zip(&want).enumerate() {
                                    assert!(
                                        (g as f64 - w).abs()
                                            <= tol * (gamma[j].abs() as f64 + w.abs()),
                                        "n {n} rows {rows} offset {offset} {isa:?} [{r},{j}]: {g} vs {w}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// A constant row normalises to `beta` (variance 0, `eps` keeps it finite); `NaN` and
    /// `∞` in a row make that row `NaN`, not its neighbours.
    #[test]
    fn constant_rows_and_non_finite_values() {
        let n = 17;
        let mut x = vec![3.0f32; 3 * n];
        x[n + 4] = f32::NAN;
        x[2 * n + 2] = f32::INFINITY;
        let gamma = vec![2.0; n];
        let beta = vec![0.5; n];
        for isa in [Isa::PORTABLE, Isa::detected()] {
            let mut y = vec![0.0; x.len()];
            layer_norm_rows_on(isa, &x, &gamma, Some(&beta), 1e-5, &mut y, n, None);
            assert!(y[..n].iter().all(|&v| v == 0.5), "{isa:?} {:?}", &y[..n]);
            assert!(y[n..].iter().all(|v| v.is_nan()), "{isa:?}");
        }
    }

    /// The backward against the `f64` formulas, and the `gamma`/`beta` gradients against
    /// `f64` sums, accumulated onto what the buffers held; serial and parallel.
    #[test]
    fn the_backward_follows_f64() {
        for n in [1usize, 3, 17, 384, 1000] {
            for rows in [3usize, 4 * PARALLEL_MIN / n + 5] {
                let x = values(rows * n, 5 + n as u64, 0.5);
                let dy = values(rows * n, 6 + n as u64, 0.0);
                let gamma = values(n, 7, 1.0);
                let (mut mean, mut rstd) = (vec![0.0; rows], vec![0.0; rows]);
                let mut y = vec![0.0; x.len()];
                let stats = RowStats {
                    mean: &mut mean,
                    rstd: &mut rstd,
                };
                layer_norm_rows(&x, &gamma, None, 1e-5, &mut y, n, Some(stats));
                for isa in [Isa::PORTABLE, Isa::detected()] {
                    let mut dx = vec![0.0; x.len()];
                    let (mut dgamma, mut dbeta) = (vec![1.0; n], vec![-1.0; n]);
                    layer_norm_backward_rows_on(
                        isa,
                        &x,
                        &dy,
                        &gamma,
                        &mean,
                        &rstd,
                        &mut dx,
                        Some(&mut dgamma),
                        Some(&mut dbeta),
                        n,
                    );
                    let (mut want_g, mut want_b) = (vec![1.0f64; n], vec![-1.0f64; n]);
                    for r in 0..rows {
                        let row = r * n..(r + 1) * n;
                        let (x, dy, dx) = (&x[row.clone()], &dy[row.clone()], &dx[row]);
                        let (m, s) = (mean[r] as f64, rstd[r] as f64);
                        let xhat: Vec<f64> = x.iter().map(|&v| (v as f64 - m) * s).collect();
                        let g: Vec<f64> = dy
                            .iter()
                            .zip(&gamma)
                            .map(|(&d, &g)| d as f64 * g as f64)
                            .collect();
                        let a = g.iter().sum::<f64>() / n as f64;
                        let b = g.iter().zip(&xhat).map(|(g, x)| g * x).sum::<f64>() / n as f64;
                        for j in 0..n {
                            let want = s * (g[j] - a - xhat[j] * b);
                            let tol =
                                2e-5 * s * (g[j].abs() + a.abs() + (xhat[j] * b).abs()) + 1e-6;
                            assert!(
                                (dx[j] as f64 - want).abs() <= tol,
                                "n {n} {isa:?} [{r},{j}]: {} vs {want}",
                                dx[j]
                            );
                            want_g[j] += dy[j] as f64 * xhat[j];
                            want_b[j] += dy[j] as f64;
                        }
                    }
                    let scale = (rows as f64).sqrt() * 2.0;
                    for j in 0..n {
                        assert!(
                            (dgamma[j] as f64 - want_g[j]).abs() <= 1e-5 * scale + 1e-5,
                            "dgamma[{j}] {} vs {}",
                            dgamma[j],
                            want_g[j]
                        );
                        assert!(
                            (dbeta[j] as f64 - want_b[j]).abs() <= 1e-5 * scale + 1e-5,
                            "dbeta[{j}] {} vs {}",
                            dbeta[j],
                            want_b[j]
                        );
                    }
                }
            }
        }
    }

    /// The parallel forward and backward give exactly what one thread gives.
    #[test]
    fn parallel_equals_serial() {
        let (n, rows) = (384, 4 * PARALLEL_MIN / 384 + 3);
        let x = values(rows * n, 9, 0.0);
        let dy = values(rows * n, 10, 0.0);
        let gamma = values(n, 11, 1.0);
        let beta = values(n, 12, 0.0);
        let run = || {
            let mut y = vec![0.0; x.len()];
            let (mut mean, mut rstd) = (vec![0.0; rows], vec![0.0; rows]);
            let stats = RowStats {
                mean: &mut mean,
                rstd: &mut rstd,
            };
            layer_norm_rows(&x, &gamma, Some(&beta), 1e-12, &mut y, n, Some(stats));
            let mut dx = vec![0.0; x.len()];
            let (mut dg, mut db) = (vec![0.0; n], vec![0.0; n]);
            layer_norm_backward_rows(
                &x,
                &dy,
                &gamma,
                &mean,
                &rstd,
                &mut dx,
                Some(&mut dg),
                Some(&mut db),
                n,
            );
            (y, mean, rstd, dx, dg, db)
        };
        let parallel = run();
        let serial = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(run);
        assert!(parallel == serial);
    }

    #[test]
    #[should_panic(expected = "one gamma per column")]
    fn a_short_gamma_is_refused() {
        layer_norm_rows(&[0.0; 6], &[1.0; 2], None, 1e-5, &mut [0.0; 6], 3, None);
    }
}
