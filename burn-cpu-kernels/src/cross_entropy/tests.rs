use super::*;
use crate::testing::uniform;

/// PyTorch's default ignore index.
const IGNORE: i64 = -100;

/// The vocabulary sizes: one class, odd sizes below and above a vector, a small model's
/// vocabulary (97), GPT-2's (50 257).
const SIZES: [usize; 5] = [1, 7, 97, 1000, 50257];

/// Logit ranges: moderate, and large positive, large negative and wide ones, where
/// `Σ exp(x)` without the maximum subtracted overflows or underflows `f32`.
const RANGES: [[f32; 2]; 4] = [[-8.0, 8.0], [70.0, 80.0], [-80.0, -70.0], [-80.0, 80.0]];

/// The tolerance, relative to the row's largest magnitude: `lse` and the loss within
/// `1e-6·max(1, |lse|, max |x|)` of the `f64` values (the loss `(max − x) + ln Σ` rounds to
/// an ulp of `max − x`), each gradient within `1e-6·|scale|·max(1, |lse|)` (a probability
/// `exp(x − lse)` inherits `lse`'s rounding, half an ulp of `lse`, as a relative error).
const TOLERANCE: f64 = 1e-6;

/// Seeded targets in `0..n`.
fn targets(rows: usize, n: usize, seed: u64) -> Vec<i64> {
    uniform(rows, seed, [0.0, n as f32])
        .into_iter()
        .map(|u| (u as usize).min(n - 1) as i64)
        .collect()
}

/// `(lse, loss)` of a row in `f64`: `max + ln Σ exp(x − max)`, and `lse − x[target]`.
fn reference(row: &[f32], target: usize) -> (f64, f64) {
    let max = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    (lse, lse - row[target] as f64)
}

/// Every vocabulary size and logit range, with 1 row, 3 rows and (for the small sizes)
/// enough rows to be shared among threads, one row's target ignored: `lse`, the losses and
/// the gradient against `f64`, on both paths; in place equal to out of place, bit for bit.
#[test]
fn forward_and_backward_follow_f64() {
    let scale = 0.25f32;
    let mut worst = [0.0f64; 3];
    for n in SIZES {
        for rows in [1usize, 3, PARALLEL_MIN / n + 5] {
            for (k, range) in RANGES.into_iter().enumerate() {
                let seed = (n * 31 + rows * 7 + k) as u64;
                let x = uniform(rows * n, seed, range);
                let mut t = targets(rows, n, seed + 1);
                if rows > 1 {
                    t[1] = IGNORE;
                }
                for isa in [Isa::PORTABLE, Isa::detected()] {
                    let what = format!("n {n} rows {rows} range {range:?} {isa:?}");
                    let (mut lse, mut losses) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
                    forward_rows_on(isa, &x, n, &t, Some(IGNORE), &mut lse, &mut losses);
                    let mut grad = vec![f32::NAN; x.len()];
                    backward_rows_on(isa, &x, n, &lse, &t, Some(IGNORE), scale, &mut grad);
                    let mut in_place = x.clone();
                    backward_rows_in_place_on(isa, &mut in_place, n, &lse, &t, Some(IGNORE), scale);
                    assert!(
                        grad.iter()
                            .zip(&in_place)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}: in place differs from out of place"
                    );
                    for r in 0..rows {
                        let row = &x[r * n..][..n];
                        let g = &grad[r * n..][..n];
                        if t[r] == IGNORE {
                            assert_eq!(losses[r], 0.0, "{what} row {r}");
                            assert!(g.iter().all(|&v| v == 0.0), "{what} row {r}");
                            let (want, _) = reference(row, 0);
                            assert!(
                                (lse[r] as f64 - want).abs() <= TOLERANCE * want.abs().max(1.0)
                            );
                            continue;
                        }
                        let target = t[r] as usize;
                        let (want_lse, want_loss) = reference(row, target);
                        let size = want_lse.abs().max(1.0);
                        let largest = row.iter().fold(size, |m, &x| m.max(x.abs() as f64));
                        let e_lse = (lse[r] as f64 - want_lse).abs() / largest;
                        let e_loss = (losses[r] as f64 - want_loss).abs() / largest;
                        assert!(
                            e_lse <= TOLERANCE && e_loss <= TOLERANCE,
                            "{what} row {r}: lse {} vs {want_lse}, loss {} vs {want_loss}",
                            lse[r],
                            losses[r]
                        );
                        let mut e_grad = 0.0f64;
                        for (j, (&g, &x)) in g.iter().zip(row).enumerate() {
                            let hot = if j == target { 1.0 } else { 0.0 };
                            let want = scale as f64 * ((x as f64 - want_lse).exp() - hot);
                            e_grad = e_grad.max((g as f64 - want).abs() / (scale as f64 * size));
                            assert!(
                                e_grad <= TOLERANCE,
                                "{what} [{r},{j}]: gradient {g} vs {want}"
                            );
                        }
                        for (w, e) in worst.iter_mut().zip([e_lse, e_loss, e_grad]) {
                            *w = w.max(e);
                        }
                    }
                }
            }
        }
    }
    eprintln!("worst relative errors (lse, loss, gradient): {worst:?}");
}

