//! Times [`sgemm::matmul`] (operands as given, the right one packed at each call) and
//! [`sgemm::matmul_packed`] (packed once, as a backend caches an inference weight) against
//! one `gemm` 0.19 call (what Flex multiplies with) on rayon's pool, at the shapes of a
//! BERT-base-sized encoder's dense layers (hidden 384, feed-forward 1536, 4096 or 3584 tokens,
//! or 1 to 64 tokens for batch-1 inference), the gradients `xᵀ·g` and `g·Wᵀ` (transposed views),
//! and a layer with its bias and GELU (fused in `sgemm`'s store; a second pass after `gemm`).
//!
//! Each point is the best of several runs, the three contenders interleaved (a shared
//! machine's neighbours can only slow a run down, and slow the three alike). The last column
//! is the best of the three as a fraction of the peak: [`peak::measure`]'s `f32` rate on one
//! thread times the threads (the cores do not share their pipes; a measurement on all of
//! them at once is the first to suffer from neighbours, so it is printed but not used).
//! `--cpu` times the process's CPU time instead of the wall clock: with
//! `RAYON_NUM_THREADS=1` (the caller asleep while the worker runs), a measure of the kernels
//! that other processes cannot inflate. `--only MxKxN` (repeatable) keeps those rows;
//! `BENCH_SECONDS` sets each row's time (1.5 s). Where `sgemm::matmul` hands a product to
//! `gemm` (see its docs), its column times `gemm` again.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p burn-cpu-kernels --example sgemm_bench [-- --json]
//! # each precision's peak on 1 and on all threads, nothing else:
//! cargo run --release -p burn-cpu-kernels --example sgemm_bench -- --peaks
//! ```

use std::time::Instant;

use burn_cpu_kernels::peak::{self, Arithmetic};
use burn_cpu_kernels::sgemm::{self, Epilogue, PackedRhs};
use burn_cpu_kernels::testing::uniform;
use burn_cpu_kernels::{Activation, Isa, MatRef, gemm};

/// What a row times besides the plain product.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// `x·W`.
    Plain,
    /// `xᵀ·g`: the weight gradient, the left operand a transposed view.
    LhsT,
    /// `g·Wᵀ`: the input gradient, the right operand a transposed view.
    RhsT,
    /// `gelu(x·W + bias)`: fused in `sgemm`'s store, a second pass after `gemm`.
    BiasGelu,
}

const SHAPES: &[(usize, usize, usize, Kind)] = &[
    (4096, 384, 384, Kind::Plain),
    (4096, 384, 1152, Kind::Plain),
    (4096, 384, 1536, Kind::Plain),
    (4096, 1536, 384, Kind::Plain),
    (3584, 384, 1536, Kind::Plain),
    (16, 384, 384, Kind::Plain),
    (16, 384, 1536, Kind::Plain),
    (16, 1536, 384, Kind::Plain),
    (1, 384, 1536, Kind::Plain),
    (64, 384, 1536, Kind::Plain),
    (384, 4096, 1536, Kind::LhsT),
    (4096, 1536, 384, Kind::RhsT),
    (4096, 384, 1536, Kind::BiasGelu),
    (16, 384, 1536, Kind::BiasGelu),
];

/// The operands' range.
const UNIT: [f32; 2] = [-1.0, 1.0];

/// `struct timespec` of Linux on 64 bits.
#[repr(C)]
struct Timespec {
    seconds: i64,
    nanoseconds: i64,
}

unsafe extern "C" {
    fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
}

/// Seconds of CPU time this process has used (`CLOCK_PROCESS_CPUTIME_ID`): with one worker
/// thread (`RAYON_NUM_THREADS=1`, the caller asleep while it works), a measure that other
/// processes on a shared machine cannot inflate by taking the core away.
fn cpu_seconds() -> f64 {
    let mut t = Timespec {
        seconds: 0,
        nanoseconds: 0,
    };
    // SAFETY: a valid clock id and a `timespec` to write to.
    unsafe { clock_gettime(2, &mut t) };
    t.seconds as f64 + t.nanoseconds as f64 * 1e-9
}

/// Wall-clock seconds, or CPU seconds under `--cpu` (see [`cpu_seconds`]).
fn now() -> f64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    if std::env::args().any(|a| a == "--cpu") {
        cpu_seconds()
    } else {
        START.get_or_init(Instant::now).elapsed().as_secs_f64()
    }
}

