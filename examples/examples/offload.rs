//! Tiered parameter offloading, measured: a stack of linear layers several times larger than a
//! device budget runs inference with its parameters on the host tier, the disk cache
//! (uncompressed or zstd) or both, with and without the prefetcher, against the resident model.
//!
//! ```text
//! cargo run --release -p examples --example offload                          # Flex (CPU)
//! cargo run --release -p examples --example offload -- --backend wgpu        # 1 GiB vs 256 MB
//! cargo run --release -p examples --example offload -- --json offload.json
//! ```
//!
//! Each row wraps a fresh, lazily initialised model (its parameters are computed on first use,
//! as a checkpoint loaded lazily would be), so the wrap itself shows whether the model ever
//! lands on the device whole. On a CPU backend the device and the host tier are the same heap:
//! only the disk rows can stay below the budget there.

use std::path::PathBuf;
use std::time::Instant;

use burn::module::{Module, Param, ParamId};
use burn::nn::Linear;
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use burn_memory::offload::{OffloadConfig, OffloadManager, OffloadSelection};
use burn_memory::{Bytes as ByteSize, DeviceMemory, Layers, MemoryReport, MemoryTracker};
use clap::Parser;
use examples::backend::BackendKind;
use examples::stats::median;
use indicatif::{ProgressBar, ProgressStyle};
use rand_xoshiro::SplitMix64;
use rand_xoshiro::rand_core::{Rng, SeedableRng};
use serde::Serialize;

/// Memory figures on CPU backends are exact heap bytes.
#[global_allocator]
static ALLOCATOR: burn_memory::CountingAllocator = burn_memory::CountingAllocator::system();

