//! burn-memory's tools, each run for real and measured: a profiled forward pass, a monitored
//! training run (CSV and plots), gradient checkpointing's savings, mixed precision's speed and
//! memory, a batch-size search, chunked inference, and serving: streaming from host data,
//! releasing cached memory and a memory cap.
//!
//! ```text
//! cargo run --release -p examples --example memory_tools                  # Flex (CPU)
//! cargo run --release -p examples --example memory_tools -- --serving     # the serving part only
//! cargo run --release -p examples --example memory_tools -- --serving --json serving.json
//! cargo run --release -p examples --features ndarray --example memory_tools -- --backend ndarray
//! cargo run --release -p examples --example memory_tools -- --backend wgpu
//! cargo run --release -p examples --features cuda --example memory_tools -- --backend cuda
//! ```
//!
//! Files go to `target/memory_tools/<backend>/`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use burn::backend::Autodiff;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::module::{AutodiffModule, Module};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, ElementConversion, Tensor};
use burn_memory::{
    BatchSizeSearchConfig, Bytes, Checkpointing, DeviceMemory, MemoryBudget, MemoryCap,
    MemoryMonitor, MemoryTracker, MixedPrecisionConfig, Precision, StreamingForward, WithAutodiff,
    chunked_forward, release_cached,
};
use clap::Parser;
use examples::backend::BackendKind;
use examples::stats::median;

/// On the CPU backends, memory figures are exact heap bytes rather than the process's resident memory.
#[global_allocator]
static ALLOCATOR: burn_memory::CountingAllocator = burn_memory::CountingAllocator::system();

#[derive(Debug, Parser)]
#[command(about = "Run and measure burn-memory's tools")]
struct Args {
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendKind,
    /// Output directory (default `target/memory_tools/<backend>`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run only the serving section (streaming, cache release, memory cap).
    #[arg(long)]
    serving: bool,
    /// Also write the serving section's figures to this JSON file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// A deep MLP of residual blocks: linear, SiLU, residual add.
#[derive(Module, Debug)]
struct DeepMlp<B: Backend> {
    layers: Vec<Linear<B>>,
}

impl<B: Backend> DeepMlp<B> {
    fn new(width: usize, depth: usize, device: &B::Device) -> Self {
        B::seed(device, 1);
        Self {
            layers: (0..depth)
                .map(|_| LinearConfig::new(width, width).init(device))
                .collect(),
        }
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for layer in &self.layers {
            let h = layer.forward(x.clone());
            x = x + (h.clone() * burn::tensor::activation::sigmoid(h)).mul_scalar(0.5);
        }
        x
    }
}

const WIDTH: usize = 512;
const DEPTH: usize = 12;
const BATCH: usize = 1024;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    examples::with_backend!(args.backend, |B| run::<B>(args.backend.name(), &args))
}