/// The best time of each of `runs`, interleaved (one run of each in turn, so that a
/// neighbour's burst of work slows them alike) over about `budget` seconds, at least 5 rounds.
fn best<const N: usize>(budget: f64, runs: &mut [&mut dyn FnMut(); N]) -> [f64; N] {
    runs.iter_mut().for_each(|f| f());
    let (start, mut best, mut rounds) = (Instant::now(), [f64::INFINITY; N], 0);
    while rounds < 5 || (start.elapsed().as_secs_f64() < budget && rounds < 500) {
        for (f, best) in runs.iter_mut().zip(&mut best) {
            let t = now();
            f();
            *best = best.min(now() - t);
        }
        rounds += 1;
    }
    best
}

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let threads = rayon::current_num_threads();
    // The path `sgemm::matmul` takes on this CPU.
    let isa = Isa::detected();
    if std::env::args().any(|a| a == "--peaks") {
        // Every precision's peak on 1 thread and on all of them, then nothing else.
        for t in [1, threads] {
            for a in [Arithmetic::F32, Arithmetic::Bf16, Arithmetic::Int8] {
                let rate = peak::measure(a, t).map_or(f64::NAN, |r| r / 1e9);
                println!("{} peak on {t} thread(s): {rate:.0} GOP/s", a.name());
            }
        }
        return;
    }
    let measured = peak::measure(Arithmetic::F32, threads).unwrap_or(f64::NAN) / 1e9;
    let peak1 = peak::measure(Arithmetic::F32, 1).unwrap_or(f64::NAN) / 1e9;
    let peak = peak1 * threads as f64;
    if !json {
        println!(
            "f32 peak: {peak1:.0} GFLOP/s on 1 thread, so {peak:.0} on {threads} \
             (measured on {threads} at once: {measured:.0})"
        );
        println!(
            "| m×k×n | gemm 0.19 | sgemm | sgemm packed | best / peak |\n|---|---|---|---|---|"
        );
    }
    let mut rows = Vec::new();
    // `--only MxKxN` (repeatable) keeps those shapes.
    let args: Vec<String> = std::env::args().collect();
    let only: Vec<&str> = args
        .windows(2)
        .filter(|w| w[0] == "--only")
        .map(|w| w[1].as_str())
        .collect();
    for &(m, k, n, kind) in SHAPES {
        if !only.is_empty() && !only.contains(&format!("{m}x{k}x{n}").as_str()) {
            continue;
        }
        let (a, b) = (uniform(m * k, 1, UNIT), uniform(k * n, 2, UNIT));
        let lhs = if kind == Kind::LhsT {
            MatRef::row_major(&a, k, m).t()
        } else {
            MatRef::row_major(&a, m, k)
        };
        let rhs = if kind == Kind::RhsT {
            MatRef::row_major(&b, n, k).t()
        } else {
            MatRef::row_major(&b, k, n)
        };
        let bias = uniform(n, 3, UNIT);
        let fused = kind == Kind::BiasGelu;
        let mut y = vec![0.0f32; m * n];
        let flops = 2.0 * (m * k * n) as f64;
        let budget: f64 = std::env::var("BENCH_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1.5);
        let parallelism = gemm::Parallelism::Rayon(threads);
        let e = if fused {
            Epilogue {
                bias: Some(&bias),
                activation: Activation::Gelu,
                accumulate: false,
            }
        } else {
            Epilogue::default()
        };
        // `gemm`, then (for the fused rows) the bias and GELU as Flex would: a second pass.
        let unfused = |y: &mut [f32]| {
            gemm(y, n, lhs, rhs, 1.0, false, parallelism);
            if fused {
                use rayon::prelude::*;
                y.par_chunks_mut(n).for_each(|row| {
                    row.iter_mut().zip(&bias).for_each(|(v, b)| *v += b);
                    Activation::Gelu.apply_to(row);
                });
            }
        };
        let packed = PackedRhs::pack(rhs);
        let (mut y1, mut y2) = (y.clone(), y.clone());
        let [t_gemm, t_sgemm, t_packed] = best(
            budget,
            &mut [
                &mut || unfused(&mut y),
                &mut || sgemm::matmul_on(isa, &mut y1, n, lhs, rhs, e, true),
                &mut || sgemm::matmul_packed_on(isa, &mut y2, n, lhs, &packed, e, true),
            ],
        );
        let [g0, g1, g2] = [t_gemm, t_sgemm, t_packed].map(|t| flops / t / 1e9);
        let fraction = g0.max(g1).max(g2) / peak;
        let kind_name = match kind {
            Kind::Plain => "x·W",
            Kind::LhsT => "xᵀ·g",
            Kind::RhsT => "g·Wᵀ",
            Kind::BiasGelu => "gelu(x·W + b)",
        };
        let shape = format!("{m}×{k}×{n} {kind_name}");
        if json {
            rows.push(format!(
                "{{\"shape\":\"{shape}\",\"m\":{m},\"k\":{k},\"n\":{n},\"kind\":\"{kind_name}\",\
                 \"gemm_gflops\":{g0:.1},\"sgemm_gflops\":{g1:.1},\"sgemm_packed_gflops\":{g2:.1},\
                 \"peak_gflops\":{peak:.1},\"fraction_of_peak\":{fraction:.3}}}"
            ));
        } else {
            println!(
                "| {shape} | {g0:.0} | {g1:.0} | {g2:.0} | {:.0}% |",
                100.0 * fraction
            );
        }
    }
    if json {
        println!("[{}]", rows.join(",\n"));
    }
}