#[derive(Debug, Parser)]
#[command(about = "Run a model larger than a device budget with burn-memory's offloading")]
struct Args {
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendKind,
    /// Linear layers in the stack.
    #[arg(long, default_value_t = 16)]
    layers: usize,
    /// Width of every layer (each holds width² f32 weights).
    #[arg(long, default_value_t = 4096)]
    width: usize,
    /// Rows per batch: 64 makes a layer's compute about as long as its load on a 2-core CPU.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Timed batches per row (after one untimed batch that teaches the prefetcher the order).
    #[arg(long, default_value_t = 3)]
    batches: usize,
    /// The device budget, in MiB.
    #[arg(long, default_value_t = 256)]
    budget_mib: u64,
    /// How often the managers' monitors read the device, in milliseconds.
    #[arg(long, default_value_t = 100)]
    check_interval_ms: u64,
    /// Where the disk cache goes (a fresh temporary directory when not given).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Also write the results as JSON here: `{"rows": [one object per row], "monitor": {..}}`.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The stack: linear layers with ReLU between them.
#[derive(Module, Debug)]
struct Stack<B: Backend> {
    layers: Vec<Linear<B>>,
}

impl<B: Backend> Stack<B> {
    /// Every layer in turn: the resident model's forward.
    fn forward(&self, input: Tensor<B, 2>) -> Tensor<B, 2> {
        (0..self.num_layers()).fold(input, |x, i| self.forward_layer(i, x))
    }
}

impl<B: Backend> Layers<B> for Stack<B> {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn forward_layer(&self, index: usize, input: Tensor<B, 2>) -> Tensor<B, 2> {
        let y = self.layers[index].forward(input);
        if index + 1 < self.layers.len() {
            relu(y)
        } else {
            y
        }
    }
}

/// Layer `layer`'s weight (`part` 0, `[width, width]`) or bias (`part` 1, `[width]`), uniform
/// in ±1/√width as `nn::Linear` draws them, from a fixed seed: every row gets the same model
/// without keeping a copy of it.
fn layer_data(layer: usize, part: u64, width: usize) -> TensorData {
    let bound = 1.0 / (width as f32).sqrt();
    let mut rng =
        SplitMix64::seed_from_u64((layer as u64 * 2 + part).wrapping_mul(0xbf58_476d_1ce4_e5b9));
    let mut next =
        move || ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * bound;
    match part {
        0 => TensorData::new((0..width * width).map(|_| next()).collect(), [width, width]),
        _ => TensorData::new((0..width).map(|_| next()).collect(), [width]),
    }
}

/// The stack with lazy parameters: nothing is computed or allocated until first use.
fn lazy_stack<B: Backend>(layers: usize, width: usize, device: &B::Device) -> Stack<B> {
    let layers = (0..layers)
        .map(|layer| Linear {
            weight: Param::uninitialized(
                ParamId::new(),
                move |device, _| Tensor::from_data(layer_data(layer, 0, width), device),
                device.clone(),
                false,
                [width, width].into(),
            ),
            bias: Some(Param::uninitialized(
                ParamId::new(),
                move |device, _| Tensor::from_data(layer_data(layer, 1, width), device),
                device.clone(),
                false,
                [width].into(),
            )),
        })
        .collect();
    Stack { layers }
}

/// One configuration's measurements: the issue's fields, then what explains them.
#[derive(Debug, Serialize)]
struct Row {
    config: String,
    backend: String,
    budget_bytes: u64,
    /// Device memory at its peak over the timed batches (CubeCL: reserved, an upper bound;
    /// CPU: heap).
    peak_device_bytes: u64,
    /// The largest in-use figure sampled over the timed batches (a lower bound of the peak).
    peak_in_use_sampled_bytes: u64,
    ms_per_batch: f64,
    /// Parameter bytes loaded onto the device per batch.
    bytes_loaded: u64,
    max_abs_diff: f32,
    /// Device memory at its peak while wrapping (the model arriving).
    wrap_peak_bytes: u64,
    prefetch_hits: u64,
    disk_bytes: u64,
    /// The time the monitor spent in its readings (waits on the device included) over the
    /// manager's lifetime.
    monitor_busy_fraction: f64,
    prefetch: bool,
}

fn configs(budget: u64, check_interval_ms: u64) -> Vec<(&'static str, OffloadConfig)> {
    let base = OffloadConfig::new()
        .with_device_budget_bytes(Some(budget))
        .with_check_interval_ms(check_interval_ms);
    let host = base.clone().with_disk_tier(false);
    let disk = base
        .clone()
        .with_host_tier(false)
        .with_compress_disk_cache(false);
    let mut configs = vec![
        ("host", host.clone().with_prefetch(false)),
        ("host+prefetch", host),
        ("disk", disk.clone().with_prefetch(false)),
        ("disk+prefetch", disk.clone()),
    ];
    if cfg!(feature = "compress") {
        configs.push((
            "disk+prefetch+compressed",
            disk.with_compress_disk_cache(true),
        ));
    } else {
        eprintln!(
            "the disk+prefetch+compressed row needs zstd: add `--features compress` to the \
             cargo command"
        );
    }
    // Both tiers: the host tier holds half the budget, the rest spills to disk.
    configs.push((
        "host→disk+prefetch",
        base.with_host_budget_bytes(Some(budget / 2)),
    ));
    configs
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    examples::with_backend!(args.backend, |B| run::<B>(&args))
}

fn run<B: DeviceMemory>(args: &Args) -> anyhow::Result<()> {
    let device = B::Device::default();
    let backend = args.backend.name().to_string();
    let budget = args.budget_mib << 20;
    let layer_bytes = (args.width * args.width * 4) as u64;
    let model_bytes = layer_bytes * args.layers as u64;
    println!(
        "{} layers of {}² f32: {} of weights against a {} device budget ({:.1}×), batch {}, {}",
        args.layers,
        args.width,
        ByteSize(model_bytes),
        ByteSize(budget),
        model_bytes as f64 / budget as f64,
        args.batch,
        backend
    );
    let tracker = MemoryTracker::<B>::new(&device);
    B::seed(&device, 7);
    let input = Tensor::<B, 2>::random(
        [args.batch, args.width],
        burn::tensor::Distribution::Normal(0.0, 1.0),
        &device,
    );
    let rows = 1 + configs(budget, args.check_interval_ms).len();
    let progress = ProgressBar::new(rows as u64).with_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ({elapsed})")
            .expect("a valid template"),
    );
    let time =
        |forward: &dyn Fn() -> Tensor<B, 2>| -> anyhow::Result<(f64, MemoryReport, TensorData)> {
            let (times, report) = tracker.profile(|| {
                let mut output = None;
                let mut times = Vec::new();
                for _ in 0..args.batches {
                    let started = Instant::now();
                    let y = forward();
                    B::sync(&device).expect("the device syncs");
                    times.push(started.elapsed().as_secs_f64() * 1e3);
                    output = Some(y);
                }
                (times, output.expect("at least one batch"))
            })?;
            let (times, output) = times;
            let ms = times.iter().sum::<f64>() / times.len() as f64;
            Ok((ms, report, output.into_data()))
        };

