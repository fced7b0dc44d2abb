//! A BERT-class encoder's forward (all-MiniLM-L6-v2's shapes, [`examples::encoder`]) timed in
//! Burn against PyTorch and ONNX Runtime in the same run, on the same machine and threads:
//! the model-level CPU benchmark. The encoder is a user's model, written with `burn::nn` alone.
//!
//! Burn's forms:
//! - `burn-flex-f32`: Burn's Flex;
//! - `fast-f32`: `burn_fast_cpu::FastFlex` (Flex with this project's CPU paths), `f32`;
//! - `fast-bf16`: the same model on `FastFlex` with its float parameters cast to `bf16`;
//! - `fast-f32-transposed`, `fast-bf16-transposed`: the same, every `Linear`'s weight a
//!   transposed view of a `[d_out, d_in]` buffer (a PyTorch port's layout);
//! - `fast-int8`: Burn's own `Module::quantize_weights` of every `Linear` (symmetric `int8`,
//!   one scale per tensor) on `FastFlex`;
//! - `fast-f32-lowrank`: the encoder with its feed-forward projections at rank `--ffn-rank`
//!   (two `Linear`s each), printed beside the same projections timed alone, so that the
//!   model-level ratio stands beside the layer-level one.
//!
//! The peer, `xtask/pytorch/encoder.py`, times Hugging Face's `BertModel` of the same shapes
//! on the same padding lengths: `torch-f32-eager`, `torch-f32-sdpa`, `torch-bf16-autocast`,
//! `torch-int8-dynamic`, `ort-f32` and `ort-int8`. Both sides build and warm up their forms,
//! then each round runs one forward of every Burn form and then one of every peer form (the
//! peer runs as a server, `--serve`), so that a busy spell of the machine falls on both.
//!
//! ```text
//! cargo run --release -p examples --example encoder_bench -- --quick
//! cargo run --release -p examples --example encoder_bench -- --batch 8 --seq 64 --json enc.json
//! ```
//!
//! Per shape, one table: each form's median, its ratio to PyTorch's and to ONNX Runtime's
//! same-precision forms, its FLOP rate and its fraction of this CPU's measured peak in its
//! precision, and Burn's forms' largest gap to `burn-flex-f32`'s output.

use std::io::{BufRead, BufReader, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use burn::backend::Flex;
use burn::module::{Module, ModuleMapper, Param, Quantizer};
use burn::tensor::backend::Backend;
use burn::tensor::ops::QuantizedTensor;
use burn::tensor::quantization::{
    Calibration, QTensorPrimitive, QuantLevel, QuantMode, QuantParam, QuantValue,
};
use burn::tensor::{Bool, DType, Int, Tensor, TensorData};
use burn_cpu_kernels::peak::{self, Arithmetic};
use burn_fast_cpu::FastFlex;
use burn_memory::draw_params;
use burn_memory::training::mixed_precision::CastParams;
use burn_profiler::{Profiled, Profiler, ProfilerConfig, SortBy};
use clap::Parser;
use examples::encoder::{Encoder, EncoderConfig};
use examples::stats::median;
use indicatif::{ProgressBar, ProgressStyle};
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

#[derive(Debug, Parser)]
#[command(about = "A BERT-class encoder in Burn against PyTorch and ONNX Runtime")]
struct Args {
    /// Sentences per batch (with --seq: one shape instead of 32×128 and 1×16).
    #[arg(long)]
    batch: Option<usize>,
    /// Tokens per sentence, padding included (≤ 512).
    #[arg(long)]
    seq: Option<usize>,
    /// Timed rounds per form (each round runs every form once).
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Untimed forwards per form first.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Fewer rounds (3, after 1 warm-up).
    #[arg(long)]
    quick: bool,
    /// Only Burn's forms whose name contains one of these (comma list).
    #[arg(long, value_delimiter = ',')]
    forms: Vec<String>,
    /// The Python with torch, transformers and onnxruntime (default: /tmp/venv/bin/python if
    /// it exists, else python3).
    #[arg(long)]
    python: Option<String>,
    /// Skip the PyTorch and ONNX Runtime peer.
    #[arg(long)]
    no_peer: bool,
    /// The weights' and inputs' seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write every row as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The rank of `fast-f32-lowrank`'s feed-forward projections (128: 42 % of their
    /// parameters).
    #[arg(long, default_value_t = 128)]
    ffn_rank: usize,
    /// Instead of timing: one forward of `burn-flex-f32`, `fast-f32` and `fast-bf16` per
    /// shape on burn-profiler's `Profiled`, and the operations they spend their time in.
    #[arg(long)]
    profile: bool,
}

/// The pause after each of the peer's rounds, longer than its OpenMP threads spin.
const PAUSE_MS: u64 = 300;

/// Burn's forms, in the table's order.
const BURN_FORMS: [&str; 7] = [
    "burn-flex-f32",
    "fast-f32",
    "fast-f32-transposed",
    "fast-bf16",
    "fast-bf16-transposed",
    "fast-int8",
    "fast-f32-lowrank",
];

/// The form whose feed-forward projections are low-rank (`--ffn-rank`): other weights, so
/// its output is not compared with Flex's.
const LOW_RANK: &str = "fast-f32-lowrank";

/// One form's timings at one shape, Burn's or the peer's (the peer's JSON has these fields).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    form: String,
    batch: usize,
    seq: usize,
    available: bool,
    reason: Option<String>,
    #[serde(default)]
    median_ms: Option<f64>,
    #[serde(default)]
    times_ms: Vec<f64>,
    /// Burn's forms: the largest `|y − y_flex_f32|` over the largest `|y_flex_f32|`, at the
    /// unpadded positions.
    #[serde(default)]
    rel_error: Option<f64>,
    /// The peer's: how the ONNX model was exported.
    #[serde(default)]
    export: Option<String>,
    /// The peer's versions.
    #[serde(default)]
    torch: Option<String>,
    #[serde(default)]
    onnxruntime: Option<String>,
}

