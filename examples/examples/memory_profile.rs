//! Memory of dense `Linear` against `SkLinear` for the layer sizes of Panther's memory analysis
//! (1024→512, 2048→1024, 4096→2048 with sketch sizes 256, 512, 1024): parameters, their bytes,
//! activation bytes per batch, and the measured peak of a forward pass and of a training step,
//! as a markdown table on stdout plus CSV and a plot.
//!
//! ```text
//! cargo run --release -p examples --example memory_profile                      # Flex (CPU)
//! cargo run --release -p examples --features ndarray --example memory_profile -- --backend ndarray
//! cargo run --release -p examples --example memory_profile -- --backend wgpu --batch 1024
//! cargo run --release -p examples --features cuda --example memory_profile -- --backend cuda
//! ```
//!
//! On the CPU backends (Flex, NdArray) the measured figures are exact heap bytes: this program installs burn-memory's
//! `CountingAllocator`. On wgpu they are CubeCL's reserved pool bytes (page-rounded).
//! Outputs go to `target/memory_profile/<backend>/`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use burn::backend::Autodiff;
use burn::module::Module;
use burn::nn::LinearConfig;
use burn::tensor::{Distribution, Tensor};
use burn_memory::{CountingAllocator, DeviceMemory, MemoryTracker};
use burn_sketch::{SkLinearConfig, SketchBackend};
use clap::Parser;
use examples::backend::BackendKind;
use examples::stats::mb;
use plotters::prelude::*;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::system();

/// The layers of Panther's memory analysis: `(d_input, d_output, sketch_size)`.
const LAYERS: [(usize, usize, usize); 3] =
    [(1024, 512, 256), (2048, 1024, 512), (4096, 2048, 1024)];
const F32: usize = 4;

#[derive(Debug, Parser)]
#[command(about = "Memory of dense against sketched linear layers")]
struct Args {
    /// Backend to measure on.
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendKind,
    /// Rows per forward pass.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Output directory (default `target/memory_profile/<backend>`).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Figures of one layer size, dense and sketched.
struct Profile {
    d_input: usize,
    d_output: usize,
    sketch_size: usize,
    dense_params: usize,
    sketch_trainable: usize,
    sketch_fixed: usize,
    /// Output bytes per batch (both layers).
    output_bytes: usize,
    /// The sketched intermediate `x·A` per batch, which the tensor-op path materialises (and
    /// training keeps for backward) and the fused kernels keep on chip.
    intermediate_bytes: usize,
    dense_forward_peak: u64,
    sketch_forward_peak: u64,
    dense_train_peak: u64,
    sketch_train_peak: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let name = args.backend.name();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/memory_profile").join(name));
    std::fs::create_dir_all(&out)?;
    let profiles = examples::with_backend!(args.backend, |B| measure_all::<B>(args.batch)?);

    let table = markdown(&profiles, args.batch);
    println!("{table}");
    std::fs::write(out.join("memory.md"), &table)?;
    std::fs::write(out.join("memory.csv"), csv(&profiles))?;
    for ext in ["svg", "png"] {
        plot(
            &profiles,
            &out.join(format!("memory.{ext}")),
            name,
            args.batch,
        )?;
    }
    println!("written to {}", out.display());
    Ok(())
}

fn measure_all<B: SketchBackend + DeviceMemory>(
    batch: usize,
) -> Result<Vec<Profile>, burn_memory::MemoryError> {
    let device = B::Device::default();
    LAYERS
        .iter()
        .map(|&(d_input, d_output, sketch_size)| {
            measure::<B>(&device, batch, d_input, d_output, sketch_size)
        })
        .collect()
}

fn measure<B: SketchBackend + DeviceMemory>(
    device: &B::Device,
    batch: usize,
    d_input: usize,
    d_output: usize,
    sketch_size: usize,
) -> Result<Profile, burn_memory::MemoryError> {
    let config = SkLinearConfig::from_sketch_size(d_input, d_output, sketch_size)
        .expect("the table's sketch sizes are even");
    let dense_config = LinearConfig::new(d_input, d_output);
    let x = Tensor::<B, 2>::random([batch, d_input], Distribution::Default, device);

    // Each measurement runs once untimed first, so that lazy initialisation and kernel
    // compilation are not counted, then is profiled from a fresh peak.
    let tracker = MemoryTracker::<B>::new(device);
    let peak = |op: &dyn Fn()| -> Result<u64, burn_memory::MemoryError> {
        op();
        B::sync(device).ok();
        let ((), report) = tracker.profile(|| {
            op();
            B::sync(device).ok();
        })?;
        Ok(report.peak_increase())
    };

    let sketch = config.init::<B>(device);
    let dense = dense_config.init::<B>(device);
    let sketch_forward_peak = peak(&|| drop(sketch.forward(x.clone())))?;
    let dense_forward_peak = peak(&|| drop(dense.forward(x.clone())))?;

    let sketch_ad = config.init::<Autodiff<B>>(device);
    let dense_ad = dense_config.init::<Autodiff<B>>(device);
    let x_ad = Tensor::<Autodiff<B>, 2>::from_inner(x.clone());
    let sketch_train_peak = peak(&|| drop(sketch_ad.forward(x_ad.clone()).sum().backward()))?;
    let dense_train_peak = peak(&|| drop(dense_ad.forward(x_ad.clone()).sum().backward()))?;

    let counts = sketch.param_counts();
    Ok(Profile {
        d_input,
        d_output,
        sketch_size,
        dense_params: dense.num_params(),
        sketch_trainable: counts.trainable,
        sketch_fixed: counts.fixed,
        output_bytes: batch * d_output * F32,
        intermediate_bytes: batch * sketch_size * F32,
        dense_forward_peak,
        sketch_forward_peak,
        dense_train_peak,
        sketch_train_peak,
    })
}

fn markdown(profiles: &[Profile], batch: usize) -> String {
    let mut out = format!(
        "Batch {batch}, f32. Sketched layers: one term, k = sketch size / 2. Parameter bytes \
         count the fixed sketches too (they are stored, not trained).\n\n\
         | layer | sketch size | params dense | params sketched (trainable + fixed) | \
         param MB dense / sketched | activations MB dense / sketched | \
         forward peak MB dense / sketched | train step peak MB dense / sketched |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    for p in profiles {
        let _ = writeln!(
            out,
            "| {}→{} | {} | {} | {} + {} ({:.0} % trainable) | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} |",
            p.d_input,
            p.d_output,
            p.sketch_size,
            p.dense_params,
            p.sketch_trainable,
            p.sketch_fixed,
            100.0 * p.sketch_trainable as f64 / p.dense_params as f64,
            mb((p.dense_params * F32) as u64),
            mb(((p.sketch_trainable + p.sketch_fixed) * F32) as u64),
            mb(p.output_bytes as u64),
            mb((p.output_bytes + p.intermediate_bytes) as u64),
            mb(p.dense_forward_peak),
            mb(p.sketch_forward_peak),
            mb(p.dense_train_peak),
            mb(p.sketch_train_peak),
        );
    }
    out
}

fn csv(profiles: &[Profile]) -> String {
    let mut out = String::from(
        "d_input,d_output,sketch_size,dense_params,sketch_trainable,sketch_fixed,output_bytes,\
         intermediate_bytes,dense_forward_peak,sketch_forward_peak,dense_train_peak,\
         sketch_train_peak\n",
    );
    for p in profiles {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            p.d_input,
            p.d_output,
            p.sketch_size,
            p.dense_params,
            p.sketch_trainable,
            p.sketch_fixed,
            p.output_bytes,
            p.intermediate_bytes,
            p.dense_forward_peak,
            p.sketch_forward_peak,
            p.dense_train_peak,
            p.sketch_train_peak
        );
    }
    out
}