    // The resident reference: the whole model on the device.
    progress.set_message("resident");
    let mut table = Vec::new();
    let reference;
    {
        let (model, wrap) = tracker.profile(|| {
            let model = lazy_stack::<B>(args.layers, args.width, &device);
            // Materialise every parameter now, as a loaded checkpoint would be.
            let _ = model.forward(input.clone());
            model
        })?;
        let _ = model.forward(input.clone());
        let (ms, peak, output) = time(&|| model.forward(input.clone()))?;
        reference = output;
        table.push(Row {
            config: "resident".into(),
            backend: backend.clone(),
            budget_bytes: budget,
            peak_device_bytes: peak.peak,
            peak_in_use_sampled_bytes: peak.peak_in_use_sampled,
            ms_per_batch: ms,
            bytes_loaded: 0,
            max_abs_diff: 0.0,
            wrap_peak_bytes: wrap.peak,
            prefetch_hits: 0,
            disk_bytes: 0,
            monitor_busy_fraction: 0.0,
            prefetch: false,
        });
        progress.inc(1);
    }

    let mut summaries = Vec::new();
    for (name, config) in configs(budget, args.check_interval_ms) {
        progress.set_message(name);
        let prefetch = config.prefetch;
        let config = config.with_cache_dir(args.cache_dir.as_ref().map(|dir| dir.join(name)));
        let manager = OffloadManager::<B>::new(config, &device)?;
        let (model, wrap) = tracker.profile(|| {
            manager.wrap(
                lazy_stack::<B>(args.layers, args.width, &device),
                &OffloadSelection::default(),
            )
        })?;
        let model = model.map_err(|error| error.error)?;
        // One batch to learn the order.
        model.forward_layers(input.clone())?;
        let loaded_before = manager.summary().bytes_loaded();
        let failed = std::cell::Cell::new(None);
        let (ms, peak, output) = time(&|| {
            model.forward_layers(input.clone()).unwrap_or_else(|error| {
                failed.set(Some(error));
                input.clone()
            })
        })?;
        if let Some(error) = failed.take() {
            return Err(error.into());
        }
        let summary = manager.summary();
        let diff = max_abs_diff(&reference, &output);
        table.push(Row {
            config: name.into(),
            backend: backend.clone(),
            budget_bytes: budget,
            peak_device_bytes: peak.peak,
            peak_in_use_sampled_bytes: peak.peak_in_use_sampled,
            ms_per_batch: ms,
            bytes_loaded: (summary.bytes_loaded() - loaded_before) / args.batches as u64,
            max_abs_diff: diff,
            wrap_peak_bytes: wrap.peak,
            prefetch_hits: summary.counters.prefetch_hits,
            disk_bytes: summary.disk.bytes,
            monitor_busy_fraction: summary.monitor_overhead(),
            prefetch,
        });
        summaries.push(format!("{name}: {summary}"));
        drop(model);
        manager.cleanup();
        progress.inc(1);
    }
    progress.set_message("monitor overhead");
    let overhead = monitor_overhead::<B>(args, budget, &input)?;
    progress.finish_and_clear();
    print_table(
        &table,
        layer_bytes,
        B::SOURCE == burn_memory::MemorySource::Process,
    );
    println!(
        "monitor overhead: {:+.2} % of the step time (host tier, median of {} paired rounds; \
         median batch {:.1} ms with a reading every {} ms, {:.1} ms without; target < 1 %)",
        100.0 * overhead.overhead,
        overhead.rounds,
        overhead.watched_ms,
        args.check_interval_ms,
        overhead.unwatched_ms
    );
    println!("\nThe managers at the end of each row:");
    for summary in summaries {
        println!("{summary}");
    }
    if let Some(path) = &args.json {
        let json = serde_json::json!({ "rows": table, "monitor": overhead });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The monitor's cost: wrapped copies of the model whose monitors read the device every
/// `--check-interval-ms` or never, run in alternation; their median batch times.
fn monitor_overhead<B: DeviceMemory>(
    args: &Args,
    budget: u64,
    input: &Tensor<B, 2>,
) -> anyhow::Result<MonitorCost> {
    let device = input.device();
    let config = OffloadConfig::new()
        .with_device_budget_bytes(Some(budget))
        .with_check_interval_ms(args.check_interval_ms)
        .with_disk_tier(false);
    // Two models of each kind, made in the order watched, unwatched, unwatched, watched, so
    // that where in memory a model's buffers landed does not favour either kind.
    let never = 24 * 3_600_000;
    let models = [
        config.check_interval_ms,
        never,
        never,
        config.check_interval_ms,
    ]
    .map(|interval| -> anyhow::Result<_> {
        let config = config.clone().with_check_interval_ms(interval);
        let manager = OffloadManager::<B>::new(config, &device)?;
        let model = manager
            .wrap(
                lazy_stack::<B>(args.layers, args.width, &device),
                &OffloadSelection::default(),
            )
            .map_err(|error| error.error)?;
        model.forward_layers(input.clone())?;
        Ok(model)
    });
    let [w1, u1, u2, w2] = models;
    let (watched, unwatched) = ([w1?, w2?], [u1?, u2?]);
    let mut ratios = Vec::new();
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..4 * args.batches {
        let mut round_times = [0.0; 2];
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for which in order {
            let model = &[&watched, &unwatched][which][(round / 2) % 2];
            let started = Instant::now();
            let _ = model.forward_layers(input.clone())?;
            B::sync(&device).expect("the device syncs");
            round_times[which] = started.elapsed().as_secs_f64() * 1e3;
            times[which].push(round_times[which]);
        }
        ratios.push(round_times[0] / round_times[1]);
    }
    let [watched_ms, unwatched_ms] = times.map(median);
    Ok(MonitorCost {
        overhead: median(ratios) - 1.0,
        watched_ms,
        unwatched_ms,
        rounds: 4 * args.batches,
    })
}

/// What the monitor costs, from [`monitor_overhead`].
#[derive(Debug, Serialize)]
struct MonitorCost {
    /// Median over rounds of (batch time with the monitor / without) − 1.
    overhead: f64,
    watched_ms: f64,
    unwatched_ms: f64,
    rounds: usize,
}

fn max_abs_diff(a: &TensorData, b: &TensorData) -> f32 {
    let (a, b) = (a.as_slice::<f32>().unwrap(), b.as_slice::<f32>().unwrap());
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            if x.to_bits() == y.to_bits() {
                0.0
            } else {
                (x - y).abs().max(f32::MIN_POSITIVE)
            }
        })
        .fold(0.0, f32::max)
}

