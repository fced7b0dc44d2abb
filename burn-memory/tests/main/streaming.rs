//! Streaming inference from host data (`StreamingForward`): it equals whole-input inference on
//! Flex, NdArray and Wgpu, for odd row counts and a model it was not written for, holds a
//! bounded number of chunks, and fails with typed errors.

use std::cell::Cell;
use std::rc::Rc;

use burn::backend::{Flex, NdArray, Wgpu};
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{AdaptiveAvgPool2d, AdaptiveAvgPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, Tolerance};
use burn_memory::{
    DeviceMemory, MemoryCap, MemoryError, MemoryTracker, StreamingForward, chunked_forward,
    stream_forward,
};

/// Two linear layers with a ReLU between them.
#[derive(Module, Debug)]
pub(crate) struct Mlp<B: Backend> {
    hidden: Linear<B>,
    output: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    pub(crate) fn new(input: usize, hidden: usize, output: usize, device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(input, hidden).init(device),
            output: LinearConfig::new(hidden, output).init(device),
        }
    }

    pub(crate) fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.output.forward(relu(self.hidden.forward(x)))
    }
}

/// A small convolutional network with batch norm (inference mode: these backends have no
/// autodiff, so it normalises with its running statistics), images `[n, 3, 8, 8]` to logits
/// `[n, 10]`: rank 4 in, rank 2 out.
#[derive(Module, Debug)]
struct ConvNet<B: Backend> {
    conv: Conv2d<B>,
    norm: BatchNorm<B>,
    pool: AdaptiveAvgPool2d,
    head: Linear<B>,
}

impl<B: Backend> ConvNet<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            conv: Conv2dConfig::new([3, 8], [3, 3])
                .with_padding(PaddingConfig2d::Same)
                .init(device),
            norm: BatchNormConfig::new(8).init(device),
            pool: AdaptiveAvgPool2dConfig::new([1, 1]).init(),
            head: LinearConfig::new(8, 10).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = relu(self.norm.forward(self.conv.forward(x)));
        self.head.forward(self.pool.forward(x).flatten(1, 3))
    }
}

/// Host rows of `width` values, different in every row so that a mixed-up order shows.
pub(crate) fn host_rows(rows: usize, width: usize) -> TensorData {
    let values = (0..rows * width)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    TensorData::new(values, [rows, width])
}

/// `StreamingForward::forward` equals the whole input's forward and `chunked_forward`, for
/// chunk sizes that divide the rows or not, a chunk larger than the input, and each of the
/// row counts `row_counts`.
pub(crate) fn stream_equals_whole_input<B: DeviceMemory>(device: &B::Device, row_counts: &[usize]) {
    let model = Mlp::<B>::new(20, 32, 7, device);
    let forward = |x: Tensor<B, 2>| model.forward(x);
    for &rows in row_counts {
        let input = host_rows(rows, 20);
        let x = Tensor::<B, 2>::from_data(input.clone(), device);
        let whole = forward(x.clone()).into_data();
        let chunked = chunked_forward(x, 128, forward).unwrap().into_data();
        for chunk in [128, 1, 1001, 5000] {
            if rows > 100 && chunk == 1 {
                continue; // 1001 uploads of one row say nothing more than 128's.
            }
            let streamed = StreamingForward::<B>::new(device, chunk)
                .forward(input.clone(), forward)
                .unwrap();
            assert_eq!(streamed.shape.as_slice(), &[rows, 7], "chunk {chunk}");
            streamed.assert_approx_eq::<f32>(&whole, Tolerance::absolute(1e-5));
            streamed.assert_approx_eq::<f32>(&chunked, Tolerance::absolute(1e-5));
        }
        // One in flight (no overlap) gives the same rows.
        let serial = StreamingForward::<B>::new(device, 100)
            .with_in_flight(1)
            .forward(input.clone(), forward)
            .unwrap();
        serial.assert_approx_eq::<f32>(&whole, Tolerance::absolute(1e-5));
        let function = stream_forward::<B, 2, 2>(input, device, 333, forward).unwrap();
        function.assert_approx_eq::<f32>(&whole, Tolerance::absolute(1e-5));
    }
}

