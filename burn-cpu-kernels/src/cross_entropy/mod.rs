//! Cross-entropy from logits over contiguous rows of `f32` (a language model's loss, one row
//! per token, one column per word of the vocabulary) and its backward, without a
//! `[rows, vocab]` matrix of probabilities.
//!
//! The composition `log_softmax`, then a gather of the targets' log-probabilities, keeps the
//! whole log-softmax for its backward: for 8 sequences of 1024 tokens over GPT-2's 50 257
//! words that is 1.6 GB of `f32` beside the logits, written once and read once more. Here the
//! forward keeps one `f32` per row, the log-sum-exp `lse = max + ln Σ exp(x − max)`, and
//! the backward recomputes each probability as `exp(x − lse)` from the logits, which it
//! reads anyway: the forward reads a row twice (its maximum, then the sum of `exp`) and
//! writes two values; the backward reads it once and writes its gradient once, into a new
//! buffer or over the logits ([`backward_rows_in_place`]).
//!
//! `exp` is [`crate::math`]'s polynomial (within an ulp; `0` rather than a slow denormal
//! below `e^−87.33`: a probability that small changes no loss and no update), vectorised on
//! AVX-512 where [`Isa::avx512`] holds. The sum of a row runs in sixteen lanes, each adding
//! at most 64 values before its partial sum joins the row's, so a row of 50 257 loses little
//! to rounding. Each row is computed the same way whether rows are shared among rayon's
//! threads or not: the results do not depend on the number of threads.
//!
//! Targets are `i64` class indices (Burn's and PyTorch's integer tensors); a row whose target
//! equals `ignore_index` (padding) has loss `0` and a zero gradient, and every other target
//! must lie in `0..n`. A `NaN` logit makes its row's `lse` and loss `NaN` (and its gradient),
//! as does a `+∞` logit or a row all `−∞` (`∞ − ∞`, as in the composition); a single `−∞`
//! logit is a class of probability `0`, and a loss of `+∞` if it is the target.
//!
//! The default forms are the `_on` forms with [`Isa::detected`]; the `_on` forms take the
//! [`Isa`], which tests and benchmarks pass to compare the paths in one process.

use crate::Isa;
use crate::math::{LANES, PARALLEL_MIN, exp_non_positive_f, lane_sum};
use crate::softmax::row_max;

/// Elements per rayon task: whole rows adding up to about 32 KiB (one row if longer).
const TASK: usize = 1 << 13;

/// Values each lane adds before its partial sum joins the row's.
const INNER: usize = 64;

/// The cross-entropy of each row of `n` logits against its target:
/// `losses[r] = lse[r] − logits[r, targets[r]]`, with `lse[r] = ln Σⱼ exp(logits[r, j])`
/// (computed as `max + ln Σ exp(x − max)`, which does not overflow), kept for
/// [`backward_rows`]. A row whose target is `ignore_index` gets loss `0` (its `lse` is still
/// written). The caller averages (over the rows not ignored, as PyTorch's `mean`).
///
/// ```
/// use burn_cpu_kernels::cross_entropy;
///
/// // Two rows over three classes: uniform logits (loss ln 3), and logits 1, 2, 3 with the
/// // target the largest (loss ln(e + e² + e³) − 3).
/// let logits = [0.0, 0.0, 0.0, 1.0, 2.0, 3.0];
/// let (mut lse, mut losses) = ([0.0; 2], [0.0; 2]);
/// cross_entropy::forward_rows(&logits, 3, &[0, 2], None, &mut lse, &mut losses);
/// assert!((losses[0] - 3f32.ln()).abs() < 1e-6);
/// assert!((losses[1] - 0.407_606).abs() < 1e-6);
/// assert!((lse[1] - 3.407_606).abs() < 1e-6);
/// ```
///
/// # Panics
/// If `logits` is not `targets.len()` rows of `n`, if `lse` or `losses` does not have one
/// value per row, or if a target is neither `ignore_index` nor in `0..n` (the message names
/// it and its row).
pub fn forward_rows(
    logits: &[f32],
    n: usize,
    targets: &[i64],
    ignore_index: Option<i64>,
    lse: &mut [f32],
    losses: &mut [f32],
) {
    forward_rows_on(
        Isa::detected(),
        logits,
        n,
        targets,
        ignore_index,
        lse,
        losses,
    );
}

