//! The language-model study's results and how they are written: a [`Run`] per trained model and
//! an [`Extra`] per measurement on the dense arm, as a markdown table (printed and
//! `results.md`), `results.csv`, `curves.png` (validation bits per character against steps) and
//! JSON.

use std::path::Path;

use anyhow::Context as _;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_compress::Converter;
use plotters::prelude::*;
use serde::Serialize;

use super::TransformerLm;
use crate::stats::{MB, mb, median};

/// One trained model's measurements.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// The arm's name (`dense`, `sketched-k16`, `converted-k16-ft`...).
    pub arm: String,
    /// The seed it was drawn and trained with.
    pub seed: u64,
    /// Validation bits per character at the end.
    pub valid_bpc: f64,
    /// (step, validation bits per character) during training.
    pub curve: Vec<(usize, f64)>,
    /// Trainable parameters of the whole model.
    pub trainable_params: usize,
    /// Trainable parameters of the blocks' linear layers.
    pub replaced_trainable_params: usize,
    /// Bytes of the trainable parameters.
    pub trainable_bytes: u64,
    /// Every stored tensor (the fixed sketches included).
    pub stored_bytes: u64,
    /// Adam's two moments per trainable parameter.
    pub optimizer_bytes: u64,
    /// Exact heap peak of a training step above what was held before it (activations,
    /// gradients, temporaries).
    pub step_peak_bytes: u64,
    /// The heap in use before that step (model, optimizer state, data).
    pub held_bytes: u64,
    /// Training tokens per second, measured alone.
    pub tokens_per_second: f64,
    /// Wall time of the training run.
    pub train_seconds: f64,
}

impl Run {
    /// A run of `model` with its sizes counted: trainable, stored and optimizer bytes, and the
    /// blocks' replaced layers' trainable parameters (attention projections and MLP layers).
    /// Its other figures are left to fill (`NaN` or 0).
    pub fn new<B: AutodiffBackend>(model: &TransformerLm<B>, arm: &str, seed: u64) -> Self {
        struct Count {
            trainable: usize,
            stored: usize,
        }
        impl<B: Backend> ModuleVisitor<B> for Count {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let n = param.shape().num_elements();
                self.stored += n;
                if param.is_require_grad() {
                    self.trainable += n;
                }
            }
        }
        let mut count = Count {
            trainable: 0,
            stored: 0,
        };
        model.visit(&mut count);
        let replaced = Converter::layers::<B, _>(&model.blocks)
            .iter()
            .map(|l| l.trainable)
            .sum();
        Run {
            arm: arm.into(),
            seed,
            valid_bpc: f64::NAN,
            curve: Vec::new(),
            trainable_params: count.trainable,
            replaced_trainable_params: replaced,
            trainable_bytes: 4 * count.trainable as u64,
            stored_bytes: 4 * count.stored as u64,
            optimizer_bytes: 8 * count.trainable as u64,
            step_peak_bytes: 0,
            held_bytes: 0,
            tokens_per_second: f64::NAN,
            train_seconds: 0.0,
        }
    }
}

/// A row of the extras (segment checkpointing, mixed precision, offloading).
#[derive(Debug, Clone, Serialize)]
pub struct Extra {
    /// What was measured.
    pub what: String,
    /// Its peak above what was held before.
    pub peak_bytes: u64,
    /// Its time (per step, or for the pass).
    pub seconds: f64,
    /// The baseline's peak.
    pub baseline_peak_bytes: u64,
    /// The baseline's time.
    pub baseline_seconds: f64,
    /// Largest relative gradient (or output) difference against the baseline.
    pub max_rel_diff: f64,
    /// A remark for the table.
    pub note: String,
}

/// What `--json` writes.
#[derive(Debug, Serialize)]
struct Report<'a> {
    args: &'a str,
    runs: &'a [Run],
    extras: &'a [Extra],
}

