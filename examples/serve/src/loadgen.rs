//! A load generator for the Open Inference Protocol: a number of users, each on its own
//! keep-alive connection, send requests back to back; throughput and latency percentiles per
//! concurrency level, bounded in requests and in time, on loopback only.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use burn_serve::protocol::{JsonTensor, Method, binary_body};
use burn_serve::{Client, HostTensor};
use plotters::prelude::*;
use serde::Serialize;

/// How much load one concurrency level sends.
#[derive(Clone, Debug, Serialize)]
pub struct LoadConfig {
    /// The model's name.
    pub model: String,
    /// Requests measured per level (after the warm-up).
    pub requests: usize,
    /// Time limit per level.
    pub seconds: f64,
    /// Unmeasured requests before each level.
    pub warmup: usize,
    /// The endpoint requests go to: `None`, the model's Open Inference Protocol `infer`;
    /// else a path such as `/v1/embeddings` (the payloads must be its bodies).
    pub path: Option<String>,
}

/// One concurrency level's result.
#[derive(Clone, Debug, Serialize)]
pub struct Level {
    /// Users sending at once.
    pub concurrency: usize,
    /// Requests answered 200 in the measured window.
    pub requests: usize,
    /// Requests answered otherwise (or not at all).
    pub failures: usize,
    /// The measured window.
    pub seconds: f64,
    /// Answered requests per second.
    pub throughput: f64,
    /// Latency percentiles, in milliseconds.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Mean rows per batch the server ran during the window (from its `/metrics`).
    pub mean_batch: f64,
}

/// Refuses anything but a loopback address: the generator is for measuring one's own server.
pub fn check_loopback(addr: SocketAddr) -> anyhow::Result<()> {
    if !addr.ip().is_loopback() {
        bail!("the load generator sends to loopback addresses only (127.0.0.1, ::1), not {addr}");
    }
    Ok(())
}

/// A request body, and the length of its JSON part when binary tensor data follows it.
pub type Payload = (Vec<u8>, Option<usize>);

/// How the load generator's requests carry their tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Numbers in the JSON body.
    Json,
    /// The binary tensor data extension, both ways (Triton's clients' default).
    Binary,
    /// Text in: OpenAI's `/v1/embeddings` with the text, tokenized by the server
    /// ([`text_payloads`]).
    Text,
}

/// One OpenAI embeddings request per text, for `model`: what an embedding server (this one's
/// `/v1/embeddings`, Infinity's `/embeddings`) takes.
pub fn text_payloads(texts: &[String], model: &str) -> Arc<Vec<Payload>> {
    let payloads = texts
        .iter()
        .map(|text| {
            let body = serde_json::json!({"input": text, "model": model});
            (serde_json::to_vec(&body).expect("JSON"), None)
        })
        .collect();
    Arc::new(payloads)
}

/// One request per input, the tensor named `name`, in `encoding`: what [`run`] sends. Text
/// payloads are texts, not tensors: [`text_payloads`] makes them, and `Text` is an error here.
pub fn payloads(
    inputs: &[HostTensor],
    name: &str,
    encoding: Encoding,
) -> anyhow::Result<Arc<Vec<Payload>>> {
    if encoding == Encoding::Text {
        bail!("`--encodings text` sends texts: this model takes tensors (json or binary)");
    }
    let payloads = inputs
        .iter()
        .map(|input| match encoding {
            Encoding::Json => {
                let body = serde_json::json!({"inputs": [JsonTensor::from_host(name, input)]});
                (serde_json::to_vec(&body).expect("JSON"), None)
            }
            // `Text` was refused above.
            Encoding::Binary | Encoding::Text => {
                let (tensor, bytes) = JsonTensor::binary_from_host(name, input);
                let request = serde_json::json!({
                    "parameters": {"binary_data_output": true},
                    "inputs": [tensor],
                });
                let (body, length) = binary_body(&request, &[bytes]);
                (body, Some(length))
            }
        })
        .collect();
    Ok(Arc::new(payloads))
}

/// Runs every level in `levels` against `addr`, sending `payloads` in turn.
pub fn run(
    addr: SocketAddr,
    config: &LoadConfig,
    payloads: Arc<Vec<Payload>>,
    levels: &[usize],
    mut progress: impl FnMut(&Level),
) -> anyhow::Result<Vec<Level>> {
    check_loopback(addr)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut results = Vec::new();
    for &concurrency in levels {
        let level = runtime.block_on(level(addr, config, Arc::clone(&payloads), concurrency))?;
        progress(&level);
        results.push(level);
    }
    Ok(results)
}

