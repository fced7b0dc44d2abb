//! Mixed good and bad requests from many users at once: every bad one must be a 4xx with a
//! message, every good one answered correctly, the server must stay up and its memory flat.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use burn_serve::protocol::JsonTensor;
use burn_serve::{Client, HostData, HostTensor};
use serde::Serialize;
use serde_json::json;
use tokio::io::AsyncWriteExt;

/// What a request of the mix is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Kind {
    /// A correct request of 1 to 4 rows.
    Good,
    /// A body cut in the middle of its JSON.
    MalformedJson,
    /// A row one element short.
    WrongShape,
    /// `FP64` data for an `FP32` input.
    WrongDatatype,
    /// More rows than a batch holds.
    Oversized,
    /// A model that is not served.
    UnknownModel,
    /// Headers and half the body, then the connection closed.
    Disconnect,
}

const MIX: [Kind; 10] = [
    Kind::Good,
    Kind::MalformedJson,
    Kind::Good,
    Kind::WrongShape,
    Kind::Good,
    Kind::WrongDatatype,
    Kind::Good,
    Kind::Oversized,
    Kind::UnknownModel,
    Kind::Disconnect,
];

/// The counts for one kind.
#[derive(Clone, Debug, Serialize)]
pub struct KindCount {
    /// The kind.
    pub kind: Kind,
    /// Requests of this kind sent.
    pub sent: usize,
    /// Answered as they must be: good ones 200 with the right values, bad ones 4xx with an
    /// error message; a disconnected client leaves nothing to answer, and counts once sent.
    pub as_expected: usize,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
pub struct MixedReport {
    /// Requests sent.
    pub requests: usize,
    /// Per kind.
    pub kinds: Vec<KindCount>,
    /// Examples of answers that were not as expected (at most 5).
    pub unexpected: Vec<String>,
    /// Wall time.
    pub seconds: f64,
}

/// One good request's body and the answer it must get.
pub struct Sample {
    /// The rows sent.
    pub input: HostTensor,
    /// The model's answer computed directly.
    pub expected: Vec<f32>,
}

/// Where the mix goes: a server, its model and the model's input.
#[derive(Clone, Debug)]
pub struct MixedTarget {
    /// The server (loopback).
    pub addr: SocketAddr,
    /// The model.
    pub model: String,
    /// Its input's name.
    pub input_name: String,
    /// Elements per input row.
    pub row_len: usize,
    /// The model's `max_batch_size`.
    pub max_batch: usize,
}

/// Sends `total` requests of the mix from `users` connections to `target`, the good ones
/// drawn from `samples`.
pub fn run(
    target: &MixedTarget,
    samples: Arc<Vec<Sample>>,
    total: usize,
    users: usize,
) -> anyhow::Result<MixedReport> {
    let MixedTarget {
        addr,
        row_len,
        max_batch,
        ..
    } = *target;
    let (model, input_name) = (target.model.as_str(), target.input_name.as_str());
    super::loadgen::check_loopback(addr)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let start = Instant::now();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let results = runtime.block_on(async {
        let tasks: Vec<_> = (0..users)
            .map(|_| {
                let next = Arc::clone(&next);
                let samples = Arc::clone(&samples);
                let (model, input_name) = (model.to_string(), input_name.to_string());
                tokio::spawn(async move {
                    let mut client = Client::connect(addr).await?;
                    let mut outcomes = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= total {
                            break;
                        }
                        let kind = MIX[i % MIX.len()];
                        let sample = &samples[i % samples.len()];
                        let outcome = one(
                            &mut client,
                            addr,
                            kind,
                            sample,
                            &model,
                            &input_name,
                            row_len,
                            max_batch,
                        )
                        .await;
                        outcomes.push((kind, outcome));
                    }
                    anyhow::Ok(outcomes)
                })
            })
            .collect();
        let mut all = Vec::new();
        for task in tasks {
            all.extend(task.await??);
        }
        anyhow::Ok(all)
    })?;
    let mut kinds: Vec<KindCount> = Vec::new();
    let mut unexpected = Vec::new();
    for (kind, outcome) in &results {
        let count = match kinds.iter_mut().find(|k| k.kind == *kind) {
            Some(count) => count,
            None => {
                kinds.push(KindCount {
                    kind: *kind,
                    sent: 0,
                    as_expected: 0,
                });
                kinds.last_mut().expect("just pushed")
            }
        };
        count.sent += 1;
        match outcome {
            Ok(()) => count.as_expected += 1,
            Err(why) if unexpected.len() < 5 => unexpected.push(format!("{kind:?}: {why}")),
            Err(_) => {}
        }
    }
    Ok(MixedReport {
        requests: results.len(),
        kinds,
        unexpected,
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[allow(clippy::too_many_arguments)]
async fn one(
    client: &mut Client,
    addr: SocketAddr,
    kind: Kind,
    sample: &Sample,
    model: &str,
    input_name: &str,
    row_len: usize,
    max_batch: usize,
) -> Result<(), String> {
    let path = format!("/v2/models/{model}/infer");
    let good = json!({"inputs": [JsonTensor::from_host(input_name, &sample.input)]});
    let (path, body) = match kind {
        Kind::Good => (path, serde_json::to_vec(&good).unwrap()),
        Kind::MalformedJson => {
            let mut body = serde_json::to_vec(&good).unwrap();
            body.truncate(body.len() / 2);
            (path, body)
        }
        Kind::WrongShape => {
            let rows = sample.input.rows();
            let data = vec![0.5f32; rows * (row_len - 1)];
            let body = json!({"inputs": [{"name": input_name, "shape": [rows, row_len - 1], "datatype": "FP32", "data": data}]});
            (path, serde_json::to_vec(&body).unwrap())
        }
        Kind::WrongDatatype => {
            let mut body = good.clone();
            body["inputs"][0]["datatype"] = json!("FP64");
            (path, serde_json::to_vec(&body).unwrap())
        }
        Kind::Oversized => {
            let rows = max_batch + 1;
            let body = json!({"inputs": [{"name": input_name, "shape": [rows, row_len], "datatype": "FP32", "data": vec![0.5f32; rows * row_len]}]});
            (path, serde_json::to_vec(&body).unwrap())
        }
        Kind::UnknownModel => (
            "/v2/models/no-such-model/infer".to_string(),
            serde_json::to_vec(&good).unwrap(),
        ),
        Kind::Disconnect => {
            let body = serde_json::to_vec(&good).unwrap();
            let mut stream = tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())?;
            let head = format!(
                "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            stream
                .write_all(head.as_bytes())
                .await
                .map_err(|e| e.to_string())?;
            stream
                .write_all(&body[..body.len() / 2])
                .await
                .map_err(|e| e.to_string())?;
            drop(stream);
            return Ok(());
        }
    };
    let answer = client
        .post(&path, body)
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    match kind {
        Kind::Good => {
            if answer.status != 200 {
                return Err(format!("status {} ({:?})", answer.status, answer.error()));
            }
            let response: burn_serve::protocol::InferResponse =
                serde_json::from_slice(&answer.body).map_err(|e| e.to_string())?;
            let output = response.outputs[0].to_host().map_err(|e| e.to_string())?;
            let HostData::F32(values) = output.data() else {
                return Err("not FP32".into());
            };
            let worst = values
                .iter()
                .zip(&sample.expected)
                .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
                .fold(0.0f32, f32::max);
            if values.len() != sample.expected.len() || worst > 1e-4 {
                return Err(format!("wrong values (relative error {worst})"));
            }
            Ok(())
        }
        _ => {
            let message = answer.error().unwrap_or_default();
            if (400..500).contains(&answer.status) && !message.is_empty() {
                Ok(())
            } else {
                Err(format!("status {} message '{message}'", answer.status))
            }
        }
    }
}