/// [`forward_rows`] on the path `isa` picks (the AVX-512 one where [`Isa::avx512`] holds).
///
/// # Panics
/// As [`forward_rows`].
pub fn forward_rows_on(
    isa: Isa,
    logits: &[f32],
    n: usize,
    targets: &[i64],
    ignore_index: Option<i64>,
    lse: &mut [f32],
    losses: &mut [f32],
) {
    let rows = targets.len();
    check_logits(logits.len(), n, rows);
    assert_eq!(lse.len(), rows, "one log-sum-exp per row");
    assert_eq!(losses.len(), rows, "one loss per row");
    check_targets(targets, n, ignore_index);
    if n == 0 {
        // Every target is ignored (none lies in 0..0): the sum of no exponentials is 0.
        lse.fill(f32::NEG_INFINITY);
        losses.fill(0.0);
        return;
    }
    let avx512 = isa.avx512();
    let run = |logits: &[f32], targets: &[i64], lse: &mut [f32], losses: &mut [f32]| {
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: `avx512` is `isa.avx512()`, true only where AVX-512 and FMA were
            // detected.
            unsafe {
                crate::x86_64::rows::cross_entropy_forward_avx512(
                    logits,
                    n,
                    targets,
                    ignore_index,
                    lse,
                    losses,
                )
            };
            return;
        }
        let _ = avx512;
        forward_block::<false>(logits, n, targets, ignore_index, lse, losses);
    };
    if !parallel(logits.len(), rows) {
        run(logits, targets, lse, losses);
        return;
    }
    use rayon::prelude::*;
    let per = (TASK / n).max(1);
    logits
        .par_chunks(per * n)
        .zip(targets.par_chunks(per))
        .zip(lse.par_chunks_mut(per))
        .zip(losses.par_chunks_mut(per))
        .for_each(|(((logits, targets), lse), losses)| run(logits, targets, lse, losses));
}

/// The gradient of `Σᵣ scale·loss[r]` with respect to the logits:
/// `grad[r, j] = scale·(exp(logits[r, j] − lse[r]) − [j = targets[r]])`, the probabilities
/// recomputed from the logits and [`forward_rows`]'s `lse`; rows whose target is
/// `ignore_index` get zeros.
///
/// `scale` is one number for every row, not one per row: for a mean loss it is the upstream
/// gradient divided by the number of rows not ignored (`1/count` when the loss is the last
/// operation), the common case, which saves a `[rows]` buffer. `lse` must be the forward's
/// for these logits (every logit at most its row's `lse`), not any upper bound.
///
/// # Panics
/// If `logits` and `grad` are not `targets.len()` rows of `n`, if `lse` does not have one
/// value per row, or if a target is neither `ignore_index` nor in `0..n`.
pub fn backward_rows(
    logits: &[f32],
    n: usize,
    lse: &[f32],
    targets: &[i64],
    ignore_index: Option<i64>,
    scale: f32,
    grad: &mut [f32],
) {
    backward_rows_on(
        Isa::detected(),
        logits,
        n,
        lse,
        targets,
        ignore_index,
        scale,
        grad,
    );
}

/// [`backward_rows`] on the path `isa` picks.
///
/// # Panics
/// As [`backward_rows`].
#[allow(clippy::too_many_arguments)]
pub fn backward_rows_on(
    isa: Isa,
    logits: &[f32],
    n: usize,
    lse: &[f32],
    targets: &[i64],
    ignore_index: Option<i64>,
    scale: f32,
    grad: &mut [f32],
) {
    assert_eq!(logits.len(), grad.len(), "one gradient per logit");
    backward_dispatch(
        isa,
        Some(logits),
        grad,
        n,
        lse,
        targets,
        ignore_index,
        scale,
    );
}

/// [`backward_rows`] over the logits themselves: `logits_then_grad` holds the logits and
/// receives their gradient. At backward time the caller often holds the only copy of the
/// logits, which nothing needs afterwards: this saves the `[rows, vocab]` gradient buffer
/// (the size of the logits, 200 KB a token for GPT-2's vocabulary).
///
/// # Panics
/// As [`backward_rows`].
pub fn backward_rows_in_place(
    logits_then_grad: &mut [f32],
    n: usize,
    lse: &[f32],
    targets: &[i64],
    ignore_index: Option<i64>,
    scale: f32,
) {
    backward_rows_in_place_on(
        Isa::detected(),
        logits_then_grad,
        n,
        lse,
        targets,
        ignore_index,
        scale,
    );
}

/// [`backward_rows_in_place`] on the path `isa` picks.
///
/// # Panics
/// As [`backward_rows`].
pub fn backward_rows_in_place_on(
    isa: Isa,
    logits_then_grad: &mut [f32],
    n: usize,
    lse: &[f32],
    targets: &[i64],
    ignore_index: Option<i64>,
    scale: f32,
) {
    backward_dispatch(
        isa,
        None,
        logits_then_grad,
        n,
        lse,
        targets,
        ignore_index,
        scale,
    );
}

/// The backward's checks and blocks: `grad` from `src`, or from itself without `src`.
#[allow(clippy::too_many_arguments)]
fn backward_dispatch(
    isa: Isa,
    src: Option<&[f32]>,
    grad: &mut [f32],
    n: usize,
    lse: &[f32],
    targets: &[i64],
    ignore_index: Option<i64>,
    scale: f32,
) {
    let rows = targets.len();
    check_logits(grad.len(), n, rows);
    assert_eq!(lse.len(), rows, "one log-sum-exp per row");
    check_targets(targets, n, ignore_index);
    if n == 0 {
        return;
    }
    let avx512 = isa.avx512();
    let run = |first: usize, grad: &mut [f32], lse: &[f32], targets: &[i64]| {
        let src = src.map(|src| &src[first * n..first * n + grad.len()]);
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: `avx512` is `isa.avx512()`, true only where AVX-512 and FMA were
            // detected.
            unsafe {
                crate::x86_64::rows::cross_entropy_backward_avx512(
                    src,
                    grad,
                    n,
                    lse,
                    targets,
                    ignore_index,
                    scale,
                )
            };
            return;
        }
        let _ = avx512;
        backward_block::<false>(src, grad, n, lse, targets, ignore_index, scale);
    };
    if !parallel(grad.len(), rows) {
        run(0, grad, lse, targets);
        return;
    }
    use rayon::prelude::*;
    let per = (TASK / n).max(1);
    grad.par_chunks_mut(per * n)
        .zip(lse.par_chunks(per))
        .zip(targets.par_chunks(per))
        .enumerate()
        .for_each(|(i, ((grad, lse), targets))| run(i * per, grad, lse, targets));
}

