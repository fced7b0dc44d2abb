//! The memory study of a deep MLP's training step: where memory peaks, how much Burn's balanced
//! checkpointing strategy and burn-memory's segment checkpointing save, what they cost in step
//! time, what mixed precision adds, and what a forward pass costs with and without an autodiff
//! graph. A sketched MLP (`SkLinear` layers) and the same with dense `nn::Linear` layers.
//!
//! ```text
//! cargo run --release -p examples --example checkpointing                     # Flex (CPU)
//! cargo run --release -p examples --features ndarray --example checkpointing -- --backend ndarray
//! cargo run --release -p examples --example checkpointing -- --backend wgpu   # + AMP rows
//! ```
//!
//! Rows (`config`): `baseline` (a plain training step), `balanced` (Burn's
//! `BalancedCheckpointing`), `segments` (√L segments), `amp` and `segments+amp` (f16 compute,
//! on a backend that has f16), `inference-autodiff` (a forward pass on the autodiff backend with
//! parameters that require gradients: the graph holds every activation until the output is
//! dropped) and `inference-inner` (the same on `model.valid()`, no graph). Columns: the peak
//! memory of the step above what was held before it (exact heap bytes on the CPU backends, this program
//! installs burn-memory's `CountingAllocator`; CubeCL pool bytes on wgpu), the median step time,
//! and the largest deviation of any parameter's gradient from the baseline's (largest absolute
//! difference over the largest absolute baseline value, per parameter).
//!
//! Outputs go to `--out` (default `target/checkpointing/<backend>`): `results.csv`, a bar chart
//! `checkpointing.png`, and with `--json PATH` one JSON object per row.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use burn_memory::{
    CountingAllocator, DeviceMemory, Layers, MemoryTracker, MixedPrecision, MixedPrecisionConfig,
    Precision, Segments, segmented_backward,
};
use burn_sketch::{SkLinear, SkLinearConfig, SketchBackend};
use clap::Parser;
use examples::backend::BackendKind;
use examples::stats::{mb, median_seconds};
use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use serde::Serialize;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::system();

#[derive(Debug, Parser)]
#[command(about = "Memory and time of a deep MLP's training step under checkpointing and AMP")]
struct Args {
    /// Backend to measure on (AMP rows need f16: wgpu or cuda).
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendKind,
    /// Hidden layers (each a linear layer and a ReLU).
    #[arg(long, default_value_t = 24)]
    layers: usize,
    /// Width of every layer.
    #[arg(long, default_value_t = 2048)]
    width: usize,
    /// Rows per step.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// Rank of the sketched layers (one term).
    #[arg(long, default_value_t = 64)]
    low_rank: usize,
    /// Timed steps per configuration (after one untimed step, which is the one measured for
    /// memory).
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Write the rows as a JSON array to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Output directory (default `target/checkpointing/<backend>`).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// A stack of equal-width layers, all sketched or all dense.
#[derive(Module, Debug)]
struct Deep<B: Backend> {
    sketched: Vec<SkLinear<B>>,
    dense: Vec<Linear<B>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    Sketched,
    Dense,
}

impl<B: Backend> Deep<B> {
    /// The model, its parameters drawn now: Burn's `Linear` draws lazily, on first use, which
    /// would make two models built after the same seed differ.
    fn new(kind: Kind, args: &Args, device: &B::Device) -> Self {
        struct Draw;
        impl<B: Backend> ModuleVisitor<B> for Draw {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                let _ = param.val();
            }
        }
        let model = Self::build(kind, args, device);
        model.visit(&mut Draw);
        model
    }

    fn build(kind: Kind, args: &Args, device: &B::Device) -> Self {
        let w = args.width;
        match kind {
            Kind::Sketched => Self {
                sketched: (0..args.layers)
                    .map(|_| SkLinearConfig::new(w, w, 1, args.low_rank).init(device))
                    .collect(),
                dense: Vec::new(),
            },
            Kind::Dense => Self {
                sketched: Vec::new(),
                dense: (0..args.layers)
                    .map(|_| LinearConfig::new(w, w).init(device))
                    .collect(),
            },
        }
    }
}