/// A model the streaming was not written for: images in, logits out, batch norm on its running
/// statistics (a forward that mixed rows, like batch norm in training mode, would differ).
pub(crate) fn stream_runs_a_conv_net<B: DeviceMemory>(device: &B::Device) {
    let model = ConvNet::<B>::new(device);
    let values = (0..77 * 3 * 8 * 8)
        .map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0)
        .collect();
    let input = TensorData::new(values, [77, 3, 8, 8]);
    let whole = model
        .forward(Tensor::from_data(input.clone(), device))
        .into_data();
    let streamed = StreamingForward::<B>::new(device, 16)
        .forward(input, |x: Tensor<B, 4>| model.forward(x))
        .unwrap();
    assert_eq!(streamed.shape.as_slice(), &[77, 10]);
    streamed.assert_approx_eq::<f32>(&whole, Tolerance::absolute(1e-4));
}

/// An iterator of host chunks of any size: one output per chunk, in order, the source pulled
/// lazily (at most `in_flight` device chunks ahead of the outputs taken), chunks longer than
/// `chunk_size` run in pieces and joined.
pub(crate) fn stream_yields_one_output_per_chunk_and_pulls_lazily<B: DeviceMemory>(
    device: &B::Device,
) {
    let model = Mlp::<B>::new(12, 16, 5, device);
    let sizes = [3usize, 300, 0, 1, 129, 64];
    let total: usize = sizes.iter().sum();
    let all = host_rows(total, 12);
    let whole = model
        .forward(Tensor::from_data(all.clone(), device))
        .into_data()
        .to_vec::<f32>()
        .unwrap();
    let values = all.to_vec::<f32>().unwrap();
    let mut start = 0;
    let chunks: Vec<TensorData> = sizes
        .iter()
        .map(|&n| {
            let chunk = TensorData::new(values[start * 12..(start + n) * 12].to_vec(), [n, 12]);
            start += n;
            chunk
        })
        .collect();

    let pulled = Rc::new(Cell::new(0usize));
    let calls = Rc::new(Cell::new(0usize));
    let source = {
        let pulled = pulled.clone();
        chunks
            .into_iter()
            .inspect(move |_| pulled.set(pulled.get() + 1))
    };
    let streaming = StreamingForward::<B>::new(device, 64);
    let mut outputs = streaming.stream(source, |x: Tensor<B, 2>| {
        calls.set(calls.get() + 1);
        model.forward(x)
    });
    // The first output: chunk 0 (3 rows) and chunk 1's first piece are on the device, no more.
    let first = outputs.next().unwrap().unwrap();
    assert_eq!(first.shape.as_slice(), &[3, 5]);
    assert_eq!(pulled.get(), 2, "source chunks pulled for the first output");
    assert_eq!(calls.get(), 2, "forwards run for the first output");
    let mut got = first.to_vec::<f32>().unwrap();
    let mut rows = vec![3];
    for (index, output) in outputs.by_ref().enumerate() {
        let output = output.unwrap();
        rows.push(output.shape[0]);
        got.extend(output.to_vec::<f32>().unwrap());
        // Output k (k >= 1) needs the pieces up to it, and at most one more, submitted.
        let pieces_through = 1 + sizes[1..=index + 1]
            .iter()
            .map(|&n| n.div_ceil(64).max(1))
            .sum::<usize>();
        assert!(
            calls.get() <= pieces_through + 1,
            "{} forwards run for output {} (needs {pieces_through})",
            calls.get(),
            index + 1
        );
    }
    assert_eq!(rows, sizes);
    assert!(outputs.next().is_none());
    // 300 rows run as 5 pieces of 64 and 129 as 3: 1 + 5 + 1 + 1 + 3 + 1 forwards.
    assert_eq!(calls.get(), 12);
    TensorData::new(got, [total, 5]).assert_approx_eq::<f32>(
        &TensorData::new(whole, [total, 5]),
        Tolerance::absolute(1e-5),
    );
}

