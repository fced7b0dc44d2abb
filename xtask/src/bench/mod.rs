//! `cargo xtask bench`: `SkLinear` against dense `nn::Linear`, forward and forward + backward,
//! over a grid of shapes.
//!
//! Each measurement warms up, then times several runs that each end with a device sync, and
//! reports the median and quartiles. The sketched and dense layers are measured in the same
//! process, one right after the other, so their ratio is meaningful even on a noisy machine;
//! absolute times across runs are not. Every row shows the speedup achieved next to the one
//! the FLOP counts allow, or on a known device (`--device-model`) the roofline bounds allow;
//! and the peak memory of each operation through burn-memory's tracker. With `--profile DIR`,
//! each point's operations then run again under burn-profiler's profiler, and each one's profile
//! is written to `DIR/<point>/<operation>/` (see `profile.rs`).

mod grid;
mod measure;
mod memory;
mod peer;
mod plots;
mod profile;
mod report;
mod roofline;
pub(crate) mod timing;
mod workloads;

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use burn::tensor::DType;
use burn_memory::DeviceMemory;
use burn_sketch::SketchBackend;
use burn_sketch::backend::KernelStrategy;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

pub use grid::{Point, grid};
pub use measure::Row;
pub use roofline::DeviceModel;
use workloads::Settings;

/// Backends the suite can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// CPU, through Flex (Burn's pure-Rust CPU backend, `gemm`-crate products).
    Flex,
    /// CPU, through ndarray.
    Ndarray,
    /// wgpu (Vulkan, Metal, DX12).
    Wgpu,
    /// CUDA (build with `--features cuda`).
    #[cfg(feature = "cuda")]
    Cuda,
}

/// Element types the layers compute in (accumulation is f32 in every float case, i32 in
/// int8's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// int8 dynamic quantization (`burn_compress::Int8Linear`, inference only; Flex):
    /// int8 weights, activations quantized per row at run time, f32 outputs.
    Int8,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
            Self::Int8 => 1,
        }
    }

    /// `"f32"`, `"f16"`, `"bf16"`, `"int8"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }

    /// The float type the layers are built in; int8 runs its own workloads
    /// ([`run_int8`]), so it never reaches a float workload.
    pub(crate) fn burn(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::F16 => DType::F16,
            Self::Bf16 => DType::BF16,
            Self::Int8 => unreachable!("int8 points run through run_int8"),
        }
    }
}

/// `burn_sketch::backend::KernelStrategy`, as a command-line value.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Strategy {
    /// The kernels of `burn-sketch-kernels`.
    Kernels,
    /// Burn tensor operations.
    TensorOps,
    /// CubeCL's autotuner times both once per shape class, the faster kept.
    Autotune,
}

impl Strategy {
    fn burn_sketch(self) -> KernelStrategy {
        match self {
            Self::Kernels => KernelStrategy::Kernels,
            Self::TensorOps => KernelStrategy::TensorOps,
            Self::Autotune => KernelStrategy::Autotune,
        }
    }
}