fn run<B: DeviceMemory>(name: &str, args: &Args) -> anyhow::Result<()> {
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/memory_tools").join(name));
    std::fs::create_dir_all(&out)?;
    let device: B::Device = Default::default();
    println!("# burn-memory on {name}\n");
    if args.serving {
        return serving::<B>(&device, args.json.as_deref());
    }

    // 1. Profiling one forward pass.
    let tracker = MemoryTracker::<B>::new(&device);
    let model = DeepMlp::<B>::new(WIDTH, DEPTH, &device);
    let x = Tensor::<B, 2>::random([BATCH, WIDTH], Distribution::Default, &device);
    let (_, report) = tracker.profile(|| model.forward(x.clone()).sum().into_scalar())?;
    println!("## Profile: forward of a {DEPTH}×{WIDTH} MLP, batch {BATCH}\n\n{report}\n");

    // 2. A monitored training run with phases, written as CSV, PNG and SVG.
    monitored_training::<B>(&device, &out)?;

    // 3. Checkpointing.
    println!("## Gradient checkpointing ({DEPTH}×{WIDTH} residual SiLU MLP, batch {BATCH})\n");
    println!("| strategy | held after forward | backward peak (in use, sampled) | fwd+bwd ms |");
    println!("|---|---|---|---|");
    for strategy in [Checkpointing::None, Checkpointing::Balanced] {
        let m = strategy.run::<B, _>(CheckpointRun::<B> {
            device: device.clone(),
        });
        println!(
            "| {strategy} | {} | {} | {:.0} |",
            Bytes(m.held),
            Bytes(m.peak),
            m.millis
        );
    }
    println!();

    // 4. Mixed precision.
    println!("## Mixed precision (training step of the same MLP, Adam)\n");
    println!("| compute | step ms (median of 5) | peak | forward output dtype |");
    println!("|---|---|---|---|");
    for precision in [Precision::F32, Precision::F16, Precision::Bf16] {
        match amp_step::<B>(&device, precision) {
            Ok((ms, peak, dtype)) => {
                println!("| {precision:?} | {ms:.0} | {} | {dtype:?} |", Bytes(peak))
            }
            Err(error) => println!("| {precision:?} | – | – | {error} |"),
        }
    }
    println!();

    // 5. Batch-size search under a budget of current usage + 256 MB.
    let base = tracker.usage()?.in_use;
    let budget = base + 256_000_000;
    let search = BatchSizeSearchConfig::new(MemoryBudget::Bytes(budget))
        .with_start(64)
        .with_multiple_of(64)
        .with_max(1 << 16)
        .init::<Autodiff<B>>(&device)?;
    let model = DeepMlp::<Autodiff<B>>::new(WIDTH, 4, &device);
    let result = search.run(|batch| {
        let mut optim = AdamConfig::new().init();
        let x = Tensor::random([batch, WIDTH], Distribution::Default, &device);
        let loss = model.forward(x).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let _ = optim.step(1e-3, model.clone(), grads);
        Ok(())
    })?;
    println!(
        "## Batch-size search (4×{WIDTH} MLP + Adam, budget = in use + 256 MB)\n\n```\n{result}```\n"
    );

    // 6. Chunked inference.
    let model = DeepMlp::<B>::new(WIDTH, DEPTH, &device);
    let big = Tensor::<B, 2>::random([8 * BATCH, WIDTH], Distribution::Default, &device);
    let (whole, one_pass) = tracker.profile(|| model.forward(big.clone()))?;
    let (chunked, in_chunks) =
        tracker.profile(|| chunked_forward(big.clone(), 512, |c| model.forward(c)))?;
    let diff: f32 = (whole - chunked?).abs().max().into_scalar().elem();
    println!("## Chunked inference ({} rows, chunks of 512)\n", 8 * BATCH);
    println!("| | peak over before |\n|---|---|");
    println!("| one pass | {} |", Bytes(one_pass.peak_increase()));
    println!("| chunked | {} |", Bytes(in_chunks.peak_increase()));
    println!("\nlargest difference between the two outputs: {diff:e}\n");

    // 7. Serving: streaming from host data, cache release, memory cap.
    serving::<B>(&device, args.json.as_deref())
}

/// Rows and chunk size of the serving section: 16 MiB of f32 in and out.
const SERVE_ROWS: usize = 8 * BATCH;
const SERVE_CHUNK: usize = 512;

