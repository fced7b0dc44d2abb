//! The server over loopback with a real HTTP client: every endpoint, every error code with its
//! message, a client that disconnects, metrics, mixed traffic and graceful shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use burn::backend::Flex;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use burn_serve::protocol::{InferRequest, InferResponse, JsonTensor};
use burn_serve::{
    BatcherConfig, BurnModel, Client, DataType, HostData, ModelSpec, RunningServer, Server,
    ServerConfig, TensorSpec,
};
use hyper::Method;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::common::{self, IN, Net, OUT, Slow, body, post, runtime};

/// Token ids `[n, 4]` → mean embedding → logits `[n, 5]`.
#[derive(Module, Debug)]
struct Tokens<B: Backend> {
    embedding: Embedding<B>,
    output: Linear<B>,
}

impl<B: Backend> Tokens<B> {
    fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let hidden: Tensor<B, 2> = self.embedding.forward(tokens).mean_dim(1).squeeze_dim(1);
        self.output.forward(hidden)
    }
}

fn spec(name: &str, input: TensorSpec, output: TensorSpec) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        version: "1".into(),
        platform: "burn-flex".into(),
        input,
        output,
    }
}

struct Fixture {
    server: RunningServer,
    net: Net<Flex>,
    tokens: Tokens<Flex>,
}

fn start(max_body_bytes: usize) -> Fixture {
    let device = Default::default();
    let net = Net::<Flex>::new(&device);
    let tokens = Tokens {
        embedding: EmbeddingConfig::new(20, 8).init(&device),
        output: LinearConfig::new(8, 5).init(&device),
    };
    burn_memory::draw_params(&tokens);
    let mut server = Server::new(ServerConfig {
        max_body_bytes,
        ..ServerConfig::default()
    });
    let batching = BatcherConfig {
        max_batch_size: 8,
        max_queue_delay: Duration::from_millis(2),
        queue_capacity: 64,
        max_batch_tokens: None,
    };
    server
        .add_model(
            spec(
                "net",
                TensorSpec::rows("x", DataType::Fp32, &[IN]),
                TensorSpec::rows("y", DataType::Fp32, &[OUT]),
            ),
            batching.clone(),
            vec![common::served(&net, &device)],
        )
        .unwrap()
        .add_model(
            spec(
                "tokens",
                TensorSpec::rows("ids", DataType::Int64, &[4]),
                TensorSpec::rows("logits", DataType::Fp32, &[5]),
            ),
            batching,
            vec![BurnModel::int(
                tokens.clone(),
                device,
                |m: &Tokens<Flex>, x| m.forward(x),
            )],
        )
        .unwrap()
        .add_model(
            spec(
                "slow",
                TensorSpec::rows("x", DataType::Fp32, &[2]),
                TensorSpec::rows("y", DataType::Fp32, &[2]),
            ),
            BatcherConfig::unbatched(),
            vec![Slow::new(Duration::from_millis(150)).0],
        )
        .unwrap();
    let server = server.start("127.0.0.1:0".parse().unwrap()).unwrap();
    Fixture {
        server,
        net,
        tokens,
    }
}

fn net_request(rows: usize, seed: usize) -> (Value, burn_serve::HostTensor) {
    let input = common::rows(rows, seed);
    let value = json!({"id": format!("r{seed}"), "inputs": [JsonTensor::from_host("x", &input)]});
    (value, input)
}

fn output_values(response: &Value) -> Vec<f32> {
    let response: InferResponse = serde_json::from_value(response.clone()).unwrap();
    match response.outputs[0].to_host().unwrap().into_data() {
        HostData::F32(values) => values,
        _ => panic!("FP32 output"),
    }
}

