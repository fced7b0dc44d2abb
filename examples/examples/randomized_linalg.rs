//! Randomized linear algebra on Flex, timed and checked against PyTorch and NumPy/SciPy in the
//! same run: the randomized SVD, tall QR (Cholesky QR and CQRRPT), and the sketching operators.
//!
//! ```text
//! cargo run --release -p examples --example randomized_linalg -- --python .venv/bin/python3
//! cargo run --release -p examples --example randomized_linalg -- --quick --json
//! ```
//!
//! Each of our operations is timed as the median of `--repeats` runs after one warm-up. The
//! matrices are then written to a temporary folder and `examples/pytorch/randomized_linalg.py`
//! times `torch.linalg.svd`, `torch.svd_lowrank`, `numpy.linalg.svd`, `torch.linalg.qr` and
//! `scipy.linalg.qr(pivoting=True)` on the same values, so both sides run on this machine in
//! this run. Without a Python that has `torch`, the table says so and shows our side alone.

use std::path::Path;
use std::process::Command;

use burn::backend::Flex;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData};
use burn_randnla::sketch::{SketchConfig, SketchKind};
use burn_randnla::{self as linalg, CqrrptConfig, RandomizedSvdConfig};
use clap::Parser;
use examples::stats::median_seconds;
use serde::Serialize;

type B = Flex;

#[derive(Debug, Parser)]
#[command(about = "Time the randomized linear algebra against PyTorch and NumPy")]
struct Args {
    /// Smaller matrices (a minute's run, for a quick check).
    #[arg(long)]
    quick: bool,
    /// Print the rows as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Runs timed per operation (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// A Python with `torch`, `numpy` and `scipy` for the peer columns.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Skip the peer.
    #[arg(long)]
    no_peer: bool,
}

/// One timed operation, ours or a peer's.
#[derive(Debug, Serialize, serde::Deserialize)]
struct Row {
    case: String,
    library: String,
    operation: String,
    seconds: f64,
    /// `‖A − U·S·Vᵀ‖_F` over the optimal rank-`k` error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error_ratio: Option<f64>,
    /// `‖A·P − Q·R‖_F / ‖A‖_F`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    residual: Option<f64>,
    /// `‖QᵀQ − I‖_F`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    orthogonality: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rank: Option<usize>,
}

impl Row {
    fn new(case: &str, operation: &str, seconds: f64) -> Self {
        Self {
            case: case.into(),
            library: "burn-sketch".into(),
            operation: operation.into(),
            seconds,
            error_ratio: None,
            residual: None,
            orthogonality: None,
            rank: None,
        }
    }
}

/// A case handed to the peer script.
#[derive(Serialize)]
struct PeerCase {
    name: String,
    kind: &'static str,
    file: String,
    rows: usize,
    cols: usize,
    rank: usize,
    oversampling: usize,
    power_iterations: usize,
    optimal_error: f64,
    tolerance: f64,
}

/// `run`'s median time over `repeats` synced calls after one warm-up
/// ([`examples::stats::median_seconds`]), with the last call's result.
fn timed<T>(repeats: usize, mut run: impl FnMut() -> T) -> (f64, T) {
    let device = Default::default();
    let mut result = None;
    let seconds = median_seconds(1, repeats, || {
        result = Some(run());
        B::sync(&device).expect("Flex syncs");
    });
    (seconds, result.expect("the warm-up ran"))
}

fn frobenius(a: Tensor<B, 2>) -> f64 {
    a.into_data()
        .iter::<f64>()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
}

fn orthogonality(q: Tensor<B, 2>) -> f64 {
    let k = q.dims()[1];
    frobenius(q.clone().transpose().matmul(q) - Tensor::eye(k, &Default::default()))
}

fn permuted(a: Tensor<B, 2>, pivots: &[usize]) -> Tensor<B, 2> {
    let index: Vec<i64> = pivots.iter().map(|&p| p as i64).collect();
    a.select(
        1,
        Tensor::from_data(TensorData::new(index, [pivots.len()]), &Default::default()),
    )
}

