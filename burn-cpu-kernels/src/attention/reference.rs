//! The `f64` reference of [`forward`](super::forward): what the tests compare against.

use super::{Options, Problem, View4};
use crate::convert::StoredFloat;

/// The fallback's computation in `f64`, naively (the whole `[b, h, sq, sk]` score tensor),
/// on the same views and options as [`forward`](super::forward): the contiguous
/// `[b, h, sq, dv]` output.
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
    let p = Problem::new(q, k, v, mask, bias, options);
    let ([b, h, sq, d], sk, dv) = (q.shape, k.shape[2], p.dv);
    let f = |e: E| e.to_f32() as f64;
    let mut out = vec![0.0f64; b * h * sq * dv];
    let mut scores = vec![0.0f64; sk];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..sq {
                for (j, s) in scores.iter_mut().enumerate() {
                    let dot: f64 = (0..d)
                        .map(|c| f(q.at([bi, hi, i, c])) * f(k.at([bi, hi, j, c])))
                        .sum();
                    *s = dot * p.scale as f64;
                    if let Some(cap) = p.softcap {
                        let cap = cap as f64;
                        *s = cap * (*s / cap).tanh();
                    }
                    if p.mask.is_some_and(|m| m.at([bi, hi, i, j]) != 0) {
                        *s = f64::NEG_INFINITY;
                    }
                    if p.causal_offset.is_some_and(|o| j as isize > i as isize + o) {
                        *s = f64::NEG_INFINITY;
                    }
                    if let Some(bias) = p.bias {
                        *s += f(bias.at([bi, hi, i, j]));
                    }
                }
                let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
                let max = max.max(f64::MIN);
                let weights: Vec<f64> = scores.iter().map(|&s| (s - max).exp()).collect();
                let sum = weights.iter().sum::<f64>().max(f64::MIN_POSITIVE);
                let row = ((bi * h + hi) * sq + i) * dv;
                for (c, o) in out[row..row + dv].iter_mut().enumerate() {
                    *o = (0..sk)
                        .map(|j| weights[j] / sum * f(v.at([bi, hi, j, c])))
                        .sum();
                }
            }
        }
    }
    out
}
