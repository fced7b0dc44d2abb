//! Inference over host data, one chunk on the device at a time.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc;
use std::task::{Context, Poll, Waker};

use burn::tensor::backend::ExecutionError;
use burn::tensor::{DType, Shape, Tensor, TensorData};

use crate::{DeviceMemory, MemoryCap, MemoryError};

/// Runs a forward function over host data ([`TensorData`]) chunk by chunk, at most `in_flight`
/// chunks (2 by default) on the device: the device never holds the whole input or output, which
/// [`chunked_forward`](crate::chunked_forward) needs there.
///
/// [`forward`](Self::forward) takes a host tensor `[n, ...]` and returns `[n, ...]`;
/// [`stream`](Self::stream) takes any iterator of host chunks and yields one output per chunk.
/// On backends that queue work (`Wgpu`, `Cuda`) the device runs chunk `i + 1` while the host
/// reads chunk `i` back; on CPU backends nothing overlaps, and [`prefetch`] makes costly chunks
/// on a thread of their own. Errors: [`MemoryError::Invalid`] for chunks that disagree in shape
/// or type or a forward that changes the row count, [`MemoryError::OverCap`] past a
/// [`MemoryCap`]. The book's chapter on chunked inference has the details and an example.
#[derive(Debug, Clone)]
pub struct StreamingForward<B: DeviceMemory> {
    device: B::Device,
    chunk_size: usize,
    in_flight: usize,
    cap: Option<MemoryCap<B>>,
}

impl<B: DeviceMemory> StreamingForward<B> {
    /// Chunks of at most `chunk_size` rows on `device`, two in flight, no cap.
    pub fn new(device: &B::Device, chunk_size: usize) -> Self {
        Self {
            device: device.clone(),
            chunk_size,
            in_flight: 2,
            cap: None,
        }
    }

    /// At most `in_flight` chunks on the device at a time (2 by default: one running, one
    /// being read back). 1 waits for each chunk before uploading the next (no overlap).
    pub fn with_in_flight(mut self, in_flight: usize) -> Self {
        self.in_flight = in_flight;
        self
    }

    /// Checks `cap` before each chunk's upload: the bytes in use plus the chunk's input bytes
    /// must stay within its limit ([`MemoryCap::reserve`]).
    pub fn with_cap(mut self, cap: MemoryCap<B>) -> Self {
        self.cap = Some(cap);
        self
    }

    /// Runs `forward` over the rows of the host tensor `input` (`[n, ...]`, rank `D`) and
    /// returns the host tensor of the outputs (`[n, ...]`, rank `D2`). An empty input is one
    /// call of `forward` on the empty chunk, which gives the output's row shape.
    pub fn forward<const D: usize, const D2: usize>(
        &self,
        input: TensorData,
        forward: impl FnMut(Tensor<B, D>) -> Tensor<B, D2>,
    ) -> Result<TensorData, MemoryError> {
        check_rank::<D>(&input)?;
        let rows = input.shape[0];
        let mut outputs = self.stream(std::iter::once(input), forward);
        let output = outputs
            .next()
            .expect("one input chunk gives one output or an error")?;
        debug_assert_eq!(output.shape[0], rows);
        Ok(output)
    }

    /// Runs `forward` over each host chunk of `chunks` (rank `D`, any number of rows) and
    /// yields each chunk's host output (rank `D2`, as many rows), in order, lazily: the next
    /// chunks are pulled from `chunks` as the outputs are taken, so the source may be
    /// unbounded.
    pub fn stream<I, F, const D: usize, const D2: usize>(
        &self,
        chunks: I,
        forward: F,
    ) -> Streamed<B, I::IntoIter, F, D, D2>
    where
        I: IntoIterator<Item = TensorData>,
        F: FnMut(Tensor<B, D>) -> Tensor<B, D2>,
    {
        let error = if self.chunk_size == 0 {
            Some(MemoryError::invalid("chunk size", "0 rows"))
        } else if self.in_flight == 0 {
            Some(MemoryError::invalid("in_flight", "0 chunks"))
        } else {
            None
        };
        Streamed {
            config: self.clone(),
            source: chunks.into_iter(),
            forward,
            current: None,
            pending: VecDeque::new(),
            input_rows: None,
            output_rows: None,
            error,
            done: false,
        }
    }
}

/// Runs `forward` over the host tensor `input` in chunks of `chunk_size` rows, two on the
/// device at a time: [`StreamingForward::forward`] with its defaults.
pub fn stream_forward<B: DeviceMemory, const D: usize, const D2: usize>(
    input: TensorData,
    device: &B::Device,
    chunk_size: usize,
    forward: impl FnMut(Tensor<B, D>) -> Tensor<B, D2>,
) -> Result<TensorData, MemoryError> {
    StreamingForward::<B>::new(device, chunk_size).forward(input, forward)
}