/// Options of `cargo xtask bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Backend to measure.
    #[arg(long, value_enum, default_value = "flex")]
    pub backend: BackendKind,
    /// Element type of inputs, weights and outputs (ndarray: f32 only).
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: Dtype,
    /// The device the run is on, to show the roofline bounds of its datasheet peaks: each
    /// row's possible speedup becomes the ratio of the bounds, and the sketched forward's
    /// fraction of its bound is shown.
    #[arg(long, value_enum)]
    pub device_model: Option<DeviceModel>,
    /// A small subset of the grid that runs in well under a minute on a CPU.
    #[arg(long)]
    pub quick: bool,
    /// Only points whose id (e.g. `d4096x4096-t1-k64-b256`) contains this text, or one of
    /// several texts separated by commas.
    #[arg(long)]
    pub filter: Option<String>,
    /// Untimed runs before timing each measurement.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// On CubeCL backends, what "sketch" times: the kernels (default), the tensor-op path, or
    /// whichever the autotuner picks.
    #[arg(long, value_enum, default_value = "kernels")]
    pub strategy: Strategy,
    /// Timed runs per measurement.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Directory under which a timestamped results directory is created.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// An earlier `results.json` to compare with: points whose sketched times grew by more
    /// than 10 % (or `--fail-on-regression`'s percentage) are flagged.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
    /// With `--baseline`: exit non-zero if any point's sketched forward or forward + backward
    /// median grew by more than this percentage.
    #[arg(long, value_name = "PCT", requires = "baseline")]
    pub fail_on_regression: Option<f64>,
    /// After timing, run each point's five operations again under burn-profiler's profiler and
    /// write each one's profile (operation table, Chrome trace, viewer.html, memory snapshot,
    /// peak) to `DIR/<point id>/<operation>/`. A separate pass: the timings are not affected.
    #[arg(long, value_name = "DIR")]
    pub profile: Option<PathBuf>,
    /// With --profile: recorded runs of each operation (after one unrecorded run).
    #[arg(long, value_name = "N", default_value_t = 3, requires = "profile",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub profile_runs: u64,
    /// With --profile: sync the device after every operation, so that each records its
    /// device time (wgpu, cuda).
    #[arg(long, requires = "profile")]
    pub profile_sync: bool,
    /// A Python with `torch`: on a CPU backend, PyTorch's same-precision form of each point
    /// (`xtask/pytorch/two_gemm.py`) is timed after ours in the same run, and each row shows
    /// the ratio. Without one the table says so.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Leave PyTorch out (the peak fractions are still shown).
    #[arg(long)]
    pub no_torch: bool,
    /// An activation after every layer: the sketched layer applies it in its product's
    /// output pass (`forward_activated`), the `tensor_ops` column runs the same backend
    /// product and then Burn's activation as its own pass (the unfused form of the first
    /// column), the dense layer is followed by Burn's; PyTorch's forms apply `torch`'s.
    #[arg(long, value_enum, default_value = "identity")]
    pub activation: ActivationArg,
}

/// `--activation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ActivationArg {
    /// None.
    Identity,
    /// ReLU.
    Relu,
    /// The exact GELU.
    Gelu,
}

impl ActivationArg {
    /// burn-sketch's form.
    pub fn burn_sketch(self) -> burn_sketch::Activation {
        match self {
            Self::Identity => burn_sketch::Activation::Identity,
            Self::Relu => burn_sketch::Activation::Relu,
            Self::Gelu => burn_sketch::Activation::Gelu,
        }
    }

    /// `two_gemm.py`'s name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Identity => "identity",
            Self::Relu => "relu",
            Self::Gelu => "gelu",
        }
    }
}

/// What a run wrote.
#[derive(Debug)]
pub struct Output {
    /// The results directory (`results.{md,json,csv}` and the plots).
    pub results: PathBuf,
    /// With `--profile`: one directory per point and operation, in the order they ran.
    pub profiles: Vec<PathBuf>,
}

/// Runs `$body` with `$b` the backend type of `$args`' backend and element type; returns the
/// error of an unsupported pair from the enclosing function.
macro_rules! with_backend {
    ($args:expr, |$b:ident| $body:expr) => {{
        use burn::backend::{Flex, NdArray, Wgpu};
        use half::{bf16, f16};
        match ($args.backend, $args.dtype) {
            (_, Dtype::Int8) => {
                return Err("int8 points run through run_int8".into());
            }
            // Flex's element type is chosen at run time: the layers are cast to `--dtype`.
            (BackendKind::Flex, Dtype::F32) => {
                type $b = Flex;
                $body
            }
            // Half precision on the CPU takes `FastFlex` (Flex computes `bf16`/`f16` one value
            // at a time, and multiplies `bf16` through `f32` copies).
            (BackendKind::Flex, _) => {
                type $b = burn_fast_cpu::FastFlex;
                $body
            }
            (BackendKind::Ndarray, Dtype::F32) => {
                type $b = NdArray;
                $body
            }
            (BackendKind::Ndarray, dtype) => {
                return Err(format!("ndarray computes in f32 and f64, not {dtype:?}").into());
            }
            (BackendKind::Wgpu, Dtype::F32) => {
                type $b = Wgpu;
                $body
            }
            (BackendKind::Wgpu, Dtype::F16) => {
                type $b = Wgpu<f16>;
                $body
            }
            (BackendKind::Wgpu, Dtype::Bf16) => {
                type $b = Wgpu<bf16>;
                $body
            }
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda, Dtype::F32) => {
                type $b = burn::backend::Cuda;
                $body
            }
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda, Dtype::F16) => {
                type $b = burn::backend::Cuda<f16>;
                $body
            }
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda, Dtype::Bf16) => {
                type $b = burn::backend::Cuda<bf16>;
                $body
            }
        }
    }};
}

