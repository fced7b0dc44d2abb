use super::*;
use crate::testing::uniform;

/// The scores' range.
const SCORES: [f32; 2] = [-8.0, 8.0];

/// Burn's composition in `f64`: `mask_fill(−∞)`, then `exp(x − max)/Σ`, or its log.
fn reference(x: &[f32], mask: Option<&[bool]>, log: bool) -> Vec<f64> {
    let v: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            if mask.is_some_and(|m| m[i]) {
                f64::NEG_INFINITY
            } else {
                x as f64
            }
        })
        .collect();
    let max = v.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
    let sum: f64 = v.iter().map(|&x| (x - max).exp()).sum();
    v.iter()
        .map(|&x| {
            if log {
                (x - max) - sum.ln()
            } else {
                (x - max).exp() / sum
            }
        })
        .collect()
}

fn close(got: f32, want: f64, rel: f64, abs: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() {
        return got as f64 == want;
    }
    (got as f64 - want).abs() <= rel * want.abs() + abs
}

/// Every row length of the brief, with no mask, some masked and all masked, on both paths
/// and with 3 rows (serial) as with many (parallel).
#[test]
fn softmax_and_log_softmax_follow_f64() {
    for n in [1usize, 3, 17, 128, 384, 1000] {
        for rows in [3usize, PARALLEL_MIN / n + 5] {
            let x = uniform(rows * n, n as u64, SCORES);
            let some: Vec<bool> = (0..rows * n).map(|i| (i * 7 + i / n) % 5 == 1).collect();
            let all = vec![true; rows * n];
            // Three mask rows, each serving 7 score rows, cycled: a block of rows on
            // another thread starts inside a mask row's run.
            let cycled = RowMask::repeated(&some[..3 * n], 7);
            for (mask, name) in [
                (None, "none"),
                (Some(RowMask::new(&some)), "some"),
                (Some(RowMask::new(&all)), "all"),
                (Some(cycled), "cycled"),
            ] {
                for log in [false, true] {
                    for isa in [Isa::PORTABLE, Isa::detected()] {
                        let mut y = vec![0.0; x.len()];
                        forward_rows_on(isa, log, Some(&x), &mut y, n, mask);
                        let mut again = x.clone();
                        forward_rows_on(isa, log, None, &mut again, n, mask);
                        assert_eq!(
                            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            again.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                        );
                        for r in 0..rows {
                            let row = r * n..(r + 1) * n;
                            let m = mask_of(mask, r, n);
                            let want = reference(&x[row.clone()], Some(&m), log);
                            for (j, (&g, &w)) in y[row].iter().zip(&want).enumerate() {
                                // Probabilities: relative 4 ulp; log-probabilities
                                // absolute, from ln Σ and x − max.
                                let ok = if log {
                                    close(g, w, 2.4e-7, 2e-6)
                                } else {
                                    close(g, w, 4.8e-7, 1e-37)
                                };
                                assert!(
                                    ok,
                                    "n {n} rows {rows} mask {name} log {log} {isa:?} [{r},{j}]: {g} vs {w}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

fn mask_of(mask: Option<RowMask<'_>>, r: usize, n: usize) -> Vec<bool> {
    mask.map_or(vec![false; n], |m| m.row(r, n).to_vec())
}

/// A fully masked row is `NaN` (Burn's and PyTorch's composition), its neighbours not; a
/// masked position is exactly 0.
#[test]
fn masks_follow_burn_s_mask_fill_then_softmax() {
    let n = 5;
    let x = uniform(3 * n, 1, SCORES);
    let mut bits = vec![false; 3 * n];
    bits[n..2 * n].fill(true);
    bits[2] = true;
    let mut y = vec![0.0; x.len()];
    masked_softmax_rows(&x, RowMask::new(&bits), &mut y, n);
    assert!(y[n..2 * n].iter().all(|v| v.is_nan()));
    assert_eq!(y[2], 0.0);
    assert!((y[..n].iter().sum::<f32>() - 1.0).abs() < 1e-6);
    assert!(y[2 * n..].iter().all(|v| v.is_finite() && *v > 0.0));
    masked_log_softmax_rows(&x, RowMask::new(&bits), &mut y, n);
    assert_eq!(y[2], f32::NEG_INFINITY);
    assert!(y[n..2 * n].iter().all(|v| v.is_nan()));
    // A key-padding mask over 2 heads × 2 queries: mask row r / 4.
    let keys = vec![false, false, true, true, false, true];
    let x = uniform(8 * 3, 2, SCORES);
    let mut y = vec![0.0; x.len()];
    masked_softmax_rows(&x, RowMask::repeated(&keys, 4), &mut y, 3);
    for r in 0..8 {
        let m = &keys[(r / 4) * 3..][..3];
        for j in 0..3 {
            assert_eq!(y[r * 3 + j] == 0.0, m[j], "row {r}");
        }
    }
}

/// `NaN` or `+∞` in a row makes that row `NaN`; `−∞` is a zero probability.
#[test]
fn nan_and_infinities_follow_the_composition() {
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let n = 20;
        let mut x = uniform(4 * n, 3, SCORES);
        x[3] = f32::NAN;
        x[n + 18] = f32::INFINITY;
        x[2 * n + 17] = f32::NEG_INFINITY;
        let mut y = vec![0.0; x.len()];
        forward_rows_on(isa, false, Some(&x), &mut y, n, None);
        assert!(y[..2 * n].iter().all(|v| v.is_nan()), "{isa:?}");
        assert_eq!(y[2 * n + 17], 0.0);
        assert!(y[2 * n..].iter().all(|v| !v.is_nan()));
        // Large scores do not overflow.
        let big = vec![1e30f32, 1e30, 0.0];
        let mut y = vec![0.0; 3];
        forward_rows_on(isa, true, Some(&big), &mut y, 3, None);
        assert!(
            (y[0] + core::f32::consts::LN_2).abs() < 1e-6 && y[2] == -1e30,
            "{y:?}"
        );
    }
}

/// The backward against `f64` formulas, on both paths, serial and parallel.
#[test]
fn backward_follows_f64() {
    for n in [1usize, 3, 17, 384, 1000] {
        for rows in [3usize, PARALLEL_MIN / n + 5] {
            let x = uniform(rows * n, 7 + n as u64, SCORES);
            let dy = uniform(rows * n, 11 + n as u64, SCORES);
            for log in [false, true] {
                let mut y = vec![0.0; x.len()];
                forward_rows_on(Isa::detected(), log, Some(&x), &mut y, n, None);
                for isa in [Isa::PORTABLE, Isa::detected()] {
                    let mut dx = vec![0.0; x.len()];
                    backward_rows_on(isa, log, &y, Some(&dy), &mut dx, n);
                    let mut again = dy.clone();
                    backward_rows_on(isa, log, &y, None, &mut again, n);
                    assert_eq!(dx, again);
                    for r in 0..rows {
                        let row = r * n..(r + 1) * n;
                        let (y, dy, dx) = (&y[row.clone()], &dy[row.clone()], &dx[row]);
                        let (s, scale) = if log {
                            let s: f64 = dy.iter().map(|&v| v as f64).sum();
                            (s, dy.iter().map(|v| v.abs() as f64).sum::<f64>())
                        } else {
                            let s: f64 = y.iter().zip(dy).map(|(&a, &b)| a as f64 * b as f64).sum();
                            (s, dy.iter().map(|v| v.abs() as f64).fold(0.0, f64::max))
                        };
                        for j in 0..n {
                            let (yj, g) = (y[j] as f64, dy[j] as f64);
                            let want = if log { g - yj.exp() * s } else { yj * (g - s) };
                            let tol = 1e-6 * (scale + want.abs());
                            assert!(
                                (dx[j] as f64 - want).abs() <= tol,
                                "n {n} log {log} {isa:?} [{r},{j}]: {} vs {want}",
                                dx[j]
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Rows split among threads give exactly what one call per row gives.
#[test]
fn parallel_rows_equal_serial_rows() {
    let n = 128;
    let rows = 4 * PARALLEL_MIN / n;
    let x = uniform(rows * n, 5, SCORES);
    let mut all = vec![0.0; x.len()];
    softmax_rows(&x, &mut all, n);
    for (r, want) in all.chunks(n).enumerate() {
        let mut one = vec![0.0; n];
        softmax_rows(&x[r * n..][..n], &mut one, n);
        assert_eq!(one, want, "row {r}");
    }
}

#[test]
#[should_panic(expected = "not whole rows")]
fn partial_rows_are_refused() {
    softmax_rows(&[0.0; 7], &mut [0.0; 7], 3);
}
