//! Serves the MNIST classifier (and, with `--lm`, the character language model) over the Open
//! Inference Protocol (KServe v2, Triton), with dynamic batching and Prometheus metrics; and
//! measures it.
//!
//! ```text
//! cargo run --release -p examples-serve --example serve -- --port 8000
//! curl localhost:8000/v2/models/mnist                      # metadata
//! curl localhost:8000/metrics                              # Prometheus
//! cargo run --release -p examples-serve --example serve -- --bench        # batched against unbatched
//! cargo run --release -p examples-serve --example serve -- --mixed 10000  # good and bad requests
//! cargo run --release -p examples-serve --example serve -- --load 127.0.0.1:8000   # another server
//! ```
//!
//! Without `--checkpoint` the classifier is the one trained before in `--dir` (default
//! `target/serve`), or is trained now (`--epochs`, as `train_mnist` trains it) and saved there
//! as a Burnpack file, which serving reads memory-mapped. `--checkpoint` takes such a `.bpk`
//! file or a `train_mnist` run directory (`target/train_mnist/sketched`). `--precision`
//! serves it in `bf16` or with `int8` weights.
//!
//! `--bench` starts the server twice on loopback, without batching and with it, and sends
//! single-digit requests from 1 to 64 concurrent users (`--concurrency`), each level bounded by
//! `--requests` and `--seconds`: a table per server, `--plot` (PNG) and `--json`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use burn::backend::Flex;
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::tensor::{DType, Tensor, TensorData};
use burn_fast_cpu::FastFlex;
use burn_memory::offload::{OffloadConfig, OffloadManager, OffloadSelection, OffloadedModel};
use burn_memory::training::mixed_precision::CastParams;
use burn_memory::{CountingAllocator, DeviceMemory};
use burn_serve::protocol::JsonTensor;
use burn_serve::{
    BatcherConfig, BurnModel, HostData, HostTensor, Servable, ServeError, Server, ServerConfig,
};
use burn_store::{ModuleSnapshot, SafetensorsStore};
use clap::Parser;
use examples::data::{DigitDataset, MEAN, STD};
use examples::lm::{Corpus, FORTUNES_DIR};
use examples::mlp::Mlp;
use examples::mlp::MlpConfig;
use examples::mnist::Mnist;
use examples::stats::{mb, median_seconds};
use examples::training::evaluate_logits;
use examples_serve::loadgen::{self, Encoding, Level, LoadConfig, payloads};
use examples_serve::mixed::{self, Sample};
use examples_serve::{MNIST_PIXELS, charlm_model, charlm_spec, load, mnist_checkpoint, mnist_spec};
use serde::Serialize;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::system();