#[test]
fn endpoints_answer_as_the_protocol_says() {
    let fixture = start(1 << 20);
    let addr = fixture.server.addr();
    runtime().block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        let server: Value = serde_json::from_slice(&client.get("/v2").await.unwrap().body).unwrap();
        assert_eq!(server["name"], "burn-serve");
        assert_eq!(client.get("/v2/health/live").await.unwrap().status, 200);
        assert_eq!(client.get("/v2/health/ready").await.unwrap().status, 200);
        let metadata: Value =
            serde_json::from_slice(&client.get("/v2/models/net").await.unwrap().body).unwrap();
        assert_eq!(
            metadata,
            json!({"name": "net", "versions": ["1"], "platform": "burn-flex",
                   "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, IN]}],
                   "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, OUT]}]})
        );
        assert_eq!(
            client
                .get("/v2/models/net/versions/1")
                .await
                .unwrap()
                .status,
            200
        );
        assert_eq!(
            client.get("/v2/models/net/ready").await.unwrap().status,
            200
        );
        assert_eq!(
            client
                .get("/v2/models/net/versions/1/ready")
                .await
                .unwrap()
                .status,
            200
        );
        for (path, status) in [
            ("/v2/models/nope", 404),
            ("/v2/models/net/versions/2", 404),
            ("/v2/models/nope/ready", 404),
            ("/v3", 404),
        ] {
            let answer = client.get(path).await.unwrap();
            assert_eq!(answer.status, status, "{path}");
            assert!(
                !answer.error().unwrap_or_default().is_empty(),
                "{path} has no message"
            );
        }
        assert_eq!(
            client.get("/v2/models/net/infer").await.unwrap().status,
            405
        );
    });
    fixture.server.shutdown().unwrap();
}

#[test]
fn inference_answers_equal_the_model() {
    let fixture = start(1 << 20);
    let addr = fixture.server.addr();
    let device = Default::default();
    runtime().block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        for (rows, seed) in [(1, 1), (3, 2), (8, 3)] {
            let (request, input) = net_request(rows, seed);
            let (status, response) = post(&mut client, "/v2/models/net/infer", request).await;
            assert_eq!(status, 200, "{response}");
            assert_eq!(response["id"], format!("r{seed}"));
            assert_eq!(response["model_name"], "net");
            assert_eq!(response["outputs"][0]["shape"], json!([rows, OUT]));
            common::assert_close(&output_values(&response), &fixture.net.answer(&input, &device));
        }
        // Nested data, and the versioned path.
        let (_, input) = net_request(2, 9);
        let HostData::F32(values) = input.data() else { unreachable!() };
        let nested: Vec<&[f32]> = values.chunks(IN).collect();
        let request = json!({"inputs": [{"name": "x", "shape": [2, IN], "datatype": "FP32", "data": nested}],
                             "outputs": [{"name": "y"}]});
        let (status, response) = post(&mut client, "/v2/models/net/versions/1/infer", request).await;
        assert_eq!(status, 200);
        common::assert_close(&output_values(&response), &fixture.net.answer(&input, &device));
        // Binary tensor data both ways, as Triton's clients send it: the same answer.
        let (_, input) = net_request(5, 11);
        let (response, outputs) = client.infer_binary("net", "x", &input).await.unwrap();
        assert_eq!(response.outputs[0].data, Value::Null);
        assert_eq!(outputs[0].shape(), &[5, OUT]);
        let HostData::F32(values) = outputs[0].data() else { unreachable!() };
        common::assert_close(values, &fixture.net.answer(&input, &device));
        // Token ids.
        let ids = [[1i64, 2, 3, 4], [19, 0, 7, 7]];
        let request = InferRequest {
            id: None,
            parameters: None,
            inputs: vec![serde_json::from_value(json!({"name": "ids", "shape": [2, 4], "datatype": "INT64", "data": ids})).unwrap()],
            outputs: None,
        };
        let response = client.infer("tokens", &request).await.unwrap();
        let expected: Vec<f32> = fixture
            .tokens
            .forward(Tensor::from_data(TensorData::new(ids.concat(), [2, 4]), &device))
            .into_data()
            .to_vec()
            .unwrap();
        let HostData::F32(got) = response.outputs[0].to_host().unwrap().into_data() else { unreachable!() };
        common::assert_close(&got, &expected);
    });
    fixture.server.shutdown().unwrap();
}

