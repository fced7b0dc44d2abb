//! The CPU's own yardsticks, in the same run as our timings: this machine's measured peak per
//! precision, and PyTorch's same-precision form of each layer (`xtask/pytorch/two_gemm.py`),
//! with the ratio ours / PyTorch per row. PyTorch is optional: without a Python that imports
//! `torch`, the table says so and shows our side and the peak fractions alone.

use std::path::Path;
use std::process::Command;

use burn::backend::Flex;
use burn::nn::LinearConfig;
use burn::tensor::{Distribution, Tensor, bf16};
use burn_compress::Int8Linear;
use burn_cpu_kernels::peak::{self, Arithmetic};
use burn_cpu_kernels::{MatRef, isa};
use burn_sketch::SkLinearConfig;
use serde::{Deserialize, Serialize};

use super::Dtype;
use super::grid::Point;
use super::measure::Row;
use super::timing::{Timing, op, time_together};

/// This CPU's peak per precision on all of rayon's threads, in operations per second (a
/// multiply and an add count two); `None` where the CPU lacks the instruction.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Peaks {
    /// Threads the peaks were measured on.
    pub threads: usize,
    /// AVX-512 `f32` fused multiply-adds.
    pub f32: Option<f64>,
    /// AVX512-BF16 pair dot products.
    pub bf16: Option<f64>,
    /// AVX512-VNNI `u8 × i8` quad dot products.
    pub int8: Option<f64>,
    /// Whether the CPU reports AMX (no kernel here uses it).
    pub amx: bool,
}

impl Peaks {
    /// Measures each precision's peak (about a second in all).
    pub fn measure() -> Self {
        let threads = rayon::current_num_threads();
        Self {
            threads,
            f32: peak::measure(Arithmetic::F32, threads),
            bf16: peak::measure(Arithmetic::Bf16, threads),
            int8: peak::measure(Arithmetic::Int8, threads),
            amx: isa::cpu_has_amx(),
        }
    }

    /// The peak a `dtype` product is held against: its own instruction's, and `f32`'s for
    /// `f16` (no AVX-512 FP16 arithmetic here: `f16` products run in `f32`).
    pub fn of(&self, dtype: Dtype) -> Option<f64> {
        match dtype {
            Dtype::F32 | Dtype::F16 => self.f32,
            Dtype::Bf16 => self.bf16,
            Dtype::Int8 => self.int8,
        }
    }

    /// A Markdown table of the peaks.
    pub fn markdown(&self) -> String {
        let cell = |v: Option<f64>| {
            v.map_or("not on this CPU".into(), |v| {
                format!("{:.0} GOP/s", v / 1e9)
            })
        };
        format!(
            "| peak on {} threads | f32 (AVX-512 FMA) | bf16 (AVX512-BF16) | int8 (AVX512-VNNI) | AMX |\n\
             |---|---|---|---|---|\n| measured | {} | {} | {} | {} |\n",
            self.threads,
            cell(self.f32),
            cell(self.bf16),
            cell(self.int8),
            if self.amx {
                "present, unused"
            } else {
                "not on this CPU"
            },
        )
    }
}

/// PyTorch's timings of one point, as `two_gemm.py --json` writes them (ms per call).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TorchRow {
    /// The point's id.
    pub point: String,
    /// PyTorch's version.
    pub torch: String,
    /// The sketched layer's forward (two GEMMs, factors packed once; int8: two quantized
    /// `nn.Linear`s).
    pub forward_ms: f64,
    /// Forward + backward (float types only).
    pub train_ms: Option<f64>,
    /// The dense layer's forward.
    pub dense_forward_ms: f64,
}

/// Runs `two_gemm.py` for `points` in `dtype` with `python`; `Err` says why there is no
/// PyTorch column (no such Python, no torch, the script failed).
pub fn torch_rows(
    python: &str,
    args: &super::BenchArgs,
    points: &[Point],
    dir: &Path,
) -> Result<Vec<TorchRow>, String> {
    let (dtype, runs) = (args.dtype, args.runs);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("pytorch/two_gemm.py");
    let json = dir.join("torch.json");
    let ids: Vec<String> = points.iter().map(Point::id).collect();
    let output = Command::new(python)
        .arg(&script)
        .args([
            "--dtype",
            dtype.name(),
            "--runs",
            &runs.to_string(),
            "--json",
        ])
        .arg(&json)
        .arg("--threads")
        .arg(rayon::current_num_threads().to_string())
        .args(["--activation", args.activation.name()])
        .arg("--points")
        .args(&ids)
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(format!("{python} {}: {last}", script.display()));
    }
    let text = std::fs::read_to_string(&json).map_err(|e| format!("{}: {e}", json.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json.display()))
}

