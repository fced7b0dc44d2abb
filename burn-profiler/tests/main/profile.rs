//! The profiler: forwarding, the table's counts, gradients under `Autodiff<Profiled<B>>`,
//! the Chrome trace's nesting, and bad input; on NdArray, Flex and Wgpu.
//!
//! One profiler runs per process, so the tests that start one hold a lock.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use burn::backend::{Autodiff, Flex, NdArray, Wgpu};
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::MaxPool2dConfig;
use burn::nn::{BatchNorm, BatchNormConfig, Dropout, DropoutConfig, Linear, LinearConfig, Relu};
use burn::tensor::activation::{gelu, sigmoid, softmax};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::cast::ToElement;
use burn::tensor::{Distribution, Int, Tensor, TensorData, Tolerance};
use burn_profiler::ProfileError;
use burn_profiler::{
    Profile, Profiled, Profiler, ProfilerConfig, RowKind, SortBy, TensorDesc, scope,
};

static PROFILER: Mutex<()> = Mutex::new(());

pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
    PROFILER.lock().unwrap_or_else(|poison| poison.into_inner())
}

fn shapes() -> ProfilerConfig {
    ProfilerConfig::new().with_record_shapes(true)
}

/// A workload over the op families a model reaches: float arithmetic and matmul, a
/// convolution and a pooling with indices, reductions, activations, int and bool ops, layout
/// ops, and a read back to the host.
fn workload<B: Backend>(device: &B::Device) -> f32 {
    let x = Tensor::<B, 4>::random([2, 3, 8, 8], Distribution::Default, device);
    let conv: Conv2d<B> = Conv2dConfig::new([3, 4], [3, 3]).init(device);
    let pool = MaxPool2dConfig::new([2, 2]).init();
    let features = pool.forward(conv.forward(x)); // [2, 4, 3, 3]
    let flat = features.reshape([2, 36]);
    let linear: Linear<B> = LinearConfig::new(36, 5).init(device);
    let logits = linear.forward(gelu(flat.clone()));
    let square = flat.clone().matmul(flat.clone().transpose()); // [2, 2]
    let probabilities = softmax(logits.clone(), 1);
    let labels = logits.clone().argmax(1).squeeze_dim::<1>(1); // int
    let shifted = labels.clone().add_scalar(1).mul_scalar(2); // int arithmetic
    let mask = probabilities.clone().greater_elem(0.2); // bool
    let kept = probabilities
        .clone()
        .mask_fill(mask.clone().bool_not(), 0.0);
    let gathered = kept.clone().gather(1, labels.clone().unsqueeze_dim::<2>(1));
    let joined = Tensor::cat(vec![kept.clone(), sigmoid(logits)], 1);
    let sliced = joined.slice([0..2, 1..4]).transpose();
    let total = sliced.sum()
        + gathered.mean()
        + shifted.float().max()
        + mask.int().float().sum()
        + square.mean();
    total.into_scalar().to_f32()
}

fn names(profile: &Profile) -> Vec<&'static str> {
    profile.ops.iter().map(|op| op.name).collect()
}

/// Every operation of the outer `Profiled` reaches the inner one under the same name, once:
/// the inner records finish first, so the recorded names come in equal pairs. A forwarding
/// that called another inner method, or a default decomposition, would break a pair.
fn forwarding_pairs<B: Backend>(device: &B::Device) {
    let _lock = exclusive();
    let profiler = Profiler::start(shapes()).unwrap();
    let value = workload::<Profiled<Profiled<B>>>(device);
    let profile = profiler.stop();
    assert!(value.is_finite());
    let names = names(&profile);
    assert!(
        names.len() >= 40,
        "only {} operations recorded",
        names.len()
    );
    for pair in names.chunks(2) {
        assert_eq!(pair.len(), 2, "an unpaired operation at the end: {pair:?}");
        assert_eq!(pair[0], pair[1], "outer and inner differ: {names:?}");
    }
    // The families the workload reaches were all recorded.
    for expected in [
        "conv2d",
        "max_pool2d",
        "linear",
        "float_matmul",
        "float_argmax",
        "int_add_scalar",
        "float_greater_elem",
        "bool_not",
        "float_gather",
        "float_cat",
        "float_into_data",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} not recorded: {names:?}"
        );
    }
}

#[test]
fn every_operation_reaches_the_inner_backend_ndarray() {
    forwarding_pairs::<NdArray>(&Default::default());
}