/// Each bad request is a 4xx (or 504 past its deadline) with a message naming the problem.
#[test]
fn bad_requests_get_their_codes_and_messages() {
    let fixture = start(64 << 10);
    let addr = fixture.server.addr();
    runtime().block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        let x = |shape: Value, datatype: &str, data: Value| {
            json!({"inputs": [{"name": "x", "shape": shape, "datatype": datatype, "data": data}]})
        };
        let row = vec![0.5f32; IN];
        let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
            ("/v2/models/net/infer", b"{\"inputs\": [".to_vec(), 400, "malformed"),
            ("/v2/models/net/infer", b"not json".to_vec(), 400, "malformed"),
            ("/v2/models/net/infer", body(json!({"input": []})), 400, "inputs"),
            ("/v2/models/net/infer", body(x(json!([1, IN + 1]), "FP32", json!(vec![0.5f32; IN + 1]))), 400, "shape"),
            ("/v2/models/net/infer", body(x(json!([1, IN]), "INT64", json!(vec![1; IN]))), 400, "datatype INT64"),
            ("/v2/models/net/infer", body(x(json!([2, IN]), "FP32", json!(row))), 400, "elements"),
            ("/v2/models/net/infer", body(x(json!([9, IN]), "FP32", json!(vec![0.5f32; 9 * IN]))), 413, "at most 8"),
            ("/v2/models/net/infer", body(x(json!([0, IN]), "FP32", json!([]))), 400, "no rows"),
            ("/v2/models/nope/infer", body(x(json!([1, IN]), "FP32", json!(row))), 404, "unknown model"),
            ("/v2/models/net/versions/7/infer", body(x(json!([1, IN]), "FP32", json!(row))), 404, "version '7'"),
            ("/v2/models/net/infer", vec![b' '; 100 << 10], 413, ""),
            (
                "/v2/models/slow/infer",
                body(json!({"parameters": {"timeout": 10_000}, "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})),
                504,
                "deadline",
            ),
        ];
        for (path, request, status, message) in cases {
            let answer = client.send(Method::POST, path, request).await.unwrap();
            assert_eq!(answer.status, status, "{path} {message}: {:?}", answer.body);
            let text = answer.error().unwrap_or_else(|| String::from_utf8_lossy(&answer.body).into_owned());
            assert!(!text.is_empty() && text.contains(message), "{path}: '{text}' lacks '{message}'");
        }
        // A binary body whose JSON part would end past the body.
        let answer = client
            .send_with(Method::POST, "/v2/models/net/infer", b"{}".to_vec(), Some(10))
            .await
            .unwrap();
        assert_eq!(answer.status, 400);
        assert!(answer.error().unwrap().contains("inference-header-content-length"));
    });
    fixture.server.shutdown().unwrap();
}

/// Clients that disconnect mid-body or before their answer leave the server serving.
#[test]
fn disconnecting_clients_leave_the_server_serving() {
    let fixture = start(1 << 20);
    let addr: SocketAddr = fixture.server.addr();
    let device = Default::default();
    runtime().block_on(async {
        // Half a body, then gone.
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"POST /v2/models/net/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n{\"inputs\": [")
            .await
            .unwrap();
        drop(stream);
        // A whole request to the slow model, gone before the answer.
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = body(json!({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}));
        let head = format!("POST /v2/models/slow/infer HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n", request.len());
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(&request).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(stream);
        // The server still answers, correctly.
        let mut client = Client::connect(addr).await.unwrap();
        let (request, input) = net_request(2, 5);
        let (status, response) = post(&mut client, "/v2/models/net/infer", request).await;
        assert_eq!(status, 200);
        common::assert_close(&output_values(&response), &fixture.net.answer(&input, &device));
        let (status, _) = post(&mut client, "/v2/models/slow/infer",
            json!({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [3, 4]}]})).await;
        assert_eq!(status, 200);
    });
    fixture.server.shutdown().unwrap();
}