/// The typed errors: a zero chunk size or in-flight count, chunks whose rows change shape or
/// rank, a forward that maps n rows to m, and a cap that the chunk's upload would pass.
pub(crate) fn stream_rejects_bad_input<B: DeviceMemory>(device: &B::Device) {
    let model = Mlp::<B>::new(8, 8, 3, device);
    let forward = |x: Tensor<B, 2>| model.forward(x);
    let input = host_rows(50, 8);
    let invalid = |result: Result<TensorData, MemoryError>, says: &str| match result {
        Err(error @ MemoryError::Invalid { .. }) => {
            assert!(error.to_string().contains(says), "{error}")
        }
        other => panic!("expected an invalid-argument error, got {other:?}"),
    };
    invalid(
        StreamingForward::<B>::new(device, 0).forward(input.clone(), forward),
        "chunk size",
    );
    invalid(
        StreamingForward::<B>::new(device, 10)
            .with_in_flight(0)
            .forward(input.clone(), forward),
        "in_flight",
    );
    // The forward takes rank 2; a rank-3 host tensor is refused before any upload.
    invalid(
        StreamingForward::<B>::new(device, 10)
            .forward(TensorData::new(vec![0f32; 24], [2, 3, 4]), forward),
        "rank",
    );
    // A forward that drops rows.
    invalid(
        StreamingForward::<B>::new(device, 10)
            .forward(input.clone(), |x: Tensor<B, 2>| forward(x).narrow(0, 0, 1)),
        "rows",
    );
    // Rows that change width: the first chunk comes back, then the error, then nothing.
    let chunks = vec![host_rows(4, 8), host_rows(4, 9), host_rows(4, 8)];
    let mut outputs = StreamingForward::<B>::new(device, 10).stream(chunks, forward);
    assert_eq!(outputs.next().unwrap().unwrap().shape.as_slice(), &[4, 3]);
    invalid(outputs.next().unwrap(), "same");
    assert!(outputs.next().is_none(), "the stream ends after its error");

    // A cap with no room left refuses the first upload.
    let in_use = MemoryTracker::<B>::new(device).usage().unwrap().in_use;
    let cap = MemoryCap::<B>::new(device, in_use / 2);
    match StreamingForward::<B>::new(device, 10)
        .with_cap(cap)
        .forward(input, forward)
    {
        Err(MemoryError::OverCap { limit, needed, .. }) => {
            assert_eq!(limit, in_use / 2);
            assert!(needed > limit);
        }
        other => panic!("expected OverCap, got {other:?}"),
    }
}

/// The device peak of streaming a large input is a few chunks', far below the whole input's:
/// an MLP whose hidden activations (`rows × 2048` f32) dominate.
pub(crate) fn stream_peak_is_far_below_the_whole_input<B: DeviceMemory>(device: &B::Device) {
    let rows = 4096;
    let model = Mlp::<B>::new(16, 2048, 16, device);
    let input = host_rows(rows, 16);
    let tracker = MemoryTracker::<B>::new(device);
    let (whole, one_pass) = tracker
        .profile(|| {
            model
                .forward(Tensor::from_data(input.clone(), device))
                .into_data()
        })
        .unwrap();
    let streaming = StreamingForward::<B>::new(device, 256);
    let (streamed, streamed_report) = tracker
        .profile(|| {
            streaming
                .forward(input.clone(), |x: Tensor<B, 2>| model.forward(x))
                .unwrap()
        })
        .unwrap();
    streamed.assert_approx_eq::<f32>(&whole, Tolerance::absolute(1e-4));
    // The whole pass holds 32 MiB of hidden activations; two chunks of 256 rows hold 4 MiB.
    let (whole_peak, stream_peak) = (one_pass.peak_increase(), streamed_report.peak_increase());
    assert!(
        whole_peak >= 32 << 20,
        "the whole pass's peak {whole_peak} misses its 32 MiB of activations"
    );
    eprintln!("peak over before: whole input {whole_peak} B, streaming {stream_peak} B");
    assert!(
        stream_peak * 4 < whole_peak,
        "streaming peak {stream_peak} is not far below the whole input's {whole_peak}"
    );
}

