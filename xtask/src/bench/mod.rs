//! `cargo xtask bench`: `SkLinear` against dense `nn::Linear`, forward and forward + backward,
//! over a grid of shapes.
//!
//! Each measurement warms up, then times several runs that each end with a device sync, and
//! reports the median and quartiles. The sketched and dense layers are measured in the same
//! process, one right after the other, so their ratio is meaningful even on a noisy machine;
//! absolute times across runs are not. Every row shows the speedup achieved next to the one
//! the FLOP counts allow.

mod grid;
mod measure;
mod report;
mod timing;

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use burn_sketch::SketchBackend;
use burn_sketch::backend::KernelPolicy;
use clap::{Args, ValueEnum};

pub use grid::{Point, grid};
pub use measure::Row;

/// Backends the suite can run on.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BackendKind {
    /// CPU, through ndarray.
    Ndarray,
    /// wgpu (Vulkan, Metal, DX12).
    Wgpu,
    /// CUDA (build with `--features cuda`).
    #[cfg(feature = "cuda")]
    Cuda,
}

/// `burn_sketch::backend::KernelPolicy`, as a command-line value.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Policy {
    /// The kernels of `burn-sketch-kernels`.
    Kernels,
    /// Burn tensor operations.
    TensorOps,
    /// Timed once per shape, the faster kept.
    Autotune,
}

/// Options of `cargo xtask bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Backend to measure.
    #[arg(long, value_enum, default_value = "ndarray")]
    pub backend: BackendKind,
    /// A small subset of the grid that runs in well under a minute on a CPU.
    #[arg(long)]
    pub quick: bool,
    /// Only points whose id (e.g. `d4096x4096-t1-k64-b256`) contains this text.
    #[arg(long)]
    pub filter: Option<String>,
    /// Untimed runs before timing each measurement.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// On CubeCL backends, what "sketch" times: the kernels (default), the tensor-op path, or
    /// whichever the autotuner picks.
    #[arg(long, value_enum, default_value = "kernels")]
    pub policy: Policy,
    /// Timed runs per measurement.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Directory under which a timestamped results directory is created.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// An earlier `results.json` to compare with: points whose sketched times grew by more
    /// than 10 % are flagged.
    #[arg(long)]
    pub baseline: Option<PathBuf>,
}

/// Runs the suite and writes `results.{md,json,csv}`; returns the results directory.
pub fn run(args: &BenchArgs) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let points: Vec<Point> = grid(args.quick)
        .into_iter()
        .filter(|p| {
            args.filter
                .as_ref()
                .is_none_or(|f| p.id().contains(f.as_str()))
        })
        .collect();
    if points.is_empty() {
        return Err(format!("no point matches the filter {:?}", args.filter).into());
    }
    burn_sketch::backend::set_kernel_policy(match args.policy {
        Policy::Kernels => KernelPolicy::Kernels,
        Policy::TensorOps => KernelPolicy::TensorOps,
        Policy::Autotune => KernelPolicy::Autotune,
    });
    let rows = match args.backend {
        BackendKind::Ndarray => {
            measure_all::<burn::backend::NdArray>(&points, &Default::default(), args)
        }
        BackendKind::Wgpu => measure_all::<burn::backend::Wgpu>(&points, &Default::default(), args),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => measure_all::<burn::backend::Cuda>(&points, &Default::default(), args),
    };

    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let dir = args.out.join(stamp.to_string());
    std::fs::create_dir_all(&dir)?;
    let table = report::markdown(&rows);
    println!("{table}");
    std::fs::write(dir.join("results.md"), &table)?;
    std::fs::write(dir.join("results.csv"), report::csv(&rows))?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    if let Some(baseline) = &args.baseline {
        compare(&rows, baseline)?;
    }
    Ok(dir)
}

fn measure_all<B: SketchBackend>(
    points: &[Point],
    device: &B::Device,
    args: &BenchArgs,
) -> Vec<Row> {
    points
        .iter()
        .enumerate()
        .map(|(i, &point)| {
            eprintln!("[{}/{}] {}", i + 1, points.len(), point.id());
            measure::measure::<B>(point, device, args.warmup, args.runs)
        })
        .collect()
}

/// Prints, for every point also in `baseline`, the ratio of sketched median times now over
/// then, flagging growth above 10 %.
fn compare(rows: &[Row], baseline: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let old: Vec<Row> = serde_json::from_str(&std::fs::read_to_string(baseline)?)?;
    println!("| point | fwd now/then | fwd+bwd now/then | |\n|---|---|---|---|");
    for row in rows {
        let Some(then) = old
            .iter()
            .find(|o| o.point == row.point && o.backend == row.backend)
        else {
            continue;
        };
        let fwd = row.sketch_forward.median_ms / then.sketch_forward.median_ms;
        let train = row.sketch_train.median_ms / then.sketch_train.median_ms;
        let flag = if fwd > 1.1 || train > 1.1 {
            "REGRESSION"
        } else {
            ""
        };
        println!("| {} | {fwd:.2} | {train:.2} | {flag} |", row.point.id());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_bench_writes_parseable_results() {
        let out = tempfile::tempdir().unwrap();
        let args = BenchArgs {
            backend: BackendKind::Ndarray,
            quick: true,
            policy: Policy::Kernels,
            filter: Some("t1-k16-b64".into()),
            warmup: 1,
            runs: 3,
            out: out.path().to_path_buf(),
            baseline: None,
        };
        let dir = run(&args).unwrap();
        let rows: Vec<Row> =
            serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap())
                .unwrap();
        assert_eq!(rows.len(), 1);
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

        let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 2);
        let header: Vec<&str> = lines[0].split(',').collect();
        let values: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(header.len(), values.len());
        let column = |name: &str| values[header.iter().position(|h| *h == name).unwrap()];
        assert_eq!(column("low_rank"), "16");
        let speedup: f64 = column("forward_speedup").parse().unwrap();
        assert!((speedup - row.forward_speedup()).abs() < 1e-9);

        // Comparing with itself flags nothing and fails on nothing.
        let again = BenchArgs {
            baseline: Some(dir.join("results.json")),
            out: out.path().join("again"),
            ..args
        };
        run(&again).unwrap();
    }
}
