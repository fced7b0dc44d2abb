//! Text in: a text model over loopback with the TEI, OpenAI and Open Inference Protocol
//! endpoints. A word tokenizer and a model whose embedding of a row is a function of its ids
//! (sum, count, first, last) make every answer checkable by hand.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use burn_serve::protocol::{JsonTensor, binary_body};
use burn_serve::{
    BatcherConfig, Client, CountTokens, DataType, Encoded, HostData, HostTensor, ModelSpec,
    RunningServer, Servable, ServeError, Server, ServerConfig, TensorSpec, TextModel, Token,
    Tokenize, Validate,
};
use hyper::Method;
use serde_json::{Value, json};

use crate::common::{post, runtime};

const CLS: i64 = 1;
const SEP: i64 = 2;
const VOCAB: i64 = 1000;
/// Tokens a text keeps, `[CLS]` and `[SEP]` included.
const MAX: usize = 6;
/// The model's id rows.
const WIDTH: usize = 8;
const KEY: &str = "s3cret";

/// Words are tokens: a word's id is 3 plus its bytes' sum modulo 900; `[CLS] words [SEP]`, cut
/// to `MAX` with `[SEP]` kept, as BERT's tokenizers cut.
struct Words;

fn word_id(word: &str) -> i64 {
    3 + word.bytes().map(i64::from).sum::<i64>() % 900
}

impl Tokenize for Words {
    fn encode(&self, text: &str) -> Result<Encoded, ServeError> {
        let words: Vec<i64> = text.split_whitespace().map(word_id).collect();
        let truncated = words.len() + 2 > MAX;
        let mut ids = vec![CLS];
        ids.extend(words.iter().take(MAX - 2));
        ids.push(SEP);
        Ok(Encoded { ids, truncated })
    }

    fn tokens(&self, text: &str, add_special_tokens: bool) -> Result<Vec<Token>, ServeError> {
        let special = |id: i64, text: &str| Token {
            id,
            text: text.into(),
            special: true,
            start: None,
            stop: None,
        };
        let mut tokens = Vec::new();
        if add_special_tokens {
            tokens.push(special(CLS, "[CLS]"));
        }
        let mut at = 0;
        for word in text.split_whitespace() {
            let start = at + text[at..].find(word).expect("the word is there");
            at = start + word.len();
            tokens.push(Token {
                id: word_id(word),
                text: word.into(),
                special: false,
                start: Some(start),
                stop: Some(at),
            });
        }
        if add_special_tokens {
            tokens.push(special(SEP, "[SEP]"));
        }
        Ok(tokens)
    }

    fn max_length(&self) -> usize {
        MAX
    }
}

/// Each row of ids (padded with 0) to `[sum, count, first, last]` of its real ids; records each
/// batch's rows and real tokens.
struct Bag {
    batches: Arc<Mutex<Vec<(usize, usize)>>>,
}

fn real(row: &[i64]) -> &[i64] {
    &row[..row
        .iter()
        .rposition(|&id| id != 0)
        .map_or(0, |last| last + 1)]
}

fn bag(ids: &[i64]) -> Vec<f32> {
    let ids = real(ids);
    vec![
        ids.iter().sum::<i64>() as f32,
        ids.len() as f32,
        ids.first().copied().unwrap_or(0) as f32,
        ids.last().copied().unwrap_or(0) as f32,
    ]
}

impl Servable for Bag {
    fn infer(&mut self, batch: HostTensor) -> Result<HostTensor, ServeError> {
        let rows = batch.rows();
        let HostData::I64(ids) = batch.data() else {
            return Err(ServeError::BadRequest("INT64 ids".into()));
        };
        let tokens = ids.chunks(WIDTH).map(|row| real(row).len()).sum();
        self.batches.lock().unwrap().push((rows, tokens));
        let values = ids.chunks(WIDTH).flat_map(bag).collect();
        HostTensor::f32(rows, 4, values)
    }

    fn validator(&self) -> Option<Validate> {
        Some(Arc::new(|input: &HostTensor| match input.data() {
            HostData::I64(ids) => match ids.iter().find(|&&id| !(0..VOCAB).contains(&id)) {
                Some(id) => Err(ServeError::BadRequest(format!(
                    "id {id} is outside the vocabulary"
                ))),
                None => Ok(()),
            },
            _ => Err(ServeError::BadRequest("INT64 ids".into())),
        }))
    }

