//! The dynamic batcher: answers equal to unbatched inference, batching by size and by delay,
//! deadlines, overload, failures (one bad request among good ones), and shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use burn::backend::{Flex, NdArray};
use burn_memory::DeviceMemory;
use burn_serve::{
    Batcher, BatcherConfig, HostData, HostTensor, Metrics, Servable, ServeError, Validate,
};

use crate::common::{self, Net, PANIC, Recording, Slow, pair};

fn config(max_batch_size: usize, delay_ms: u64, queue_capacity: usize) -> BatcherConfig {
    BatcherConfig {
        max_batch_size,
        max_queue_delay: Duration::from_millis(delay_ms),
        queue_capacity,
        max_batch_tokens: None,
    }
}

fn values(tensor: &HostTensor) -> &[f32] {
    match tensor.data() {
        HostData::F32(values) => values,
        _ => panic!("FP32 output"),
    }
}

/// Requests of 1 to 5 rows from 4 threads at once, on two replicas: each answer equals the
/// model run on that request alone, and some batches held several requests.
fn batched_equals_unbatched<B: DeviceMemory>()
where
    B::Device: Default,
{
    let device = B::Device::default();
    let net = Net::<B>::new(&device);
    let batches = Arc::new(std::sync::Mutex::new(Vec::new()));
    let replicas = (0..2)
        .map(|_| Recording {
            inner: common::served(&net, &device),
            batches: Arc::clone(&batches),
        })
        .collect();
    let batcher = Arc::new(Batcher::new(config(16, 20, 256), replicas).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|thread| {
            let batcher = Arc::clone(&batcher);
            std::thread::spawn(move || {
                let inputs: Vec<HostTensor> = (0..12)
                    .map(|i| common::rows(1 + (i + thread) % 5, thread * 100 + i))
                    .collect();
                let tickets: Vec<_> = inputs
                    .iter()
                    .map(|input| batcher.submit(input.clone(), None).unwrap())
                    .collect();
                inputs
                    .into_iter()
                    .zip(tickets)
                    .map(|(input, ticket)| (input, ticket.wait().unwrap()))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for thread in threads {
        for (input, output) in thread.join().unwrap() {
            assert_eq!(output.shape(), &[input.rows(), common::OUT]);
            common::assert_close(values(&output), &net.answer(&input, &device));
        }
    }
    let batches = batches.lock().unwrap();
    assert_eq!(
        batches.iter().sum::<usize>(),
        (0..4)
            .map(|t| (0..12).map(|i| 1 + (i + t) % 5).sum::<usize>())
            .sum::<usize>()
    );
    assert!(batches.iter().all(|&rows| rows <= 16));
    // A request has at most 5 rows: a larger batch held several.
    assert!(
        batches.iter().any(|&rows| rows > 5),
        "no batch held several requests: {batches:?}"
    );
    batcher.shutdown();
}

#[test]
fn batched_equals_unbatched_flex() {
    batched_equals_unbatched::<Flex>();
}

#[test]
fn batched_equals_unbatched_ndarray() {
    batched_equals_unbatched::<NdArray>();
}

/// Requests queued together form one batch; a batch never exceeds `max_batch_size` rows and
/// never splits a request.
#[test]
fn batches_form_by_size_and_by_delay() {
    let (model, batches) = Slow::new(Duration::from_millis(30));
    let batcher = Batcher::new(config(4, 300, 64), vec![model]).unwrap();
    // Ten single rows, queued faster than the delay: 4 + 4 + 2.
    let tickets: Vec<_> = (0..10)
        .map(|i| batcher.submit(pair(i as f32), None).unwrap())
        .collect();
    for (i, ticket) in tickets.into_iter().enumerate() {
        assert_eq!(values(&ticket.wait().unwrap()), &[2.0 * i as f32, 2.0]);
    }
    assert_eq!(*batches.lock().unwrap(), vec![4, 4, 2]);

    // A request of 3 rows after one of 2 does not fit a batch of 4: they run apart.
    batches.lock().unwrap().clear();
    let two = HostTensor::f32(2, 2, vec![1.0; 4]).unwrap();
    let three = HostTensor::f32(3, 2, vec![1.0; 6]).unwrap();
    let a = batcher.submit(two, None).unwrap();
    let b = batcher.submit(three, None).unwrap();
    assert_eq!(a.wait().unwrap().rows(), 2);
    assert_eq!(b.wait().unwrap().rows(), 3);
    assert_eq!(*batches.lock().unwrap(), vec![2, 3]);
}

/// A full batch does not wait for the delay; a partial one waits for it.
#[test]
fn full_batch_runs_at_once_partial_waits() {
    let (model, _) = Slow::new(Duration::ZERO);
    let batcher = Batcher::new(config(4, 10_000, 64), vec![model]).unwrap();
    let start = Instant::now();
    let tickets: Vec<_> = (0..4)
        .map(|i| batcher.submit(pair(i as f32), None).unwrap())
        .collect();
    for ticket in tickets {
        ticket.wait().unwrap();
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "a full batch waited {:?}",
        start.elapsed()
    );

    let (model, _) = Slow::new(Duration::ZERO);
    let batcher = Batcher::new(config(4, 150, 64), vec![model]).unwrap();
    let start = Instant::now();
    batcher.submit(pair(1.0), None).unwrap().wait().unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(150),
        "a partial batch ran after {:?}, before the delay",
        start.elapsed()
    );
}

/// A request still queued at its deadline is answered `DeadlineExceeded` and never runs.
#[test]
fn deadline_passes_in_the_queue() {
    let (model, batches) = Slow::new(Duration::from_millis(200));
    let batcher = Batcher::new(BatcherConfig::unbatched(), vec![model]).unwrap();
    let first = batcher.submit(pair(1.0), None).unwrap();
    let late = batcher
        .submit(pair(2.0), Some(Instant::now() + Duration::from_millis(20)))
        .unwrap();
    let in_time = batcher
        .submit(pair(3.0), Some(Instant::now() + Duration::from_secs(30)))
        .unwrap();
    assert!(first.wait().is_ok());
    match late.wait() {
        Err(ServeError::DeadlineExceeded { waited_ms }) => assert!(waited_ms >= 20.0),
        other => panic!("expected DeadlineExceeded, got {other:?}"),
    }
    assert_eq!(values(&in_time.wait().unwrap()), &[6.0, 2.0]);
    assert_eq!(*batches.lock().unwrap(), vec![1, 1], "the late request ran");
}

/// A full queue answers `Overloaded` at once; the accepted requests are all answered.
#[test]
fn full_queue_is_overloaded() {
    let (model, _) = Slow::new(Duration::from_millis(100));
    let batcher = Batcher::new(config(1, 0, 3), vec![model]).unwrap();
    let mut accepted = Vec::new();
    let mut refused = None;
    for i in 0..10 {
        let start = Instant::now();
        match batcher.submit(pair(i as f32), None) {
            Ok(ticket) => accepted.push(ticket),
            Err(error) => {
                assert!(
                    start.elapsed() < Duration::from_millis(50),
                    "refusal waited"
                );
                refused = Some(error);
                break;
            }
        }
    }
    assert_eq!(refused, Some(ServeError::Overloaded { capacity: 3 }));
    // Three queued, and at most one taken by the worker already.
    assert!(
        (3..=4).contains(&accepted.len()),
        "accepted {}",
        accepted.len()
    );
    for ticket in accepted {
        ticket.wait().unwrap();
    }
}

/// Shutdown refuses new requests and answers every accepted one.
#[test]
fn shutdown_drains_the_queue() {
    let (model, batches) = Slow::new(Duration::from_millis(5));
    let batcher = Batcher::new(config(2, 1000, 64), vec![model]).unwrap();
    let tickets: Vec<_> = (0..15)
        .map(|i| batcher.submit(pair(i as f32), None).unwrap())
        .collect();
    batcher.shutdown();
    assert_eq!(
        batcher.submit(pair(0.0), None).unwrap_err(),
        ServeError::ShuttingDown
    );
    for (i, ticket) in tickets.into_iter().enumerate() {
        assert_eq!(values(&ticket.wait().unwrap()), &[2.0 * i as f32, 2.0]);
    }
    assert_eq!(batches.lock().unwrap().iter().sum::<usize>(), 15);
}

/// A model that fails or panics fails its batch only; the worker goes on.
#[test]
fn model_failures_fail_their_batch_only() {
    struct WrongRows;
    impl Servable for WrongRows {
        fn infer(&mut self, batch: HostTensor) -> Result<HostTensor, ServeError> {
            HostTensor::f32(batch.rows() + 1, 1, vec![0.0; batch.rows() + 1])
        }
    }
    let batcher = Batcher::new(BatcherConfig::unbatched(), vec![WrongRows]).unwrap();
    let error = batcher.submit(pair(1.0), None).unwrap().wait().unwrap_err();
    assert!(
        matches!(error, ServeError::Model(ref m) if m.contains("2 rows for a batch of 1")),
        "{error}"
    );

    let (model, _) = Slow::new(Duration::ZERO);
    let batcher = Batcher::new(BatcherConfig::unbatched(), vec![model]).unwrap();
    let error = batcher
        .submit(pair(PANIC), None)
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(
        matches!(error, ServeError::Model(ref m) if m.contains("asked to panic")),
        "{error}"
    );
    assert_eq!(
        values(&batcher.submit(pair(4.0), None).unwrap().wait().unwrap()),
        &[8.0, 2.0]
    );
}

/// [`Slow`] that refuses a batch holding a negative value (as an encoder refuses an id
/// outside its vocabulary), and offers that check as its validator when `checked`.
struct Picky {
    inner: Slow,
    checked: bool,
}

fn refuse_negatives(input: &HostTensor) -> Result<(), ServeError> {
    let HostData::F32(values) = input.data() else {
        return Err(ServeError::BadRequest("FP32 only".into()));
    };
    match values.iter().find(|&&v| v < 0.0 && v != PANIC) {
        Some(v) => Err(ServeError::BadRequest(format!("{v} is negative"))),
        None => Ok(()),
    }
}

impl Servable for Picky {
    fn infer(&mut self, batch: HostTensor) -> Result<HostTensor, ServeError> {
        refuse_negatives(&batch)?;
        self.inner.infer(batch)
    }

    fn validator(&self) -> Option<Validate> {
        self.checked.then(|| Arc::new(refuse_negatives) as Validate)
    }
}

/// Good and bad requests queued together, as Triton's client sends them: 6 good, one the
/// model refuses and one that panics it. Without a validator the batch fails and runs again
/// request by request: every good request gets its own answer, each bad one its own error.
/// With one, the refused request fails at `submit` and never joins the batch.
#[test]
fn one_bad_request_fails_alone() {
    for checked in [false, true] {
        let (inner, batches) = Slow::new(Duration::ZERO);
        let metrics = Metrics::default();
        let batcher = Batcher::with_metrics(
            config(16, 200, 64),
            vec![Picky { inner, checked }],
            metrics.model("picky"),
        )
        .unwrap();
        // `Slow` panics when a batch starts with `PANIC`: it is queued first.
        let inputs = [PANIC, 1.0, 2.0, -7.0, 3.0, 4.0, 5.0, 6.0];
        let tickets: Vec<_> = inputs
            .iter()
            .map(|&v| batcher.submit(pair(v), None))
            .collect();
        for (&v, ticket) in inputs.iter().zip(tickets) {
            let answer = ticket.and_then(|ticket| ticket.wait());
            match v {
                -7.0 => assert!(
                    matches!(answer, Err(ServeError::BadRequest(ref m)) if m == "-7 is negative"),
                    "checked {checked}: {answer:?}"
                ),
                PANIC => assert!(
                    matches!(answer, Err(ServeError::Model(ref m)) if m.contains("asked to panic")),
                    "checked {checked}: {answer:?}"
                ),
                _ => assert_eq!(
                    values(&answer.unwrap_or_else(|e| panic!("{v}: {e}"))),
                    &[2.0 * v, 2.0],
                    "checked {checked}"
                ),
            }
        }
        // `Slow` records the batches that reach it. With the validator: the 7 queued
        // requests (the panic fails them), then each of them alone. Without: the batch of 8
        // is refused before `Slow`, then the 7 requests that pass the check run alone.
        let want = if checked {
            [vec![7], vec![1; 7]].concat()
        } else {
            vec![1; 7]
        };
        assert_eq!(*batches.lock().unwrap(), want, "checked {checked}");
        assert!(
            metrics
                .encode()
                .contains("burn_serve_batches_retried_total{model=\"picky\"} 1"),
            "{}",
            metrics.encode()
        );
    }
}

/// Bad settings and requests are typed errors.
#[test]
fn bad_settings_and_requests() {
    let (model, _) = Slow::new(Duration::ZERO);
    let error = Batcher::new(config(0, 1, 1), vec![model]).unwrap_err();
    assert!(matches!(
        error,
        ServeError::Invalid {
            name: "max_batch_size",
            ..
        }
    ));
    let (model, _) = Slow::new(Duration::ZERO);
    let error = Batcher::new(config(1, 1, 0), vec![model]).unwrap_err();
    assert!(matches!(
        error,
        ServeError::Invalid {
            name: "queue_capacity",
            ..
        }
    ));
    let error = Batcher::new(config(1, 1, 1), Vec::<Slow>::new()).unwrap_err();
    assert!(matches!(
        error,
        ServeError::Invalid {
            name: "replicas",
            ..
        }
    ));

    let (model, _) = Slow::new(Duration::ZERO);
    let batcher = Batcher::new(config(4, 1, 8), vec![model]).unwrap();
    let big = HostTensor::f32(5, 2, vec![0.0; 10]).unwrap();
    assert_eq!(
        batcher.submit(big, None).unwrap_err(),
        ServeError::TooLarge { rows: 5, max: 4 }
    );
    let empty = HostTensor::f32(0, 2, vec![]).unwrap();
    assert!(matches!(
        batcher.submit(empty, None).unwrap_err(),
        ServeError::BadRequest(_)
    ));
}

/// A batch that would pass the memory cap fails with `MemoryLimit` (503) without running; a
/// cap with room runs it.
#[test]
fn memory_cap_refuses_a_batch_that_does_not_fit() {
    let device = Default::default();
    let net = Net::<Flex>::new(&device);
    let tight = common::served(&net, &device).with_memory_cap(1, 1 << 20);
    let batcher = Batcher::new(BatcherConfig::unbatched(), vec![tight]).unwrap();
    let error = batcher
        .submit(common::rows(1, 1), None)
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(
        matches!(error, ServeError::MemoryLimit(ref m) if m.contains("limit")),
        "{error}"
    );
    assert_eq!(error.status(), 503);

    let roomy = common::served(&net, &device).with_memory_cap(u64::MAX / 2, 1 << 20);
    let replicas = roomy.replicas(&[device, device]);
    let batcher = Batcher::new(config(4, 1, 8), replicas).unwrap();
    let input = common::rows(3, 2);
    let output = batcher.submit(input.clone(), None).unwrap().wait().unwrap();
    common::assert_close(values(&output), &net.answer(&input, &device));
}