/// One shape's comparison, as the JSON holds it.
#[derive(Debug, Serialize)]
struct Shape {
    batch: usize,
    seq: usize,
    lengths: Vec<usize>,
    gflop: f64,
    peer: String,
    /// The machine's 1-minute load average before and after the shape (Linux): above the
    /// thread count, other processes shared the cores.
    load_average: (Option<f64>, Option<f64>),
    rows: Vec<Row>,
    /// The low-rank form's time over `fast-f32`'s, beside its feed-forward layers' alone.
    low_rank: Option<LowRank>,
}

/// What a low-rank model keeps of its layers' speedup.
#[derive(Debug, Serialize)]
struct LowRank {
    rank: usize,
    /// The two feed-forward projections (rank-`r` pairs over dense), timed alone on
    /// `FastFlex` at the shape's tokens.
    layers_ratio: f64,
    /// The whole encoder: `fast-f32-lowrank` over `fast-f32`.
    model_ratio: f64,
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    if args.quick {
        args.rounds = args.rounds.min(3);
        args.warmup = args.warmup.min(1);
    }
    let shapes = match (args.batch, args.seq) {
        (None, None) => vec![(32, 128), (1, 16)],
        (b, s) => vec![(b.unwrap_or(32), s.unwrap_or(128))],
    };
    let config = EncoderConfig::new();
    anyhow::ensure!(
        shapes.iter().all(|&(_, s)| s <= config.max_positions),
        "--seq is at most {}",
        config.max_positions
    );
    // Flex and FastFlex run on rayon's global pool: one thread per core unless
    // RAYON_NUM_THREADS says otherwise. The peer gets as many.
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let python = args.python.clone().unwrap_or_else(|| {
        if Path::new("/tmp/venv/bin/python").exists() {
            "/tmp/venv/bin/python".into()
        } else {
            "python3".into()
        }
    });
    eprintln!("… measuring this CPU's peak on {threads} threads");
    let peaks = [Arithmetic::F32, Arithmetic::Bf16, Arithmetic::Int8]
        .map(|a| (a, peak::measure(a, threads)));
    let peak_of = |form: &str| {
        let arithmetic = precision(form);
        peaks.iter().find(|p| p.0 == arithmetic).and_then(|p| p.1)
    };