/// A plotted figure of a layer: its dense and sketched values, in MB.
type Quantity = fn(&Profile) -> (f64, f64);

/// Grouped bars, one group per layer: parameter bytes and the two measured peaks, dense
/// against sketched.
fn plot(profiles: &[Profile], path: &Path, backend: &str, batch: usize) -> anyhow::Result<()> {
    burn_memory::register_plot_font();
    let size = (1200, 600);
    if path.extension().is_some_and(|e| e == "svg") {
        let root = SVGBackend::new(path, size).into_drawing_area();
        draw(&root, profiles, backend, batch)?;
        root.present()?;
    } else {
        let root = BitMapBackend::new(path, size).into_drawing_area();
        draw(&root, profiles, backend, batch)?;
        root.present()?;
    }
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    profiles: &[Profile],
    backend: &str,
    batch: usize,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let quantities: [(&str, Quantity); 3] = [
        ("parameters", |p| {
            (
                mb((p.dense_params * F32) as u64),
                mb(((p.sketch_trainable + p.sketch_fixed) * F32) as u64),
            )
        }),
        ("forward peak", |p| {
            (mb(p.dense_forward_peak), mb(p.sketch_forward_peak))
        }),
        ("train step peak", |p| {
            (mb(p.dense_train_peak), mb(p.sketch_train_peak))
        }),
    ];
    let top = profiles
        .iter()
        .flat_map(|p| quantities.iter().map(move |(_, q)| q(p).0.max(q(p).1)))
        .fold(0.0_f64, f64::max)
        * 1.3;
    // Each layer takes 7 slots: three pairs of bars and a gap.
    let slots = (profiles.len() * 7) as f64;
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("Dense vs sketched memory ({backend}, batch {batch})"),
            ("sans-serif", 26),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..slots, 0.0..top)?;
    let labels: Vec<String> = profiles
        .iter()
        .map(|p| {
            format!(
                "{} in, {} out, s = {}",
                p.d_input, p.d_output, p.sketch_size
            )
        })
        .collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("MB")
        .draw()?;
    // Each group is named just above its tallest bar.
    chart.draw_series(
        profiles
            .iter()
            .zip(&labels)
            .enumerate()
            .map(|(layer, (p, label))| {
                let tallest = quantities
                    .iter()
                    .map(|(_, q)| q(p).0.max(q(p).1))
                    .fold(0.0_f64, f64::max);
                let at = (layer as f64 * 7.0 + 0.5, tallest + top * 0.06);
                Text::new(label.clone(), at, ("sans-serif", 18))
            }),
    )?;
    let colors = [
        RGBColor(90, 90, 90),
        RGBColor(30, 90, 200),
        RGBColor(200, 120, 0),
    ];
    for (q, (name, value)) in quantities.iter().enumerate() {
        for (layer, profile) in profiles.iter().enumerate() {
            let (dense, sketched) = value(profile);
            let x0 = layer as f64 * 7.0 + 0.5 + 2.0 * q as f64;
            let color = colors[q];
            chart.draw_series([
                Rectangle::new([(x0, 0.0), (x0 + 0.9, dense)], color.mix(0.45).filled()),
                Rectangle::new([(x0 + 0.9, 0.0), (x0 + 1.8, sketched)], color.filled()),
            ])?;
        }
        let color = colors[q];
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(format!("{name}: dense (light) / sketched (dark)"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperMiddle)
        .draw()?;
    Ok(())
}