#[test]
fn every_operation_reaches_the_inner_backend_flex() {
    forwarding_pairs::<Flex>(&Default::default());
}

#[test]
fn every_operation_reaches_the_inner_backend_wgpu() {
    burn_memory::wgpu_adapter().expect("a wgpu adapter (Mesa's lavapipe in CI)");
    // Allocates on the device whose whole-device figures the `wgpu` module's tests read.
    let _device = crate::wgpu::exclusive();
    forwarding_pairs::<Wgpu>(&Default::default());
}

/// The results are `B`'s: the same workload gives the same value with and without the
/// profiler type.
#[test]
fn profiled_results_equal_the_inner_backends() {
    // In a process of its own: the seed fixes the draws only where no other test draws from
    // the same generator meanwhile.
    crate::own_process::in_own_process(
        "profile::profiled_results_equal_the_inner_backends",
        same_results,
    );
}

fn same_results() {
    let _lock = exclusive();
    let device = Default::default();
    <NdArray as Backend>::seed(&device, 7);
    let plain = workload::<NdArray>(&device);
    <NdArray as Backend>::seed(&device, 7);
    let profiled = workload::<Profiled<NdArray>>(&device);
    assert_eq!(plain, profiled);
}

/// A model whose training forward differs from inference (dropout, batch statistics).
#[derive(Module, Debug)]
struct Net<B: Backend> {
    first: Linear<B>,
    norm: BatchNorm<B>,
    dropout: Dropout,
    second: Linear<B>,
    relu: Relu,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            first: LinearConfig::new(12, 16).init(device),
            norm: BatchNormConfig::new(16).init(device),
            dropout: DropoutConfig::new(0.3).init(),
            second: LinearConfig::new(16, 3).init(device),
            relu: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let hidden = self.first.forward(x);
        let hidden = self
            .norm
            .forward(hidden.unsqueeze_dim::<3>(2))
            .squeeze_dim::<2>(2);
        let hidden = self.dropout.forward(self.relu.forward(hidden));
        self.second.forward(hidden)
    }
}

fn gradients<B: AutodiffBackend>(seed: u64) -> Vec<TensorData> {
    let device = Default::default();
    B::seed(&device, seed);
    let net = Net::<B>::new(&device);
    let x = Tensor::<B, 2>::random([10, 12], Distribution::Default, &device);
    let grads = net.forward(x).powi_scalar(2).mean().backward();
    vec![
        net.first.weight.grad(&grads).unwrap().into_data(),
        net.second.weight.grad(&grads).unwrap().into_data(),
        net.norm.gamma.grad(&grads).unwrap().into_data(),
    ]
}

/// `Autodiff<Profiled<B>>` trains as `Autodiff<B>` does: same dropout masks, batch
/// statistics and gradients, bit for bit; and the backward's operations are recorded.
#[test]
fn autodiff_over_profiled_gives_the_same_gradients() {
    // In a process of its own, for the same dropout masks and weights on both sides: the
    // seed fixes the draws only where no other test draws from the generator meanwhile.
    crate::own_process::in_own_process(
        "profile::autodiff_over_profiled_gives_the_same_gradients",
        same_gradients,
    );
}

fn same_gradients() {
    let _lock = exclusive();
    let plain = gradients::<Autodiff<NdArray>>(3);
    let profiler = Profiler::start(ProfilerConfig::new()).unwrap();
    let profiled = gradients::<Autodiff<Profiled<NdArray>>>(3);
    let profile = profiler.stop();
    for (plain, profiled) in plain.iter().zip(&profiled) {
        plain.assert_approx_eq::<f32>(profiled, Tolerance::absolute(0.0));
    }
    // Forward: the two layers are Burn's `linear` operation. Backward: each layer's weight
    // and bias gradients, and the input gradient of the second only (the first layer's input
    // needs none).
    let table = profile.key_averages();
    assert_eq!(table.row("linear").unwrap().calls, 2);
    assert_eq!(table.row("linear_weight_backward").unwrap().calls, 2);
    assert_eq!(table.row("linear_bias_backward").unwrap().calls, 2);
    assert_eq!(table.row("linear_x_backward").unwrap().calls, 1);
    assert_eq!(table.row("relu_backward").unwrap().calls, 1);
}