    if args.profile {
        for &(batch, seq) in &shapes {
            profile(
                &config,
                batch,
                seq,
                &draw_lengths(batch, seq, args.seed),
                args.seed,
            )?;
        }
        return Ok(());
    }
    let mut report = Vec::new();
    for (batch, seq) in shapes {
        let lengths = draw_lengths(batch, seq, args.seed);
        let load_before = load_average();
        let mut burn = BurnForms::build(&args, &config, batch, seq, &lengths);
        eprintln!("… the peer (PyTorch, ONNX Runtime) at {batch}×{seq}: building and warming up");
        let mut peer = if args.no_peer {
            Err("--no-peer".to_string())
        } else {
            Peer::start(&python, &args, batch, seq, &lengths, threads)
        };
        // Each round: one forward of each of Burn's forms, then one of each of the peer's.
        let bar = ProgressBar::new(args.rounds as u64).with_style(
            ProgressStyle::with_template("{elapsed_precise} {bar:30} {pos}/{len} rounds {msg}")
                .expect("a valid template"),
        );
        bar.set_message(format!("{batch}×{seq}, Burn and the peer alternating"));
        for _ in 0..args.rounds {
            burn.round();
            if let Ok(p) = &mut peer
                && let Err(e) = p.round()
            {
                peer = Err(e);
            }
            // PyTorch's OpenMP threads keep spinning for a while after its forward (Intel
            // OpenMP's `KMP_BLOCKTIME`, 200 ms): without a pause they would share the cores
            // with the next round's first Burn form.
            std::thread::sleep(std::time::Duration::from_millis(PAUSE_MS));
            bar.inc(1);
        }
        bar.finish_and_clear();
        let mut rows = burn.finish();
        let peer_note = match peer.and_then(Peer::finish) {
            Ok(peer_rows) => {
                rows.extend(peer_rows);
                format!("ran in the same run, rounds alternating with Burn's ({python})")
            }
            Err(e) => format!("unavailable: {e}"),
        };
        let load = (load_before, load_average());
        let gflop = flops(&config, batch, seq) / 1e9;
        let low_rank_config = config.clone().with_ffn_rank(Some(args.ffn_rank));
        let low_rank_gflop = flops(&low_rank_config, batch, seq) / 1e9;
        println!(
            "{}",
            markdown(
                &rows,
                batch,
                seq,
                &|form| if form == LOW_RANK {
                    low_rank_gflop
                } else {
                    gflop
                },
                threads,
                &peer_note,
                &peak_of
            )
        );
        let median_of = |form: &str| {
            rows.iter()
                .find(|r| r.form == form)
                .and_then(|r| r.median_ms)
        };
        let low_rank = match (median_of(LOW_RANK), median_of("fast-f32")) {
            (Some(low), Some(dense)) => {
                let layers = ffn_layers_ratio(&config, batch * seq, args.ffn_rank, args.rounds);
                println!(
                    "low rank {}: the feed-forward layers alone take {:.2} of the dense ones' \
                     time; the whole encoder {:.2} of fast-f32's",
                    args.ffn_rank,
                    layers,
                    low / dense
                );
                Some(LowRank {
                    rank: args.ffn_rank,
                    layers_ratio: layers,
                    model_ratio: low / dense,
                })
            }
            _ => None,
        };
        if let (Some(a), Some(b)) = load {
            println!("load average (1 min) before / after this shape: {a:.2} / {b:.2}");
        }
        report.push(Shape {
            batch,
            seq,
            lengths,
            gflop,
            peer: peer_note,
            load_average: load,
            rows,
            low_rank,
        });
    }
    let peaks_line = peaks
        .iter()
        .map(|(a, p)| {
            format!(
                "{} {}",
                a.name(),
                p.map_or("–".into(), |p| format!("{:.0} GOP/s", p / 1e9))
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    println!("measured peak on {threads} threads: {peaks_line}");
    if let Some(path) = &args.json {
        let peaks_json: serde_json::Map<String, serde_json::Value> = peaks
            .iter()
            .map(|(a, p)| (a.name().to_string(), serde_json::json!(p)))
            .collect();
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&serde_json::json!({
                "threads": threads,
                "rounds": args.rounds,
                "warmup": args.warmup,
                "peak_ops_per_second": peaks_json,
                "shapes": report,
            }))?,
        )?;
        println!("JSON: {}", path.display());
    }
    Ok(())
}

/// Prints where `burn-flex-f32`, `fast-f32` and `fast-bf16` spend a forward at one shape:
/// Burn's operations by total time, from one recorded forward after a warm-up.
fn profile(
    config: &EncoderConfig,
    batch: usize,
    seq: usize,
    lengths: &[usize],
    seed: u64,
) -> anyhow::Result<()> {
    profile_on::<Flex>("burn-flex-f32", None, config, batch, seq, lengths, seed)?;
    profile_on::<FastFlex>("fast-f32", None, config, batch, seq, lengths, seed)?;
    profile_on::<FastFlex>(
        "fast-bf16",
        Some(DType::BF16),
        config,
        batch,
        seq,
        lengths,
        seed,
    )
}

/// [`profile`] of one form: the encoder on `Profiled<B>`, its parameters cast to `cast`.
fn profile_on<B: Backend + burn_memory::DeviceMemory>(
    form: &str,
    cast: Option<DType>,
    config: &EncoderConfig,
    batch: usize,
    seq: usize,
    lengths: &[usize],
    seed: u64,
) -> anyhow::Result<()> {
    type P<B> = Profiled<B>;
    let device = Default::default();
    P::<B>::seed(&device, seed);
    let encoder = config.init::<P<B>>(&device);
    draw_params(&encoder);
    let encoder = match cast {
        Some(dtype) => encoder.map(&mut CastParams(dtype)),
        None => encoder,
    };
    let (ids, mask) = inputs::<P<B>>(batch, seq, lengths, config.vocab, seed);
    let _ = encoder.forward(ids.clone(), mask.clone()).into_data();
    let profiler = Profiler::start(ProfilerConfig::new())?;
    let _ = encoder.forward(ids, mask).into_data();
    let profile = profiler.stop();
    println!(
        "\n{form} at {batch}×{seq}, one forward:\n{}",
        profile
            .key_averages()
            .sorted_by(SortBy::TotalTime)
            .limit(12)
    );
    Ok(())
}

/// The feed-forward projections' time at rank `rank` over the dense ones', on `FastFlex` at
/// `tokens` rows (medians of `rounds` forwards): the layer-level side of a low-rank model.
fn ffn_layers_ratio(config: &EncoderConfig, tokens: usize, rank: usize, rounds: usize) -> f64 {
    use burn::nn::LinearConfig;
    let device = Default::default();
    let (h, f) = (config.hidden, config.ffn);
    let layer = |i: usize, o: usize, bias: bool| {
        let l = LinearConfig::new(i, o)
            .with_bias(bias)
            .init::<FastFlex>(&device);
        draw_params(&l);
        l
    };
    let (up, down) = (layer(h, f, true), layer(f, h, true));
    let (up_a, up_b) = (layer(h, rank, false), layer(rank, f, true));
    let (down_a, down_b) = (layer(f, rank, false), layer(rank, h, true));
    let x =
        Tensor::<FastFlex, 2>::random([tokens, h], burn::tensor::Distribution::Default, &device);
    let time = |run: &dyn Fn() -> Tensor<FastFlex, 2>| {
        let _ = run().into_data();
        let times: Vec<f64> = (0..rounds.max(3))
            .map(|_| {
                let start = Instant::now();
                let _ = run().into_data();
                start.elapsed().as_secs_f64()
            })
            .collect();
        median(times)
    };
    let dense = time(&|| down.forward(up.forward(x.clone())));
    let low = time(&|| down_b.forward(down_a.forward(up_b.forward(up_a.forward(x.clone())))));
    low / dense
}

/// The arithmetic a form's products run in, for its peak.
fn precision(form: &str) -> Arithmetic {
    if form.contains("bf16") {
        Arithmetic::Bf16
    } else if form.contains("int8") {
        Arithmetic::Int8
    } else {
        Arithmetic::F32
    }
}

/// The encoder's forward FLOPs at `batch × seq` (padding included, as every form computes
/// it): per layer, the six products `2·tokens·(4·h² + 2·h·ffn)` and attention's two
/// `2·2·batch·heads·seq²·d_head`.
fn flops(config: &EncoderConfig, batch: usize, seq: usize) -> f64 {
    let (h, f) = (config.hidden as f64, config.ffn as f64);
    let tokens = (batch * seq) as f64;
    let d_head = h / config.heads as f64;
    let ffn = match config.ffn_rank {
        Some(r) => 2.0 * r as f64 * (h + f),
        None => 2.0 * h * f,
    };
    let linear = 2.0 * tokens * (4.0 * h * h + ffn);
    let attention = 2.0 * 2.0 * (batch * config.heads) as f64 * (seq * seq) as f64 * d_head;
    config.layers as f64 * (linear + attention)
}

/// The sentences' lengths, drawn between `seq / 2` and `seq` (the first one `seq`, so that
/// the batch's length is used), the same for Burn and the peer.
fn draw_lengths(batch: usize, seq: usize, seed: u64) -> Vec<usize> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x1e46);
    let low = (seq / 2).max(1);
    (0..batch)
        .map(|i| {
            if i == 0 {
                seq
            } else {
                low + (rng.next_u64() as usize) % (seq - low + 1)
            }
        })
        .collect()
}