/// Produces the items of `source` on a thread of its own, at most `depth` ahead of the
/// consumer: the preparation of chunk `i + 1` (reading, decoding, converting) overlaps the
/// forward of chunk `i`, on every backend. The thread stops when the iterator ends or the
/// returned iterator is dropped.
pub fn prefetch<I>(source: I, depth: usize) -> impl Iterator<Item = I::Item>
where
    I: IntoIterator,
    I::IntoIter: Send + 'static,
    I::Item: Send + 'static,
{
    let (sender, receiver) = mpsc::sync_channel(depth.max(1));
    let source = source.into_iter();
    std::thread::Builder::new()
        .name("burn-memory-prefetch".into())
        .spawn(move || {
            for item in source {
                if sender.send(item).is_err() {
                    break;
                }
            }
        })
        .expect("the prefetch thread starts");
    receiver.into_iter()
}

/// The host outputs of [`StreamingForward::stream`], one per input chunk.
pub struct Streamed<B: DeviceMemory, I, F, const D: usize, const D2: usize> {
    config: StreamingForward<B>,
    source: I,
    forward: F,
    /// The source chunk being uploaded, and its first row not yet uploaded.
    current: Option<(TensorData, usize)>,
    /// Chunks on the device: their read-back started, oldest first.
    pending: VecDeque<Pending>,
    /// The first chunk's row shape and element type, which every chunk must have.
    input_rows: Option<(Vec<usize>, DType)>,
    /// The first output's row shape and element type.
    output_rows: Option<(Vec<usize>, DType)>,
    /// An error to yield once what came before it has been yielded.
    error: Option<MemoryError>,
    done: bool,
}

/// A chunk whose output is being read back.
struct Pending {
    read: Pin<Box<dyn Future<Output = Result<TensorData, ExecutionError>>>>,
    ready: Option<Result<TensorData, ExecutionError>>,
    /// Whether this piece ends its source chunk.
    last: bool,
    /// The rows of its source chunk.
    chunk_rows: usize,
}

impl Pending {
    /// Starts reading `output` back: the first poll of Burn's `into_data_async` submits the
    /// copy (and, under fusion, the queued operations) to the device and returns.
    fn start<B: DeviceMemory, const D2: usize>(
        output: Tensor<B, D2>,
        last: bool,
        chunk_rows: usize,
    ) -> Self {
        let mut read: Pin<Box<dyn Future<Output = _>>> = Box::pin(output.into_data_async());
        let ready = match read.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => Some(result),
            Poll::Pending => None,
        };
        Self {
            read,
            ready,
            last,
            chunk_rows,
        }
    }

    /// Waits for the host copy.
    fn finish(self) -> Result<TensorData, MemoryError> {
        let result = match self.ready {
            Some(result) => result,
            None => burn::tensor::try_read_sync(self.read).ok_or_else(|| {
                MemoryError::Backend("this platform cannot block on a device read".into())
            })?,
        };
        result.map_err(|error| MemoryError::Backend(format!("{error:?}")))
    }
}