fn metric(text: &str, line_start: &str) -> f64 {
    text.lines()
        .find(|line| line.starts_with(line_start))
        .unwrap_or_else(|| panic!("no metric {line_start} in\n{text}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Mixed good and bad requests from 8 connections at once: every good one answered correctly,
/// every bad one a 4xx with a message, and the metrics count them.
#[test]
fn mixed_traffic_and_metrics() {
    let fixture = start(1 << 20);
    let addr = fixture.server.addr();
    let net = fixture.net.clone();
    let (good, bad) = runtime().block_on(async move {
        let tasks: Vec<_> = (0..8)
            .map(|user| {
                let net = net.clone();
                tokio::spawn(async move {
                    let device = Default::default();
                    let mut client = Client::connect(addr).await.unwrap();
                    let (mut good, mut bad) = (0, 0);
                    for i in 0..40 {
                        let seed = user * 1000 + i;
                        if seed % 3 == 0 {
                            let (mut request, _) = net_request(1 + i % 4, seed);
                            request["inputs"][0]["datatype"] = json!("FP64");
                            let (status, response) =
                                post(&mut client, "/v2/models/net/infer", request).await;
                            assert_eq!(status, 400);
                            assert!(response["error"].as_str().unwrap().contains("FP64"));
                            bad += 1;
                        } else {
                            let (request, input) = net_request(1 + i % 4, seed);
                            let (status, response) =
                                post(&mut client, "/v2/models/net/infer", request).await;
                            assert_eq!(status, 200);
                            common::assert_close(
                                &output_values(&response),
                                &net.answer(&input, &device),
                            );
                            good += 1;
                        }
                    }
                    (good, bad)
                })
            })
            .collect();
        let mut totals = (0, 0);
        for task in tasks {
            let (good, bad) = task.await.unwrap();
            totals.0 += good;
            totals.1 += bad;
        }
        let mut client = Client::connect(addr).await.unwrap();
        let answer = client.get("/metrics").await.unwrap();
        let text = String::from_utf8(answer.body.to_vec()).unwrap();
        assert_eq!(
            metric(
                &text,
                "burn_serve_requests_total{model=\"net\",code=\"200\"}"
            ),
            totals.0 as f64
        );
        assert_eq!(
            metric(
                &text,
                "burn_serve_requests_total{model=\"net\",code=\"400\"}"
            ),
            totals.1 as f64
        );
        assert_eq!(
            metric(
                &text,
                "burn_serve_request_duration_seconds_count{model=\"net\"}"
            ),
            (totals.0 + totals.1) as f64
        );
        // Rows of the good requests, over however many batches.
        let rows: usize = (0..8)
            .flat_map(|u| {
                (0..40)
                    .filter(move |i| (u * 1000 + i) % 3 != 0)
                    .map(|i| 1 + i % 4)
            })
            .sum();
        assert_eq!(
            metric(&text, "burn_serve_batch_size_sum{model=\"net\"}"),
            rows as f64
        );
        assert_eq!(metric(&text, "burn_serve_queue_depth{model=\"net\"}"), 0.0);
        assert!(metric(&text, "burn_serve_memory_in_use_bytes{model=\"net\"}") > 0.0);
        assert!(text.ends_with("# EOF\n"));
        totals
    });
    assert_eq!(good + bad, 320);
    fixture.server.shutdown().unwrap();
}

/// Shutdown answers the requests already received, then stops listening.
#[test]
fn graceful_shutdown_answers_what_it_received() {
    let fixture = start(1 << 20);
    let addr = fixture.server.addr();
    let runtime = runtime();
    let tasks: Vec<_> = (0..4)
        .map(|i| {
            runtime.spawn(async move {
                let mut client = Client::connect(addr).await.unwrap();
                post(&mut client, "/v2/models/slow/infer",
                    json!({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [i, 1]}]})).await
            })
        })
        .collect();
    // Let the four requests arrive (the slow model runs them one by one, 150 ms each).
    std::thread::sleep(Duration::from_millis(100));
    fixture.server.shutdown().unwrap();
    runtime.block_on(async {
        for (i, task) in tasks.into_iter().enumerate() {
            let (status, response) = task.await.unwrap();
            assert_eq!(status, 200, "request {i}: {response}");
            assert_eq!(output_values(&response), vec![2.0 * i as f32, 2.0]);
        }
        assert!(Client::connect(addr).await.is_err(), "still listening");
    });
}