impl<B: SketchBackend> Layers<B> for Deep<B> {
    fn num_layers(&self) -> usize {
        self.sketched.len() + self.dense.len()
    }

    fn forward_layer(&self, index: usize, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match self.sketched.get(index) {
            Some(layer) => relu(layer.forward(x)),
            None => relu(self.dense[index].forward(x)),
        }
    }
}

impl<B: SketchBackend> Deep<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        (0..self.num_layers()).fold(x, |x, i| self.forward_layer(i, x))
    }
}

/// The training loss: the mean square of the last layer's output.
fn loss<B: Backend>(out: Tensor<B, 2>) -> Tensor<B, 1> {
    out.powi_scalar(2).mean()
}

/// One row of the study.
#[derive(Debug, Serialize)]
struct Row {
    model: Kind,
    config: &'static str,
    backend: &'static str,
    peak_bytes: u64,
    step_ms: f64,
    /// `None` for the inference rows.
    max_grad_rel_err: Option<f64>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let backend = args.backend.name();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/checkpointing").join(backend));
    std::fs::create_dir_all(&out)?;
    let rows = examples::with_backend!(args.backend, |B| study::<B>(&args)?);

    print!("{}", table(&rows, &args));
    let mut csv = String::from("model,config,backend,peak_bytes,step_ms,max_grad_rel_err\n");
    for row in &rows {
        let err = row
            .max_grad_rel_err
            .map(|e| e.to_string())
            .unwrap_or_default();
        let model = serde_json::to_value(row.model)?;
        let model = model.as_str().unwrap_or_default();
        writeln!(
            csv,
            "{model},{},{},{},{:.3},{err}",
            row.config, row.backend, row.peak_bytes, row.step_ms
        )?;
    }
    std::fs::write(out.join("results.csv"), csv)?;
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    plot(&rows, &out.join("checkpointing.png"), &args)?;
    println!(
        "\nwrote {} and {}",
        out.join("results.csv").display(),
        out.join("checkpointing.png").display()
    );
    Ok(())
}

/// Every configuration for both models on backend `B`.
fn study<B>(args: &Args) -> anyhow::Result<Vec<Row>>
where
    B: DeviceMemory + SketchBackend,
{
    let device = B::Device::default();
    let f16 = MixedPrecisionConfig::new()
        .with_compute(Precision::F16)
        .init::<Autodiff<B>>(&device)
        .ok();
    if f16.is_none() {
        eprintln!(
            "{} has no f16: the amp rows are left out (run with --backend wgpu)",
            args.backend.name()
        );
    }
    let per_model = 5 + if f16.is_some() { 2 } else { 0 };
    let bar = ProgressBar::new(2 * per_model as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("a valid template"),
    );
    let mut rows = Vec::new();
    for kind in [Kind::Sketched, Kind::Dense] {
        rows.extend(study_model::<B>(kind, args, f16.as_ref(), &bar)?);
    }
    bar.finish_and_clear();
    Ok(rows)
}

