//! `cargo xtask profiler-cost`: what burn-profiler's profiler costs a training step.
//!
//! The step is `train_mnist`'s: an MLP 784 → 512 → 256 → 10 with sketched hidden layers
//! (T = 1, k = 32), a batch of 64, cross-entropy, backward and an Adam update. It runs on
//! `Autodiff<B>` and on `Autodiff<Profiled<B>>`: with no profiler running, recording (host
//! times, as `train_mnist --profile` does without `--profile-sync`), recording shapes too, and
//! recording shapes, the memory after each operation and every heap allocation (what
//! `train_mnist --profile` records).
//! The variants take turns in blocks of steps, each block with one profiler running from its
//! start to its end (as in `train_mnist --profile`), in an order that rotates, so that drift
//! of the machine (frequency, other load) falls on all of them alike; the table gives each
//! one's median step time and its ratio to the plain backend's. The target is at most
//! 1.15× while recording.

use std::time::Instant;

use anyhow::Result;
use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor};
use burn_memory::DeviceMemory;
use burn_profiler::{Profiled, Profiler, ProfilerConfig};
use burn_sketch::{SkLinear, SkLinearConfig, SketchBackend};
use serde::Serialize;

use crate::stats::median;

/// Options of `cargo xtask profiler-cost`.
#[derive(Debug, clap::Args)]
pub struct ProfilerCostArgs {
    /// Measured steps per variant (after 3 warm-up steps, in 4 blocks).
    #[arg(long, default_value_t = 40)]
    pub steps: usize,
    /// Write the rows as JSON to this file too.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `flex` or `ndarray`.
    pub backend: &'static str,
    /// What ran.
    pub variant: &'static str,
    /// Median step time, milliseconds.
    pub median_ms: f64,
    /// Against the plain backend's median.
    pub ratio: f64,
    /// Operations recorded per step (0 when nothing records).
    pub ops_per_step: usize,
}

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    hidden: Vec<SkLinear<B>>,
    output: Linear<B>,
}

impl<B: Backend + SketchBackend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            hidden: vec![
                SkLinearConfig::new(784, 512, 1, 32).init(device),
                SkLinearConfig::new(512, 256, 1, 32).init(device),
            ],
            output: LinearConfig::new(256, 10).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let hidden = self
            .hidden
            .iter()
            .fold(x, |x, layer| relu(layer.forward(x)));
        self.output.forward(hidden)
    }
}

/// One variant's model, optimizer and data, stepping on demand.
struct Stepper<B: AutodiffBackend + SketchBackend> {
    model: Option<Mlp<B>>,
    optimizer: burn::optim::adaptor::OptimizerAdaptor<burn::optim::Adam, Mlp<B>, B>,
    images: Tensor<B, 2>,
    labels: Tensor<B, 1, Int>,
}

impl<B: AutodiffBackend + SketchBackend> Stepper<B>
where
    Mlp<B>: AutodiffModule<B>,
{
    fn new(device: &B::Device) -> Self {
        B::seed(device, 1);
        Self {
            model: Some(Mlp::new(device)),
            optimizer: AdamConfig::new().init(),
            images: Tensor::random([64, 784], Distribution::Default, device),
            labels: Tensor::random([64], Distribution::Uniform(0.0, 10.0), device),
        }
    }

    /// One training step, synced; its wall time in seconds.
    fn step(&mut self) -> f64 {
        let start = Instant::now();
        let model = self.model.take().expect("a model between steps");
        let logits = model.forward(self.images.clone());
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, self.labels.clone());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        self.model = Some(self.optimizer.step(1e-3, model, grads));
        B::sync(&self.images.device()).expect("the device syncs");
        start.elapsed().as_secs_f64()
    }
}

/// What one variant runs: the plain backend, or the profiled one with or without a
/// profiler (and memory sampling).
#[derive(Clone, Copy)]
struct Variant {
    name: &'static str,
    profiled: bool,
    config: Option<ProfilerConfig>,
    memory: bool,
}

/// The variants of one backend, in blocks that take turns: each block starts its profiler
/// once (as `train_mnist --profile` does), runs one unmeasured step and then measured ones.
fn backend_rows<B>(backend: &'static str, steps: usize) -> Vec<Row>
where
    B: Backend + SketchBackend + DeviceMemory,
{
    const ROUNDS: usize = 4;
    let device = B::Device::default();
    let mut plain = Stepper::<Autodiff<B>>::new(&device);
    let mut profiled = Stepper::<Autodiff<Profiled<B>>>::new(&device);
    let shapes = ProfilerConfig::new().with_record_shapes(true);
    let variants = [
        Variant {
            name: "plain backend",
            profiled: false,
            config: None,
            memory: false,
        },
        Variant {
            name: "Profiled, no profiler running",
            profiled: true,
            config: None,
            memory: false,
        },
        Variant {
            name: "recording",
            profiled: true,
            config: Some(ProfilerConfig::new()),
            memory: false,
        },
        Variant {
            name: "recording shapes",
            profiled: true,
            config: Some(shapes),
            memory: false,
        },
        Variant {
            name: "recording shapes, memory and allocations",
            profiled: true,
            config: Some(shapes),
            memory: true,
        },
    ];
    for _ in 0..3 {
        plain.step();
        profiled.step();
    }
    let per_round = steps.div_ceil(ROUNDS);
    let mut times = vec![Vec::new(); variants.len()];
    let mut ops = vec![0usize; variants.len()];
    for round in 0..ROUNDS {
        for offset in 0..variants.len() {
            // Rotate the order each round, so no variant always follows the same one.
            let index = (offset + round) % variants.len();
            let variant = variants[index];
            let profiler = variant.config.map(|config| {
                if variant.memory {
                    Profiler::start_with_memory::<B>(config, &device)
                } else {
                    Profiler::start(config)
                }
                .expect("no other profiler runs in xtask")
            });
            let mut step = || {
                if variant.profiled {
                    profiled.step()
                } else {
                    plain.step()
                }
            };
            step();
            for _ in 0..per_round {
                times[index].push(step());
            }
            if let Some(profiler) = profiler {
                ops[index] = profiler.stop().ops.len() / (per_round + 1);
            }
        }
    }
    let medians: Vec<f64> = times.into_iter().map(median).collect();
    variants
        .iter()
        .zip(&medians)
        .zip(ops)
        .map(|((variant, &time), ops)| Row {
            backend,
            variant: variant.name,
            median_ms: time * 1e3,
            ratio: time / medians[0],
            ops_per_step: ops,
        })
        .collect()
}

/// Measures and prints the table.
pub fn run(args: &ProfilerCostArgs) -> Result<Vec<Row>> {
    anyhow::ensure!(args.steps >= 1, "--steps must be at least 1");
    let mut rows = backend_rows::<Flex>("flex", args.steps);
    rows.extend(backend_rows::<NdArray>("ndarray", args.steps));
    println!(
        "MNIST MLP training step (784-512-256-10, sketched T = 1, k = 32, batch 64, Adam), \
         median of {} steps per variant:\n",
        args.steps
    );
    println!("| backend | variant | median step | against plain | operations recorded per step |");
    println!("|---|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {} | {:.2} ms | {:.3}× | {} |",
            row.backend, row.variant, row.median_ms, row.ratio, row.ops_per_step
        );
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(rows)
}