/// Streaming inference from host data against one pass over the whole input (peak and time,
/// one and two chunks in flight), `release_cached`, and a `MemoryCap` refusing the whole
/// batch that streaming fits in.
fn serving<B: DeviceMemory>(
    device: &B::Device,
    json: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let model = DeepMlp::<B>::new(WIDTH, DEPTH, device);
    let values: Vec<f32> = (0..SERVE_ROWS * WIDTH)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let input = &burn::tensor::TensorData::new(values, [SERVE_ROWS, WIDTH]);
    let forward = |x: Tensor<B, 2>| model.forward(x);
    // Warm-up (kernel compilation, lazy weights), not measured.
    let _ = StreamingForward::<B>::new(device, SERVE_CHUNK).forward(input.clone(), forward)?;
    let tracker = MemoryTracker::<B>::new(device);

    let timed = |f: &dyn Fn() -> anyhow::Result<burn::tensor::TensorData>| {
        let start = Instant::now();
        let result = f();
        result.map(|data| (data, start.elapsed().as_secs_f64() * 1e3))
    };
    let whole_pass = || Ok(forward(Tensor::from_data(input.clone(), device)).into_data());
    let streamed = |in_flight: usize| {
        move || {
            Ok(StreamingForward::<B>::new(device, SERVE_CHUNK)
                .with_in_flight(in_flight)
                .forward(input.clone(), forward)?)
        }
    };
    let (whole, whole_report) = tracker.profile(|| timed(&whole_pass))?;
    let (serial, serial_report) = tracker.profile(|| timed(&streamed(1)))?;
    let (overlapped, overlapped_report) = tracker.profile(|| timed(&streamed(2)))?;
    let ((whole, whole_ms), (serial, serial_ms), (overlapped, overlapped_ms)) =
        (whole?, serial?, overlapped?);
    let difference = |a: &burn::tensor::TensorData| -> anyhow::Result<f32> {
        let (a, b) = (a.to_vec::<f32>()?, whole.to_vec::<f32>()?);
        Ok(a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max))
    };
    let max_difference = difference(&serial)?.max(difference(&overlapped)?);
    println!(
        "## Serving: streaming from host data ({SERVE_ROWS} rows × {WIDTH} f32 in and out, \
         {DEPTH}-layer MLP, chunks of {SERVE_CHUNK})\n"
    );
    println!("| | peak over before | ms |\n|---|---|---|");
    println!(
        "| whole input on the device | {} | {whole_ms:.0} |",
        Bytes(whole_report.peak_increase())
    );
    println!(
        "| streaming, 1 chunk in flight | {} | {serial_ms:.0} |",
        Bytes(serial_report.peak_increase())
    );
    println!(
        "| streaming, 2 chunks in flight | {} | {overlapped_ms:.0} |",
        Bytes(overlapped_report.peak_increase())
    );
    println!("\nlargest difference from the whole input's output: {max_difference:e}\n");

    // Release: after a whole-input pass, what the allocator keeps cached goes back.
    drop(forward(Tensor::from_data(input.clone(), device)).into_data());
    let released = release_cached::<B>(device)?;
    println!("## Releasing cached memory after a whole-input pass\n\n{released}\n");

    // A cap of what is in use plus 45 MB: streaming fits in it, the whole batch does not.
    let in_use = tracker.usage()?.in_use;
    let cap = MemoryCap::<B>::new(device, in_use + 45_000_000);
    let whole_capped = cap.run(|| whole_pass().map(|_| ()));
    let stream_capped = cap.run(|| {
        StreamingForward::<B>::new(device, SERVE_CHUNK)
            .with_cap(cap.clone())
            .forward(input.clone(), forward)
    });
    println!(
        "## A memory cap of in use + 45 MB ({})\n",
        Bytes(cap.limit())
    );
    let whole_outcome = match &whole_capped {
        Ok((_, report)) => format!("passed (peak {})", Bytes(report.peak)),
        Err(error) => format!("refused: {error}"),
    };
    let stream_outcome = match &stream_capped {
        Ok((Ok(_), report)) => format!("passed (peak {})", Bytes(report.peak)),
        Ok((Err(error), _)) | Err(error) => format!("refused: {error}"),
    };
    println!("- whole input: {whole_outcome}\n- streaming: {stream_outcome}\n");

    if let Some(path) = json {
        let figures = serde_json::json!({
            "rows": SERVE_ROWS,
            "width": WIDTH,
            "depth": DEPTH,
            "chunk": SERVE_CHUNK,
            "whole": { "peak_increase": whole_report.peak_increase(), "ms": whole_ms },
            "streaming_1_in_flight": { "peak_increase": serial_report.peak_increase(), "ms": serial_ms },
            "streaming_2_in_flight": { "peak_increase": overlapped_report.peak_increase(), "ms": overlapped_ms },
            "max_difference": max_difference,
            "release": released,
            "cap": { "limit": cap.limit(), "whole": whole_outcome, "streaming": stream_outcome },
        });
        std::fs::write(path, serde_json::to_string_pretty(&figures)?)?;
    }
    Ok(())
}