/// Our `int8` layers at one point, with the `f32` layers they were quantized from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Int8Row {
    /// The shape.
    pub point: Point,
    /// [`Int8Linear`] from the sketched layer.
    pub sketch_forward: Timing,
    /// [`Int8Linear`] from the dense layer.
    pub dense_forward: Timing,
    /// The `f32` sketched layer.
    pub sketch_forward_f32: Timing,
    /// The `f32` dense layer.
    pub dense_forward_f32: Timing,
    /// Largest `|y_int8 − y_f32|` of the sketched layer over the largest `|y_f32|`.
    pub sketch_error: f64,
    /// The same for the dense layer.
    pub dense_error: f64,
}

/// Times the `int8` layers of `point` on Flex.
pub fn measure_int8(point: Point, warmup: usize, runs: usize) -> Int8Row {
    let device = Default::default();
    let sketch = SkLinearConfig::new(
        point.d_input,
        point.d_output,
        point.num_terms,
        point.low_rank,
    )
    .init::<Flex>(&device);
    let dense = LinearConfig::new(point.d_input, point.d_output).init::<Flex>(&device);
    let (sketch_q, dense_q) = (
        Int8Linear::from_sketched(&sketch),
        Int8Linear::from_linear(&dense),
    );
    let x = Tensor::<Flex, 2>::random([point.batch, point.d_input], Distribution::Default, &device);
    let error = |q: Tensor<Flex, 2>, f: Tensor<Flex, 2>| -> f64 {
        let scale: f32 = f.clone().abs().max().into_scalar();
        let gap: f32 = (q - f).abs().max().into_scalar();
        (gap / scale) as f64
    };
    let sketch_error = error(sketch_q.forward(x.clone()), sketch.forward(x.clone()));
    let dense_error = error(dense_q.forward(x.clone()), dense.forward(x.clone()));
    let [
        sketch_forward,
        dense_forward,
        sketch_forward_f32,
        dense_forward_f32,
    ] = time_together(
        warmup,
        runs,
        [
            op(|| sketch_q.forward(x.clone())),
            op(|| dense_q.forward(x.clone())),
            op(|| sketch.forward(x.clone())),
            op(|| dense.forward(x.clone())),
        ],
        || {},
    );
    Int8Row {
        point,
        sketch_forward,
        dense_forward,
        sketch_forward_f32,
        dense_forward_f32,
        sketch_error,
        dense_error,
    }
}

/// Our dense `bf16` product `x·W` on [`burn_cpu_kernels::bf16`]'s kernel (what `nn::Linear`
/// would take if Flex multiplied `bf16` with it), timed like the rest.
pub fn dense_bf16_kernel(point: Point, warmup: usize, runs: usize) -> Timing {
    let fill = |len: usize, seed: usize| -> Vec<bf16> {
        (0..len)
            .map(|i| bf16::from_f32((((i * 7919 + seed) % 2001) as f32 - 1000.0) / 1000.0))
            .collect()
    };
    let (x, w) = (
        fill(point.batch * point.d_input, 1),
        fill(point.d_input * point.d_output, 2),
    );
    let (lhs, rhs) = (
        MatRef::row_major(&x, point.batch, point.d_input),
        MatRef::row_major(&w, point.d_input, point.d_output),
    );
    let [timing] = time_together(
        warmup,
        runs,
        [op(|| {
            let mut y = vec![bf16::ZERO; point.batch * point.d_output];
            burn_cpu_kernels::bf16::matmul(&mut y, point.d_output, lhs, rhs, 1.0, false, true);
            y
        })],
        || {},
    );
    timing
}

/// One point's comparison, as `peer.json` holds it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    /// The point's id.
    pub point: String,
    /// The precision.
    pub dtype: Dtype,
    /// Ours, ms: sketched forward, forward + backward (float types), dense forward (through
    /// `nn::Linear`), and for `bf16` our dense kernel.
    pub ours: Side,
    /// PyTorch's, ms, when it ran.
    pub torch: Option<Side>,
    /// Ours over PyTorch's, per column.
    pub ratio: Option<Side>,
    /// Our sketched and dense forwards' fractions of this precision's peak.
    pub peak_fraction: (Option<f64>, Option<f64>),
}