#[derive(Debug, Clone, Parser)]
#[command(about = "Serve the MNIST classifier over the Open Inference Protocol, and measure it")]
struct Args {
    /// The port to serve on.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The address to serve on (`0.0.0.0` for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// A classifier checkpoint: a `.bpk` file (with its `.json` configuration beside it) or a
    /// `train_mnist` run directory.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Where trained models are kept.
    #[arg(long, default_value = "target/serve")]
    dir: PathBuf,
    /// Epochs when the classifier has to be trained first.
    #[arg(long, default_value_t = 2)]
    epochs: usize,
    /// The classifier's precision: `f32`; `bf16` (weights and activations, on `FastFlex`'s
    /// AVX512-BF16 products); `int8` (weights, burn-compress's `Int8Linear`).
    #[arg(long, value_enum, default_value = "f32")]
    precision: Served,
    /// Also serve the character language model as `charlm`.
    #[arg(long)]
    lm: bool,
    /// A language-model checkpoint (`.bpk` with its `.json`).
    #[arg(long)]
    lm_checkpoint: Option<PathBuf>,
    /// Training steps when the language model has to be trained first.
    #[arg(long, default_value_t = 300)]
    lm_steps: usize,
    /// A text to train the language model on instead of Debian's `fortunes`.
    #[arg(long)]
    text: Option<PathBuf>,
    /// The most rows per batch (1: no batching).
    #[arg(long, default_value_t = 32)]
    max_batch_size: usize,
    /// How long the oldest request may wait for its batch to fill, in microseconds.
    #[arg(long, default_value_t = 2000)]
    max_queue_delay_us: u64,
    /// Requests that may wait; one more is answered 503.
    #[arg(long, default_value_t = 1024)]
    queue_capacity: usize,
    /// The device's budget for the classifier's weights, in MB: a model larger than this is
    /// served from burn-memory's offload tiers, one layer on the device at a time (`f32`
    /// only; one replica).
    #[arg(long, value_name = "MB")]
    device_budget_mb: Option<u64>,
    /// Model replicas, one worker thread each.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// The deadline of a request that sets none, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Measure batched against unbatched serving instead of serving.
    #[arg(long)]
    bench: bool,
    /// Send this many mixed good and bad requests to a server of its own instead of serving.
    #[arg(long, value_name = "N")]
    mixed: Option<usize>,
    /// Measure the server already running at this loopback address instead of serving.
    #[arg(long, value_name = "ADDR")]
    load: Option<SocketAddr>,
    /// The model `--load` sends to (single digits for `mnist`).
    #[arg(long, default_value = "mnist")]
    model: String,
    /// How `--bench` and `--load` send tensors: `json`, `binary` (the binary tensor data
    /// extension), or both.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Encoding::Json, Encoding::Binary])]
    encodings: Vec<Encoding>,
    /// Train the dense MLP instead of the sketched one when the classifier is trained here.
    #[arg(long)]
    dense: bool,
    /// Concurrency levels of `--bench` and `--load`.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8, 16, 32, 64])]
    concurrency: Vec<usize>,
    /// Measured requests per level.
    #[arg(long, default_value_t = 3000)]
    requests: usize,
    /// Time limit per level, in seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Where `--bench` draws its curves.
    #[arg(long, default_value = "target/serve/latency.png")]
    plot: PathBuf,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The precisions the classifier can be served in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Served {
    F32,
    Bf16,
    Int8,
}

/// The classifier as served (pixels in `[0, 1]`, normalised as in training, then the MLP), one
/// replica per worker, and its forward on the same backend for checking answers.
fn classifier(args: &Args) -> anyhow::Result<(Vec<Box<dyn Servable>>, ModelForward)> {
    let path = mnist_checkpoint(
        args.checkpoint.as_deref(),
        &args.dir,
        args.epochs,
        args.dense,
    )?;
    let device = Default::default();
    let (mlp, config) = load::<Flex, _, MlpConfig>(&path, |c| c.init(&device))?;
    println!(
        "classifier: {}, {:?}",
        examples::training::describe(&config),
        args.precision
    );
    if let Some(budget_mb) = args.device_budget_mb {
        let (budget, bytes) = (budget_mb * 1_000_000, mlp.num_params() as u64 * 4);
        if bytes > budget && args.precision == Served::F32 {
            println!(
                "its {:.1} MB of weights exceed the device budget of {budget_mb} MB: offloaded",
                mb(bytes)
            );
            return offloaded(mlp, &config, &args.dir, budget);
        }
        println!("its weights fit the device budget: not offloaded");
    }
    let workers = args.workers.max(1);
    fn boxed<S: Servable>(replicas: Vec<S>) -> Vec<Box<dyn Servable>> {
        replicas
            .into_iter()
            .map(|r| Box::new(r) as Box<dyn Servable>)
            .collect()
    }
    match args.precision {
        Served::F32 => {
            let reference = mlp.clone();
            let model = BurnModel::float(mlp, device, |m, x| m.forward((x - MEAN) / STD))
                .with_validator(finite_pixels);
            let replicas = boxed(model.replicas(&vec![device; workers]));
            Ok((
                replicas,
                Box::new(move |x| host(reference.forward((x - MEAN) / STD))),
            ))
        }
        Served::Int8 => {
            let int8 = mlp.to_int8();
            let reference = int8.clone();
            let model = BurnModel::float(int8, device, |m, x| m.forward((x - MEAN) / STD))
                .with_validator(finite_pixels);
            let replicas = boxed(model.replicas(&vec![device; workers]));
            Ok((
                replicas,
                Box::new(move |x| host(reference.forward((x - MEAN) / STD))),
            ))
        }
        Served::Bf16 => {
            // The same weights on `FastFlex`, cast to `bf16`; inputs cast on the way in and
            // logits back to `f32` on the way out.
            let half = Default::default();
            let (mlp, _) = load::<FastFlex, _, MlpConfig>(&path, |c| c.init(&half))?;
            let mlp = mlp.map(&mut CastParams(DType::BF16));
            let forward = |m: &Mlp<FastFlex>, x: Tensor<FastFlex, 2>| {
                m.forward(((x - MEAN) / STD).cast(DType::BF16))
                    .cast(DType::F32)
            };
            let reference = mlp.clone();
            let model = BurnModel::float(mlp, half, forward).with_validator(finite_pixels);
            let replicas = boxed(model.replicas(&vec![half; workers]));
            Ok((
                replicas,
                Box::new(move |x: Tensor<Flex, 2>| {
                    let x = Tensor::<FastFlex, 2>::from_data(x.into_data(), &half);
                    host(forward(&reference, x))
                }),
            ))
        }
    }
}

/// The classifier on burn-memory's offload tiers, one layer on the device at a time, its
/// weights read from a memory-mapped safetensors checkpoint straight to the host tier.
struct Offloaded {
    model: OffloadedModel<Flex, Mlp<Flex>>,
    device: burn::tensor::Device<Flex>,
}

/// The classifier's check of each request before batching: a pixel that is NaN or infinite
/// would give meaningless logits for its row, so its request is refused with the position.
fn finite_pixels(input: &HostTensor) -> Result<(), ServeError> {
    let HostData::F32(pixels) = input.data() else {
        return Err(ServeError::BadRequest("FP32 pixels only".into()));
    };
    match pixels.iter().position(|p| !p.is_finite()) {
        Some(at) => Err(ServeError::BadRequest(format!(
            "pixel {} (row {}, position {}) is not a finite number",
            pixels[at],
            at / MNIST_PIXELS,
            at % MNIST_PIXELS
        ))),
        None => Ok(()),
    }
}

/// The language model's check of each request before batching: every token within its
/// vocabulary of `vocab` (the embedding's rows), so that one bad request fails alone.
fn tokens_within(vocab: usize) -> impl Fn(&HostTensor) -> Result<(), ServeError> + Send + Sync {
    move |input| {
        let HostData::I64(tokens) = input.data() else {
            return Err(ServeError::BadRequest("INT64 tokens only".into()));
        };
        match tokens.iter().find(|&&t| t < 0 || t as u64 >= vocab as u64) {
            Some(t) => Err(ServeError::BadRequest(format!(
                "token {t} is outside the vocabulary of {vocab}"
            ))),
            None => Ok(()),
        }
    }
}

impl Servable for Offloaded {
    fn infer(&mut self, batch: HostTensor) -> Result<HostTensor, ServeError> {
        let rows = batch.rows();
        let HostData::F32(pixels) = batch.into_data() else {
            return Err(ServeError::BadRequest("FP32 pixels only".into()));
        };
        let x = Tensor::<Flex, 2>::from_data(
            TensorData::new(pixels, [rows, MNIST_PIXELS]),
            &self.device,
        );
        let logits = self
            .model
            .forward_layers((x - MEAN) / STD)
            .map_err(|error| ServeError::Model(error.to_string()))?;
        HostTensor::f32(rows, logits.dims()[1], host(logits))
    }