/// Token ids and the padding mask (`true` at padding) on `B`.
fn inputs<B: Backend>(
    batch: usize,
    seq: usize,
    lengths: &[usize],
    vocab: usize,
    seed: u64,
) -> (Tensor<B, 2, Int>, Tensor<B, 2, Bool>) {
    let device = Default::default();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let ids: Vec<i64> = (0..batch * seq)
        .map(|_| (rng.next_u64() % vocab as u64) as i64)
        .collect();
    let mask: Vec<bool> = (0..batch * seq)
        .map(|i| i % seq >= lengths[i / seq])
        .collect();
    (
        Tensor::from_data(TensorData::new(ids, [batch, seq]), &device),
        Tensor::from_data(TensorData::new(mask, [batch, seq]), &device),
    )
}

/// Every `Linear` of the encoder through Burn's `Module::quantize_weights` (symmetric `int8`,
/// one scale per tensor, min-max calibration), as `quantize_dynamic` quantizes PyTorch's
/// `nn.Linear`s; embeddings and norms stay `f32`.
fn quantize_linears<B: Backend>(mut encoder: Encoder<B>) -> Encoder<B> {
    let scheme = <QuantizedTensor<B> as QTensorPrimitive>::default_scheme()
        .with_value(QuantValue::Q8S)
        .with_mode(QuantMode::Symmetric)
        .with_level(QuantLevel::Tensor)
        .with_param(QuantParam::F32);
    let mut quantizer = Quantizer {
        calibration: Calibration::MinMax,
        scheme,
    };
    for layer in &mut encoder.layers {
        let a = &mut layer.attention;
        a.query = a.query.clone().quantize_weights(&mut quantizer);
        a.key = a.key.clone().quantize_weights(&mut quantizer);
        a.value = a.value.clone().quantize_weights(&mut quantizer);
        a.output = a.output.clone().quantize_weights(&mut quantizer);
        layer.intermediate = layer.intermediate.clone().quantize_weights(&mut quantizer);
        layer.output = layer.output.clone().quantize_weights(&mut quantizer);
    }
    encoder
}

