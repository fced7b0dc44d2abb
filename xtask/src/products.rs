//! `cargo xtask products`: the six matrix products of a sketched layer's training step, each
//! timed on the CPU engines we could run it on, to pick the fastest per product.
//!
//! With `A = [S1 | U2]` (`[d_in, r]`, `r = 2Tk`), `B = [U1; S2]` (`[r, d_out]`), `P = x·A`:
//!
//! | product | shapes | where |
//! |---|---|---|
//! | `x·A` | `[n, d_in]·[d_in, r]` | forward, and `P` again in the backward |
//! | `P·B` | `[n, r]·[r, d_out]` | forward |
//! | `∂y·Bᵀ` | `[n, d_out]·[d_out, r]` | `∂P` |
//! | `∂P·Aᵀ` | `[n, r]·[r, d_in]` | `∂x` |
//! | `xᵀ·∂P` | `[d_in, n]·[n, r]` | `∂S1`, `∂U2` |
//! | `Pᵀ·∂y` | `[r, n]·[n, d_out]` | `∂U1`, `∂S2` |
//!
//! Engines: Flex's `matmul` (the `gemm` crate, transposes as strided views), ndarray's
//! `general_mat_mul` (matrixmultiply, what `SkLinear`'s NdArray path calls), and the `gemm`
//! crate called directly on the buffers: threaded by `gemm` over rayon's pool, on one thread,
//! and with the result's rows split into one block per rayon thread, each a single-threaded
//! call. Every transposed operand is a view in every engine: no engine copies. Each engine's
//! result is checked against ndarray's before anything is timed.

use std::path::PathBuf;

use burn::backend::Flex;
use burn::tensor::Tensor;
use clap::Args;
use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView2};
use rayon::prelude::*;
use serde::Serialize;

use crate::bench::timing::{op, time_together};
use crate::bench::{Point, grid};

/// Options of `cargo xtask products`.
#[derive(Debug, Args)]
pub struct ProductsArgs {
    /// Only points whose id contains this text (default: the three CPU comparison points).
    #[arg(long)]
    pub filter: Option<String>,
    /// Timed runs per product and engine.
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Untimed runs before timing.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Also write the rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The points the book's CPU comparison with PyTorch uses.
pub const CPU_POINTS: [&str; 3] = [
    "d4096x4096-t1-k64-b256",
    "d8192x8192-t1-k16-b256",
    "d4096x4096-t4-k16-b256",
];

/// One product at one point: median milliseconds per engine.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The point's id.
    pub point: String,
    /// The product, as in the module docs.
    pub product: &'static str,
    /// `[m, k]·[k, n]`.
    pub m: usize,
    /// The inner dimension.
    pub k: usize,
    /// Columns of the result.
    pub n: usize,
    /// Flex's `matmul`.
    pub flex_ms: f64,
    /// ndarray's `general_mat_mul` (matrixmultiply).
    pub ndarray_ms: f64,
    /// `gemm` on the buffers, rayon.
    pub gemm_rayon_ms: f64,
    /// `gemm` on the buffers, one thread.
    pub gemm_single_ms: f64,
    /// `gemm` on the buffers, the result's rows split into one block per rayon thread, each
    /// block a single-threaded call (what `SkLinear`'s Flex path does).
    pub gemm_row_blocks_ms: f64,
}

/// An `m × k` by `k × n` product whose left operand is stored transposed (`lhs_t`) and/or
/// whose right one is (`rhs_t`), as in the training step.
#[derive(Clone, Copy)]
struct Product {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
    lhs_t: bool,
    rhs_t: bool,
}

fn products(point: &Point) -> [Product; 6] {
    let (n, d_in, d_out) = (point.batch, point.d_input, point.d_output);
    let r = 2 * point.num_terms * point.low_rank;
    let product = |name, m, k, cols, lhs_t, rhs_t| Product {
        name,
        m,
        k,
        n: cols,
        lhs_t,
        rhs_t,
    };
    [
        product("x·A", n, d_in, r, false, false),
        product("P·B", n, r, d_out, false, false),
        product("∂y·Bᵀ", n, d_out, r, false, true),
        product("∂P·Aᵀ", n, r, d_in, false, true),
        product("xᵀ·∂P", d_in, n, r, true, false),
        product("Pᵀ·∂y", r, n, d_out, true, false),
    ]
}

