//! The `f64` references of [`forward`](super::forward), [`forward_train`](super::forward_train)
//! and [`backward`](super::backward): what the tests compare against. Each forms the whole
//! `[sq, sk]` score matrix of a head, naively.

use super::{Options, Problem, View4, dropout_keep};
use crate::convert::StoredFloat;

/// The fallback's computation in `f64`, naively (the whole `[b, h, sq, sk]` score tensor),
/// on the same views and options as [`forward`](super::forward): the contiguous
/// `[b, h, sq, dv]` output (dropout applied if the options set it).
///
/// # Panics
/// As [`forward`](super::forward).
pub fn reference<E: StoredFloat>(
    q: View4<'_, E>,
    k: View4<'_, E>,
    v: View4<'_, E>,
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, E>>,
    options: Options,
) -> Vec<f64> {
    reference_train(q, k, v, mask, bias, options).0
}

/// One head's probabilities in `f64`: `P` (`sq × sk`, row-major, before dropout), the
/// scaled keep mask `Z` (1 without dropout), the softcap derivatives `1 − tanh²` (1 without
/// softcap) and each query's log-sum-exp (`+∞` for a fully masked query).
struct HeadProbabilities {
    p: Vec<f64>,
    z: Vec<f64>,
    cap_grad: Vec<f64>,
    lse: Vec<f64>,
}

fn probabilities<E: StoredFloat>(
    problem: &Problem<'_, E>,
    bi: usize,
    hi: usize,
) -> HeadProbabilities {
    let (q, k) = (problem.q, problem.k);
    let ([_, _, sq, d], sk) = (q.shape, k.shape[2]);
    let f = |e: E| e.to_f32() as f64;
    let mut out = HeadProbabilities {
        p: vec![0.0; sq * sk],
        z: vec![1.0; sq * sk],
        cap_grad: vec![1.0; sq * sk],
        lse: vec![0.0; sq],
    };
    for i in 0..sq {
        let row = &mut out.p[i * sk..(i + 1) * sk];
        for (j, s) in row.iter_mut().enumerate() {
            let dot: f64 = (0..d)
                .map(|c| f(q.at([bi, hi, i, c])) * f(k.at([bi, hi, j, c])))
                .sum();
            *s = dot * problem.scale as f64;
            if let Some(cap) = problem.softcap {
                let cap = cap as f64;
                let t = (*s / cap).tanh();
                *s = cap * t;
                out.cap_grad[i * sk + j] = 1.0 - t * t;
            }
            if problem.mask.is_some_and(|m| m.at([bi, hi, i, j]) != 0) {
                *s = f64::NEG_INFINITY;
            }
            if problem
                .causal_offset
                .is_some_and(|o| j as isize > i as isize + o)
            {
                *s = f64::NEG_INFINITY;
            }
            if let Some(bias) = problem.bias {
                *s += f(bias.at([bi, hi, i, j]));
            }
            if let Some(dropout) = problem.dropout {
                let keep = dropout_keep(dropout, problem.dropout_index(bi, hi, i, j));
                out.z[i * sk + j] = if keep {
                    1.0 / (1.0 - dropout.prob as f64)
                } else {
                    0.0
                };
            }
        }
        let raw_max = row.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
        let max = raw_max.max(f64::MIN);
        row.iter_mut().for_each(|s| *s = (*s - max).exp());
        let sum = row.iter().sum::<f64>();
        row.iter_mut()
            .for_each(|w| *w /= sum.max(f64::MIN_POSITIVE));
        out.lse[i] = if raw_max == f64::NEG_INFINITY {
            f64::INFINITY
        } else {
            max + sum.ln()
        };
    }
    out
}