    fn validator(&self) -> Option<burn_serve::Validate> {
        Some(std::sync::Arc::new(finite_pixels))
    }
}

/// One offloaded replica (the tiers belong to it), and the forward run directly.
fn offloaded(
    mlp: Mlp<Flex>,
    config: &MlpConfig,
    dir: &std::path::Path,
    budget: u64,
) -> anyhow::Result<(Vec<Box<dyn Servable>>, ModelForward)> {
    let device = Default::default();
    let path = dir.join("mnist-offload.safetensors");
    mlp.save_into(&mut SafetensorsStore::from_file(&path).overwrite(true))
        .with_context(|| format!("cannot write {}", path.display()))?;
    let manager = OffloadManager::<Flex>::new(
        OffloadConfig::new().with_device_budget_bytes(Some(budget)),
        &device,
    )?;
    let model = manager
        .wrap_checkpoint(
            config.init::<Flex>(&device),
            &path,
            &OffloadSelection::default(),
        )
        .map_err(|wrap| wrap.error)?;
    let replica: Box<dyn Servable> = Box::new(Offloaded { model, device });
    Ok((
        vec![replica],
        Box::new(move |x| host(mlp.forward((x - MEAN) / STD))),
    ))
}

/// The served classifier's accuracy on the embedded test digits, through its direct forward
/// (the examples' `evaluate_logits`, whose batches come normalised: the served forward takes
/// pixels in `[0, 1]`): a check that a precision or an offloaded copy still classifies.
fn test_accuracy(forward: &ModelForward) -> anyhow::Result<f64> {
    let test = DigitDataset::new(Mnist::read(&Mnist::embedded_dir(), "t10k")?);
    let device = Default::default();
    let (_, accuracy) = evaluate_logits::<Flex>(&test, &device, |x| {
        let [rows, _] = x.dims();
        let logits = forward(x * STD + MEAN);
        let classes = logits.len() / rows.max(1);
        Tensor::from_data(TensorData::new(logits, [rows, classes]), &device)
    });
    Ok(accuracy)
}

/// Rows as they come back to the host.
fn host<B: burn::tensor::backend::Backend>(logits: Tensor<B, 2>) -> Vec<f32> {
    logits
        .into_data()
        .convert::<f32>()
        .to_vec()
        .expect("f32 logits")
}

/// The served model's forward, run directly: input rows on Flex, logits on the host.
type ModelForward = Box<dyn Fn(Tensor<Flex, 2>) -> Vec<f32>>;

fn batching(args: &Args) -> BatcherConfig {
    BatcherConfig {
        max_batch_size: args.max_batch_size,
        max_queue_delay: Duration::from_micros(args.max_queue_delay_us),
        queue_capacity: args.queue_capacity,
        ..BatcherConfig::default()
    }
}

fn server(
    args: &Args,
    replicas: Vec<Box<dyn Servable>>,
    batching: BatcherConfig,
) -> anyhow::Result<Server> {
    let mut server = Server::new(ServerConfig {
        request_timeout: Some(Duration::from_millis(args.timeout_ms)),
        ..ServerConfig::default()
    });
    server.add_model(mnist_spec(platform(args)), batching, replicas)?;
    Ok(server)
}

fn describe(args: &Args) -> String {
    let kind = if args.dense { "dense" } else { "sketched" };
    format!("{kind} MNIST MLP, {:?}", args.precision)
}

fn platform(args: &Args) -> &'static str {
    match args.precision {
        Served::F32 => "burn-flex",
        Served::Bf16 => "burn-fastflex-bf16",
        Served::Int8 => "burn-flex-int8",
    }
}