    fn token_count(&self) -> Option<CountTokens> {
        Some(Arc::new(|input: &HostTensor| match input.data() {
            HostData::I64(ids) => ids.chunks(input.row_len()).map(|row| real(row).len()).sum(),
            _ => 0,
        }))
    }
}

struct Fixture {
    server: RunningServer,
    batches: Arc<Mutex<Vec<(usize, usize)>>>,
}

const BUDGET: usize = 20;

fn start(api_key: Option<&str>, auto_truncate: bool) -> Fixture {
    let batches = Arc::new(Mutex::new(Vec::new()));
    let mut server = Server::new(ServerConfig {
        max_body_bytes: 1 << 20,
        api_key: api_key.map(String::from),
        ..ServerConfig::default()
    });
    let mut text = TextModel::new(Arc::new(Words), "words-bag");
    text.truncate = auto_truncate;
    text.max_client_batch_size = 256;
    server
        .add_text_model(
            ModelSpec {
                name: "bag".into(),
                version: "1".into(),
                platform: "test".into(),
                input: TensorSpec::rows("input_ids", DataType::Int64, &[WIDTH]),
                output: TensorSpec::rows("embeddings", DataType::Fp32, &[4]),
            },
            BatcherConfig {
                max_batch_size: 8,
                max_queue_delay: Duration::from_millis(5),
                queue_capacity: 256,
                max_batch_tokens: Some(BUDGET),
            },
            vec![Bag {
                batches: Arc::clone(&batches),
            }],
            text,
        )
        .unwrap();
    Fixture {
        server: server.start("127.0.0.1:0".parse().unwrap()).unwrap(),
        batches,
    }
}

/// `text`'s expected embedding: the bag of its ids, cut as the tokenizer cuts.
fn expected(text: &str, normalize: bool) -> Vec<f32> {
    let mut row = bag(&Words.encode(text).unwrap().ids);
    if normalize {
        let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
        row.iter_mut().for_each(|v| *v /= norm);
    }
    row
}

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}

fn close(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (g - w).abs() <= 1e-6 * (1.0 + w.abs()))
}

const TEXTS: [&str; 4] = ["a cat", "", "the quick brown fox", "Ωμέγα naïve"];

