//! Dynamic batching: requests queue, and a batch runs when it is full or when its oldest
//! request has waited long enough (Triton's `max_queue_delay_microseconds`, TorchServe's
//! `maxBatchDelay`).
//!
//! Each worker thread owns one model replica (one per device, or several on a CPU whose
//! backend is single-threaded); all workers take batches from one queue. The queue is bounded:
//! a full queue answers [`ServeError::Overloaded`] at once instead of growing, so a burst costs
//! latency up to the bound and memory never.
//!
//! A request is the only one to fail for its own fault: the model's [`Validate`] check runs
//! on it before it is queued, and a batch that fails anyway runs again one request at a time,
//! so each request gets its own answer (Triton, by contrast, fails the whole batch).

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::metrics::ModelMetrics;
use crate::sync::lock;
use crate::{CountTokens, HostTensor, Servable, ServeError, Validate};

/// How requests are grouped into batches.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BatcherConfig {
    /// The most rows one batch holds (and so one request). `1` turns batching off.
    pub max_batch_size: usize,
    /// How long the oldest queued request may wait for more to join its batch.
    pub max_queue_delay: Duration,
    /// The most requests waiting; one more is answered [`ServeError::Overloaded`].
    pub queue_capacity: usize,
    /// The most tokens one batch holds, as the model counts them ([`Servable::token_count`];
    /// TEI's `max_batch_tokens`): long texts make small batches and short ones large, so a
    /// batch's cost stays bounded. `None`: rows alone bound a batch.
    #[serde(default)]
    pub max_batch_tokens: Option<usize>,
}

impl Default for BatcherConfig {
    /// 32 rows, 2 ms, 1024 requests, no token budget.
    fn default() -> Self {
        Self {
            max_batch_size: 32,
            max_queue_delay: Duration::from_millis(2),
            queue_capacity: 1024,
            max_batch_tokens: None,
        }
    }
}

impl BatcherConfig {
    /// No batching: each request runs alone, as soon as a worker is free.
    pub fn unbatched() -> Self {
        Self {
            max_batch_size: 1,
            max_queue_delay: Duration::ZERO,
            ..Self::default()
        }
    }
}

type Reply = oneshot::Sender<Result<HostTensor, ServeError>>;

struct Pending {
    input: HostTensor,
    tokens: usize,
    enqueued: Instant,
    deadline: Option<Instant>,
    reply: Reply,
}

struct Queue {
    pending: VecDeque<Pending>,
    rows: usize,
    tokens: usize,
    open: bool,
}

struct Shared {
    config: BatcherConfig,
    queue: Mutex<Queue>,
    work: Condvar,
    metrics: ModelMetrics,
    validate: Option<Validate>,
    count_tokens: Option<CountTokens>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A worker never panics while holding the lock (the model runs outside it).
        lock(&self.queue)
    }
}

/// A queue of requests served in batches by one worker thread per model replica: a batch runs
/// when it holds `max_batch_size` rows or its oldest request has waited `max_queue_delay`
/// ([`BatcherConfig`]), so that a model runs on batches without its callers coordinating. The
/// queue is bounded ([`ServeError::Overloaded`]), a request that fails the model's
/// [`Validate`] check is refused before it joins a batch, a batch that fails anyway is run
/// again one request at a time (a panicking model included), and [`shutdown`](Self::shutdown) answers every accepted request. The [`Server`] runs
/// one per model; an example without it is in the book's chapter "Serving a model".
///
/// [`Server`]: crate::Server
pub struct Batcher {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("config", &self.shared.config)
            .field("queued", &self.queue_depth())
            .finish()
    }
}

/// The answer to one submitted request, once its batch has run.
#[derive(Debug)]
pub struct Ticket(oneshot::Receiver<Result<HostTensor, ServeError>>);

impl Ticket {
    /// Blocks until the answer arrives (not from inside an async runtime: use
    /// [`Ticket::result`] there).
    pub fn wait(self) -> Result<HostTensor, ServeError> {
        self.0
            .blocking_recv()
            .unwrap_or(Err(ServeError::ShuttingDown))
    }

    /// Waits for the answer without blocking the async runtime.
    pub async fn result(self) -> Result<HostTensor, ServeError> {
        self.0.await.unwrap_or(Err(ServeError::ShuttingDown))
    }
}

impl Batcher {
    /// Starts one worker thread per replica, without metrics.
    pub fn new<S: Servable>(config: BatcherConfig, replicas: Vec<S>) -> Result<Self, ServeError> {
        Self::with_metrics(config, replicas, ModelMetrics::default())
    }

