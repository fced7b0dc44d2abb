//! Times [`attention::forward`] against an unfused attention on the same thread pool: the
//! `[b, h, sq, sk]` scores materialised by `gemm`, a separate softmax pass, then the product
//! with the values (what burn-backend's fallback does, kernel by kernel, but parallel over
//! heads). Inputs arrive as Burn's would after `swap_dims(1, 2)` of a `[b, s, h, d]`
//! projection: permuted views, read in place; the mask is a `[b, 1, 1, sk]` padding mask.
//!
//! ```text
//! cargo run --release -p burn-cpu-kernels --example attention_bench
//! ```
//!
//! With `--backward`, the training pair instead: [`attention::forward_train`] and
//! [`attention::backward`] (causal, a padding mask, dropout 0.1), in milliseconds.

use std::time::Instant;

use burn_cpu_kernels::View4;
use burn_cpu_kernels::attention::{self, Options};
use burn_cpu_kernels::testing::uniform;
use burn_cpu_kernels::{MatRef, gemm};
use rayon::prelude::*;

/// One benchmark case.
struct Case {
    name: &'static str,
    b: usize,
    h: usize,
    sq: usize,
    sk: usize,
    d: usize,
    causal: bool,
}

/// Inputs stored `[b, s, h, d]`, a padding mask with batch `i` keeping `sk − (i mod 4)·sk/8`
/// keys.
struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    mask: Vec<u8>,
}

impl Case {
    fn inputs(&self) -> Inputs {
        let Case {
            b, h, sq, sk, d, ..
        } = *self;
        Inputs {
            q: uniform(b * sq * h * d, 1, [-1.0, 1.0]),
            k: uniform(b * sk * h * d, 2, [-1.0, 1.0]),
            v: uniform(b * sk * h * d, 3, [-1.0, 1.0]),
            mask: (0..b * sk)
                .map(|n| (n % sk >= sk - (n / sk % 4) * sk / 8) as u8)
                .collect(),
        }
    }

    /// `[b, h, s, d]` views of `[b, s, h, d]` buffers.
    fn views<'a>(&self, x: &'a Inputs) -> [View4<'a, f32>; 3] {
        let Case {
            b, h, sq, sk, d, ..
        } = *self;
        let swap = |data, s| View4::contiguous(data, [b, s, h, d]).permute([0, 2, 1, 3]);
        [swap(&x.q, sq), swap(&x.k, sk), swap(&x.v, sk)]
    }

    /// Multiply-adds of the two products, counted as two operations each (all of them: a
    /// causal case does about half).
    fn flops(&self) -> f64 {
        4.0 * (self.b * self.h * self.sq * self.sk * self.d) as f64
    }
}

/// The unfused attention: scores for every head, then softmax rows, then the product.
fn unfused(case: &Case, x: &Inputs, out: &mut [f32], scores: &mut [f32]) {
    let Case {
        h,
        sq,
        sk,
        d,
        causal,
        ..
    } = *case;
    let scale = 1.0 / (d as f32).sqrt();
    // Head bh = (bi, hi) of a [b, s, h, d] buffer: s rows h·d apart from this offset.
    let head = |s: usize, bh: usize| (bh / h * s * h + bh % h) * d;
    scores
        .par_chunks_mut(sq * sk)
        .enumerate()
        .for_each(|(bh, s)| {
            let qo = head(sq, bh);
            let ko = head(sk, bh);
            let qm = MatRef::strided(&x.q, qo, [sq, d], [(h * d) as isize, 1]);
            let km = MatRef::strided(&x.k, ko, [sk, d], [(h * d) as isize, 1]);
            gemm(s, sk, qm, km.t(), scale, false, gemm::Parallelism::None);
        });
    scores.par_chunks_mut(sk).enumerate().for_each(|(row, s)| {
        let (bi, i) = (row / (h * sq), row % sq);
        let mask = &x.mask[bi * sk..(bi + 1) * sk];
        for (j, (v, &m)) in s.iter_mut().zip(mask).enumerate() {
            if m != 0 || (causal && j + sq > i + sk) {
                *v = f32::NEG_INFINITY;
            }
        }
        let max = s.iter().fold(f32::MIN, |m, &v| m.max(v));
        let mut sum = 0.0;
        for v in s.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum.max(f32::MIN_POSITIVE);
        s.iter_mut().for_each(|v| *v *= inv);
    });
    out.par_chunks_mut(sq * d)
        .zip(scores.par_chunks(sq * sk))
        .enumerate()
        .for_each(|(bh, (o, s))| {
            let vo = head(sk, bh);
            let vm = MatRef::strided(&x.v, vo, [sk, d], [(h * d) as isize, 1]);
            gemm(
                o,
                d,
                MatRef::row_major(s, sq, sk),
                vm,
                1.0,
                false,
                gemm::Parallelism::None,
            );
        });
}