fn monitored_training<B: DeviceMemory>(
    device: &B::Device,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    type A<B> = Autodiff<B>;
    let tracker = MemoryTracker::<A<B>>::new(device);
    let monitor = MemoryMonitor::start(tracker.clone(), Duration::from_millis(2));
    let mut model = DeepMlp::<A<B>>::new(WIDTH, DEPTH, device);
    let mut optim = AdamConfig::new().init();
    for step in 0..3 {
        monitor.mark(format!("forward {step}"));
        let x = Tensor::random([BATCH, WIDTH], Distribution::Default, device);
        let loss = model.forward(x).powi_scalar(2).mean();
        tracker.usage()?;
        monitor.mark(format!("backward {step}"));
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        tracker.usage()?;
        monitor.mark(format!("step {step}"));
        model = optim.step(1e-3, model, grads);
        tracker.usage()?;
    }
    let timeline = monitor.stop();
    timeline.write_csv(out.join("training.csv"))?;
    timeline.plot(out.join("training.png"), "Memory during 3 training steps")?;
    timeline.plot(out.join("training.svg"), "Memory during 3 training steps")?;
    println!(
        "## Monitor: 3 training steps\n\n{}\n(written: {}/training.csv, .png, .svg)\n",
        timeline.summary(),
        out.display()
    );
    Ok(())
}

struct Measured {
    held: u64,
    peak: u64,
    millis: f64,
}

struct CheckpointRun<B: Backend> {
    device: B::Device,
}

impl<B: DeviceMemory> WithAutodiff<B> for CheckpointRun<B> {
    type Output = Measured;

    fn run<C: CheckpointStrategy>(self) -> Measured {
        let device = &self.device;
        let model = DeepMlp::<Autodiff<B, C>>::new(WIDTH, DEPTH, device);
        let x = Tensor::random([BATCH, WIDTH], Distribution::Default, device);
        let tracker = MemoryTracker::<Autodiff<B, C>>::new(device);
        let start = Instant::now();
        let loss = model.forward(x).powi_scalar(2).mean();
        tracker.reset_peak().expect("device memory");
        let held = tracker.usage().expect("device memory").in_use;
        let monitor = MemoryMonitor::start(tracker.clone(), Duration::from_millis(1));
        let grads = loss.backward();
        let _ = model.layers[0].weight.grad(&grads);
        tracker.usage().expect("device memory");
        let millis = start.elapsed().as_secs_f64() * 1e3;
        drop(monitor.stop());
        // On CPU backends the kernel's high-water mark is exact; on CubeCL the sampled in-use
        // peak is the finer figure.
        let peak = match B::SOURCE {
            burn_memory::MemorySource::Process => tracker.current_peak(),
            burn_memory::MemorySource::DevicePools => tracker.peak_in_use_sampled(),
        };
        Measured { held, peak, millis }
    }
}

fn amp_step<B: DeviceMemory>(
    device: &B::Device,
    precision: Precision,
) -> anyhow::Result<(f64, u64, DType)> {
    type A<B> = Autodiff<B>;
    let mut amp = MixedPrecisionConfig::new()
        .with_compute(precision)
        .init::<A<B>>(device)?;
    let tracker = MemoryTracker::<A<B>>::new(device);
    let mut model = DeepMlp::<A<B>>::new(WIDTH, DEPTH, device);
    let mut optim = AdamConfig::new().init();
    let x = Tensor::<A<B>, 2>::random([BATCH, WIDTH], Distribution::Default, device);
    let mut times = Vec::new();
    let mut dtype = DType::F32;
    tracker.reset_peak()?;
    for _ in 0..6 {
        let start = Instant::now();
        let y = amp.cast_module(&model).forward(amp.cast_input(x.clone()));
        dtype = y.dtype();
        let loss = y.cast(DType::F32).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(amp.scale_loss(loss).backward(), &model);
        (model, _) = amp.step(&mut optim, 1e-4, model, grads);
        tracker.usage()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let _ = model.valid();
    times.remove(0); // warm-up
    Ok((median(times), tracker.peak()?, dtype))
}