/// An ignore index inside `0..n` (a padding token's id) ignores exactly its rows; rows all
/// ignored give zero losses and gradients; without an ignore index every class counts.
#[test]
fn ignored_targets_have_no_loss_and_no_gradient() {
    let n = 7;
    let x = uniform(4 * n, 3, [-4.0, 4.0]);
    let t = [3, 0, 3, 6];
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let (mut lse, mut losses) = ([0.0; 4], [0.0; 4]);
        forward_rows_on(isa, &x, n, &t, Some(3), &mut lse, &mut losses);
        assert_eq!([losses[0], losses[2]], [0.0, 0.0]);
        assert!(losses[1] > 0.0 && losses[3] > 0.0);
        let mut grad = vec![f32::NAN; x.len()];
        backward_rows_on(isa, &x, n, &lse, &t, Some(3), 1.0, &mut grad);
        assert!(
            grad[..n]
                .iter()
                .chain(&grad[2 * n..3 * n])
                .all(|&g| g == 0.0)
        );
        // Each row's gradient sums to 0 (probabilities sum to 1, minus the one-hot).
        let sum: f32 = grad[n..2 * n].iter().sum();
        assert!(sum.abs() < 1e-6, "{sum}");
        assert!(grad[n] < 0.0 && grad[n + 1..2 * n].iter().all(|&g| g > 0.0));
        // Without an ignore index, target 3 is a class like any other.
        forward_rows_on(isa, &x, n, &t, None, &mut lse, &mut losses);
        assert!(losses.iter().all(|&l| l > 0.0));
        // Every row ignored.
        forward_rows_on(
            isa,
            &x,
            n,
            &[IGNORE; 4],
            Some(IGNORE),
            &mut lse,
            &mut losses,
        );
        assert_eq!(losses, [0.0; 4]);
        backward_rows_on(isa, &x, n, &lse, &[IGNORE; 4], Some(IGNORE), 1.0, &mut grad);
        assert!(grad.iter().all(|&g| g == 0.0));
    }
}

/// One row is a batch like any other; no rows (and rows of no classes, all ignored) are
/// nothing to compute.
#[test]
fn one_row_and_no_rows() {
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let x = [2.0f32, -1.0, 0.5];
        let (mut lse, mut losses) = ([0.0], [0.0]);
        forward_rows_on(isa, &x, 3, &[1], None, &mut lse, &mut losses);
        let (want_lse, want_loss) = reference(&x, 1);
        assert!((lse[0] as f64 - want_lse).abs() < 1e-6 * want_lse);
        assert!((losses[0] as f64 - want_loss).abs() < 1e-6 * want_loss);
        // A single class: probability 1, loss 0, gradient 0.
        forward_rows_on(isa, &[5.0], 1, &[0], None, &mut lse, &mut losses);
        assert_eq!((lse[0], losses[0]), (5.0, 0.0));
        let mut grad = [f32::NAN];
        backward_rows_on(isa, &[5.0], 1, &lse, &[0], None, 1.0, &mut grad);
        assert_eq!(grad[0], 0.0);
        // No rows.
        forward_rows_on(isa, &[], 50257, &[], None, &mut [], &mut []);
        backward_rows_on(isa, &[], 50257, &[], &[], None, 1.0, &mut []);
        backward_rows_in_place_on(isa, &mut [], 50257, &[], &[], None, 1.0);
        // Rows of no classes, all ignored: ln Σ of nothing is −∞.
        let (mut lse, mut losses) = ([0.0; 2], [1.0; 2]);
        forward_rows_on(isa, &[], 0, &[-1, -1], Some(-1), &mut lse, &mut losses);
        assert_eq!((lse, losses), ([f32::NEG_INFINITY; 2], [0.0; 2]));
    }
}

/// A `NaN` or `+∞` logit makes its row `NaN`, and only its row; a `−∞` logit is a class of
/// probability 0 (loss `+∞` as the target).
#[test]
fn nan_and_infinities_stay_in_their_row() {
    let n = 40;
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let mut x = uniform(5 * n, 9, [-4.0, 4.0]);
        x[17] = f32::NAN;
        x[n + 33] = f32::INFINITY;
        x[2 * n + 5] = f32::NEG_INFINITY;
        x[3 * n + 2] = f32::NEG_INFINITY;
        let t = [0, 1, 2, 2, 4];
        let (mut lse, mut losses) = ([0.0; 5], [0.0; 5]);
        forward_rows_on(isa, &x, n, &t, None, &mut lse, &mut losses);
        assert!(lse[0].is_nan() && losses[0].is_nan(), "{isa:?}");
        assert!(lse[1].is_nan() && losses[1].is_nan(), "{isa:?}");
        assert!(lse[2].is_finite() && losses[2].is_finite(), "{isa:?}");
        assert!(lse[3].is_finite() && losses[3] == f32::INFINITY, "{isa:?}");
        assert!(lse[4].is_finite() && losses[4].is_finite(), "{isa:?}");
        let mut grad = vec![0.0; x.len()];
        backward_rows_on(isa, &x, n, &lse, &t, None, 1.0, &mut grad);
        assert!(grad[..2 * n].iter().all(|g| g.is_nan()), "{isa:?}");
        assert!(grad[2 * n..].iter().all(|g| g.is_finite()), "{isa:?}");
        assert_eq!(grad[2 * n + 5], 0.0);
        assert_eq!(grad[3 * n + 2], -1.0);
    }
}