/// Where the study's results go.
#[derive(Debug, Clone, Copy)]
pub struct Outputs<'a> {
    /// The directory of `results.md`, `results.csv` and `curves.png`.
    pub dir: &'a Path,
    /// The JSON report's file, if one is asked for.
    pub json: Option<&'a Path>,
    /// The run's arguments, as the JSON report records them.
    pub args: &'a str,
}

/// The mean of `values` and their spread (largest minus smallest).
pub fn mean_spread(values: &[f64]) -> (f64, f64) {
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, hi - lo)
}

/// The arms of `runs`, in the order they first appear.
fn arm_names(runs: &[Run]) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for run in runs {
        if !names.contains(&run.arm.as_str()) {
            names.push(&run.arm);
        }
    }
    names
}

/// Prints the table and writes every output: `results.md`, `results.csv`, `curves.png`, and
/// the JSON report.
pub fn write_outputs(outputs: Outputs<'_>, runs: &[Run], extras: &[Extra]) -> anyhow::Result<()> {
    let dir = outputs.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let names = arm_names(runs);
    let table = markdown(runs, &names, extras);
    println!("\n{table}");
    std::fs::write(dir.join("results.md"), &table)?;
    std::fs::write(dir.join("results.csv"), csv(runs))?;
    plot_curves(runs, &names, &dir.join("curves.png"))?;
    if let Some(path) = outputs.json {
        let report = Report {
            args: outputs.args,
            runs,
            extras,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    println!(
        "wrote {}/results.md, results.csv, curves.png",
        dir.display()
    );
    Ok(())
}

/// One line per run.
fn csv(runs: &[Run]) -> String {
    let mut csv = String::from(
        "arm,seed,valid_bpc,trainable_params,replaced_trainable_params,trainable_bytes,stored_bytes,optimizer_bytes,held_bytes,step_peak_bytes,tokens_per_second,train_seconds\n",
    );
    for run in runs {
        csv.push_str(&format!(
            "{},{},{:.5},{},{},{},{},{},{},{},{:.1},{:.2}\n",
            run.arm,
            run.seed,
            run.valid_bpc,
            run.trainable_params,
            run.replaced_trainable_params,
            run.trainable_bytes,
            run.stored_bytes,
            run.optimizer_bytes,
            run.held_bytes,
            run.step_peak_bytes,
            run.tokens_per_second,
            run.train_seconds
        ));
    }
    csv
}

/// One row per arm (the mean and spread over its seeds, against dense), then the extras.
fn markdown(runs: &[Run], names: &[&str], extras: &[Extra]) -> String {
    let dense_bpc = runs
        .iter()
        .filter(|r| r.arm == "dense")
        .map(|r| r.valid_bpc)
        .collect::<Vec<_>>();
    let dense_bpc = (!dense_bpc.is_empty()).then(|| mean_spread(&dense_bpc).0);
    let dense_replaced = runs
        .iter()
        .find(|r| r.arm == "dense")
        .map(|r| r.replaced_trainable_params);
    let mut table = String::from(
        "| arm | valid bits/char (mean ± spread) | vs dense | replaced layers' trainable params | trainable MB | stored MB | Adam state MB | held MB | step peak MB | tokens/s |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for name in names {
        let of: Vec<&Run> = runs.iter().filter(|r| r.arm == *name).collect();
        let (bpc, spread) = mean_spread(&of.iter().map(|r| r.valid_bpc).collect::<Vec<_>>());
        let first = of[0];
        let median_of = |f: &dyn Fn(&Run) -> f64| median(of.iter().map(|r| f(r)));
        let versus = dense_bpc.map_or("".into(), |d| format!("{:+.1} %", 100.0 * (bpc / d - 1.0)));
        let share = dense_replaced.map_or("".into(), |d| {
            format!(
                "{} ({:.0} %)",
                first.replaced_trainable_params,
                100.0 * first.replaced_trainable_params as f64 / d as f64
            )
        });
        let peak = median_of(&|r| r.step_peak_bytes as f64);
        let tps = median_of(&|r| r.tokens_per_second);
        table.push_str(&format!(
            "| {name} | {bpc:.3} ± {spread:.3} | {versus} | {share} | {:.2} | {:.2} | {:.2} | {} | {} | {} |\n",
            mb(first.trainable_bytes),
            mb(first.stored_bytes),
            mb(first.optimizer_bytes),
            match median_of(&|r| r.held_bytes as f64) {
                0.0 => "–".to_string(),
                held => format!("{:.1}", held / MB),
            },
            if peak > 0.0 { format!("{:.1}", peak / MB) } else { "–".into() },
            if tps.is_finite() { format!("{tps:.0}") } else { "–".into() },
        ));
    }
    if !extras.is_empty() {
        table.push_str("\n| extra | peak MB | baseline peak MB | s per step | baseline s | max rel. diff | note |\n|---|---|---|---|---|---|---|\n");
        for e in extras {
            table.push_str(&format!(
                "| {} | {:.1} | {:.1} | {:.3} | {:.3} | {:.1e} | {} |\n",
                e.what,
                mb(e.peak_bytes),
                mb(e.baseline_peak_bytes),
                e.seconds,
                e.baseline_seconds,
                e.max_rel_diff,
                e.note
            ));
        }
    }
    table
}

/// Validation bits per character against training steps, one line per arm (the mean over its
/// seeds), as a PNG.
fn plot_curves(runs: &[Run], names: &[&str], path: &Path) -> anyhow::Result<()> {
    burn_memory::register_plot_font();
    let root = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let points: Vec<(usize, f64)> = runs.iter().flat_map(|r| r.curve.iter().copied()).collect();
    let max_step = points.iter().map(|p| p.0).max().unwrap_or(1).max(1);
    let lo = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Validation bits per character (mean over seeds)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0..max_step, (lo - 0.05)..(hi.min(lo + 4.0) + 0.05))?;
    chart
        .configure_mesh()
        .x_desc("training step")
        .y_desc("bits per character")
        .draw()?;
    for (i, name) in names.iter().enumerate() {
        let of: Vec<&Run> = runs.iter().filter(|r| r.arm == *name).collect();
        let curve: Vec<(usize, f64)> = of[0]
            .curve
            .iter()
            .enumerate()
            .map(|(j, &(step, _))| {
                let values: Vec<f64> = of
                    .iter()
                    .filter_map(|r| r.curve.get(j).map(|p| p.1))
                    .collect();
                (step, values.iter().sum::<f64>() / values.len() as f64)
            })
            .collect();
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(curve, color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(arm: &str, seed: u64, valid_bpc: f64) -> Run {
        Run {
            arm: arm.into(),
            seed,
            valid_bpc,
            curve: vec![(0, 4.0), (10, valid_bpc)],
            trainable_params: 1000,
            replaced_trainable_params: 500,
            trainable_bytes: 4000,
            stored_bytes: 6000,
            optimizer_bytes: 8000,
            step_peak_bytes: 2_000_000,
            held_bytes: 0,
            tokens_per_second: 100.0,
            train_seconds: 1.0,
        }
    }

    #[test]
    fn the_table_has_a_row_per_arm_against_dense_and_the_csv_a_line_per_run() {
        let runs = [
            run("dense", 1, 2.0),
            run("dense", 2, 2.2),
            run("sketched-k16", 1, 2.31),
        ];
        let names = arm_names(&runs);
        assert_eq!(names, ["dense", "sketched-k16"]);
        let table = markdown(&runs, &names, &[]);
        assert!(
            table.contains("| dense | 2.100 ± 0.200 | +0.0 % | 500 (100 %) |"),
            "{table}"
        );
        assert!(
            table.contains("| sketched-k16 | 2.310 ± 0.000 | +10.0 % |"),
            "{table}"
        );
        // No held bytes measured: a dash; the step peak in MB.
        assert!(table.contains("| – | 2.0 | 100 |"), "{table}");
        assert!(!table.contains("| extra |"), "{table}");
        assert_eq!(csv(&runs).lines().count(), 1 + runs.len());
    }
}