/// Runs the suite and writes `results.{md,json,csv}`, then, with `--profile`, the profiles;
/// returns where they went.
pub fn run(args: &BenchArgs) -> Result<Output, Box<dyn std::error::Error>> {
    let points: Vec<Point> = grid(args.quick)
        .into_iter()
        .filter(|p| {
            args.filter
                .as_ref()
                .is_none_or(|f| f.split(',').any(|part| p.id().contains(part)))
        })
        .collect();
    if points.is_empty() {
        return Err(format!("no point matches the filter {:?}", args.filter).into());
    }
    if args.backend == BackendKind::Wgpu {
        // Before CubeCL's device thread looks for the adapter and panics without one.
        burn_memory::wgpu_adapter()?;
    }
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let dir = args.out.join(stamp.to_string());
    std::fs::create_dir_all(&dir)?;
    if args.dtype == Dtype::Int8 {
        return run_int8(&points, args, dir);
    }
    let rows = with_backend!(args, |B| measure_all::<B>(&points, args)?);

    let table = report::markdown(&rows);
    println!("{table}");
    std::fs::write(dir.join("results.md"), &table)?;
    std::fs::write(dir.join("results.csv"), report::csv(&rows))?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    plots::write_all(&rows, &dir).map_err(|e| format!("cannot draw the plots: {e}"))?;
    if matches!(args.backend, BackendKind::Flex | BackendKind::Ndarray) {
        let sides = rows
            .iter()
            .map(|row| {
                let kernel = (args.dtype == Dtype::Bf16)
                    .then(|| peer::dense_bf16_kernel(row.point, args.warmup, args.runs));
                (row.point, peer::float_side(row, kernel))
            })
            .collect();
        compare_on_cpu(&points, sides, args, &dir)?;
    }
    // After every timing, and after its results are safe on disk.
    let profiles = match &args.profile {
        Some(to) => with_backend!(args, |B| profile_all::<B>(&points, args, to)?),
        None => Vec::new(),
    };
    if let Some(baseline) = &args.baseline {
        let old: Vec<Row> = serde_json::from_str(&std::fs::read_to_string(baseline)?)?;
        let threshold = args.fail_on_regression.unwrap_or(10.0);
        let regressions = compare(&rows, &old, threshold);
        if args.fail_on_regression.is_some() && !regressions.is_empty() {
            return Err(format!(
                "{} point(s) regressed by more than {threshold} % against {}: {} (results in {})",
                regressions.len(),
                baseline.display(),
                regressions.join(", "),
                dir.display()
            )
            .into());
        }
    }
    Ok(Output {
        results: dir,
        profiles,
    })
}

/// The measurement settings of `args`, once `B` is known to compute in its element type.
/// `--dtype int8`: our int8 layers (and the f32 ones they come from) on Flex, then the
/// comparison with PyTorch's `quantize_dynamic`.
fn run_int8(
    points: &[Point],
    args: &BenchArgs,
    dir: PathBuf,
) -> Result<Output, Box<dyn std::error::Error>> {
    if args.backend != BackendKind::Flex {
        return Err("int8 runs on Flex (--backend flex): its kernel is the CPU's".into());
    }
    let progress = ProgressBar::new(points.len() as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}, ~{eta}] {msg}")
            .expect("a valid template"),
    );
    let rows: Vec<peer::Int8Row> = points
        .iter()
        .map(|&point| {
            progress.set_message(point.id());
            let row = peer::measure_int8(point, args.warmup, args.runs);
            progress.inc(1);
            row
        })
        .collect();
    progress.finish_and_clear();
    println!(
        "| point | int8 sketch / f32 sketch ms | int8 dense / f32 dense ms | relative error sketch / dense |"
    );
    println!("|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.4} / {:.4} |",
            r.point.id(),
            r.sketch_forward.median_ms,
            r.sketch_forward_f32.median_ms,
            r.dense_forward.median_ms,
            r.dense_forward_f32.median_ms,
            r.sketch_error,
            r.dense_error
        );
    }
    std::fs::write(dir.join("int8.json"), serde_json::to_string_pretty(&rows)?)?;
    let sides = rows.iter().map(|r| (r.point, peer::int8_side(r))).collect();
    compare_on_cpu(points, sides, args, &dir)?;
    Ok(Output {
        results: dir,
        profiles: Vec::new(),
    })
}