async fn level(
    addr: SocketAddr,
    config: &LoadConfig,
    payloads: Arc<Vec<Payload>>,
    concurrency: usize,
) -> anyhow::Result<Level> {
    let path = config
        .path
        .clone()
        .unwrap_or_else(|| format!("/v2/models/{}/infer", config.model));
    // Warm-up, unmeasured.
    send_all(addr, &path, &payloads, concurrency, config.warmup, 60.0).await?;
    let before = batch_totals(addr, &config.model).await?;
    let start = Instant::now();
    let (mut latencies, failures) = send_all(
        addr,
        &path,
        &payloads,
        concurrency,
        config.requests,
        config.seconds,
    )
    .await?;
    let seconds = start.elapsed().as_secs_f64();
    let after = batch_totals(addr, &config.model).await?;
    latencies.sort_by(f64::total_cmp);
    let percentile = |p: f64| {
        if latencies.is_empty() {
            return f64::NAN;
        }
        let rank = ((p * latencies.len() as f64).ceil() as usize).clamp(1, latencies.len());
        latencies[rank - 1] * 1e3
    };
    let batches = after.0 - before.0;
    Ok(Level {
        concurrency,
        requests: latencies.len(),
        failures,
        seconds,
        throughput: latencies.len() as f64 / seconds,
        p50_ms: percentile(0.50),
        p95_ms: percentile(0.95),
        p99_ms: percentile(0.99),
        mean_batch: if batches > 0.0 {
            (after.1 - before.1) / batches
        } else {
            f64::NAN
        },
    })
}

/// `concurrency` users send until `requests` were sent or `seconds` passed: the latencies of
/// the 200 answers, in seconds, and the count of the others.
async fn send_all(
    addr: SocketAddr,
    path: &str,
    payloads: &Arc<Vec<Payload>>,
    concurrency: usize,
    requests: usize,
    seconds: f64,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let next = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let users: Vec<_> = (0..concurrency)
        .map(|_| {
            let next = Arc::clone(&next);
            let payloads = Arc::clone(payloads);
            let path = path.to_string();
            tokio::spawn(async move {
                let mut client = Client::connect(addr).await?;
                let (mut latencies, mut failures) = (Vec::new(), 0usize);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= requests || Instant::now() >= until {
                        break;
                    }
                    let (body, header_length) = payloads[i % payloads.len()].clone();
                    let sent = Instant::now();
                    match client
                        .send_with(Method::POST, &path, body, header_length)
                        .await
                    {
                        Ok(answer) if answer.status == 200 => {
                            latencies.push(sent.elapsed().as_secs_f64())
                        }
                        _ => failures += 1,
                    }
                }
                anyhow::Ok((latencies, failures))
            })
        })
        .collect();
    let (mut latencies, mut failures) = (Vec::new(), 0);
    for user in users {
        let (l, f) = user.await??;
        latencies.extend(l);
        failures += f;
    }
    Ok((latencies, failures))
}

/// The server's batch count and rows so far for `model`, from its metrics.
pub async fn batch_totals(addr: SocketAddr, model: &str) -> anyhow::Result<(f64, f64)> {
    let mut client = Client::connect(addr).await?;
    let answer = client.get("/metrics").await?;
    let text = String::from_utf8_lossy(&answer.body);
    let value = |name: &str| {
        let prefix = format!("{name}{{model=\"{model}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((
        value("burn_serve_batch_size_count"),
        value("burn_serve_batch_size_sum"),
    ))
}

/// A table row per level, as the book shows them.
pub fn table(name: &str, levels: &[Level]) -> String {
    let mut out = format!(
        "{name}\n| concurrency | requests/s | p50 ms | p95 ms | p99 ms | rows/batch | failures |\n|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    for l in levels {
        out.push_str(&format!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} | {} |\n",
            l.concurrency, l.throughput, l.p50_ms, l.p95_ms, l.p99_ms, l.mean_batch, l.failures
        ));
    }
    out
}

/// Throughput and p99 latency against concurrency, one line per named series.
pub fn plot(series: &[(&str, &[Level])], path: &Path) -> anyhow::Result<()> {
    burn_memory::register_plot_font();
    let root = BitMapBackend::new(path, (1100, 450)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(550);
    // Concurrency on a log2 axis, labelled with the levels themselves.
    let max_c = (series
        .iter()
        .flat_map(|(_, l)| l.iter().map(|l| l.concurrency))
        .max()
        .unwrap_or(1) as f64)
        .log2()
        .max(1.0);
    let panel = |area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
                 caption: &str,
                 y_desc: &str,
                 value: fn(&Level) -> f64|
     -> anyhow::Result<()> {
        let max_y = series
            .iter()
            .flat_map(|(_, l)| l.iter().map(value))
            .filter(|v| v.is_finite())
            .fold(0.0, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..max_c, 0.0..max_y.max(1e-9))?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .x_labels(max_c as usize + 1)
            .x_label_formatter(&|v| format!("{}", 2f64.powf(*v).round()))
            .x_desc("concurrent users")
            .y_desc(y_desc)
            .draw()?;
        for (i, (name, levels)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let points: Vec<(f64, f64)> = levels
                .iter()
                .map(|l| ((l.concurrency as f64).log2(), value(l)))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    };
    panel(&left, "Throughput", "requests per second", |l| l.throughput)?;
    panel(&right, "p99 latency", "milliseconds", |l| l.p99_ms)?;
    root.present()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