    /// Starts one worker thread per replica, recording batch sizes and compute times in
    /// `metrics`.
    pub fn with_metrics<S: Servable>(
        config: BatcherConfig,
        replicas: Vec<S>,
        metrics: ModelMetrics,
    ) -> Result<Self, ServeError> {
        if config.max_batch_size == 0 {
            return Err(ServeError::invalid("max_batch_size", "0 rows"));
        }
        if config.queue_capacity == 0 {
            return Err(ServeError::invalid("queue_capacity", "0 requests"));
        }
        if config.max_batch_tokens == Some(0) {
            return Err(ServeError::invalid("max_batch_tokens", "0 tokens"));
        }
        let Some(first) = replicas.first() else {
            return Err(ServeError::invalid("replicas", "no model replica to run"));
        };
        let validate = first.validator();
        let count_tokens = first.token_count();
        let shared = Arc::new(Shared {
            config,
            queue: Mutex::new(Queue {
                pending: VecDeque::new(),
                rows: 0,
                tokens: 0,
                open: true,
            }),
            work: Condvar::new(),
            metrics,
            validate,
            count_tokens,
        });
        let workers = replicas
            .into_iter()
            .enumerate()
            .map(|(index, replica)| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("burn-serve-worker-{index}"))
                    .spawn(move || work(&shared, replica))
                    .map_err(|error| ServeError::Io(format!("cannot start a worker: {error}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            shared,
            workers: Mutex::new(workers),
        })
    }

    /// The batching settings.
    pub fn config(&self) -> &BatcherConfig {
        &self.shared.config
    }

    /// Requests waiting for a batch.
    pub fn queue_depth(&self) -> usize {
        self.shared.lock().pending.len()
    }

    /// Queues `input` (`[rows, ...]`). Fails at once when the request has no rows, more than
    /// `max_batch_size` or more tokens than `max_batch_tokens`, fails the model's [`Validate`]
    /// check, the queue is full, or the batcher is shutting down. A request still
    /// queued at its `deadline` is answered [`ServeError::DeadlineExceeded`] without running.
    pub fn submit(
        &self,
        input: HostTensor,
        deadline: Option<Instant>,
    ) -> Result<Ticket, ServeError> {
        let rows = input.rows();
        let max = self.shared.config.max_batch_size;
        if rows == 0 {
            return Err(ServeError::bad("the request has no rows"));
        }
        if rows > max {
            return Err(ServeError::TooLarge { rows, max });
        }
        if let Some(validate) = &self.shared.validate {
            validate(&input)?;
        }
        let tokens = self.tokens(&input);
        if let Some(budget) = self.shared.config.max_batch_tokens
            && tokens > budget
        {
            return Err(ServeError::TooManyTokens {
                tokens,
                max: budget,
            });
        }
        let (reply, answer) = oneshot::channel();
        let mut queue = self.shared.lock();
        if !queue.open {
            return Err(ServeError::ShuttingDown);
        }
        if queue.pending.len() >= self.shared.config.queue_capacity {
            return Err(ServeError::Overloaded {
                capacity: self.shared.config.queue_capacity,
            });
        }
        queue.rows += rows;
        queue.tokens += tokens;
        queue.pending.push_back(Pending {
            input,
            tokens,
            enqueued: Instant::now(),
            deadline,
            reply,
        });
        // A worker needs waking only to start a batch's clock or to take a full batch; in
        // between, the one waiting for the batch to fill would wake and sleep again for nothing.
        let wake = queue.pending.len() == 1 || is_full(&self.shared.config, &queue);
        drop(queue);
        if wake {
            self.shared.work.notify_one();
        }
        Ok(Ticket(answer))
    }

    /// The tokens of `input` as the model counts them ([`Servable::token_count`]); without a
    /// count, its elements.
    pub fn tokens(&self, input: &HostTensor) -> usize {
        match &self.shared.count_tokens {
            Some(count) => count(input),
            None => input.data().len(),
        }
    }

    /// Stops accepting requests, lets the workers finish every accepted one, and waits for
    /// them. Calling it again does nothing.
    pub fn shutdown(&self) {
        self.shared.lock().open = false;
        self.shared.work.notify_all();
        let workers = std::mem::take(&mut *lock(&self.workers));
        for worker in workers {
            if worker.join().is_err() {
                tracing::warn!("a burn-serve worker thread panicked");
            }
        }
    }
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// One worker: take a batch, run it on the replica, answer each request with its rows.
fn work<S: Servable>(shared: &Shared, mut replica: S) {
    while let Some(batch) = next_batch(shared) {
        let now = Instant::now();
        let (live, expired): (Vec<Pending>, Vec<Pending>) = batch
            .into_iter()
            .partition(|pending| pending.deadline.is_none_or(|deadline| deadline > now));
        for pending in expired {
            let waited_ms = now.duration_since(pending.enqueued).as_secs_f64() * 1e3;
            let _ = pending
                .reply
                .send(Err(ServeError::DeadlineExceeded { waited_ms }));
        }
        if live.is_empty() {
            continue;
        }
        let sizes: Vec<usize> = live.iter().map(|pending| pending.input.rows()).collect();
        let (inputs, replies): (Vec<HostTensor>, Vec<Reply>) = live
            .into_iter()
            .map(|pending| (pending.input, pending.reply))
            .unzip();
        let rows: usize = sizes.iter().sum();
        let started = Instant::now();
        // A copy of the requests only where a retry may need them: a batch of one has none.
        let retry = (inputs.len() > 1).then(|| inputs.clone());
        let outputs = run(&mut replica, inputs, &sizes);
        shared
            .metrics
            .observe_batch(rows, started.elapsed().as_secs_f64());
        let answers = match (outputs, retry) {
            (Ok(outputs), _) => outputs.into_iter().map(Ok).collect(),
            (Err(error), Some(inputs)) => {
                // Whatever failed the batch may be one request's: each runs alone now, so that
                // only the requests that fail by themselves fail.
                tracing::warn!(
                    "a batch of {rows} rows failed ({error}); running its {} requests one by one",
                    inputs.len()
                );
                shared.metrics.observe_retry();
                inputs
                    .into_iter()
                    .map(|input| {
                        let rows = input.rows();
                        run(&mut replica, vec![input], &[rows])
                            .map(|mut output| output.pop().expect("one request, one output"))
                    })
                    .collect()
            }
            (Err(error), None) => vec![Err(error)],
        };
        if let Some(bytes) = replica.memory_in_use() {
            shared.metrics.set_memory_in_use(bytes);
        }
        for (reply, answer) in replies.into_iter().zip(answers) {
            if let Err(error) = &answer {
                tracing::warn!("a request of the batch failed: {error}");
            }
            // A client that gave up (timed out, disconnected) dropped its receiver.
            let _ = reply.send(answer);
        }
    }
}

/// Runs `inputs` as one batch on `replica` and splits its output into `sizes` rows each; a
/// panic in the model is an error.
fn run<S: Servable>(
    replica: &mut S,
    inputs: Vec<HostTensor>,
    sizes: &[usize],
) -> Result<Vec<HostTensor>, ServeError> {
    HostTensor::concat(inputs).and_then(|batch| {
        std::panic::catch_unwind(AssertUnwindSafe(|| replica.infer(batch)))
            .unwrap_or_else(|panic| Err(ServeError::Model(panic_message(&panic))))
            .and_then(|output| output.split(sizes))
    })
}

/// Whether the queue holds a full batch: `max_batch_size` rows or `max_batch_tokens` tokens.
fn is_full(config: &BatcherConfig, queue: &Queue) -> bool {
    queue.rows >= config.max_batch_size
        || config
            .max_batch_tokens
            .is_some_and(|budget| queue.tokens >= budget)
}

/// Waits for a batch: returns once `max_batch_size` rows are queued, the oldest request has
/// waited `max_queue_delay`, or the batcher is closing (then without waiting). `None` when the
/// batcher is closed and drained.
fn next_batch(shared: &Shared) -> Option<Vec<Pending>> {
    let config = &shared.config;
    let mut queue = shared.lock();
    loop {
        let Some(oldest) = queue.pending.front() else {
            if !queue.open {
                return None;
            }
            queue = shared
                .work
                .wait(queue)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            continue;
        };
        let due = oldest.enqueued + config.max_queue_delay;
        let now = Instant::now();
        if is_full(config, &queue) || now >= due || !queue.open {
            break;
        }
        queue = shared
            .work
            .wait_timeout(queue, due - now)
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .0;
    }
    let mut batch = Vec::new();
    let (mut rows, mut tokens) = (0, 0);
    while let Some(next) = queue.pending.front() {
        let next_rows = next.input.rows();
        let over_budget = config
            .max_batch_tokens
            .is_some_and(|budget| tokens + next.tokens > budget);
        // A request fits any empty batch: submit refused those over either bound.
        if !batch.is_empty() && (rows + next_rows > config.max_batch_size || over_budget) {
            break;
        }
        rows += next_rows;
        tokens += next.tokens;
        batch.push(queue.pending.pop_front().expect("front exists"));
    }
    queue.rows -= rows;
    queue.tokens -= tokens;
    let more = !queue.pending.is_empty();
    drop(queue);
    if more {
        // Another worker may start on what is left.
        shared.work.notify_one();
    }
    Some(batch)
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "the model panicked".to_string())
}