/// This CPU's peak and PyTorch's same-precision times next to ours: printed, and written as
/// `peer.md` and `peer.json`.
fn compare_on_cpu(
    points: &[Point],
    sides: Vec<(Point, peer::Side)>,
    args: &BenchArgs,
    dir: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let peaks = peer::Peaks::measure();
    let torch = if args.no_torch {
        Err("--no-torch".to_string())
    } else {
        eprintln!(
            "timing PyTorch's {} forms with {}",
            args.dtype.name(),
            args.python
        );
        peer::torch_rows(&args.python, args, points, dir)
    };
    let comparisons = peer::compare(args.dtype, sides, torch.as_deref().ok(), &peaks);
    let table = format!(
        "{}\n{}",
        peaks.markdown(),
        peer::markdown(&comparisons, torch.as_ref().err().map(String::as_str))
    );
    println!("{table}");
    std::fs::write(dir.join("peer.md"), &table)?;
    #[derive(Serialize)]
    struct PeerJson<'a> {
        peaks: peer::Peaks,
        rows: &'a [peer::Comparison],
        torch: Option<&'a [peer::TorchRow]>,
    }
    let json = PeerJson {
        peaks,
        rows: &comparisons,
        torch: torch.as_deref().ok(),
    };
    std::fs::write(dir.join("peer.json"), serde_json::to_string_pretty(&json)?)?;
    Ok(())
}

fn settings<B: SketchBackend>(
    device: &B::Device,
    args: &BenchArgs,
) -> Result<Settings, Box<dyn std::error::Error>> {
    if !B::supports_dtype(device, args.dtype.burn()) {
        return Err(format!("{} does not support {:?}", B::name(device), args.dtype).into());
    }
    Ok(Settings {
        warmup: args.warmup,
        runs: args.runs,
        dtype: args.dtype,
        device_spec: args.device_model.map(DeviceModel::spec),
        strategy: args.strategy.burn_sketch(),
        activation: args.activation.burn_sketch(),
    })
}

fn measure_all<B: SketchBackend + DeviceMemory>(
    points: &[Point],
    args: &BenchArgs,
) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let device = B::Device::default();
    let settings = settings::<B>(&device, args)?;
    // Hidden when stderr is not a terminal (CI logs), where it would only add noise.
    let progress = ProgressBar::new(points.len() as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} [{elapsed_precise}, ~{eta}] {msg}")
            .expect("a valid template"),
    );
    let rows = points
        .iter()
        .map(|&point| {
            progress.set_message(point.id());
            let row = measure::measure::<B>(point, &device, settings);
            progress.inc(1);
            row
        })
        .collect();
    progress.finish_and_clear();
    Ok(rows)
}

/// The profile pass of `--profile`: every point's workloads on `Profiled<B>`, written under
/// `dir`; returns the directories written.
fn profile_all<B: SketchBackend + DeviceMemory>(
    points: &[Point],
    args: &BenchArgs,
    dir: &std::path::Path,
) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    let device = B::Device::default();
    let settings = settings::<B>(&device, args)?;
    let profile = profile::ProfileSettings {
        runs: args.profile_runs as usize,
        sync_each_op: args.profile_sync,
    };
    let mut written = Vec::new();
    for &point in points {
        eprintln!("profiling {}", point.id());
        written.extend(profile::profile_point::<B>(
            point, &device, settings, profile, dir,
        )?);
    }
    Ok(written)
}