/// `U·diag(σ)·Vᵀ` with orthonormal `U`, `V` (QR of Gaussian matrices).
fn with_spectrum(m: usize, n: usize, sigma: &[f64]) -> Tensor<B, 2> {
    let device = Default::default();
    let r = sigma.len();
    let basis = |rows| {
        linalg::qr(Tensor::<B, 2>::random(
            [rows, r],
            Distribution::Normal(0.0, 1.0),
            &device,
        ))
        .unwrap()
        .q
    };
    let s: Vec<f32> = sigma.iter().map(|&x| x as f32).collect();
    let s = Tensor::<B, 1>::from_data(TensorData::new(s, [r]), &device);
    (basis(m) * s.unsqueeze_dim(0)).matmul(basis(n).transpose())
}

fn write(a: &Tensor<B, 2>, path: &Path) -> anyhow::Result<()> {
    let bytes: Vec<u8> = a
        .to_data()
        .iter::<f32>()
        .flat_map(f32::to_le_bytes)
        .collect();
    std::fs::write(path, bytes)?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let device = Default::default();
    let folder = tempfile::tempdir()?;
    let mut rows = Vec::new();
    let mut peer_cases = Vec::new();
    let progress = |what: &str| {
        if !args.json {
            eprintln!("… {what}");
        }
    };

    // Randomized SVD on matrices with decaying spectra (400 nonzero singular values).
    let (size, k, oversampling, power_iterations) = if args.quick {
        (600, 20, 10, 2)
    } else {
        (2000, 50, 10, 2)
    };
    for (spectrum, sigma) in [
        (
            "geometric 0.95^i",
            (0..400).map(|i| 0.95f64.powi(i)).collect::<Vec<_>>(),
        ),
        (
            "polynomial 1/(1+i)",
            (0..400).map(|i| 1.0 / (1.0 + i as f64)).collect(),
        ),
    ] {
        let case = format!("svd {size}×{size}, k = {k}, σ {spectrum}");
        progress(&case);
        let a = with_spectrum(size, size, &sigma);
        let optimal = sigma.iter().skip(k).map(|s| s * s).sum::<f64>().sqrt();
        let config = RandomizedSvdConfig::new(k)
            .with_oversampling(oversampling)
            .with_power_iterations(power_iterations);
        let (seconds, svd) = timed(args.repeats, || config.decompose(a.clone()).unwrap());
        let mut row = Row::new(
            &case,
            &format!("randomized SVD (p = {oversampling}, q = {power_iterations})"),
            seconds,
        );
        row.error_ratio = Some(frobenius(svd.reconstruct() - a.clone()) / optimal);
        rows.push(row);
        let file = format!("svd{}.f32", peer_cases.len());
        write(&a, &folder.path().join(&file))?;
        peer_cases.push(PeerCase {
            name: case,
            kind: "svd",
            file,
            rows: size,
            cols: size,
            rank: k,
            oversampling,
            power_iterations,
            optimal_error: optimal,
            tolerance: 0.0,
        });
    }

    // Tall QR: full rank, and rank 200 of 256 columns.
    let (m, n) = if args.quick {
        (4096, 128)
    } else {
        (16_384, 256)
    };
    let full = Tensor::<B, 2>::random([m, n], Distribution::Normal(0.0, 1.0), &device);
    let deficient =
        Tensor::<B, 2>::random([m, n * 25 / 32], Distribution::Normal(0.0, 1.0), &device).matmul(
            Tensor::random([n * 25 / 32, n], Distribution::Normal(0.0, 1.0), &device),
        );
    let tolerance = CqrrptConfig::new().tolerance;
    for (what, a) in [
        ("full rank", full),
        (&*format!("rank {}", n * 25 / 32), deficient),
    ] {
        let case = format!("qr {m}×{n}, {what}");
        progress(&case);
        let norm = frobenius(a.clone());
        let (seconds, qr) = timed(args.repeats, || {
            CqrrptConfig::new().decompose(a.clone()).unwrap()
        });
        let mut row = Row::new(&case, "CQRRPT", seconds);
        row.residual =
            Some(frobenius(qr.q.clone().matmul(qr.r) - permuted(a.clone(), &qr.pivots)) / norm);
        row.orthogonality = Some(orthogonality(qr.q));
        row.rank = Some(qr.rank);
        rows.push(row);
        if what == "full rank" {
            let (seconds, qr) = timed(args.repeats, || linalg::qr(a.clone()).unwrap());
            let mut row = Row::new(&case, "Cholesky QR (linalg::qr)", seconds);
            row.residual = Some(frobenius(qr.q.clone().matmul(qr.r) - a.clone()) / norm);
            row.orthogonality = Some(orthogonality(qr.q));
            rows.push(row);
        }
        let file = format!("qr{}.f32", peer_cases.len());
        write(&a, &folder.path().join(&file))?;
        peer_cases.push(PeerCase {
            name: case,
            kind: "qr",
            file,
            rows: m,
            cols: n,
            rank: 0,
            oversampling: 0,
            power_iterations: 0,
            optimal_error: 0.0,
            tolerance,
        });
    }

    // Sketching operators: S·A for A [n, 256] into d = 128 and 512 rows.
    let sizes: &[usize] = if args.quick { &[4096] } else { &[4096, 16_384] };
    for (&n, d) in sizes.iter().flat_map(|n| [(n, 128), (n, 512)]) {
        let columns = 256;
        let case = format!("sketch S·A, A {n}×{columns}, d = {d}");
        progress(&case);
        let a = Tensor::<B, 2>::random([n, columns], Distribution::Normal(0.0, 1.0), &device);
        for kind in [
            SketchKind::Gaussian,
            SketchKind::ScaledSign,
            SketchKind::SparseSign { nonzeros: 8 },
            SketchKind::CountSketch,
            SketchKind::Srht,
        ] {
            let sketch = SketchConfig::new(kind, n, d)
                .with_seed(1)
                .init::<B>(&device);
            let (seconds, _) = timed(args.repeats, || sketch.apply_left(a.clone()).unwrap());
            rows.push(Row::new(&case, &format!("{kind:?}"), seconds));
        }
    }

    // The peer, on the same matrices.
    let peer = if args.no_peer {
        Err("--no-peer".to_string())
    } else {
        progress("the peer (PyTorch, NumPy, SciPy) on the same matrices");
        std::fs::write(
            folder.path().join("cases.json"),
            serde_json::to_vec(&peer_cases)?,
        )?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("pytorch/randomized_linalg.py");
        match Command::new(&args.python)
            .arg(script)
            .arg(folder.path())
            .arg(args.repeats.to_string())
            .output()
        {
            Ok(output) if output.status.success() => Ok(String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter_map(|line| serde_json::from_str::<Row>(line).ok())
                .collect::<Vec<_>>()),
            Ok(output) => Err(format!(
                "{} failed: {}",
                args.python,
                String::from_utf8_lossy(&output.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            )),
            Err(err) => Err(format!("cannot run {}: {err}", args.python)),
        }
    };
    let peer_note = peer.as_ref().err().cloned();
    rows.extend(peer.unwrap_or_default());

    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "backend": "flex",
                "threads": rayon_threads(),
                "peer": peer_note.as_deref().unwrap_or("ran"),
                "rows": rows,
            }))?
        );
        return Ok(());
    }
    println!(
        "Flex, {} threads; peer: {}",
        rayon_threads(),
        peer_note.as_deref().unwrap_or("ran in the same run")
    );
    let mut case = String::new();
    for row in &rows_by_case(&rows) {
        if row.case != case {
            case = row.case.clone();
            println!("\n### {case}\n");
            println!(
                "| library | operation | median time | error / optimal | ‖AP − QR‖/‖A‖ | ‖QᵀQ − I‖ | rank |"
            );
            println!("|---|---|---:|---:|---:|---:|---:|");
        }
        let show =
            |x: Option<f64>, digits: usize| x.map_or("".into(), |x| format!("{x:.digits$e}"));
        println!(
            "| {} | {} | {:.2} ms | {} | {} | {} | {} |",
            row.library,
            row.operation,
            row.seconds * 1e3,
            row.error_ratio.map_or("".into(), |x| format!("{x:.4}")),
            show(row.residual, 1),
            show(row.orthogonality, 1),
            row.rank.map_or("".into(), |r| r.to_string()),
        );
    }
    Ok(())
}

/// The rows grouped by case, in the order the cases first appear.
fn rows_by_case(rows: &[Row]) -> Vec<&Row> {
    let mut cases: Vec<&str> = Vec::new();
    for row in rows {
        if !cases.contains(&row.case.as_str()) {
            cases.push(&row.case);
        }
    }
    cases
        .iter()
        .flat_map(|case| rows.iter().filter(move |row| row.case == *case))
        .collect()
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
