//! burn-memory's tools, each run for real and measured: a profiled forward pass, a monitored
//! training run (CSV and plots), gradient checkpointing's savings, mixed precision's speed and
//! memory, a batch-size search and chunked inference.
//!
//! ```text
//! cargo run --release -p examples --example memory_tools                  # Flex (CPU)
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
    BatchSizeSearchConfig, Bytes, Checkpointing, DeviceMemory, MemoryBudget, MemoryMonitor,
    MemoryTracker, MixedPrecisionConfig, Precision, WithAutodiff, chunked_forward,
};
use clap::Parser;
use examples::backend::BackendKind;

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
    examples::with_backend!(args.backend, |B| run::<B>(args.backend.name(), args.out))
}

fn run<B: DeviceMemory>(name: &str, out: Option<PathBuf>) -> anyhow::Result<()> {
    let out = out.unwrap_or_else(|| PathBuf::from("target/memory_tools").join(name));
    std::fs::create_dir_all(&out)?;
    let device: B::Device = Default::default();
    println!("# burn-memory on {name}\n");

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
    println!("\nlargest difference between the two outputs: {diff:e}");
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
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], tracker.peak()?, dtype))
}
