//! The protocol's JSON: the specification's examples round-trip, and tensors convert to and
//! from host tensors with every malformation refused.

use burn_serve::protocol::{
    InferRequest, InferResponse, JsonTensor, ModelMetadata, ServerMetadata, binary_body,
    host_tensors, split_body,
};
use burn_serve::{DataType, HostData, HostTensor, ModelSpec, ServeError, TensorSpec};
use serde_json::{Value, json};

/// The Open Inference Protocol's REST examples (KServe's "V2 inference protocol" page): an
/// inference request, its response, model metadata and server metadata.
fn spec_examples() -> [(Value, &'static str); 4] {
    [
        (
            json!({
                "id": "42",
                "inputs": [
                    {"name": "input0", "shape": [2, 2], "datatype": "UINT32", "data": [1, 2, 3, 4]},
                    {"name": "input1", "shape": [3], "datatype": "BOOL", "data": [true]}
                ],
                "outputs": [{"name": "output0"}]
            }),
            "request",
        ),
        (
            json!({
                "id": "42",
                "model_name": "mymodel",
                "outputs": [
                    {"name": "output0", "shape": [3, 2], "datatype": "FP32", "data": [1.0, 1.1, 2.0, 2.1, 3.0, 3.1]}
                ]
            }),
            "response",
        ),
        (
            json!({
                "name": "mymodel",
                "versions": ["1"],
                "platform": "pytorch_torchscript",
                "inputs": [{"name": "input0", "datatype": "FP32", "shape": [-1, 3]}],
                "outputs": [{"name": "output0", "datatype": "FP32", "shape": [-1, 2]}]
            }),
            "model",
        ),
        (
            json!({"name": "triton", "version": "2.0.0", "extensions": []}),
            "server",
        ),
    ]
}

#[test]
fn specification_examples_round_trip() {
    for (example, kind) in spec_examples() {
        let back = match kind {
            "request" => serde_json::to_value(
                serde_json::from_value::<InferRequest>(example.clone()).unwrap(),
            ),
            "response" => serde_json::to_value(
                serde_json::from_value::<InferResponse>(example.clone()).unwrap(),
            ),
            "model" => serde_json::to_value(
                serde_json::from_value::<ModelMetadata>(example.clone()).unwrap(),
            ),
            _ => serde_json::to_value(
                serde_json::from_value::<ServerMetadata>(example.clone()).unwrap(),
            ),
        }
        .unwrap();
        assert_eq!(back, example, "{kind}");
    }
    // The example's datatypes are not ones this server serves: a typed refusal.
    let request: InferRequest = serde_json::from_value(spec_examples()[0].0.clone()).unwrap();
    let error = request.inputs[0].to_host().unwrap_err();
    assert!(
        matches!(error, ServeError::BadRequest(ref m) if m.contains("UINT32")),
        "{error}"
    );
    // The example's FP32 output reads as a [3, 2] tensor.
    let response: InferResponse = serde_json::from_value(spec_examples()[1].0.clone()).unwrap();
    let output = response.outputs[0].to_host().unwrap();
    assert_eq!(output.shape(), &[3, 2]);
    assert_eq!(
        output.data(),
        &HostData::F32(vec![1.0, 1.1, 2.0, 2.1, 3.0, 3.1])
    );
}

fn tensor(value: Value) -> JsonTensor {
    serde_json::from_value(value).unwrap()
}

#[test]
fn nested_data_equals_flat_data() {
    let flat = tensor(
        json!({"name": "x", "shape": [2, 3], "datatype": "INT64", "data": [1, 2, 3, 4, 5, 6]}),
    );
    let nested = tensor(
        json!({"name": "x", "shape": [2, 3], "datatype": "INT64", "data": [[1, 2, 3], [4, 5, 6]]}),
    );
    assert_eq!(flat.to_host().unwrap(), nested.to_host().unwrap());
    assert_eq!(
        flat.to_host().unwrap().data(),
        &HostData::I64(vec![1, 2, 3, 4, 5, 6])
    );
    // And a host tensor comes back as it went.
    let host = HostTensor::f32(2, 2, vec![0.5, -1.25, 3.0, 1e-3]).unwrap();
    assert_eq!(JsonTensor::from_host("y", &host).to_host().unwrap(), host);
}

#[test]
fn malformed_tensors_are_refused() {
    let cases = [
        (
            json!({"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5]}),
            "holds 6 elements",
        ),
        (
            json!({"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, "a"]}),
            "not a number",
        ),
        (
            json!({"name": "x", "shape": [1, 2], "datatype": "INT64", "data": [1, 1.5]}),
            "not INT64",
        ),
        (
            json!({"name": "x", "shape": [1, 1], "datatype": "FP32", "data": 3}),
            "must be an array",
        ),
        (
            json!({"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1e300]}),
            "not FP32",
        ),
        (
            json!({"name": "x", "shape": [], "datatype": "FP32", "data": []}),
            "batch dimension",
        ),
        (
            json!({"name": "x", "shape": [1, 1], "datatype": "FP16", "data": [1]}),
            "FP16",
        ),
    ];
    for (value, message) in cases {
        let error = tensor(value.clone()).to_host().unwrap_err();
        assert!(
            matches!(error, ServeError::BadRequest(ref m) if m.contains(message)),
            "{value}: {error}"
        );
    }
}

#[test]
fn requests_are_checked_against_the_model() {
    let spec = ModelSpec {
        name: "m".into(),
        version: "1".into(),
        platform: "burn-flex".into(),
        input: TensorSpec::rows("x", DataType::Fp32, &[3]),
        output: TensorSpec::rows("y", DataType::Fp32, &[2]),
    };
    let request = |input: Value, outputs: Value| -> InferRequest {
        serde_json::from_value(json!({"inputs": [input], "outputs": outputs})).unwrap()
    };
    let good =
        json!({"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]});
    assert_eq!(
        request(good.clone(), json!(null))
            .input_for(&spec, &[])
            .unwrap()
            .rows(),
        2
    );
    assert_eq!(
        request(good.clone(), json!([{"name": "y"}]))
            .input_for(&spec, &[])
            .unwrap()
            .rows(),
        2
    );
    let cases = [
        (
            request(good.clone(), json!([{"name": "z"}])),
            "unknown output 'z'",
        ),
        (
            request(
                json!({"name": "w", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}),
                json!(null),
            ),
            "unknown input 'w'",
        ),
        (
            request(
                json!({"name": "x", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]}),
                json!(null),
            ),
            "datatype INT64",
        ),
        (
            request(
                json!({"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}),
                json!(null),
            ),
            "shape [1, 4]",
        ),
        (
            request(
                json!({"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}),
                json!(null),
            ),
            "shape [3]",
        ),
    ];
    for (request, message) in cases {
        let error = request.input_for(&spec, &[]).unwrap_err();
        assert!(
            matches!(error, ServeError::BadRequest(ref m) if m.contains(message)),
            "{error}"
        );
    }
    let two: InferRequest =
        serde_json::from_value(json!({"inputs": [good.clone(), good]})).unwrap();
    assert!(two.input_for(&spec, &[]).is_err());
    let timeout: InferRequest =
        serde_json::from_value(json!({"parameters": {"timeout": 1500}, "inputs": []})).unwrap();
    assert_eq!(timeout.timeout_micros().unwrap(), Some(1500));
    let bad: InferRequest =
        serde_json::from_value(json!({"parameters": {"timeout": "soon"}, "inputs": []})).unwrap();
    assert!(bad.timeout_micros().is_err());
}

/// The binary tensor data extension: bytes after the JSON part, in input order, equal to the
/// same tensors in JSON; every size mismatch refused.
#[test]
fn binary_data_round_trips() {
    let x = HostTensor::f32(2, 3, vec![0.5, -1.25, 3.0, 1e-3, f32::MIN_POSITIVE, 7.0]).unwrap();
    let ids = HostTensor::new(vec![1, 2], HostData::I64(vec![i64::MAX, -3])).unwrap();
    let (tx, bx) = JsonTensor::binary_from_host("x", &x);
    let (tids, bids) = JsonTensor::binary_from_host("ids", &ids);
    assert_eq!(bx.len(), 24);
    let json = JsonTensor::from_host("plain", &x);
    let request = InferRequest {
        id: None,
        parameters: Some(json!({"binary_data_output": true})),
        inputs: vec![tx, json, tids],
        outputs: None,
    };
    assert!(request.wants_binary_output());
    let (body, length) = binary_body(&request, &[bx.clone(), bids.clone()]);
    let (head, binary) = split_body(&body, Some(length)).unwrap();
    let parsed: InferRequest = serde_json::from_slice(head).unwrap();
    assert_eq!(
        parsed.inputs[0].data,
        Value::Null,
        "binary tensors carry no data"
    );
    let tensors = host_tensors(&parsed.inputs, binary).unwrap();
    assert_eq!(tensors, vec![x.clone(), x.clone(), ids]);

    // Too few bytes, bytes left over, a size that is not whole elements, a header past the end.
    let short = host_tensors(&parsed.inputs, &binary[..binary.len() - 1]).unwrap_err();
    assert!(
        matches!(short, ServeError::BadRequest(ref m) if m.contains("declares 16 bytes")),
        "{short}"
    );
    let mut long = binary.to_vec();
    long.push(0);
    let extra = host_tensors(&parsed.inputs, &long).unwrap_err();
    assert!(
        matches!(extra, ServeError::BadRequest(ref m) if m.contains("1 bytes")),
        "{extra}"
    );
    let (odd, _) = JsonTensor::binary_from_host("x", &x);
    let odd = JsonTensor {
        parameters: Some(json!({"binary_data_size": 23})),
        ..odd
    };
    assert!(host_tensors(&[odd], &bx[..23]).is_err());
    assert!(split_body(&body, Some(body.len() + 1)).is_err());
    let plain: InferRequest = serde_json::from_value(json!({"inputs": []})).unwrap();
    assert!(!plain.wants_binary_output());
    let per_output: InferRequest = serde_json::from_value(
        json!({"inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": true}}]}),
    )
    .unwrap();
    assert!(per_output.wants_binary_output());
}