/// The backward is the forward's gradient: central differences of the mean loss over three
/// rows (one ignored, so the mean divides by 2 and `scale = 1/2`) on a row of 7, within
/// `2e-3` (steps of `1e-2` in `f32`: truncation about `1e-5`, rounding about `1e-4`). A
/// wrong sign, a missing one-hot or a wrong scale is off by `0.07` or more.
#[test]
fn backward_matches_finite_differences() {
    let n = 7;
    let x = uniform(3 * n, 21, [-2.0, 2.0]);
    let t = [4, IGNORE, 0];
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let mean_loss = |x: &[f32]| {
            let (mut lse, mut losses) = ([0.0; 3], [0.0; 3]);
            forward_rows_on(isa, x, n, &t, Some(IGNORE), &mut lse, &mut losses);
            losses.iter().map(|&l| l as f64).sum::<f64>() / 2.0
        };
        let (mut lse, mut losses) = ([0.0; 3], [0.0; 3]);
        forward_rows_on(isa, &x, n, &t, Some(IGNORE), &mut lse, &mut losses);
        let mut grad = vec![0.0; x.len()];
        backward_rows_on(isa, &x, n, &lse, &t, Some(IGNORE), 0.5, &mut grad);
        for i in 0..x.len() {
            let (mut up, mut down) = (x.clone(), x.clone());
            up[i] += 1e-2;
            down[i] -= 1e-2;
            let step = (up[i] - down[i]) as f64;
            let want = (mean_loss(&up) - mean_loss(&down)) / step;
            assert!(
                (grad[i] as f64 - want).abs() < 2e-3,
                "{isa:?} logit {i}: gradient {} vs finite difference {want}",
                grad[i]
            );
        }
    }
}

/// Rows shared among threads give exactly what one call per row gives.
#[test]
fn parallel_rows_equal_serial_rows() {
    let n = 97;
    let rows = 4 * PARALLEL_MIN / n;
    let x = uniform(rows * n, 5, [-8.0, 8.0]);
    let t = targets(rows, n, 6);
    let (mut lse, mut losses) = (vec![0.0; rows], vec![0.0; rows]);
    forward_rows(&x, n, &t, None, &mut lse, &mut losses);
    let mut grad = vec![0.0; x.len()];
    backward_rows(&x, n, &lse, &t, None, 1.0, &mut grad);
    for r in 0..rows {
        let row = &x[r * n..][..n];
        let (mut one_lse, mut one_loss) = ([0.0], [0.0]);
        forward_rows(row, n, &t[r..=r], None, &mut one_lse, &mut one_loss);
        assert_eq!((one_lse[0], one_loss[0]), (lse[r], losses[r]), "row {r}");
        let mut one_grad = vec![0.0; n];
        backward_rows(row, n, &one_lse, &t[r..=r], None, 1.0, &mut one_grad);
        assert_eq!(one_grad, grad[r * n..][..n], "row {r}");
    }
}

#[test]
#[should_panic(expected = "target 7 of row 1 is not a class of 0..7")]
fn a_target_past_the_vocabulary_is_refused() {
    let x = [0.0; 14];
    forward_rows(&x, 7, &[0, 7], Some(IGNORE), &mut [0.0; 2], &mut [0.0; 2]);
}

#[test]
#[should_panic(expected = "target -1 of row 0 is not a class of 0..7")]
fn a_negative_target_other_than_the_ignore_index_is_refused() {
    let x = [0.0; 7];
    backward_rows(&x, 7, &[0.0], &[-1], Some(IGNORE), 1.0, &mut [0.0; 7]);
}

#[test]
#[should_panic(expected = "14 logits are not 3 rows (one per target) of 7")]
fn logits_that_are_not_one_row_per_target_are_refused() {
    forward_rows(
        &[0.0; 14],
        7,
        &[0, 1, 2],
        None,
        &mut [0.0; 3],
        &mut [0.0; 3],
    );
}

#[test]
#[should_panic(expected = "one log-sum-exp per row")]
fn a_missing_log_sum_exp_is_refused() {
    let mut x = [0.0; 14];
    backward_rows_in_place(&mut x, 7, &[0.0], &[0, 1], None, 1.0);
}