/// Test digits as pixel rows in `[0, 1]`.
fn digits(count: usize) -> anyhow::Result<Vec<Vec<f32>>> {
    let test = DigitDataset::new(Mnist::read(&Mnist::embedded_dir(), "t10k")?);
    Ok((0..count.min(test.len()))
        .filter_map(|i| test.get(i))
        .map(|d| d.pixels.iter().map(|&p| p as f32 / 255.0).collect())
        .collect())
}

fn request_body(rows: &[Vec<f32>]) -> anyhow::Result<(Vec<u8>, HostTensor)> {
    let input = HostTensor::f32(rows.len(), MNIST_PIXELS, rows.concat())?;
    let body = serde_json::json!({"inputs": [JsonTensor::from_host("input", &input)]});
    Ok((serde_json::to_vec(&body)?, input))
}

/// What `--bench` measures: a served model, single-row requests for it, and its forward on one
/// full batch run directly.
struct Target {
    model: String,
    description: String,
    input_name: &'static str,
    inputs: Vec<HostTensor>,
    server: Box<dyn Fn(BatcherConfig) -> anyhow::Result<Server>>,
    full_batch: Box<dyn Fn()>,
}

/// The classifier, or with `--lm` the language model.
fn target(args: &Args) -> anyhow::Result<Target> {
    let device = Default::default();
    if !args.lm {
        let digits = digits(256)?;
        let inputs = digits
            .iter()
            .map(|d| HostTensor::f32(1, MNIST_PIXELS, d.clone()))
            .collect::<Result<_, _>>()?;
        let (_, forward) = classifier(args)?;
        let rows = args.max_batch_size.min(digits.len());
        let x = Tensor::<Flex, 2>::from_data(
            TensorData::new(digits[..rows].concat(), [rows, MNIST_PIXELS]),
            &device,
        );
        let owned = args.clone();
        return Ok(Target {
            model: "mnist".into(),
            description: describe(args),
            input_name: "input",
            inputs,
            server: Box::new(move |batching| {
                let (replicas, _) = classifier(&owned)?;
                server(&owned, replicas, batching)
            }),
            full_batch: Box::new(move || drop(forward(x.clone()))),
        });
    }
    let (lm, config) = charlm_model(
        args.lm_checkpoint.as_deref(),
        &args.dir,
        args.lm_steps,
        args.text.as_deref(),
    )?;
    let documents = match &args.text {
        Some(text) => Corpus::read_text(text)?,
        None => Corpus::read_fortunes(std::path::Path::new(FORTUNES_DIR))?,
    };
    let corpus = Corpus::split(&documents, 10, 10_000)?;
    let (context, vocab) = (config.context, config.vocab);
    let windows: Vec<Vec<i64>> = (0..256)
        .map(|i| {
            let start = (i * 997) % (corpus.valid.len() - context);
            corpus.valid[start..start + context]
                .iter()
                .map(|&t| t as i64)
                .collect()
        })
        .collect();
    let inputs = windows
        .iter()
        .map(|w| HostTensor::new(vec![1, context], HostData::I64(w.clone())))
        .collect::<Result<_, _>>()?;
    let rows = args.max_batch_size.min(windows.len());
    let x = Tensor::<Flex, 2, burn::tensor::Int>::from_data(
        TensorData::new(windows[..rows].concat(), [rows, context]),
        &device,
    );
    let reference = lm.clone();
    let workers = args.workers.max(1);
    let timeout = Duration::from_millis(args.timeout_ms);
    Ok(Target {
        model: "charlm".into(),
        description: format!(
            "character LM, {} blocks, width {}, context {context}",
            config.n_blocks, config.d_model
        ),
        input_name: "tokens",
        inputs,
        server: Box::new(move |batching| {
            let model = BurnModel::int(lm.clone(), device, |m, tokens| m.next_logits(tokens))
                .with_validator(tokens_within(vocab));
            let mut server = Server::new(ServerConfig {
                request_timeout: Some(timeout),
                ..ServerConfig::default()
            });
            server.add_model(
                charlm_spec("burn-flex", context),
                batching,
                model.replicas(&vec![device; workers]),
            )?;
            Ok(server)
        }),
        full_batch: Box::new(move || drop(reference.next_logits(x.clone()).into_data())),
    })
}