fn print_table(rows: &[Row], layer_bytes: u64, cpu: bool) {
    println!(
        "\n| config | peak device | within budget | wrap peak | ms/batch | loaded/batch | disk | prefetch hits | max |Δ| | monitor |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let allowance = row.budget_bytes + if row.prefetch { layer_bytes } else { 0 };
        let within = if row.config == "resident" {
            "(reference)".to_string()
        } else if row.peak_device_bytes <= allowance {
            "yes".to_string()
        } else {
            "no".to_string()
        };
        println!(
            "| {} | {} | {} | {} | {:.1} | {} | {} | {} | {:e} | {:.3} % |",
            row.config,
            ByteSize(row.peak_device_bytes),
            within,
            ByteSize(row.wrap_peak_bytes),
            row.ms_per_batch,
            ByteSize(row.bytes_loaded),
            ByteSize(row.disk_bytes),
            row.prefetch_hits,
            row.max_abs_diff,
            100.0 * row.monitor_busy_fraction
        );
    }
    let ms = |name: &str| {
        rows.iter()
            .find(|r| r.config == name)
            .map(|r| r.ms_per_batch)
    };
    for (tier, plain, ahead) in [
        ("host", "host", "host+prefetch"),
        ("disk", "disk", "disk+prefetch"),
    ] {
        let (Some(resident), Some(plain), Some(ahead)) = (ms("resident"), ms(plain), ms(ahead))
        else {
            continue;
        };
        let cost = plain - resident;
        if cost < 0.02 * resident {
            println!(
                "{tier} tier: loading costs {cost:.1} ms per batch without prefetch, within 2 % \
                 of the resident model's {resident:.1} ms: nothing for prefetch to hide"
            );
        } else {
            println!(
                "{tier} tier: loading costs {cost:.1} ms per batch without prefetch; prefetch \
                 hides {:.0} % of it (target ≥ 50 %)",
                100.0 * (plain - ahead) / cost
            );
        }
    }
    let identical = rows.iter().all(|row| row.max_abs_diff == 0.0);
    println!(
        "outputs bitwise identical to the resident model's: {}",
        if identical { "yes, every row" } else { "NO" }
    );
    if cpu {
        println!(
            "(CPU backend: the device is the heap, which also holds the host tier: the host rows \
             hold the whole model there, and their loads are free, zero-copy. Disk rows map \
             their files: the running layer is in the page cache, not on the heap)"
        );
    }
}