/// The table counts known work exactly: n linear layers are n calls of Burn's `linear`
/// operation, and the scopes around them are rows of their own whose self time excludes their
/// operations.
#[test]
fn the_table_counts_known_work_exactly() {
    let _lock = exclusive();
    type B = Profiled<NdArray>;
    let device = Default::default();
    let layers: Vec<Linear<B>> = (0..4)
        .map(|_| LinearConfig::new(32, 32).init(&device))
        .collect();
    let x = Tensor::<B, 2>::random([8, 32], Distribution::Default, &device);
    let profiler = Profiler::start(shapes()).unwrap();
    let mut hidden = x;
    {
        let _model = scope("model");
        for (index, layer) in layers.iter().enumerate() {
            let _layer = scope(&format!("layer {index}"));
            hidden = layer.forward(hidden);
        }
    }
    let profile = profiler.stop();
    drop(hidden);

    let table = profile.key_averages();
    let linear = table.row("linear").unwrap();
    assert_eq!(linear.calls, 4);
    assert_eq!(linear.output_bytes, 4 * 8 * 32 * 4);
    assert_eq!(table.row("model").unwrap().kind, RowKind::Scope);
    assert_eq!(table.row("layer 2").unwrap().calls, 1);
    let model = table.row("model").unwrap();
    assert!(model.self_ns < model.total_ns, "{model:?}");
    // Each layer ran inside `model` and its own scope.
    for op in profile.ops.iter().filter(|op| op.name == "linear") {
        assert_eq!(op.scopes.len(), 2, "{op:?}");
        assert_eq!(profile.scope_names[op.scopes[0] as usize], "model");
        assert_eq!(
            op.inputs,
            vec![
                TensorDesc {
                    shape: vec![8, 32],
                    dtype: burn::tensor::DType::F32
                },
                TensorDesc {
                    shape: vec![32, 32],
                    dtype: burn::tensor::DType::F32
                },
                TensorDesc {
                    shape: vec![32],
                    dtype: burn::tensor::DType::F32
                },
            ]
        );
    }
    let by_shape = profile.key_averages_by_shape();
    let row = by_shape.row("linear").unwrap();
    assert_eq!(row.shapes.as_deref(), Some("[[8, 32], [32, 32], [32]]"));

    let printed = table.clone().sorted_by(SortBy::Calls).limit(3).to_string();
    assert!(
        printed.contains("linear") && printed.contains("more rows"),
        "{printed}"
    );
    let json: serde_json::Value = serde_json::from_str(&table.to_json()).unwrap();
    assert_eq!(json["rows"].as_array().unwrap().len(), table.rows.len());
}

/// The Chrome trace is valid JSON, and on each thread its complete events nest: any two are
/// disjoint or one contains the other.
#[test]
fn chrome_trace_events_nest_per_thread() {
    let _lock = exclusive();
    type B = Autodiff<Profiled<NdArray>>;
    let device = Default::default();
    let profiler = Profiler::start(shapes()).unwrap();
    {
        let _step = scope("step");
        let _grads = {
            let _forward = scope("forward");
            let x = Tensor::<B, 2>::random([16, 8], Distribution::Default, &device).require_grad();
            x.clone().matmul(x.transpose()).tanh().sum()
        }
        .backward();
    }
    let profile = profiler.stop();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    profile.write_chrome_trace(&path).unwrap();
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let mut per_thread: HashMap<u64, Vec<(f64, f64, String)>> = HashMap::new();
    for event in events.iter().filter(|event| event["ph"] == "X") {
        let start = event["ts"].as_f64().unwrap();
        let end = start + event["dur"].as_f64().unwrap();
        let name = event["name"].as_str().unwrap().to_owned();
        per_thread
            .entry(event["tid"].as_u64().unwrap())
            .or_default()
            .push((start, end, name));
    }
    assert!(per_thread.values().map(Vec::len).sum::<usize>() >= profile.ops.len() + 2);
    for events in per_thread.values() {
        for (i, a) in events.iter().enumerate() {
            for b in &events[i + 1..] {
                let disjoint = a.1 <= b.0 || b.1 <= a.0;
                let nested = (a.0 <= b.0 && b.1 <= a.1) || (b.0 <= a.0 && a.1 <= b.1);
                assert!(disjoint || nested, "{a:?} and {b:?} overlap");
            }
        }
    }
    assert!(events.iter().any(|event| event["name"] == "float_matmul"));
}