/// A form's forward, boxed: runs once and returns the output as `f32` data.
type Forward = Box<dyn FnMut() -> TensorData>;

fn forward_of<B: Backend>(
    encoder: Encoder<B>,
    ids: Tensor<B, 2, Int>,
    mask: Tensor<B, 2, Bool>,
) -> Forward {
    Box::new(move || {
        let y = encoder.forward(ids.clone(), mask.clone());
        // Reading the output waits for the backend and keeps the work from being skipped.
        y.cast(DType::F32).into_data()
    })
}

/// The text of a caught panic.
fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Builds one of Burn's forms with the seeded weights (the same on every backend: Flex and
/// FastFlex draw from the same seeded generator) and runs it once; `Err` says why the form
/// is unavailable.
fn build_form(
    form: &str,
    config: &EncoderConfig,
    batch: usize,
    seq: usize,
    lengths: &[usize],
    seed: u64,
    ffn_rank: usize,
) -> Result<Forward, String> {
    let attempt = catch_unwind(AssertUnwindSafe(|| -> Forward {
        let vocab = config.vocab;
        match form {
            "burn-flex-f32" => {
                let device = Default::default();
                Flex::seed(&device, seed);
                let (ids, mask) = inputs::<Flex>(batch, seq, lengths, vocab, seed);
                let encoder = config.init::<Flex>(&device);
                // Drawn now, in field order, so that every form holds the same weights.
                draw_params(&encoder);
                forward_of(encoder, ids, mask)
            }
            "fast-f32"
            | "fast-f32-transposed"
            | "fast-bf16"
            | "fast-bf16-transposed"
            | "fast-int8"
            | LOW_RANK => {
                let device = Default::default();
                FastFlex::seed(&device, seed);
                let encoder = if form == LOW_RANK {
                    config
                        .clone()
                        .with_ffn_rank(Some(ffn_rank))
                        .init::<FastFlex>(&device)
                } else {
                    config.init::<FastFlex>(&device)
                };
                draw_params(&encoder);
                let encoder = match form {
                    "fast-bf16" => encoder.map(&mut CastParams(DType::BF16)),
                    // Cast after: the cast keeps a transposed view's layout.
                    "fast-bf16-transposed" => encoder
                        .map(&mut TransposedLinears::default())
                        .map(&mut CastParams(DType::BF16)),
                    "fast-f32-transposed" => encoder.map(&mut TransposedLinears::default()),
                    "fast-int8" => quantize_linears(encoder),
                    _ => encoder,
                };
                let (ids, mask) = inputs::<FastFlex>(batch, seq, lengths, vocab, seed);
                forward_of(encoder, ids, mask)
            }
            other => panic!("unknown form {other}"),
        }
    }));
    let mut forward = attempt.map_err(panic_text)?;
    // The first forward, where an unsupported operation would panic.
    catch_unwind(AssertUnwindSafe(&mut forward)).map_err(panic_text)?;
    Ok(forward)
}