/// Whether a call of `len` logits in `rows` rows is worth sharing among rayon's threads.
fn parallel(len: usize, rows: usize) -> bool {
    len >= PARALLEL_MIN && rows > 1 && rayon::current_num_threads() > 1
}

/// Panics unless `len` logits are `rows` rows of `n`.
fn check_logits(len: usize, n: usize, rows: usize) {
    assert!(
        rows.checked_mul(n) == Some(len),
        "{len} logits are not {rows} rows (one per target) of {n}"
    );
}

/// Panics on the first target that is neither `ignore` nor a class of `0..n`.
fn check_targets(targets: &[i64], n: usize, ignore: Option<i64>) {
    let classes = i64::try_from(n).unwrap_or(i64::MAX);
    for (r, &t) in targets.iter().enumerate() {
        assert!(
            Some(t) == ignore || (0..classes).contains(&t),
            "target {t} of row {r} is not a class of 0..{n} (ignore index {ignore:?})"
        );
    }
}

/// The rows of one forward block: each row's `lse` and loss. Compiled twice: here with
/// `FMA = false`, and with `FMA = true` in the AVX-512 wrapper of `x86_64/rows.rs`.
#[inline(always)]
pub(crate) fn forward_block<const FMA: bool>(
    logits: &[f32],
    n: usize,
    targets: &[i64],
    ignore: Option<i64>,
    lse: &mut [f32],
    losses: &mut [f32],
) {
    let rows = logits.chunks_exact(n).zip(targets).zip(lse).zip(losses);
    for (((row, &target), lse), loss) in rows {
        let max = row_max(row);
        let log_sum = sum_exp::<FMA>(row, max).ln();
        *lse = max + log_sum;
        // `(max − x) + ln Σ` rather than `lse − x`: where the target is the largest logit
        // and the logits are large, the loss keeps the digits `lse`'s rounding would lose.
        *loss = if Some(target) == ignore {
            0.0
        } else {
            (max - row[target as usize]) + log_sum
        };
    }
}

/// `Σ exp(x − max)` over a row: sixteen lanes, each adding at most [`INNER`] values before
/// its partial sum joins the outer lanes, then the lanes pairwise and the tail.
#[inline(always)]
fn sum_exp<const FMA: bool>(row: &[f32], max: f32) -> f32 {
    let body = row.len() / LANES * LANES;
    let mut outer = [0.0f32; LANES];
    for block in row[..body].chunks(LANES * INNER) {
        let mut acc = [0.0f32; LANES];
        for c in block.chunks_exact(LANES) {
            for (a, &v) in acc.iter_mut().zip(c) {
                *a += exp_non_positive_f::<FMA>(v - max);
            }
        }
        outer.iter_mut().zip(acc).for_each(|(o, a)| *o += a);
    }
    row[body..].iter().fold(lane_sum(outer), |s, &v| {
        s + exp_non_positive_f::<FMA>(v - max)
    })
}

/// The rows of one backward block, into `grad` from `src`, or from `grad` itself (holding
/// the logits) without `src`; compiled twice, as [`forward_block`].
#[inline(always)]
pub(crate) fn backward_block<const FMA: bool>(
    src: Option<&[f32]>,
    grad: &mut [f32],
    n: usize,
    lse: &[f32],
    targets: &[i64],
    ignore: Option<i64>,
    scale: f32,
) {
    let rows = grad.chunks_exact_mut(n).zip(lse).zip(targets).enumerate();
    for (r, ((grad, &lse), &target)) in rows {
        if Some(target) == ignore {
            grad.fill(0.0);
            continue;
        }
        let t = target as usize;
        let src = src.map(|src| &src[r * n..][..n]);
        let x_t = src.map_or(grad[t], |src| src[t]);
        match src {
            Some(src) => {
                for (g, &x) in grad.iter_mut().zip(src) {
                    *g = scale * exp_non_positive_f::<FMA>(x - lse);
                }
            }
            None => {
                for g in grad.iter_mut() {
                    *g = scale * exp_non_positive_f::<FMA>(*g - lse);
                }
            }
        }
        // `p − 1` before the scale: exact where `p` is near 1 (the target well learnt).
        grad[t] = scale * (exp_non_positive_f::<FMA>(x_t - lse) - 1.0);
    }
}

#[cfg(test)]
mod tests;