#[test]
fn streaming_equals_whole_input_on_flex() {
    stream_equals_whole_input::<Flex>(&Default::default(), &[1001, 1, 0]);
}

/// Not 0 rows: NdArray 0.21's matmul divides by zero on an empty batch, in the whole-input
/// pass as in any chunk.
#[test]
fn streaming_equals_whole_input_on_ndarray() {
    stream_equals_whole_input::<NdArray>(&Default::default(), &[1001, 1]);
}

#[test]
fn streaming_equals_whole_input_on_wgpu() {
    let _device = crate::wgpu::exclusive();
    stream_equals_whole_input::<Wgpu>(&Default::default(), &[1001, 1, 0]);
}

#[test]
fn streaming_runs_a_conv_net_on_flex() {
    stream_runs_a_conv_net::<Flex>(&Default::default());
}

#[test]
fn streaming_runs_a_conv_net_on_ndarray() {
    stream_runs_a_conv_net::<NdArray>(&Default::default());
}

#[test]
fn streaming_runs_a_conv_net_on_wgpu() {
    let _device = crate::wgpu::exclusive();
    stream_runs_a_conv_net::<Wgpu>(&Default::default());
}

#[test]
fn streaming_yields_one_output_per_chunk_on_flex() {
    stream_yields_one_output_per_chunk_and_pulls_lazily::<Flex>(&Default::default());
}

#[test]
fn streaming_yields_one_output_per_chunk_on_wgpu() {
    let _device = crate::wgpu::exclusive();
    stream_yields_one_output_per_chunk_and_pulls_lazily::<Wgpu>(&Default::default());
}

#[test]
fn streaming_rejects_bad_input_on_ndarray() {
    stream_rejects_bad_input::<NdArray>(&Default::default());
}

#[test]
fn streaming_rejects_bad_input_on_wgpu() {
    let _device = crate::wgpu::exclusive();
    stream_rejects_bad_input::<Wgpu>(&Default::default());
}

#[test]
fn streaming_peak_is_far_below_the_whole_input_on_wgpu() {
    let _device = crate::wgpu::exclusive();
    stream_peak_is_far_below_the_whole_input::<Wgpu>(&Default::default());
}

/// Exact heap peaks, so in a process of its own (other tests' allocations would move them).
#[test]
fn streaming_peak_is_far_below_the_whole_input_on_flex() {
    crate::own_process::in_own_process(
        "streaming::streaming_peak_is_far_below_the_whole_input_on_flex",
        || stream_peak_is_far_below_the_whole_input::<Flex>(&Default::default()),
    );
}

/// `prefetch` yields the source's items in order from its thread, and streaming accepts it.
#[test]
fn prefetched_source_streams_the_same_rows() {
    let device = Default::default();
    let model = Mlp::<Flex>::new(6, 8, 2, &device);
    let chunks: Vec<TensorData> = (0..9).map(|i| host_rows(10 + i, 6)).collect();
    let expected: Vec<TensorData> = chunks
        .iter()
        .map(|c| {
            model
                .forward(Tensor::from_data(c.clone(), &device))
                .into_data()
        })
        .collect();
    let outputs: Vec<TensorData> = StreamingForward::<Flex>::new(&device, 4)
        .stream(burn_memory::prefetch(chunks, 2), |x: Tensor<Flex, 2>| {
            model.forward(x)
        })
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(outputs.len(), expected.len());
    for (got, want) in outputs.iter().zip(&expected) {
        got.assert_approx_eq::<f32>(want, Tolerance::absolute(1e-5));
    }
}