/// One side's times (ms).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Side {
    /// Sketched forward.
    pub sketch_forward: f64,
    /// Sketched forward + backward.
    pub sketch_train: Option<f64>,
    /// Dense forward.
    pub dense_forward: f64,
    /// Dense forward on our own kernel (bf16).
    pub dense_kernel: Option<f64>,
}

impl Side {
    fn ratio(&self, to: &Side) -> Side {
        let div = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        Side {
            sketch_forward: self.sketch_forward / to.sketch_forward,
            sketch_train: div(self.sketch_train, to.sketch_train),
            dense_forward: self.dense_forward / to.dense_forward,
            // Our dense kernel against PyTorch's dense layer.
            dense_kernel: div(self.dense_kernel, Some(to.dense_forward)),
        }
    }
}

/// Pairs our sides with PyTorch's rows and the peak.
pub fn compare(
    dtype: Dtype,
    ours: Vec<(Point, Side)>,
    torch: Option<&[TorchRow]>,
    peaks: &Peaks,
) -> Vec<Comparison> {
    ours.into_iter()
        .map(|(point, side)| {
            let id = point.id();
            let theirs = torch
                .and_then(|rows| rows.iter().find(|r| r.point == id))
                .map(|r| Side {
                    sketch_forward: r.forward_ms,
                    sketch_train: r.train_ms,
                    dense_forward: r.dense_forward_ms,
                    dense_kernel: None,
                });
            let fraction =
                |flops: f64, ms: f64| peaks.of(dtype).map(|peak| flops / (ms * 1e-3) / peak);
            let dense_ms = side
                .dense_kernel
                .unwrap_or(side.dense_forward)
                .min(side.dense_forward);
            Comparison {
                point: id,
                dtype,
                ratio: theirs.map(|t| side.ratio(&t)),
                torch: theirs,
                peak_fraction: (
                    fraction(point.sketch_forward_flops(), side.sketch_forward),
                    fraction(point.dense_forward_flops(), dense_ms),
                ),
                ours: side,
            }
        })
        .collect()
}

/// Our side of a float-precision run, from the bench's rows.
pub fn float_side(row: &Row, dense_kernel: Option<Timing>) -> Side {
    Side {
        sketch_forward: row.sketch_forward.median_ms,
        sketch_train: Some(row.sketch_train.median_ms),
        dense_forward: row.dense_forward.median_ms,
        dense_kernel: dense_kernel.map(|t| t.median_ms),
    }
}

/// Our side of an `int8` run.
pub fn int8_side(row: &Int8Row) -> Side {
    Side {
        sketch_forward: row.sketch_forward.median_ms,
        sketch_train: None,
        dense_forward: row.dense_forward.median_ms,
        dense_kernel: None,
    }
}

/// The comparison as a Markdown table; `torch_note` says why PyTorch is missing, if it is.
pub fn markdown(rows: &[Comparison], torch_note: Option<&str>) -> String {
    let ms = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.2}"));
    let ratio = |v: Option<f64>| v.map_or("–".into(), |v| format!("**{v:.2}**"));
    let pct = |v: Option<f64>| v.map_or("–".into(), |v| format!("{:.0} %", 100.0 * v));
    let mut out = String::from(
        "| point | dtype | sketch fwd ours / torch ms | ratio | fwd+bwd ours / torch ms | ratio \
         | dense fwd ours / torch ms | ratio | dense kernel ms | ratio | % of peak (sketch / dense) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in rows {
        let t = c.torch.unwrap_or_default();
        let has = c.torch.is_some();
        let r = c.ratio;
        out += &format!(
            "| {} | {} | {} / {} | {} | {} / {} | {} | {} / {} | {} | {} | {} | {} / {} |\n",
            c.point,
            c.dtype.name(),
            ms(Some(c.ours.sketch_forward)),
            ms(has.then_some(t.sketch_forward)),
            ratio(r.map(|r| r.sketch_forward)),
            ms(c.ours.sketch_train),
            ms(t.sketch_train),
            ratio(r.and_then(|r| r.sketch_train)),
            ms(Some(c.ours.dense_forward)),
            ms(has.then_some(t.dense_forward)),
            ratio(r.map(|r| r.dense_forward)),
            ms(c.ours.dense_kernel),
            ratio(r.and_then(|r| r.dense_kernel)),
            pct(c.peak_fraction.0),
            pct(c.peak_fraction.1),
        );
    }
    out += "\nratio: ours / PyTorch's (below 1: ours is faster). dense kernel: our `bf16` kernel on the \
            raw buffers, against PyTorch's dense layer.\n";
    if let Some(note) = torch_note {
        out += &format!("PyTorch not measured: {note}\n");
    }
    out
}
