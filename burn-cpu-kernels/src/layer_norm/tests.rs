use super::*;
use crate::testing::uniform;

/// The inputs' range: width 4 around `offset`, `[offset − 2, offset + 2)`.
fn around(offset: f32) -> [f32; 2] {
    [offset - 2.0, offset + 2.0]
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
                let x = uniform(rows * n, n as u64, around(offset));
                let gamma = uniform(n, 3, around(1.0));
                let beta = uniform(n, 4, around(0.0));
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
                                    (g as f64 - w).abs() <= tol * (gamma[j].abs() as f64 + w.abs()),
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
            let x = uniform(rows * n, 5 + n as u64, around(0.5));
            let dy = uniform(rows * n, 6 + n as u64, around(0.0));
            let gamma = uniform(n, 7, around(1.0));
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
                        let tol = 2e-5 * s * (g[j].abs() + a.abs() + (xhat[j] * b).abs()) + 1e-6;
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
    let x = uniform(rows * n, 9, around(0.0));
    let dy = uniform(rows * n, 10, around(0.0));
    let gamma = uniform(n, 11, around(1.0));
    let beta = uniform(n, 12, around(0.0));
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