fn study_model<B>(
    kind: Kind,
    args: &Args,
    f16: Option<&MixedPrecision>,
    bar: &ProgressBar,
) -> anyhow::Result<Vec<Row>>
where
    B: DeviceMemory + SketchBackend,
{
    type A<B> = Autodiff<B>;
    let device = B::Device::default();
    let tracker = MemoryTracker::<B>::new(&device);
    let backend = args.backend.name();
    B::seed(&device, 1);
    let model = Deep::<A<B>>::new(kind, args, &device);
    let x = Tensor::<A<B>, 2>::random([args.batch, args.width], Distribution::Default, &device);
    let mut rows = Vec::new();
    let mut record = |config: &'static str, (peak, ms): (u64, f64), err: Option<f64>| {
        bar.inc(1);
        // Without a terminal the bar is hidden: a line per row shows the progress instead.
        if bar.is_hidden() {
            eprintln!(
                "{kind:?} {config}: peak {:.1} MB, step {ms:.1} ms",
                mb(peak)
            );
        }
        rows.push(Row {
            model: kind,
            config,
            backend,
            peak_bytes: peak,
            step_ms: ms,
            max_grad_rel_err: err,
        });
    };

    bar.set_message(format!("{kind:?}: baseline"));
    let mut grads = None;
    let baseline = measure(&tracker, args.steps, || {
        let graph = loss(model.forward(x.clone())).backward();
        grads = Some(GradientsParams::from_grads(graph, &model));
    })?;
    let reference = flat(&model, &grads.take().expect("the step ran"));
    record("baseline", baseline, Some(0.0));

    bar.set_message(format!("{kind:?}: balanced"));
    {
        // The same parameters on the balanced strategy's backend type (same seed, same draws).
        type Balanced<B> = Autodiff<B, BalancedCheckpointing>;
        B::seed(&device, 1);
        let model = Deep::<Balanced<B>>::new(kind, args, &device);
        let x = Tensor::<Balanced<B>, 2>::from_inner(x.clone().inner());
        let mut grads = None;
        let figures = measure(&tracker, args.steps, || {
            let graph = loss(model.forward(x.clone())).backward();
            grads = Some(GradientsParams::from_grads(graph, &model));
        })?;
        let err = deviation(&flat(&model, &grads.expect("the step ran")), &reference);
        record("balanced", figures, Some(err));
    }

    bar.set_message(format!("{kind:?}: segments"));
    let figures = measure(&tracker, args.steps, || {
        let step = segmented_backward(&model, x.clone(), &Segments::Sqrt, loss).expect("√L fits");
        grads = Some(step.grads);
    })?;
    let err = deviation(&flat(&model, &grads.take().expect("ran")), &reference);
    record("segments", figures, Some(err));

    if let Some(amp) = f16 {
        bar.set_message(format!("{kind:?}: amp"));
        let mut amp = amp.clone();
        let figures = measure(&tracker, args.steps, || {
            let out = amp.cast_module(&model).forward(amp.cast_input(x.clone()));
            let graph = amp.scale_loss(loss(out)).backward();
            let scaled = GradientsParams::from_grads(graph, &model);
            grads = amp.unscale(&model, scaled);
        })?;
        let err = grads
            .take()
            .map(|g| deviation(&flat(&model, &g), &reference));
        record("amp", figures, err);

        bar.set_message(format!("{kind:?}: segments+amp"));
        let figures = measure(&tracker, args.steps, || {
            let step = amp
                .segmented_backward(&model, x.clone(), &Segments::Sqrt, |out| {
                    loss(out.cast(burn::tensor::DType::F32))
                })
                .expect("√L fits");
            grads = amp.unscale(&model, step.grads);
        })?;
        let err = grads
            .take()
            .map(|g| deviation(&flat(&model, &g), &reference));
        record("segments+amp", figures, err);
    }

    bar.set_message(format!("{kind:?}: inference"));
    let figures = measure(&tracker, args.steps, || {
        let _ = model.forward(x.clone()).into_data();
    })?;
    record("inference-autodiff", figures, None);
    let inner = model.valid();
    let x = x.inner();
    let figures = measure(&tracker, args.steps, || {
        let _ = inner.forward(x.clone()).into_data();
    })?;
    record("inference-inner", figures, None);
    Ok(rows)
}

/// Peak memory of one untimed call of `step` (above what was in use before it), then the
/// median time of `steps` calls, in ms. Every call ends with its results read back, so the
/// time includes the device's work.
fn measure<B: DeviceMemory>(
    tracker: &MemoryTracker<B>,
    steps: usize,
    mut step: impl FnMut(),
) -> anyhow::Result<(u64, f64)> {
    let ((), report) = tracker.profile(&mut step)?;
    let millis = 1e3 * median_seconds(0, steps.max(1), &mut step);
    Ok((report.peak_increase(), millis))
}