/// Prints, for every point also in `baseline`, the ratio of sketched median times now over
/// then, flagging growth above `threshold_pct`; returns the flagged points' ids.
fn compare(rows: &[Row], baseline: &[Row], threshold_pct: f64) -> Vec<String> {
    let limit = 1.0 + threshold_pct / 100.0;
    let mut regressions = Vec::new();
    println!("| point | fwd now/then | fwd+bwd now/then | |\n|---|---|---|---|");
    for row in rows {
        let Some(then) = baseline
            .iter()
            .find(|o| o.point == row.point && o.backend == row.backend && o.dtype == row.dtype)
        else {
            continue;
        };
        let fwd = row.sketch_forward.median_ms / then.sketch_forward.median_ms;
        let train = row.sketch_train.median_ms / then.sketch_train.median_ms;
        let regressed = fwd > limit || train > limit;
        let flag = if regressed { "REGRESSION" } else { "" };
        println!("| {} | {fwd:.2} | {train:.2} | {flag} |", row.point.id());
        if regressed {
            regressions.push(row.point.id());
        }
    }
    regressions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_bench_writes_parseable_results() {
        let out = tempfile::tempdir().unwrap();
        let args = BenchArgs {
            backend: BackendKind::Ndarray,
            dtype: Dtype::F32,
            device_model: None,
            quick: true,
            strategy: Strategy::Kernels,
            filter: None,
            warmup: 1,
            runs: 3,
            out: out.path().to_path_buf(),
            baseline: None,
            fail_on_regression: None,
            profile: None,
            profile_runs: 3,
            profile_sync: false,
            python: "python3".into(),
            no_torch: true,
            // The activated workloads run too (every column's value is checked below).
            activation: ActivationArg::Gelu,
        };
        let output = run(&args).unwrap();
        assert!(output.profiles.is_empty(), "no --profile, no profile pass");
        let dir = output.results;
        let rows: Vec<Row> =
            serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap())
                .unwrap();
        assert_eq!(rows.len(), 4);
        let row = &rows[0];
        assert_eq!(row.point.id(), "d1024x1024-t1-k16-b64");
        assert_eq!(row.dense_params, 1024 * 1024 + 1024);
        assert_eq!(row.sketch_params, 16 * 2048 + 1024);
        assert!((row.flop_ratio - 32.0 * 2048.0 / (1024.0 * 1024.0)).abs() < 1e-12);
        assert_eq!(row.forward_bytes, 4 * (64 * 2048 + 2 * 16 * 2048 + 1024));
        for t in [
            row.sketch_forward,
            row.tensor_ops_forward,
            row.dense_forward,
            row.sketch_train,
            row.dense_train,
        ] {
            assert_eq!(t.runs, 3);
            assert!(t.p25_ms > 0.0 && t.p25_ms <= t.median_ms && t.median_ms <= t.p75_ms);
        }

        eprintln!("{:?}", row.memory);
        // The dense layer's training step holds a 4 MB weight gradient at least.
        assert!(row.memory.dense_train >= 4 << 20, "{:?}", row.memory);
        assert!(row.memory.sketch_train > 0, "{:?}", row.memory);

        // Each plot has its text: the dense reference line, the speedup in each cell.
        for (name, text) in [
            ("time_vs_terms", "dense Linear"),
            ("time_vs_rank", "dense Linear"),
            ("speedup_heatmap", &format!("{:.1}×", row.forward_speedup())),
        ] {
            let svg = std::fs::read_to_string(dir.join(format!("{name}.svg"))).unwrap();
            assert!(
                svg.starts_with("<svg") && svg.contains(text),
                "{name}: no {text:?}"
            );
            let png = std::fs::read(dir.join(format!("{name}.png"))).unwrap();
            assert_eq!(&png[1..4], b"PNG");
        }

        let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 5);
        let header: Vec<&str> = lines[0].split(',').collect();
        let values: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(header.len(), values.len());
        let column = |name: &str| values[header.iter().position(|h| *h == name).unwrap()];
        assert_eq!(column("low_rank"), "16");
        let speedup: f64 = column("forward_speedup").parse().unwrap();
        assert!((speedup - row.forward_speedup()).abs() < 1e-9);

        // Against itself nothing regresses; against a baseline twice as fast, every point does.
        assert!(compare(&rows, &rows, 10.0).is_empty());
        let mut faster = rows.clone();
        for row in &mut faster {
            row.sketch_forward.median_ms /= 2.0;
        }
        assert_eq!(compare(&rows, &faster, 10.0).len(), rows.len());
        assert!(
            compare(&rows, &faster, 150.0).is_empty(),
            "a 2x slowdown is within 150 %"
        );

        // `--fail-on-regression` turns a regression into a failed run (a non-zero exit), and
        // lets a run within the threshold pass. The baseline is 1000× faster than this run,
        // not 2×: the re-run is timed afresh, and on a loaded machine (other test binaries, the
        // overhead test's own process) the first run can be more than twice as slow as it.
        let mut much_faster = rows.clone();
        for row in &mut much_faster {
            row.sketch_forward.median_ms /= 1000.0;
        }
        let faster_path = out.path().join("faster.json");
        std::fs::write(&faster_path, serde_json::to_string(&much_faster).unwrap()).unwrap();
        let again = BenchArgs {
            baseline: Some(faster_path),
            fail_on_regression: Some(10.0),
            out: out.path().join("again"),
            filter: Some("d1024x1024-t1-k16".into()),
            ..args
        };
        let err = run(&again).unwrap_err().to_string();
        assert!(err.contains("regressed by more than 10 %"), "{err}");
        let tolerant = BenchArgs {
            fail_on_regression: Some(1e9),
            out: out.path().join("tolerant"),
            ..again
        };
        run(&tolerant).unwrap();
    }
}