/// Bad input gives typed errors or a clear record, never a panic inside the backend.
#[test]
fn bad_input_is_refused_or_reported() {
    let _lock = exclusive();
    match Profiler::start(ProfilerConfig::new().with_max_entries(0)) {
        Err(ProfileError::Invalid { name, .. }) => assert_eq!(name, "max_entries"),
        other => panic!("max_entries = 0: {other:?}"),
    }
    let profiler = Profiler::start(ProfilerConfig::new().with_max_entries(3)).unwrap();
    assert!(matches!(
        Profiler::start(ProfilerConfig::new()),
        Err(ProfileError::Running)
    ));
    let device = Default::default();
    let open = scope("never closed");
    let x = Tensor::<Profiled<NdArray>, 1>::ones([4], &device);
    let y = (x.clone() + x.clone()).exp() * x;
    let profile = profiler.stop();
    drop((open, y));
    assert_eq!(profile.ops.len() + profile.scopes.len(), 3);
    assert!(profile.dropped > 0);
    assert!(profile.scopes.iter().all(|scope| scope.left_open) || profile.scopes.is_empty());
    match profile.write_chrome_trace("/nonexistent-directory/trace.json") {
        Err(ProfileError::Io { path, .. }) => assert!(path.ends_with("trace.json")),
        other => panic!("an unwritable path: {other:?}"),
    }
    // A new profiler starts once the old one stopped, and a scope left open is closed and
    // marked at the stop.
    let profiler = Profiler::start(ProfilerConfig::new()).unwrap();
    let _open = scope("left open");
    let _ = Tensor::<Profiled<NdArray>, 1>::ones([2], &device).sum();
    let profile = profiler.stop();
    let scope = profile.scopes.last().unwrap();
    assert!(scope.left_open);
    assert_eq!(profile.scope_names[scope.name as usize], "left open");
}

/// With `sync_each_op`, each operation records its device time, at least its host time.
#[test]
fn sync_each_op_records_device_time_on_wgpu() {
    burn_memory::wgpu_adapter().expect("a wgpu adapter (Mesa's lavapipe in CI)");
    let _lock = exclusive();
    // Always after the profiler's lock: no test takes them the other way round.
    let _device = crate::wgpu::exclusive();
    type B = Profiled<Wgpu>;
    let device = Default::default();
    let profiler = Profiler::start(ProfilerConfig::new().with_sync_each_op(true)).unwrap();
    let x = Tensor::<B, 2>::random([64, 64], Distribution::Default, &device);
    let y = x.clone().matmul(x).int().sum();
    let _ = y.into_scalar();
    let profile = profiler.stop();
    let matmul = profile
        .ops
        .iter()
        .find(|op| op.name == "float_matmul")
        .expect("the matmul was recorded");
    let device_ns = matmul.device_ns.expect("synced after the matmul");
    assert!(device_ns >= matmul.host_ns);
    let _: Tensor<B, 1, Int> = Tensor::arange(0..3, &device);
}

/// Memory sampled after each operation follows the heap (the binary counts it exactly) and
/// names where it peaked; the last sample agrees with `MemoryTracker`. In a process of its
/// own: other tests' allocations would move the heap.
#[test]
fn memory_after_each_operation_names_the_peak() {
    crate::own_process::in_own_process(
        "profile::memory_after_each_operation_names_the_peak",
        memory_peak,
    );
}

fn memory_peak() {
    const MB: u64 = 1_000_000;
    type B = Profiled<NdArray>;
    let device = Default::default();
    let profiler = Profiler::start_with_memory::<NdArray>(ProfilerConfig::new(), &device).unwrap();
    let small = Tensor::<B, 1>::ones([16], &device);
    let total = {
        let _big = scope("big");
        // Two 8 MB tensors alive together.
        let a = Tensor::<B, 1>::ones([2_000_000], &device);
        let b = Tensor::<B, 1>::ones([2_000_000], &device);
        (a * b).sum()
    };
    let after = (small + total).sum();
    let profile = profiler.stop();
    let tracker = burn_memory::MemoryTracker::<NdArray>::new(&device);
    let now = tracker.usage().unwrap().in_use;

    let first = profile.ops.first().unwrap().memory.unwrap().in_use;
    let peak = profile.peak().expect("memory was sampled");
    assert_eq!(peak.scopes, vec!["big".to_owned()], "{peak:?}");
    assert!(
        peak.memory.in_use >= first + 16 * MB,
        "peak {} against {first} at the first operation",
        peak.memory.in_use
    );
    let last = profile.ops.last().unwrap().memory.unwrap().in_use;
    assert!(
        last.abs_diff(now) < MB / 4,
        "the last sample {last} and the tracker now {now}"
    );
    // 16 elements of 1 + 2 000 000.
    assert_eq!(after.into_scalar(), 16.0 * 2_000_001.0);
}