/// Every `Linear`'s weight as a transposed view of its `[d_out, d_in]` copy: the layout a
/// port of PyTorch's `nn.Linear` holds (`Param::from_tensor(w.transpose())`, or Burn's
/// `LinearLayout::Col`). The same values, so the form's output equals `fast-f32`'s.
#[derive(Default)]
struct TransposedLinears {
    in_linear: usize,
}

impl<B: Backend> ModuleMapper<B> for TransposedLinears {
    fn enter_module(&mut self, _name: &str, container_type: &str) {
        if container_type == "Struct:Linear" {
            self.in_linear += 1;
        }
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        if container_type == "Struct:Linear" {
            self.in_linear -= 1;
        }
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let tensor = if self.in_linear > 0 && D == 2 {
            let device = tensor.device();
            // `into_data` of the transposed view is `[d_out, d_in]`, row-major.
            let stored = Tensor::<B, D>::from_data(tensor.transpose().into_data(), &device);
            stored.transpose()
        } else {
            tensor
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Burn's forms at one shape, built and warmed up, with each form's gap to `burn-flex-f32`
/// at the unpadded positions; [`BurnForms::round`] times one forward of each.
struct BurnForms {
    forms: Vec<(Row, Option<Forward>)>,
}

impl BurnForms {
    fn build(
        args: &Args,
        config: &EncoderConfig,
        batch: usize,
        seq: usize,
        lengths: &[usize],
    ) -> Self {
        let names: Vec<&str> = BURN_FORMS
            .into_iter()
            .filter(|f| args.forms.is_empty() || args.forms.iter().any(|s| f.contains(s.as_str())))
            .collect();
        let bar = ProgressBar::new((names.len() * (1 + args.warmup)) as u64).with_style(
            ProgressStyle::with_template("{elapsed_precise} {bar:30} {pos}/{len} forwards {msg}")
                .expect("a valid template"),
        );
        let mut forms: Vec<(Row, Option<Forward>)> = Vec::new();
        let mut reference: Option<Vec<f32>> = None;
        for form in names {
            bar.set_message(format!("{form} at {batch}×{seq}: building and warming up"));
            let mut row = Row {
                form: form.into(),
                batch,
                seq,
                available: true,
                reason: None,
                median_ms: None,
                times_ms: Vec::new(),
                rel_error: None,
                export: None,
                torch: None,
                onnxruntime: None,
            };
            // Panics are caught and reported as the row's reason: keep the default hook quiet.
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let built = build_form(form, config, batch, seq, lengths, args.seed, args.ffn_rank);
            std::panic::set_hook(hook);
            bar.inc(1);
            match built {
                Ok(mut forward) => {
                    let y = forward();
                    let y: Vec<f32> = y.convert::<f32>().to_vec().expect("f32 data");
                    match &reference {
                        None => reference = Some(y),
                        Some(_) if form == LOW_RANK => {}
                        Some(want) => row.rel_error = Some(unpadded_gap(want, &y, lengths, seq)),
                    }
                    for _ in 0..args.warmup {
                        forward();
                        bar.inc(1);
                    }
                    forms.push((row, Some(forward)));
                }
                Err(reason) => {
                    tracing::warn!("{form} unavailable: {reason}");
                    row.available = false;
                    row.reason = Some(reason);
                    bar.inc(args.warmup as u64);
                    forms.push((row, None));
                }
            }
        }
        bar.finish_and_clear();
        Self { forms }
    }

    /// One forward of each available form, timed.
    fn round(&mut self) {
        for (row, forward) in &mut self.forms {
            if let Some(forward) = forward {
                let start = Instant::now();
                forward();
                row.times_ms.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }

    /// The rows, with their medians.
    fn finish(self) -> Vec<Row> {
        self.forms
            .into_iter()
            .map(|(mut row, _)| {
                if row.available {
                    row.median_ms = Some(median(row.times_ms.iter().copied()));
                }
                row
            })
            .collect()
    }
}

/// The machine's 1-minute load average, where `/proc/loadavg` exists.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The largest `|y − want|` over the largest `|want|`, at the unpadded positions.
fn unpadded_gap(want: &[f32], y: &[f32], lengths: &[usize], seq: usize) -> f64 {
    let hidden = want.len() / (lengths.len() * seq);
    let kept = |i: &usize| (i / hidden) % seq < lengths[i / hidden / seq];
    let (mut gap, mut scale) = (0f64, 0f64);
    for i in (0..want.len()).filter(kept) {
        scale = scale.max(want[i].abs() as f64);
        gap = gap.max((y[i] - want[i]).abs() as f64);
    }
    gap / scale
}

/// `xtask/pytorch/encoder.py --serve` at one shape, with the same lengths: built and warmed
/// up on start, then one round of its forms per [`Peer::round`].
struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    dir: PathBuf,
    json: PathBuf,
    what: String,
}

/// The marker of the peer's protocol lines (everything else on its stdout is ignored).
const MARKER: &str = "@@encoder ";

impl Peer {
    /// Starts the peer and waits until its forms are warm; `Err` says why there is no peer
    /// (no such Python, no torch, the script failed).
    fn start(
        python: &str,
        args: &Args,
        batch: usize,
        seq: usize,
        lengths: &[usize],
        threads: usize,
    ) -> Result<Self, String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../xtask/pytorch/encoder.py");
        let dir = std::env::temp_dir().join(format!("encoder_bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let json = dir.join(format!("peer-{batch}x{seq}.json"));
        let stderr = std::fs::File::create(dir.join("stderr.txt"))
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        let lengths = lengths
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut child = Command::new(python)
            .arg(&script)
            .args(["--batch", &batch.to_string(), "--seq", &seq.to_string()])
            .args(["--warmup", &args.warmup.to_string()])
            .args(["--threads", &threads.to_string()])
            .args(["--seed", &args.seed.to_string()])
            .args(["--lengths", &lengths, "--serve"])
            .arg("--json")
            .arg(&json)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot run {python}: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut peer = Self {
            child,
            stdin,
            stdout,
            dir,
            json,
            what: format!("{python} {}", script.display()),
        };
        peer.answer()?;
        Ok(peer)
    }

    /// The peer's next protocol line; on its end, why it stopped (its stderr's last line).
    fn answer(&mut self) -> Result<serde_json::Value, String> {
        let mut line = String::new();
        loop {
            line.clear();
            let read = self
                .stdout
                .read_line(&mut line)
                .map_err(|e| e.to_string())?;
            if read == 0 {
                let _ = self.child.wait();
                return Err(format!("{}: {}", self.what, self.last_error()));
            }
            if let Some(json) = line.trim_end().strip_prefix(MARKER) {
                return serde_json::from_str(json).map_err(|e| format!("{json}: {e}"));
            }
        }
    }

    fn last_error(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.txt"))
            .unwrap_or_default()
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("exited")
            .to_string()
    }

    /// One forward of each of the peer's forms (it keeps the times).
    fn round(&mut self) -> Result<(), String> {
        writeln!(self.stdin, "round")
            .and_then(|_| self.stdin.flush())
            .map_err(|e| format!("{}: {e}: {}", self.what, self.last_error()))?;
        self.answer().map(|_| ())
    }

    /// Ends the peer; its rows.
    fn finish(mut self) -> Result<Vec<Row>, String> {
        let _ = writeln!(self.stdin, "end").and_then(|_| self.stdin.flush());
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("{}: {}", self.what, self.last_error()));
        }
        let json = &self.json;
        let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
        let _ = std::fs::remove_dir_all(&self.dir);
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json.display()))
    }
}

/// One shape's table.
fn markdown(
    rows: &[Row],
    batch: usize,
    seq: usize,
    gflop_of: &dyn Fn(&str) -> f64,
    threads: usize,
    peer_note: &str,
    peak_of: &dyn Fn(&str) -> Option<f64>,
) -> String {
    let gflop = gflop_of("fast-f32");
    let ms_of = |form: &str| {
        rows.iter()
            .find(|r| r.form == form)
            .and_then(|r| r.median_ms)
    };
    let ratio = |ms: f64, to: &str| {
        ms_of(to).map(|t| format!("{:.2} ({})", ms / t, to.trim_start_matches("torch-")))
    };
    let mut out = format!(
        "\n### batch {batch} × seq {seq}: {gflop:.2} GFLOP per forward, {threads} threads\n\n\
         | form | median ms | best ms | ÷ PyTorch | ÷ ONNX Runtime | GFLOP/s | % of peak | rel. error vs burn-flex-f32 |\n\
         |---|---:|---:|---|---|---:|---:|---:|\n"
    );
    for row in rows {
        let Some(ms) = row.median_ms.filter(|_| row.available) else {
            out += &format!(
                "| {} | unavailable: {} | | | | | | |\n",
                row.form,
                row.reason.as_deref().unwrap_or("?").replace('|', "/")
            );
            continue;
        };
        let burn = BURN_FORMS.contains(&row.form.as_str());
        let (torch, ort) = if !burn {
            (None, None)
        } else {
            match precision(&row.form) {
                Arithmetic::F32 => (
                    [ratio(ms, "torch-f32-sdpa"), ratio(ms, "torch-f32-eager")]
                        .into_iter()
                        .flatten()
                        .reduce(|a, b| format!("{a}, {b}")),
                    ratio(ms, "ort-f32"),
                ),
                Arithmetic::Bf16 => (ratio(ms, "torch-bf16-autocast"), None),
                Arithmetic::Int8 => (ratio(ms, "torch-int8-dynamic"), ratio(ms, "ort-int8")),
            }
        };
        let rate = gflop_of(&row.form) / (ms * 1e-3);
        out += &format!(
            "| {} | {:.2} | {:.2} | {} | {} | {:.1} | {} | {} |\n",
            row.form,
            ms,
            row.times_ms.iter().copied().fold(f64::INFINITY, f64::min),
            torch.unwrap_or_else(|| "–".into()),
            ort.unwrap_or_else(|| "–".into()),
            rate,
            peak_of(&row.form).map_or("–".into(), |p| format!("{:.1} %", 100.0 * rate * 1e9 / p)),
            row.rel_error.map_or("–".into(), |e| format!("{e:.1e}")),
        );
    }
    out += &format!(
        "\n÷: Burn's median over the peer form's (below 1: Burn is faster). best: the fastest \
         round. GFLOP/s and % of peak: of the median, in the form's precision. Peer: {peer_note}.\n"
    );
    if let Some(row) = rows.iter().find(|r| r.export.is_some()) {
        out += &format!(
            "ONNX model: {}; torch {}, onnxruntime {}.\n",
            row.export.as_deref().unwrap_or(""),
            row.torch.as_deref().unwrap_or("?"),
            row.onnxruntime.as_deref().unwrap_or("?"),
        );
    }
    out
}
