//! Times the element-wise and row-wise kernels (`math`, `softmax`, `layer_norm`, the GELU of
//! `Activation`) against naive scalar versions of what burn-flex computes (a `libm`
//! `erff`/`expf` call per value; softmax and layer norm as separate passes over the whole
//! tensor) at BERT-base encoder sizes: batch 32, sequence 128, 12 heads, hidden 384 for the
//! layer norm and 1536 for the GELU.
//!
//! `cargo run --release -p burn-cpu-kernels --example rows_bench`
//!
//! Columns: the naive version (one thread), the kernel on one thread, on rayon's threads,
//! and on rayon's threads forced onto the portable path; GB/s counts each element read and
//! written once, speed-up is the naive time over the kernel's on all threads.
//! `Activation`'s GELU runs on the calling thread by design (a product's epilogue), so its
//! thread columns time one thread; `math::gelu_to` is the same function on all threads.

use std::hint::black_box;
use std::time::Instant;

use burn_cpu_kernels::Activation;
use burn_cpu_kernels::Isa;
use burn_cpu_kernels::layer_norm::{self, RowStats};
use burn_cpu_kernels::math::{self, Func};
use burn_cpu_kernels::softmax::{self, RowMask};
use burn_cpu_kernels::testing::uniform;

/// The best of `reps` runs, in seconds, after one warm-up run.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

struct Row {
    name: &'static str,
    bytes: f64,
    naive: f64,
    one: f64,
    all: f64,
    portable: f64,
}