/// [`reference()`] and the log-sum-exp [`forward_train`](super::forward_train) saves: the
/// contiguous `[b, h, sq, dv]` output and `[b, h, sq]` log-sum-exp, in `f64`.
///
/// # Panics
/// As [`forward`](super::forward).
pub fn reference_train<E: StoredFloat>(
    q: View4<'_, E>,
    k: View4<'_, E>,
    v: View4<'_, E>,
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, E>>,
    options: Options,
) -> (Vec<f64>, Vec<f64>) {
    let p = Problem::new(q, k, v, mask, bias, options);
    let ([b, h, sq, _], sk, dv) = (q.shape, k.shape[2], p.dv);
    let f = |e: E| e.to_f32() as f64;
    let mut out = vec![0.0f64; b * h * sq * dv];
    let mut lse = vec![0.0f64; b * h * sq];
    for bi in 0..b {
        for hi in 0..h {
            let head = probabilities(&p, bi, hi);
            for i in 0..sq {
                let at = (bi * h + hi) * sq + i;
                lse[at] = head.lse[i];
                for (c, o) in out[at * dv..(at + 1) * dv].iter_mut().enumerate() {
                    *o = (0..sk)
                        .map(|j| head.p[i * sk + j] * head.z[i * sk + j] * f(v.at([bi, hi, j, c])))
                        .sum();
                }
            }
        }
    }
    (out, lse)
}

/// The gradients [`backward`](super::backward) computes, in `f64` from the full probability
/// matrices: `[dq, dk, dv]`, contiguous `[b, h, sq, d]`, `[b, h, sk, d]`, `[b, h, sk, dv]`,
/// for the output gradient `grad_out` (`[b, h, sq, dv]`). The forward is recomputed here (no
/// saved statistics are taken).
///
/// # Panics
/// As [`forward`](super::forward), and if `grad_out` is not `[b, h, sq, dv]`.
pub fn reference_backward<E: StoredFloat>(
    q: View4<'_, E>,
    k: View4<'_, E>,
    v: View4<'_, E>,
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, E>>,
    grad_out: View4<'_, E>,
    options: Options,
) -> [Vec<f64>; 3] {
    let p = Problem::new(q, k, v, mask, bias, options);
    let ([b, h, sq, d], sk, dvn) = (q.shape, k.shape[2], p.dv);
    assert_eq!(
        grad_out.shape,
        [b, h, sq, dvn],
        "the output gradient's shape"
    );
    let f = |e: E| e.to_f32() as f64;
    let mut dq = vec![0.0f64; b * h * sq * d];
    let mut dk = vec![0.0f64; b * h * sk * d];
    let mut dv = vec![0.0f64; b * h * sk * dvn];
    for bi in 0..b {
        for hi in 0..h {
            let head = probabilities(&p, bi, hi);
            let bh = bi * h + hi;
            // dS_ij = P_ij·(dP_ij − Σ_l P_il·dP_il)·(1 − tanh²), dP_ij = (dO_i·v_j)·Z_ij.
            let mut ds = vec![0.0f64; sq * sk];
            for i in 0..sq {
                let d_p: Vec<f64> = (0..sk)
                    .map(|j| {
                        let dot: f64 = (0..dvn)
                            .map(|c| f(grad_out.at([bi, hi, i, c])) * f(v.at([bi, hi, j, c])))
                            .sum();
                        dot * head.z[i * sk + j]
                    })
                    .collect();
                let delta: f64 = (0..sk).map(|j| head.p[i * sk + j] * d_p[j]).sum();
                for j in 0..sk {
                    let n = i * sk + j;
                    ds[n] = head.p[n] * (d_p[j] - delta) * head.cap_grad[n];
                    let weight = head.p[n] * head.z[n];
                    for c in 0..dvn {
                        dv[(bh * sk + j) * dvn + c] += weight * f(grad_out.at([bi, hi, i, c]));
                    }
                }
            }
            let scale = p.scale as f64;
            for i in 0..sq {
                for j in 0..sk {
                    let g = ds[i * sk + j] * scale;
                    for c in 0..d {
                        dq[(bh * sq + i) * d + c] += g * f(k.at([bi, hi, j, c]));
                        dk[(bh * sk + j) * d + c] += g * f(q.at([bi, hi, i, c]));
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}