#[test]
fn text_and_ids_give_the_same_embeddings_on_every_endpoint() {
    let fixture = start(None, false);
    let addr = fixture.server.addr();
    runtime().block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        // TEI, normalized (the default) and not.
        for normalize in [true, false] {
            let (status, body) = post(
                &mut client,
                "/embed",
                json!({"inputs": TEXTS, "normalize": normalize}),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            for (text, row) in TEXTS.iter().zip(body.as_array().unwrap()) {
                assert!(
                    close(&floats(row), &expected(text, normalize)),
                    "{text}: {row}"
                );
            }
        }
        // One text, not a list.
        let (status, body) = post(&mut client, "/embed", json!({"inputs": "a cat"})).await;
        assert_eq!(status, 200);
        assert!(close(&floats(&body[0]), &expected("a cat", true)));
        // OpenAI, float and base64, with its usage.
        for format in ["float", "base64"] {
            let (status, body) = post(
                &mut client,
                "/v1/embeddings",
                json!({"input": TEXTS, "model": "bag", "encoding_format": format}),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["object"], "list");
            assert_eq!(body["model"], "bag");
            let tokens: usize = TEXTS
                .iter()
                .map(|t| Words.encode(t).unwrap().ids.len())
                .sum();
            assert_eq!(body["usage"]["prompt_tokens"], tokens);
            for (i, (text, item)) in TEXTS
                .iter()
                .zip(body["data"].as_array().unwrap())
                .enumerate()
            {
                assert_eq!(item["index"], i);
                let row = match format {
                    "float" => floats(&item["embedding"]),
                    _ => base64::engine::general_purpose::STANDARD
                        .decode(item["embedding"].as_str().unwrap())
                        .unwrap()
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                        .collect(),
                };
                assert!(close(&row, &expected(text, true)), "{format} {text}");
            }
        }
        // OpenAI's token-id inputs embed as the same ids would.
        let ids = Words.encode("a cat").unwrap().ids;
        let (status, body) = post(
            &mut client,
            "/v1/embeddings",
            json!({"input": [ids], "model": "bag"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert!(close(
            &floats(&body["data"][0]["embedding"]),
            &expected("a cat", true)
        ));
        // The Open Inference Protocol: BYTES as JSON strings, BYTES as binary data, and ids;
        // the model's own output (not normalized).
        let texts = HostTensor::texts(TEXTS);
        let (status, body) = post(
            &mut client,
            "/v2/models/bag/infer",
            json!({"inputs": [JsonTensor::from_host("text", &texts)]}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let served = floats(&body["outputs"][0]["data"]);
        let (_, outputs) = client.infer_binary("bag", "text", &texts).await.unwrap();
        let HostData::F32(binary) = outputs[0].data() else {
            panic!("FP32")
        };
        let mut rows = vec![0i64; TEXTS.len() * WIDTH];
        for (i, text) in TEXTS.iter().enumerate() {
            let ids = Words.encode(text).unwrap().ids;
            rows[i * WIDTH..i * WIDTH + ids.len()].copy_from_slice(&ids);
        }
        let ids = HostTensor::new(vec![TEXTS.len(), WIDTH], HostData::I64(rows)).unwrap();
        let (_, outputs) = client.infer_binary("bag", "input_ids", &ids).await.unwrap();
        let HostData::F32(by_ids) = outputs[0].data() else {
            panic!("FP32")
        };
        let want: Vec<f32> = TEXTS.iter().flat_map(|t| expected(t, false)).collect();
        assert!(close(&served, &want), "{served:?}");
        assert!(close(binary, &want));
        assert!(close(by_ids, &want));
        // Metadata lists both inputs.
        let answer = client.get("/v2/models/bag").await.unwrap();
        let metadata: Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(
            metadata["inputs"][1],
            json!({"name": "text", "datatype": "BYTES", "shape": [-1]})
        );
    });
    fixture.server.shutdown().unwrap();
}

#[test]
fn truncation_at_the_limit_and_by_choice() {
    let fixture = start(None, false);
    let addr = fixture.server.addr();
    let at_limit = "one two three four"; // MAX tokens with [CLS] and [SEP]
    let over = "one two three four five";
    runtime().block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        let (status, body) = post(&mut client, "/embed", json!({"inputs": [at_limit]})).await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = post(&mut client, "/embed", json!({"inputs": ["a", over]})).await;
        assert_eq!(status, 413, "{body}");
        assert_eq!(body["error_type"], "validation");
        assert!(
            body["error"].as_str().unwrap().contains("input 1"),
            "{body}"
        );
        let (status, body) = post(
            &mut client,
            "/embed",
            json!({"inputs": [over], "truncate": true}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        // Cut to the first four words, `[SEP]` kept: the limit's own embedding.
        assert!(close(&floats(&body[0]), &expected(at_limit, true)));
        let (status, body) = post(
            &mut client,
            "/v1/embeddings",
            json!({"input": over, "model": "bag"}),
        )
        .await;
        assert_eq!(status, 413, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        // Token ids longer than the limit are refused too.
        let (status, _) = post(
            &mut client,
            "/v1/embeddings",
            json!({"input": [[1, 5, 5, 5, 5, 5, 2]], "model": "bag"}),
        )
        .await;
        assert_eq!(status, 413);
    });
    fixture.server.shutdown().unwrap();
    // A server that cuts by default, unless a request refuses.
    let fixture = start(None, true);
    runtime().block_on(async {
        let mut client = Client::connect(fixture.server.addr()).await.unwrap();
        let (status, body) = post(&mut client, "/embed", json!({"inputs": [over]})).await;
        assert_eq!(status, 200, "{body}");
        assert!(close(&floats(&body[0]), &expected(at_limit, true)));
        let (status, _) = post(
            &mut client,
            "/embed",
            json!({"inputs": [over], "truncate": false}),
        )
        .await;
        assert_eq!(status, 413);
        let info: Value = serde_json::from_slice(&client.get("/info").await.unwrap().body).unwrap();
        assert_eq!(info["auto_truncate"], true);
        assert_eq!(info["max_input_length"], MAX);
        assert_eq!(info["max_batch_tokens"], BUDGET);
        assert_eq!(info["model_id"], "words-bag");
    });
    fixture.server.shutdown().unwrap();
}

/// A body with one `BYTES` tensor holding `bytes`, as binary data.
fn bytes_request(bytes: &[u8]) -> (Vec<u8>, usize) {
    let mut blob = (bytes.len() as u32).to_le_bytes().to_vec();
    blob.extend_from_slice(bytes);
    let header = json!({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
        "parameters": {"binary_data_size": blob.len()}}]});
    binary_body(&header, &[blob])
}

#[test]
fn bad_inputs_fail_with_their_own_status() {
    let fixture = start(None, false);
    let addr = fixture.server.addr();
    runtime().block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        // An empty list is refused; an empty text is its special tokens.
        let (status, body) = post(&mut client, "/embed", json!({"inputs": []})).await;
        assert_eq!(status, 400, "{body}");
        let (status, body) = post(&mut client, "/embed", json!({"inputs": [""]})).await;
        assert_eq!(status, 200);
        assert!(close(&floats(&body[0]), &expected("", true)));
        // Bytes that are not UTF-8 (only binary BYTES can carry them).
        let (body, length) = bytes_request(&[b'a', 0xff, 0xfe]);
        let answer = client
            .send_with(Method::POST, "/v2/models/bag/infer", body, Some(length))
            .await
            .unwrap();
        assert_eq!(answer.status, 400);
        assert!(
            answer.error().unwrap().contains("not UTF-8"),
            "{:?}",
            answer.error()
        );
        // A BYTES element cut short.
        let header = json!({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
            "parameters": {"binary_data_size": 6}}]});
        let (body, length) = binary_body(&header, &[vec![9, 0, 0, 0, b'a', b'b']]);
        let answer = client
            .send_with(Method::POST, "/v2/models/bag/infer", body, Some(length))
            .await
            .unwrap();
        assert_eq!(answer.status, 400);
        // 10,000 texts: over the client batch size.
        let many: Vec<String> = (0..10_000).map(|i| format!("t{i}")).collect();
        let (status, body) = post(&mut client, "/embed", json!({"inputs": many})).await;
        assert_eq!(status, 413, "{body}");
        // 10 MB: over the body limit.
        // The server answers 413 from the length header without reading the body and closes
        // the connection; a client still writing may see the close before the answer. Either
        // way the body is refused, and the next connection is served.
        let huge = "word ".repeat(2_000_000);
        let body = serde_json::to_vec(&json!({"inputs": [huge]})).unwrap();
        match client.send(Method::POST, "/embed", body).await {
            Ok(answer) => assert_eq!(answer.status, 413),
            Err(error) => assert!(matches!(error, ServeError::Io(_)), "{error}"),
        }
        // Malformed JSON, a missing field, an unknown OpenAI size.
        let answer = client
            .send(Method::POST, "/embed", b"{\"inputs\": [".to_vec())
            .await
            .unwrap();
        assert_eq!(answer.status, 400);
        let (status, body) = post(&mut client, "/v1/embeddings", json!({"input": "a"})).await;
        assert_eq!(status, 400, "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("model"));
        let (status, _) = post(
            &mut client,
            "/v1/embeddings",
            json!({"input": "a", "model": "bag", "dimensions": 2}),
        )
        .await;
        assert_eq!(status, 400);
        // The server still answers.
        let (status, _) = post(&mut client, "/embed", json!({"inputs": "a cat"})).await;
        assert_eq!(status, 200);
    });
    fixture.server.shutdown().unwrap();
}