/// Every parameter's gradient as flat values, in the module's visiting order (the same order
/// for the same model on another backend type).
fn flat<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    grads: &GradientsParams,
) -> Vec<Vec<f32>> {
    struct Collect<'a>(&'a GradientsParams, Vec<Vec<f32>>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(grad) = self.0.get::<B::InnerBackend, D>(param.id) {
                let values = grad.into_data().convert::<f32>().to_vec::<f32>();
                self.1.push(values.expect("converted to f32"));
            }
        }
    }
    let mut collect = Collect(grads, Vec::new());
    model.visit(&mut collect);
    collect.1
}

/// The largest per-parameter deviation of `grads` from `reference`: max |a − b| over max |b|.
fn deviation(grads: &[Vec<f32>], reference: &[Vec<f32>]) -> f64 {
    assert_eq!(grads.len(), reference.len(), "a parameter lacks a gradient");
    grads
        .iter()
        .zip(reference)
        .map(|(a, b)| {
            let scale = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
            let diff = a
                .iter()
                .zip(b)
                .fold(0f64, |m, (x, y)| m.max((x - y).abs() as f64));
            if scale > 0.0 { diff / scale } else { diff }
        })
        .fold(0.0, f64::max)
}

fn table(rows: &[Row], args: &Args) -> String {
    let mut out = format!(
        "\n{} layers of width {}, batch {}, sketched rank {} ({}), peak above the held model:\n\n\
         | model | config | peak MB | vs baseline | step ms | vs baseline | max grad rel. err |\n\
         |---|---|---|---|---|---|---|\n",
        args.layers,
        args.width,
        args.batch,
        args.low_rank,
        args.backend.name()
    );
    for row in rows {
        let base = rows
            .iter()
            .find(|r| r.model == row.model && r.config == "baseline")
            .expect("a baseline row per model");
        let err = row
            .max_grad_rel_err
            .map_or("—".to_string(), |e| format!("{e:.1e}"));
        let _ = writeln!(
            out,
            "| {:?} | {} | {:.1} | {:.0} % | {:.1} | {:.2}× | {err} |",
            row.model,
            row.config,
            mb(row.peak_bytes),
            100.0 * row.peak_bytes as f64 / base.peak_bytes.max(1) as f64,
            row.step_ms,
            row.step_ms / base.step_ms,
        );
    }
    out
}

/// Two bar charts side by side: peak MB and step ms per configuration, sketched and dense.
fn plot(rows: &[Row], path: &Path, args: &Args) -> anyhow::Result<()> {
    burn_memory::register_plot_font();
    let root = BitMapBackend::new(path, (1400, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(700);
    let configs: Vec<&str> = rows
        .iter()
        .filter(|r| r.model == Kind::Sketched)
        .map(|r| r.config)
        .collect();
    let title = format!(
        "{}×{} MLP, batch {} ({})",
        args.layers,
        args.width,
        args.batch,
        args.backend.name()
    );
    type Value = fn(&Row) -> f64;
    let panels: [(&str, Value, _); 2] = [
        ("peak MB", |r| mb(r.peak_bytes), left),
        ("step ms", |r| r.step_ms, right),
    ];
    for (name, value, area) in panels {
        let top = rows.iter().map(value).fold(0.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(&area)
            .caption(format!("{name}: {title}"), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(90)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..configs.len() as f64, 0.0..top.max(1e-9))?;
        let labels = configs.clone();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(configs.len() * 2 + 1)
            .x_label_formatter(&|x| {
                let i = x.floor() as usize;
                if (x - i as f64 - 0.5).abs() < 0.01 {
                    labels.get(i).map(|s| s.to_string()).unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc(name)
            .draw()?;
        for (model, color, offset) in [
            (Kind::Sketched, RGBColor(30, 90, 200), 0.1),
            (Kind::Dense, RGBColor(120, 120, 120), 0.5),
        ] {
            chart
                .draw_series(rows.iter().filter(|r| r.model == model).filter_map(|r| {
                    let i = configs.iter().position(|c| *c == r.config)? as f64;
                    let x0 = i + offset;
                    Some(Rectangle::new(
                        [(x0, 0.0), (x0 + 0.38, value(r))],
                        color.filled(),
                    ))
                }))?
                .label(format!("{model:?}"))
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled())
                });
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