#[derive(Serialize)]
struct Series {
    encoding: Encoding,
    batched: bool,
    levels: Vec<Level>,
}

#[derive(Serialize)]
struct BenchReport {
    model: String,
    batching: BatcherConfig,
    workers: usize,
    batch_compute_ms: f64,
    p99_bound_ms: f64,
    series: Vec<Series>,
}

fn bench(args: &Args) -> anyhow::Result<()> {
    let target = target(args)?;
    let config = LoadConfig {
        model: target.model.clone(),
        requests: args.requests,
        seconds: args.seconds,
        warmup: 200,
        path: None,
    };
    // One batch's compute, measured directly: the median of 50 forwards of a full batch.
    let rows = args.max_batch_size.min(target.inputs.len());
    let batch_compute_ms = 1e3 * median_seconds(0, 50, || (target.full_batch)());
    let p99_bound_ms = 2.0 * args.max_queue_delay_us as f64 / 1e3 + batch_compute_ms;
    println!("{}", target.description);

    let mut series = Vec::new();
    for &encoding in &args.encodings {
        let payloads = payloads(&target.inputs, target.input_name, encoding)?;
        for batched in [false, true] {
            let batching = if batched {
                batching(args)
            } else {
                BatcherConfig::unbatched()
            };
            let running = (target.server)(batching.clone())?.start("127.0.0.1:0".parse()?)?;
            println!(
                "\n{encoding:?} requests, max_batch_size {}, max_queue_delay {:?}, {} worker(s)",
                batching.max_batch_size, batching.max_queue_delay, args.workers
            );
            let levels = loadgen::run(
                running.addr(),
                &config,
                Arc::clone(&payloads),
                &args.concurrency,
                |level| {
                    println!(
                        "  concurrency {:>3}: {:>7.0} requests/s, p50 {:.2} ms, p99 {:.2} ms, {:.1} rows/batch",
                        level.concurrency,
                        level.throughput,
                        level.p50_ms,
                        level.p99_ms,
                        level.mean_batch
                    )
                },
            )?;
            running.shutdown()?;
            series.push(Series {
                encoding,
                batched,
                levels,
            });
        }
    }
    println!();
    let name = |s: &Series| {
        format!(
            "{:?}, {}",
            s.encoding,
            if s.batched { "batched" } else { "unbatched" }
        )
    };
    for s in &series {
        println!("{}", loadgen::table(&name(s), &s.levels));
    }
    println!("one batch of {rows} rows: {batch_compute_ms:.2} ms (median of 50 direct forwards)");
    let at = |levels: &[Level], c: usize| levels.iter().find(|l| l.concurrency == c).cloned();
    for pair in series.chunks(2) {
        if let [unbatched, batched] = pair
            && let (Some(u), Some(b)) = (at(&unbatched.levels, 32), at(&batched.levels, 32))
        {
            println!(
                "{:?} at concurrency 32: batched {:.2}× the unbatched throughput (target ≥ 5×); batched p99 {:.2} ms against 2 × max_queue_delay + one batch = {p99_bound_ms:.2} ms",
                batched.encoding,
                b.throughput / u.throughput,
                b.p99_ms
            );
        }
    }
    let names: Vec<String> = series.iter().map(name).collect();
    let plotted: Vec<(&str, &[Level])> = series
        .iter()
        .zip(&names)
        .map(|(s, n)| (n.as_str(), s.levels.as_slice()))
        .collect();
    loadgen::plot(&plotted, &args.plot)?;
    println!("curves: {}", args.plot.display());
    if let Some(path) = &args.json {
        let report = BenchReport {
            model: target.description.clone(),
            batching: batching(args),
            workers: args.workers,
            batch_compute_ms,
            p99_bound_ms,
            series,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        println!("json: {}", path.display());
    }
    Ok(())
}

#[derive(Serialize)]
struct MixedRun {
    report: mixed::MixedReport,
    heap_after_warmup: u64,
    heap_after: u64,
    resident_after_warmup: u64,
    resident_after: u64,
}

fn mixed_run(args: &Args, total: usize) -> anyhow::Result<()> {
    let (replicas, forward) = classifier(args)?;
    println!("test accuracy: {:.2} %", test_accuracy(&forward)? * 100.0);
    let device = Default::default();
    let digits = digits(64)?;
    let samples: Vec<Sample> = (0..64)
        .map(|i| {
            let rows: Vec<Vec<f32>> = (0..1 + i % 4)
                .map(|j| digits[(i + j) % digits.len()].clone())
                .collect();
            let (_, input) = request_body(&rows)?;
            let x = Tensor::<Flex, 2>::from_data(
                TensorData::new(rows.concat(), [rows.len(), MNIST_PIXELS]),
                &device,
            );
            let expected = forward(x);
            Ok(Sample { input, expected })
        })
        .collect::<anyhow::Result<_>>()?;
    let samples = Arc::new(samples);
    let running = server(args, replicas, batching(args))?.start("127.0.0.1:0".parse()?)?;
    let usage = || Flex::memory_usage(&device, Flex::current_stream());
    let target = mixed::MixedTarget {
        addr: running.addr(),
        model: "mnist".into(),
        input_name: "input".into(),
        row_len: MNIST_PIXELS,
        max_batch: args.max_batch_size,
    };
    let run = |n| mixed::run(&target, Arc::clone(&samples), n, 16);
    // A warm-up, so that the allocator's and the runtime's steady state is the baseline.
    run(1000)?;
    let warm = usage()?;
    let report = run(total)?;
    let after = usage()?;
    running.shutdown()?;
    println!(
        "{total} mixed requests from 16 connections in {:.1} s:",
        report.seconds
    );
    println!("| kind | sent | answered as expected |\n|---|---:|---:|");
    for kind in &report.kinds {
        println!("| {:?} | {} | {} |", kind.kind, kind.sent, kind.as_expected);
    }
    for why in &report.unexpected {
        println!("unexpected: {why}");
    }
    println!(
        "heap in use {:.1} MB after the warm-up, {:.1} MB after the run; resident {:.1} MB, {:.1} MB",
        mb(warm.in_use),
        mb(after.in_use),
        mb(warm.reserved),
        mb(after.reserved)
    );
    if let Some(path) = &args.json {
        let run = MixedRun {
            report,
            heap_after_warmup: warm.in_use,
            heap_after: after.in_use,
            resident_after_warmup: warm.reserved,
            resident_after: after.reserved,
        };
        std::fs::write(path, serde_json::to_string_pretty(&run)?)?;
    }
    Ok(())
}

fn serve(args: &Args) -> anyhow::Result<()> {
    let (replicas, forward) = classifier(args)?;
    println!("test accuracy: {:.2} %", test_accuracy(&forward)? * 100.0);
    let mut server = server(args, replicas, batching(args))?;
    if args.lm {
        let (lm, config) = charlm_model(
            args.lm_checkpoint.as_deref(),
            &args.dir,
            args.lm_steps,
            args.text.as_deref(),
        )
        .context("the language model")?;
        let device = Default::default();
        let model = BurnModel::int(lm, device, |m, tokens| m.next_logits(tokens))
            .with_validator(tokens_within(config.vocab));
        let replicas: Vec<Box<dyn Servable>> = model
            .replicas(&vec![device; args.workers.max(1)])
            .into_iter()
            .map(|r| Box::new(r) as Box<dyn Servable>)
            .collect();
        server.add_model(
            charlm_spec("burn-flex", config.context),
            batching(args),
            replicas,
        )?;
    }
    let running = server.start(SocketAddr::new(args.host, args.port))?;
    let addr = running.addr();
    println!("serving on http://{addr} (Ctrl-C stops after answering the requests received)");
    println!("  curl http://{addr}/v2/models/mnist");
    println!("  curl http://{addr}/metrics");
    // A real request to try: the first test digit.
    std::fs::create_dir_all(&args.dir)?;
    let sample = args.dir.join("digit.json");
    let digit = DigitDataset::new(Mnist::read(&Mnist::embedded_dir(), "t10k")?)
        .get(0)
        .context("no test digits")?;
    let pixels: Vec<f32> = digit.pixels.iter().map(|&p| p as f32 / 255.0).collect();
    let (body, _) = request_body(&[pixels])?;
    std::fs::write(&sample, body).with_context(|| format!("cannot write {}", sample.display()))?;
    println!(
        "  curl -d @{} http://{addr}/v2/models/mnist/infer   # a test digit, labelled {}",
        sample.display(),
        digit.label
    );
    running.wait_for_ctrl_c()?;
    println!("stopped");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.bench {
        bench(&args)
    } else if let Some(total) = args.mixed {
        mixed_run(&args, total)
    } else if let Some(addr) = args.load {
        let inputs: Vec<HostTensor> = digits(256)?
            .into_iter()
            .map(|d| HostTensor::f32(1, MNIST_PIXELS, d))
            .collect::<Result<_, _>>()?;
        let payloads = payloads(&inputs, "input", args.encodings[0])?;
        let config = LoadConfig {
            model: args.model.clone(),
            requests: args.requests,
            seconds: args.seconds,
            warmup: 200,
            path: None,
        };
        let levels = loadgen::run(addr, &config, payloads, &args.concurrency, |_| {})?;
        println!(
            "{}",
            loadgen::table(&format!("{addr} model {}", args.model), &levels)
        );
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&levels)?)?;
        }
        Ok(())
    } else {
        serve(&args)
    }
}