#[test]
fn the_api_key_guards_every_endpoint_but_health() {
    let fixture = start(Some(KEY), false);
    let addr = fixture.server.addr();
    runtime().block_on(async {
        let mut anonymous = Client::connect(addr).await.unwrap();
        let mut wrong = Client::connect(addr).await.unwrap().with_api_key("guess");
        let mut right = Client::connect(addr).await.unwrap().with_api_key(KEY);
        for client in [&mut anonymous, &mut wrong] {
            let (status, body) = post(client, "/embed", json!({"inputs": "a"})).await;
            assert_eq!(status, 401);
            assert_eq!(body["error_type"], "unauthorized");
            let (status, body) = post(
                client,
                "/v1/embeddings",
                json!({"input": "a", "model": "bag"}),
            )
            .await;
            assert_eq!(status, 401);
            assert_eq!(body["error"]["type"], "authentication_error");
            assert_eq!(client.get("/v2/models/bag").await.unwrap().status, 401);
            assert_eq!(client.get("/metrics").await.unwrap().status, 401);
            assert_eq!(client.get("/health").await.unwrap().status, 200);
            assert_eq!(client.get("/v2/health/ready").await.unwrap().status, 200);
        }
        let (status, _) = post(&mut right, "/embed", json!({"inputs": "a"})).await;
        assert_eq!(status, 200);
        assert_eq!(right.get("/v2/models/bag").await.unwrap().status, 200);
        let models: Value =
            serde_json::from_slice(&right.get("/v1/models").await.unwrap().body).unwrap();
        assert_eq!(models["data"][0]["id"], "bag");
    });
    fixture.server.shutdown().unwrap();
}