/// The fastest of `f`'s times in milliseconds, over about half a second after a warm-up: the
/// minimum rather than the median, since other processes share this machine's two cores and
/// only ever add time.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    f();
    let once = start.elapsed().as_secs_f64();
    let runs = ((0.5 / once) as usize).clamp(5, 500);
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// The training pair's rows: `forward_train`, `backward`, and both on one thread.
fn backward_rows() {
    let cases = [
        Case {
            name: "small",
            b: 16,
            h: 4,
            sq: 64,
            sk: 64,
            d: 32,
            causal: true,
        },
        Case {
            name: "long",
            b: 1,
            h: 12,
            sq: 512,
            sk: 512,
            d: 64,
            causal: true,
        },
    ];
    println!(
        "{} rayon threads; causal, padding mask [b, 1, 1, sk], dropout 0.1; inputs permuted \
         from [b, s, h, d]",
        rayon::current_num_threads()
    );
    println!(
        "| case | b×h×s×d | forward ms | forward_train ms | backward ms | train + backward 1 thread ms |"
    );
    println!("|---|---|---|---|---|---|");
    for case in &cases {
        let x = case.inputs();
        let [q, k, v] = case.views(&x);
        let Case {
            b, h, sq, sk, d, ..
        } = *case;
        let mask = View4::contiguous(&x.mask, [b, 1, 1, sk]);
        let options = Options {
            causal: case.causal,
            dropout: Some(attention::AttentionDropout { prob: 0.1, seed: 7 }),
            ..Options::default()
        };
        let n = b * h * sq * d;
        let mut out = vec![0.0f32; n];
        let mut lse = vec![0.0f32; b * h * sq];
        let grad = uniform(n, 4, [-1.0, 1.0]);
        let grad_out = View4::contiguous(&grad, [b, h, sq, d]);
        let (mut dq, mut dk, mut dv) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
        let t_forward =
            time(|| attention::forward(&mut out, q, k, v, Some(mask), None, options, true));
        let t_train = time(|| {
            attention::forward_train(&mut out, &mut lse, q, k, v, Some(mask), None, options, true)
        });
        let mut backward = |parallel| {
            let out_view = View4::contiguous(&out, [b, h, sq, d]);
            attention::backward(
                q,
                k,
                v,
                Some(mask),
                None,
                out_view,
                &lse,
                grad_out,
                options,
                &mut dq,
                &mut dk,
                &mut dv,
                parallel,
            )
        };
        let t_backward = time(|| backward(true));
        let t_serial = time(|| {
            let mut out = vec![0.0f32; n];
            let mut lse = vec![0.0f32; b * h * sq];
            attention::forward_train(
                &mut out,
                &mut lse,
                q,
                k,
                v,
                Some(mask),
                None,
                options,
                false,
            );
            let (mut dq, mut dk, mut dv) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
            attention::backward(
                q,
                k,
                v,
                Some(mask),
                None,
                View4::contiguous(&out, [b, h, sq, d]),
                &lse,
                grad_out,
                options,
                &mut dq,
                &mut dk,
                &mut dv,
                false,
            );
        });
        println!(
            "| {} | {b}×{h}×{sq}×{d} | {t_forward:.3} | {t_train:.3} | {t_backward:.3} | {t_serial:.3} |",
            case.name
        );
    }
}

fn main() {
    if std::env::args().any(|a| a == "--backward") {
        backward_rows();
        return;
    }
    let cases = [
        Case {
            name: "BERT-base",
            b: 32,
            h: 12,
            sq: 128,
            sk: 128,
            d: 64,
            causal: false,
        },
        Case {
            name: "short",
            b: 1,
            h: 12,
            sq: 16,
            sk: 16,
            d: 64,
            causal: false,
        },
        Case {
            name: "long",
            b: 1,
            h: 12,
            sq: 1024,
            sk: 1024,
            d: 64,
            causal: false,
        },
        Case {
            name: "long causal",
            b: 1,
            h: 12,
            sq: 1024,
            sk: 1024,
            d: 64,
            causal: true,
        },
    ];
    println!(
        "{} rayon threads; padding mask [b, 1, 1, sk]; inputs permuted from [b, s, h, d]",
        rayon::current_num_threads()
    );
    println!(
        "| case | b×h×sq×sk×d | unfused ms | fused ms | speed-up | fused 1 thread ms | fused GFLOP/s | max Δ |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for case in &cases {
        let x = case.inputs();
        let [q, k, v] = case.views(&x);
        let Case {
            b, h, sq, sk, d, ..
        } = *case;
        let mask = View4::contiguous(&x.mask, [b, 1, 1, sk]);
        let options = Options {
            causal: case.causal,
            ..Options::default()
        };
        let mut fused = vec![0.0f32; b * h * sq * d];
        let mut naive = vec![0.0f32; b * h * sq * d];
        let mut scores = vec![0.0f32; b * h * sq * sk];
        let t_unfused = time(|| unfused(case, &x, &mut naive, &mut scores));
        let t_fused =
            time(|| attention::forward(&mut fused, q, k, v, Some(mask), None, options, true));
        let t_serial =
            time(|| attention::forward(&mut fused, q, k, v, Some(mask), None, options, false));
        let diff = fused
            .iter()
            .zip(&naive)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        println!(
            "| {} | {b}×{h}×{sq}×{sk}×{d}{} | {t_unfused:.3} | {t_fused:.3} | {:.2}× | {t_serial:.3} | {:.0} | {diff:.1e} |",
            case.name,
            if case.causal { " causal" } else { "" },
            t_unfused / t_fused,
            case.flops() / t_fused / 1e6,
        );
    }
}