/// Runs the measurement, prints a markdown table and writes the JSON if asked.
pub fn run(args: &ProductsArgs) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let points: Vec<Point> = grid(false)
        .into_iter()
        .filter(|p| match &args.filter {
            Some(filter) => p.id().contains(filter.as_str()),
            None => CPU_POINTS.contains(&p.id().as_str()),
        })
        .collect();
    if points.is_empty() {
        return Err(format!("no point matches the filter {:?}", args.filter).into());
    }
    println!(
        "| point | product | m×k·k×n | Flex matmul | ndarray | gemm (rayon) | gemm (1 thread) | gemm (row blocks) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for point in &points {
        for product in products(point) {
            let row = measure(point, product, args)?;
            println!(
                "| {} | {} | {}×{}·{}×{} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
                row.point,
                row.product,
                row.m,
                row.k,
                row.k,
                row.n,
                row.flex_ms,
                row.ndarray_ms,
                row.gemm_rayon_ms,
                row.gemm_single_ms,
                row.gemm_row_blocks_ms
            );
            rows.push(row);
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(rows)
}

fn measure(
    point: &Point,
    p: Product,
    args: &ProductsArgs,
) -> Result<Row, Box<dyn std::error::Error>> {
    // Operands in their stored layouts: a transposed operand is the transpose of a row-major
    // matrix, as `Aᵀ`, `Bᵀ`, `xᵀ` and `Pᵀ` are in the training step.
    let stored = |rows: usize, cols: usize, transposed: bool| {
        let (r, c) = if transposed {
            (cols, rows)
        } else {
            (rows, cols)
        };
        let values: Vec<f32> = (0..r * c)
            .map(|i| ((i * 7919) % 1000) as f32 / 1e3)
            .collect();
        (values, r, c)
    };
    let (lhs, lr, lc) = stored(p.m, p.k, p.lhs_t);
    let (rhs, rr, rc) = stored(p.k, p.n, p.rhs_t);

    let device = Default::default();
    let flex = |values: &[f32], r: usize, c: usize, t: bool| {
        let tensor = Tensor::<Flex, 1>::from_floats(values, &device).reshape([r, c]);
        if t { tensor.transpose() } else { tensor }
    };
    let (flex_lhs, flex_rhs) = (flex(&lhs, lr, lc, p.lhs_t), flex(&rhs, rr, rc, p.rhs_t));

    let view = |values: &[f32], r: usize, c: usize, t: bool| -> Array2<f32> {
        let array = Array2::from_shape_vec((r, c), values.to_vec()).expect("shape");
        if t { array.reversed_axes() } else { array }
    };
    let (nd_lhs, nd_rhs) = (view(&lhs, lr, lc, p.lhs_t), view(&rhs, rr, rc, p.rhs_t));

    let strides = |_rows: usize, c: usize, t: bool| -> (isize, isize) {
        // (row stride, column stride) of the logical matrix.
        if t { (1, c as isize) } else { (c as isize, 1) }
    };
    let (lhs_rs, lhs_cs) = strides(lr, lc, p.lhs_t);
    let (rhs_rs, rhs_cs) = strides(rr, rc, p.rhs_t);
    // Rows `first..` of the result into `dst` (whole rows).
    let call = |dst: &mut [f32], first: usize, parallelism: gemm::Parallelism| {
        let rows = dst.len() / p.n;
        assert!(first + rows <= p.m);
        // SAFETY: both operands hold exactly the elements their strides reach (the lhs from
        // row `first` on, `rows` rows), and `dst` holds those rows of the row-major result.
        unsafe {
            gemm::gemm(
                rows,
                p.n,
                p.k,
                dst.as_mut_ptr(),
                1,
                p.n as isize,
                false,
                lhs.as_ptr().offset(first as isize * lhs_rs),
                lhs_cs,
                lhs_rs,
                rhs.as_ptr(),
                rhs_cs,
                rhs_rs,
                0.0,
                1.0,
                false,
                false,
                false,
                parallelism,
            );
        }
    };
    let direct = |parallelism: gemm::Parallelism| {
        let mut dst = vec![0f32; p.m * p.n];
        call(&mut dst, 0, parallelism);
        dst
    };
    let row_blocks = || {
        let mut dst = vec![0f32; p.m * p.n];
        let block = p.m.div_ceil(rayon::current_num_threads());
        dst.par_chunks_mut(block * p.n)
            .enumerate()
            .for_each(|(i, rows)| call(rows, i * block, gemm::Parallelism::None));
        dst
    };

    let nd_product = || {
        let mut dst = Array2::<f32>::zeros((p.m, p.n));
        let (a, b): (ArrayView2<'_, f32>, ArrayView2<'_, f32>) = (nd_lhs.view(), nd_rhs.view());
        general_mat_mul(1.0, &a, &b, 0.0, &mut dst);
        dst
    };
    // The engines must agree before their times are compared.
    let reference = nd_product();
    let reference = reference.as_slice().expect("row-major");
    let results: [(&str, Vec<f32>); 4] = [
        (
            "Flex",
            flex_lhs
                .clone()
                .matmul(flex_rhs.clone())
                .into_data()
                .to_vec()
                .expect("f32"),
        ),
        ("gemm (rayon)", direct(gemm::Parallelism::Rayon(0))),
        ("gemm (1 thread)", direct(gemm::Parallelism::None)),
        ("gemm (row blocks)", row_blocks()),
    ];
    for (engine, values) in results {
        let worst = values
            .iter()
            .zip(reference)
            .map(|(a, b)| (a - b).abs() / b.abs().max(1.0))
            .fold(0f32, f32::max);
        if worst > 1e-4 {
            return Err(format!("{}: {engine} differs from ndarray by {worst:e}", p.name).into());
        }
    }

    let [flex_t, ndarray_t, rayon_t, single_t, blocks_t] = time_together(
        args.warmup,
        args.runs,
        [
            op(|| flex_lhs.clone().matmul(flex_rhs.clone())),
            op(nd_product),
            op(|| direct(gemm::Parallelism::Rayon(0))),
            op(|| direct(gemm::Parallelism::None)),
            op(row_blocks),
        ],
        || {},
    );
    Ok(Row {
        point: point.id(),
        product: p.name,
        m: p.m,
        k: p.k,
        n: p.n,
        flex_ms: flex_t.median_ms,
        ndarray_ms: ndarray_t.median_ms,
        gemm_rayon_ms: rayon_t.median_ms,
        gemm_single_ms: single_t.median_ms,
        gemm_row_blocks_ms: blocks_t.median_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a non-square point (so that a transposed operand with the wrong strides would not
    /// even have the right shape): six products, every engine agreeing with ndarray (`run`
    /// fails otherwise), positive times, and the JSON written.
    #[test]
    fn products_agree_across_engines_and_are_written() {
        let out = tempfile::tempdir().unwrap();
        let json = out.path().join("products.json");
        let args = ProductsArgs {
            filter: Some("d4096x1024-t2-k16-b64".into()),
            runs: 2,
            warmup: 0,
            json: Some(json.clone()),
        };
        let rows = run(&args).unwrap();
        let names: Vec<&str> = rows.iter().map(|r| r.product).collect();
        assert_eq!(names, ["x·A", "P·B", "∂y·Bᵀ", "∂P·Aᵀ", "xᵀ·∂P", "Pᵀ·∂y"]);
        // x·A: [64, 4096]·[4096, 64]; Pᵀ·∂y: [64, 64]·[64, 1024].
        assert_eq!((rows[0].m, rows[0].k, rows[0].n), (64, 4096, 64));
        assert_eq!((rows[5].m, rows[5].k, rows[5].n), (64, 64, 1024));
        for row in &rows {
            for ms in [
                row.flex_ms,
                row.ndarray_ms,
                row.gemm_rayon_ms,
                row.gemm_single_ms,
                row.gemm_row_blocks_ms,
            ] {
                assert!(ms > 0.0, "{row:?}");
            }
        }
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
        assert_eq!(written.as_array().unwrap().len(), 6);
    }
}