#[test]
fn tokenize_answers_each_token_with_its_bytes() {
    let fixture = start(None, false);
    runtime().block_on(async {
        let mut client = Client::connect(fixture.server.addr()).await.unwrap();
        let (status, body) = post(
            &mut client,
            "/tokenize",
            json!({"inputs": ["a  naïve cat"]}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let tokens: Vec<Token> = serde_json::from_value(body[0].clone()).unwrap();
        assert_eq!(tokens.len(), 5);
        assert!(tokens[0].special && tokens[4].special);
        assert_eq!(
            (tokens[2].text.as_str(), tokens[2].start, tokens[2].stop),
            ("naïve", Some(3), Some(9))
        );
        let (_, body) = post(
            &mut client,
            "/tokenize",
            json!({"inputs": "a b c d e f g", "add_special_tokens": false}),
        )
        .await;
        // Uncut: seven words.
        assert_eq!(body[0].as_array().unwrap().len(), 7);
    });
    fixture.server.shutdown().unwrap();
}

#[test]
fn many_texts_batch_within_rows_and_tokens_and_bad_ids_fail_alone() {
    let fixture = start(None, false);
    let addr: SocketAddr = fixture.server.addr();
    let texts: Vec<String> = (0..100)
        .map(|i| {
            (0..(i % 5))
                .map(|w| format!("w{i}x{w}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    runtime().block_on(async {
        // One request of 100 texts, and beside it users sending good texts and bad ids.
        let big = {
            let texts = texts.clone();
            tokio::spawn(async move {
                let mut client = Client::connect(addr).await.unwrap();
                post(
                    &mut client,
                    "/embed",
                    json!({"inputs": texts, "normalize": false}),
                )
                .await
            })
        };
        let users: Vec<_> = (0..12)
            .map(|i| {
                tokio::spawn(async move {
                    let mut client = Client::connect(addr).await.unwrap();
                    let input = if i % 4 == 3 {
                        json!({"input": [[CLS, VOCAB + 7, SEP]], "model": "bag"})
                    } else {
                        json!({"input": format!("user {i}"), "model": "bag"})
                    };
                    (i, post(&mut client, "/v1/embeddings", input).await)
                })
            })
            .collect();
        let (status, body) = big.await.unwrap();
        assert_eq!(status, 200, "{body}");
        for (text, row) in texts.iter().zip(body.as_array().unwrap()) {
            assert!(close(&floats(row), &expected(text, false)), "{text}");
        }
        for user in users {
            let (i, (status, body)) = user.await.unwrap();
            if i % 4 == 3 {
                assert_eq!(status, 400, "{body}");
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("vocabulary")
                );
            } else {
                assert_eq!(status, 200, "user {i}: {body}");
                let want = expected(&format!("user {i}"), true);
                assert!(close(&floats(&body["data"][0]["embedding"]), &want));
            }
        }
    });
    let batches = fixture.batches.lock().unwrap().clone();
    assert!(batches.len() >= 100 * 3 / BUDGET, "{batches:?}");
    assert!(
        batches
            .iter()
            .all(|&(rows, tokens)| rows <= 8 && tokens <= BUDGET),
        "{batches:?}"
    );
    fixture.server.shutdown().unwrap();
}
