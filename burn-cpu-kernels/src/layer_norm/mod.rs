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
//! [`layer_norm_rows`] and [`layer_norm_backward_rows`] are their `_on` forms with
//! [`Isa::detected`]; the `_on` forms take the [`Isa`] (the AVX-512 path where
//! [`Isa::avx512`] holds), which tests and benchmarks pass to compare the paths in one
//! process.

use crate::Isa;
use crate::math::{LANES, PARALLEL_MIN, lane_sum, mul_add, sum};

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
            // SAFETY: `avx512` is `isa.avx512()`, true only where AVX-512 and FMA were
            // detected.
            unsafe {
                crate::x86_64::rows::layer_norm_forward_avx512(
                    x, gamma, beta, eps, y, n, mean, rstd,
                )
            };
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

/// The rows of one forward block: `y`, and each row's mean and `rstd` where asked for.
/// Compiled twice: here with `FMA = false`, and with `FMA = true` in the AVX-512 wrapper of
/// `x86_64/rows.rs`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_block<const FMA: bool>(
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
            // SAFETY: `avx512` is `isa.avx512()`, true only where AVX-512 and FMA were
            // detected.
            unsafe { crate::x86_64::rows::layer_norm_backward_avx512(&args, dx, pg, pb) };
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
pub(crate) struct BackwardBlock<'a> {
    x: &'a [f32],
    dy: &'a [f32],
    gamma: &'a [f32],
    mean: &'a [f32],
    rstd: &'a [f32],
    n: usize,
}

/// The rows of one block: `dx`, and the block's own `gamma`/`beta` gradients; compiled
/// twice, as [`forward_block`].
#[inline(always)]
pub(crate) fn backward_block<const FMA: bool>(
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

#[cfg(test)]
mod tests;