fn main() {
    let threads = rayon::current_num_threads();
    let single = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let reps = 10;
    let mut rows: Vec<Row> = Vec::new();
    // Times `kernel(isa)` on one thread, on all, and portable on all.
    let mut bench = |name: &'static str,
                     bytes: f64,
                     naive: &mut dyn FnMut(),
                     kernel: &mut (dyn FnMut(Isa) + Send)| {
        let naive = time(reps, naive);
        let one = single.install(|| time(reps, || kernel(Isa::detected())));
        let all = time(reps, || kernel(Isa::detected()));
        let portable = time(reps, || kernel(Isa::PORTABLE));
        rows.push(Row {
            name,
            bytes,
            naive,
            one,
            all,
            portable,
        });
    };

    // Element-wise: the GELU's input, batch 32 × sequence 128 × 1536.
    let len = 32 * 128 * 1536;
    let x = uniform(len, 1, [-4.0, 4.0]);
    let mut out = vec![0.0f32; len];
    let mut grad = vec![0.0f32; len];
    let b = 8.0 * len as f64;
    macro_rules! unary {
        ($name:expr, $func:expr, $naive:expr) => {{
            let (x, out_ptr) = (&x, &mut out);
            let mut naive = || {
                for (o, &v) in out_ptr.iter_mut().zip(x.iter()) {
                    *o = $naive(v);
                }
                black_box(&*out_ptr);
            };
            let mut y = vec![0.0f32; len];
            bench($name, b, &mut naive, &mut |isa| {
                math::map_to_on(isa, $func, x, &mut y)
            });
        }};
    }
    unary!("exp", Func::Exp, libm::expf);
    unary!("erf", Func::Erf, libm::erff);
    unary!("tanh", Func::Tanh, libm::tanhf);
    let naive_gelu = |v: f32| 0.5 * v * (1.0 + libm::erff(v * core::f32::consts::FRAC_1_SQRT_2));
    unary!("gelu (math::gelu_to)", Func::Gelu, naive_gelu);
    {
        // Activation::apply_to: one thread by design (a product's epilogue); in place.
        let mut naive = || {
            for (o, &v) in out.iter_mut().zip(&x) {
                *o = naive_gelu(v);
            }
            black_box(&out);
        };
        // In place, on a fresh copy each run (repeated GELUs would reach denormals); the
        // copy is timed with it.
        let mut y = x.clone();
        bench(
            "gelu (Activation::apply_to, +copy)",
            b,
            &mut naive,
            &mut |isa| {
                y.copy_from_slice(&x);
                Activation::Gelu.apply_to_on(isa, &mut y);
            },
        );
        // The same gradient each run (multiplying one in place again and again would reach
        // denormals); `backward_to` works in place, so it copies it first, timed with it.
        let dy = uniform(len, 8, [-1.0, 1.0]);
        let mut naive = || {
            for ((g, &z), &d) in grad.iter_mut().zip(&x).zip(&dy) {
                let cdf = 0.5 * (1.0 + libm::erff(z * core::f32::consts::FRAC_1_SQRT_2));
                *g = d * (cdf + z * 0.398_942_3 * libm::expf(-0.5 * z * z));
            }
            black_box(&grad);
        };
        let mut g = vec![1.0f32; len];
        bench(
            "gelu backward (Activation, +copy)",
            12.0 * len as f64,
            &mut naive,
            &mut |isa| {
                g.copy_from_slice(&dy);
                Activation::Gelu.backward_to_on(isa, &x, &mut g)
            },
        );
    }

    // Attention scores: 32 × 12 heads × 128 queries, rows of 128 keys.
    let (n, r) = (128, 32 * 12 * 128);
    let s = uniform(n * r, 2, [-8.0, 8.0]);
    let mut y = vec![0.0f32; n * r];
    let naive_softmax = |dst: &mut [f32], log: bool| {
        // burn-flex's passes: max per row, x − max, exp per value (libm), sum per row, divide.
        let max: Vec<f32> = s
            .chunks(n)
            .map(|row| row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)))
            .collect();
        for (i, (d, &v)) in dst.iter_mut().zip(&s).enumerate() {
            *d = v - max[i / n];
        }
        if log {
            let lse: Vec<f32> = dst
                .chunks(n)
                .map(|row| row.iter().map(|&v| libm::expf(v)).sum::<f32>().ln())
                .collect();
            for (i, d) in dst.iter_mut().enumerate() {
                *d -= lse[i / n];
            }
        } else {
            dst.iter_mut().for_each(|d| *d = libm::expf(*d));
            let sum: Vec<f32> = dst.chunks(n).map(|row| row.iter().sum()).collect();
            for (i, d) in dst.iter_mut().enumerate() {
                *d /= sum[i / n];
            }
        }
        black_box(&*dst);
    };
    let sb = 8.0 * (n * r) as f64;
    let mut out2 = vec![0.0f32; n * r];
    bench(
        "softmax 49152×128",
        sb,
        &mut || naive_softmax(&mut out2, false),
        &mut |isa| softmax::forward_rows_on(isa, false, Some(&s), &mut y, n, None),
    );
    bench(
        "log_softmax 49152×128",
        sb,
        &mut || naive_softmax(&mut out2, true),
        &mut |isa| softmax::forward_rows_on(isa, true, Some(&s), &mut y, n, None),
    );
    // A key-padding mask: the last 28 keys of every other sequence.
    let mut keys = vec![false; 32 * n];
    for b in (0..32).step_by(2) {
        keys[b * n + 100..(b + 1) * n].fill(true);
    }
    let mut naive_masked = || {
        let mut masked = s.clone();
        for (i, v) in masked.iter_mut().enumerate() {
            if keys[(i / (n * 12 * 128)) * n + i % n] {
                *v = f32::NEG_INFINITY;
            }
        }
        black_box(&masked);
        naive_softmax(&mut out2, false);
    };
    bench(
        "masked softmax 49152×128",
        sb + (n * r) as f64,
        &mut naive_masked,
        &mut |isa| {
            let mask = RowMask::repeated(&keys, 12 * 128);
            softmax::forward_rows_on(isa, false, Some(&s), &mut y, n, Some(mask))
        },
    );
    let probs = {
        let mut p = vec![0.0f32; n * r];
        softmax::softmax_rows(&s, &mut p, n);
        p
    };
    let dy = uniform(n * r, 3, [-1.0, 1.0]);
    let mut dx = vec![0.0f32; n * r];
    let mut naive_back = || {
        let dots: Vec<f32> = probs
            .chunks(n)
            .zip(dy.chunks(n))
            .map(|(y, g)| y.iter().zip(g).map(|(a, b)| a * b).sum())
            .collect();
        for (i, ((d, &y), &g)) in dx.iter_mut().zip(&probs).zip(&dy).enumerate() {
            *d = y * (g - dots[i / n]);
        }
        black_box(&dx);
    };
    let mut dx2 = vec![0.0f32; n * r];
    bench(
        "softmax backward",
        12.0 * (n * r) as f64,
        &mut naive_back,
        &mut |isa| softmax::backward_rows_on(isa, false, &probs, Some(&dy), &mut dx2, n),
    );

    // Layer norm: 32 × 128 rows of 384.
    let (n, r) = (384, 32 * 128);
    let x = uniform(n * r, 4, [-2.0, 2.0]);
    let gamma = uniform(n, 5, [-0.5, 0.5]);
    let beta = uniform(n, 6, [-0.5, 0.5]);
    let mut y = vec![0.0f32; n * r];
    let (mut mean, mut rstd) = (vec![0.0f32; r], vec![0.0f32; r]);
    let mut naive_ln = || {
        // var_mean_bias, then (x − mean)/√(var + eps)·gamma + beta, as separate passes.
        let means: Vec<f32> = x
            .chunks(n)
            .map(|row| row.iter().sum::<f32>() / n as f32)
            .collect();
        let mut centred: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| v - means[i / n])
            .collect();
        let vars: Vec<f32> = centred
            .chunks(n)
            .map(|row| row.iter().map(|v| v * v).sum::<f32>() / n as f32)
            .collect();
        for (i, c) in centred.iter_mut().enumerate() {
            *c /= (vars[i / n] + 1e-5).sqrt();
        }
        for (i, (o, &c)) in y.iter_mut().zip(&centred).enumerate() {
            *o = c * gamma[i % n] + beta[i % n];
        }
        black_box(&y);
    };
    let mut y2 = vec![0.0f32; n * r];
    bench(
        "layer_norm 4096×384",
        8.0 * (n * r) as f64,
        &mut naive_ln,
        &mut |isa| {
            let stats = RowStats {
                mean: &mut mean,
                rstd: &mut rstd,
            };
            layer_norm::layer_norm_rows_on(
                isa,
                &x,
                &gamma,
                Some(&beta),
                1e-5,
                &mut y2,
                n,
                Some(stats),
            )
        },
    );
    let (mut mean, mut rstd) = (vec![0.0f32; r], vec![0.0f32; r]);
    let stats = RowStats {
        mean: &mut mean,
        rstd: &mut rstd,
    };
    layer_norm::layer_norm_rows(&x, &gamma, Some(&beta), 1e-5, &mut y2, n, Some(stats));
    let dy = uniform(n * r, 7, [-1.0, 1.0]);
    let mut dx = vec![0.0f32; n * r];
    let mut naive_ln_back = || {
        let mut dg = vec![0.0f32; n];
        let mut db = vec![0.0f32; n];
        let xhat: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, &v)| (v - mean[i / n]) * rstd[i / n])
            .collect();
        let g: Vec<f32> = dy
            .iter()
            .enumerate()
            .map(|(i, &d)| d * gamma[i % n])
            .collect();
        let a: Vec<f32> = g
            .chunks(n)
            .map(|row| row.iter().sum::<f32>() / n as f32)
            .collect();
        let b: Vec<f32> = g
            .chunks(n)
            .zip(xhat.chunks(n))
            .map(|(g, x)| g.iter().zip(x).map(|(g, x)| g * x).sum::<f32>() / n as f32)
            .collect();
        for i in 0..n * r {
            dx[i] = rstd[i / n] * (g[i] - a[i / n] - xhat[i] * b[i / n]);
            dg[i % n] += dy[i] * xhat[i];
            db[i % n] += dy[i];
        }
        black_box((&dx, dg, db));
    };
    let mut dx2 = vec![0.0f32; n * r];
    let (mut dg, mut db) = (vec![0.0f32; n], vec![0.0f32; n]);
    bench(
        "layer_norm backward",
        12.0 * (n * r) as f64,
        &mut naive_ln_back,
        &mut |isa| {
            layer_norm::layer_norm_backward_rows_on(
                isa,
                &x,
                &dy,
                &gamma,
                &mean,
                &rstd,
                &mut dx2,
                Some(&mut dg),
                Some(&mut db),
                n,
            )
        },
    );

    println!(
        "{threads} threads; AVX-512 path: {}; best of {reps} runs\n",
        Isa::detected().avx512()
    );
    println!(
        "| kernel | naive ms | naive GB/s | 1 thread ms | GB/s | {threads} threads ms | GB/s | portable {threads}T ms | speed-up |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let gbs = |t: f64| row.bytes / t / 1e9;
        println!(
            "| {} | {:.2} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1} | {:.2} | {:.1}× |",
            row.name,
            row.naive * 1e3,
            gbs(row.naive),
            row.one * 1e3,
            gbs(row.one),
            row.all * 1e3,
            gbs(row.all),
            row.portable * 1e3,
            row.naive / row.all,
        );
    }
}