impl<B, I, F, const D: usize, const D2: usize> Streamed<B, I, F, D, D2>
where
    B: DeviceMemory,
    I: Iterator<Item = TensorData>,
    F: FnMut(Tensor<B, D>) -> Tensor<B, D2>,
{
    /// Uploads and submits chunks until `in_flight` are on the device or the source ends.
    fn fill(&mut self) -> Result<(), MemoryError> {
        while self.pending.len() < self.config.in_flight {
            if self.current.is_none() {
                let Some(chunk) = self.source.next() else {
                    return Ok(());
                };
                self.check_input(&chunk)?;
                self.current = Some((chunk, 0));
            }
            let chunk_rows = self.current.as_ref().map_or(0, |(chunk, _)| chunk.shape[0]);
            let (piece, last) = self.next_piece();
            self.submit(piece, last, chunk_rows)?;
        }
        Ok(())
    }

    /// The next piece of at most `chunk_size` rows of the current source chunk (the chunk
    /// itself, uncopied, when it fits), and whether it is the chunk's last.
    fn next_piece(&mut self) -> (TensorData, bool) {
        let (chunk, start) = self.current.take().expect("a current chunk");
        let rows = chunk.shape[0];
        let chunk_size = self.config.chunk_size;
        if start == 0 && rows <= chunk_size {
            return (chunk, true);
        }
        let len = chunk_size.min(rows - start);
        let row_bytes = chunk.bytes.len() / rows;
        let mut shape = chunk.shape.to_vec();
        shape[0] = len;
        let bytes = chunk.as_bytes()[start * row_bytes..(start + len) * row_bytes].to_vec();
        let piece = TensorData::from_bytes_vec(bytes, Shape::from(shape), chunk.dtype);
        let last = start + len == rows;
        if !last {
            self.current = Some((chunk, start + len));
        }
        (piece, last)
    }

    fn check_input(&mut self, chunk: &TensorData) -> Result<(), MemoryError> {
        check_rank::<D>(chunk)?;
        let rows = (chunk.shape[1..].to_vec(), chunk.dtype);
        match &self.input_rows {
            None => self.input_rows = Some(rows),
            Some(first) if *first != rows => {
                return Err(MemoryError::invalid(
                    "chunk",
                    format!(
                        "rows of shape and type {rows:?}, {first:?} in the first chunk: every \
                         chunk's rows must have the same ones"
                    ),
                ));
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Uploads one piece, submits its forward and starts its read-back.
    fn submit(
        &mut self,
        piece: TensorData,
        last: bool,
        chunk_rows: usize,
    ) -> Result<(), MemoryError> {
        if let Some(cap) = &self.config.cap {
            cap.reserve(piece.bytes.len() as u64)?;
        }
        let rows = piece.shape[0];
        let input = Tensor::<B, D>::from_data(piece, &self.config.device);
        let output = (self.forward)(input);
        let dims = output.dims();
        if dims[0] != rows {
            return Err(MemoryError::invalid(
                "forward",
                format!(
                    "returned {} rows for a chunk of {rows}: it must map rows to rows",
                    dims[0]
                ),
            ));
        }
        let out_rows = (dims[1..].to_vec(), output.dtype());
        match &self.output_rows {
            None => self.output_rows = Some(out_rows),
            Some(first) if *first != out_rows => {
                return Err(MemoryError::invalid(
                    "forward",
                    format!(
                        "returned rows of shape and type {out_rows:?}, {first:?} for the first \
                         chunk: every chunk's rows must have the same ones"
                    ),
                ));
            }
            Some(_) => {}
        }
        self.pending
            .push_back(Pending::start(output, last, chunk_rows));
        Ok(())
    }

    /// The next source chunk's output: its pieces read back, each appended to the chunk's
    /// output as it arrives (a chunk of one piece is its output, uncopied).
    fn next_output(&mut self) -> Option<Result<TensorData, MemoryError>> {
        let mut joined: Option<Joined> = None;
        loop {
            if self.error.is_none()
                && let Err(error) = self.fill()
            {
                self.error = Some(error);
            }
            let Some(pending) = self.pending.pop_front() else {
                // Nothing on the device: the source ended, or failed before this chunk.
                return self.error.take().map(Err);
            };
            let (last, chunk_rows) = (pending.last, pending.chunk_rows);
            let part = match pending.finish() {
                Ok(part) => part,
                Err(error) => return Some(Err(error)),
            };
            match joined.as_mut() {
                None if last => return Some(Ok(part)),
                None => joined = Some(Joined::new(part, chunk_rows)),
                Some(joined) => joined.push(&part),
            }
            if last {
                return joined.map(|joined| Ok(joined.finish()));
            }
        }
    }
}

/// A source chunk's output, assembled from its pieces' outputs in one buffer of the chunk's
/// final size (the pieces' row shapes and types were checked equal when they were submitted).
struct Joined {
    bytes: Vec<u8>,
    shape: Vec<usize>,
    dtype: DType,
}

impl Joined {
    fn new(first: TensorData, chunk_rows: usize) -> Self {
        let row_bytes = first.bytes.len() / first.shape[0].max(1);
        let mut bytes = Vec::with_capacity(row_bytes * chunk_rows);
        bytes.extend_from_slice(first.as_bytes());
        let mut shape = first.shape.to_vec();
        shape[0] = chunk_rows;
        Self {
            bytes,
            shape,
            dtype: first.dtype,
        }
    }

    fn push(&mut self, part: &TensorData) {
        self.bytes.extend_from_slice(part.as_bytes());
    }

    fn finish(self) -> TensorData {
        TensorData::from_bytes_vec(self.bytes, Shape::from(self.shape), self.dtype)
    }
}

impl<B, I, F, const D: usize, const D2: usize> Iterator for Streamed<B, I, F, D, D2>
where
    B: DeviceMemory,
    I: Iterator<Item = TensorData>,
    F: FnMut(Tensor<B, D>) -> Tensor<B, D2>,
{
    type Item = Result<TensorData, MemoryError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let next = self.next_output();
        if !matches!(next, Some(Ok(_))) {
            // After an error, or at the end: the chunks still on the device are dropped.
            self.done = true;
            self.pending.clear();
        }
        next
    }
}

fn check_rank<const D: usize>(data: &TensorData) -> Result<(), MemoryError> {
    if data.shape.len() != D {
        return Err(MemoryError::invalid(
            "chunk",
            format!(
                "shape {:?} has rank {}, the forward takes rank {D}",
                data.shape,
                data.shape.len()
            ),
        ));
    }
    if matches!(data.dtype, DType::QFloat(_)) {
        return Err(MemoryError::invalid(
            "chunk",
            "quantized host data cannot be cut into rows; dequantize it first",
        ));
    }
    Ok(())
}
