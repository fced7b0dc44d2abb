//! The profiler's allocation log on NdArray with the binary's `CountingAllocator`: exact
//! heap accounting event by event, attribution to operations and scopes, the `max_entries`
//! bound, and the PyTorch memory snapshot read back by a small pickle reader.
//!
//! The heap is process-wide, so the exact tests run in processes of their own; every test
//! that starts a profiler holds the profiler tests' lock.

use std::collections::{HashMap, HashSet};

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use burn_profiler::ProfileError;
use burn_profiler::{AllocAction, AllocEvent, Profile, Profiled, Profiler, ProfilerConfig, scope};

type Inner = NdArray;
type B = Autodiff<Profiled<Inner>>;

#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    first: Linear<B>,
    relu: Relu,
    second: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            first: LinearConfig::new(32, 256).init(device),
            relu: Relu::new(),
            second: LinearConfig::new(256, 8).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let hidden = {
            let _scope = scope("first");
            self.relu.forward(self.first.forward(x))
        };
        let _scope = scope("second");
        self.second.forward(hidden)
    }
}

/// One SGD step of the MLP on a batch of 64, profiled with the allocation log.
fn profiled_step(config: ProfilerConfig) -> Profile {
    let device = Default::default();
    let profiler = Profiler::start_with_memory::<Inner>(config, &device).unwrap();
    let model = Mlp::<B>::new(&device);
    let x = Tensor::<B, 2>::random([64, 32], Distribution::Default, &device);
    let y = Tensor::<B, 2>::random([64, 8], Distribution::Default, &device);
    let loss = {
        let _forward = scope("forward");
        MseLoss::new().forward(model.forward(x), y, Reduction::Mean)
    };
    let grads = {
        let _backward = scope("backward");
        GradientsParams::from_grads(loss.backward(), &model)
    };
    let mut optim = SgdConfig::new().init();
    let model = optim.step(0.1, model, grads);
    drop(model);
    profiler.stop()
}

/// The running sum of the events' sizes, from the bytes in use before the first, is each
/// event's `in_use`; `None` when it holds, else the first event where it does not.
fn first_inconsistency(events: &[AllocEvent]) -> Option<(usize, u64, u64)> {
    let first = events.first()?;
    let mut running = match first.action {
        AllocAction::Alloc => first.in_use - first.size,
        AllocAction::Free => first.in_use + first.size,
    };
    for (index, event) in events.iter().enumerate() {
        running = match event.action {
            AllocAction::Alloc => running + event.size,
            AllocAction::Free => running - event.size,
        };
        if running != event.in_use {
            return Some((index, running, event.in_use));
        }
    }
    None
}

#[test]
fn allocation_events_add_up_to_the_heap_count_over_a_training_step() {
    crate::own_process::in_own_process(
        "profile_memory::allocation_events_add_up_to_the_heap_count_over_a_training_step",
        || {
            let _lock = crate::profile::exclusive();
            let profile = profiled_step(ProfilerConfig::new());
            let events = &profile.allocations;
            assert!(
                events.len() > 100,
                "only {} allocation events in a training step",
                events.len()
            );
            assert_eq!(profile.dropped, 0);
            assert_eq!(first_inconsistency(events), None);
            // The log's order is the counter's: times never go back.
            assert!(events.windows(2).all(|w| w[0].time_ns <= w[1].time_ns));
            // The hidden activation, [64, 256] f32, was allocated by operations on the
            // step's thread (the workers of a parallel kernel run no operation of their own).
            let step_thread = profile.ops[0].thread;
            let hidden = 64 * 256 * 4;
            let big: Vec<&AllocEvent> = events
                .iter()
                .filter(|event| event.thread == step_thread && event.size >= hidden)
                .filter(|event| event.action == AllocAction::Alloc)
                .collect();
            assert!(big.len() >= 4, "{big:?}");
            assert!(big.iter().all(|event| event.op.is_some()), "{big:?}");
            // Frees and allocations both: the step frees what it allocated.
            let frees = events
                .iter()
                .filter(|event| event.action == AllocAction::Free)
                .count();
            assert!(frees * 2 > events.len() / 2, "{frees} frees");
        },
    );
}

#[test]
fn allocations_name_the_operation_and_the_scope_they_ran_in() {
    crate::own_process::in_own_process(
        "profile_memory::allocations_name_the_operation_and_the_scope_they_ran_in",
        attribution,
    );
}

fn attribution() {
    let _lock = crate::profile::exclusive();
    type P = Profiled<Inner>;
    let device = Default::default();
    let profiler = Profiler::start_with_memory::<Inner>(ProfilerConfig::new(), &device).unwrap();
    // Sizes no other allocation of the run has: a tensor of 1 000 003 f32 values made by an
    // operation, and a plain vector, both inside scope "x"; another vector outside it.
    let (tensor, inside) = {
        let _x = scope("x");
        let tensor = Tensor::<P, 1>::ones([1_000_003], &device);
        (tensor, Vec::<u8>::with_capacity(777_777))
    };
    let outside = Vec::<u8>::with_capacity(555_555);
    let profile = profiler.stop();
    drop((tensor, inside, outside));

    let find = |size: u64| {
        profile
            .allocations
            .iter()
            .find(|event| event.size == size && event.action == AllocAction::Alloc)
            .unwrap_or_else(|| panic!("no allocation of {size} bytes"))
    };
    let scope_name = |event: &AllocEvent| {
        event
            .scope
            .map(|scope| profile.scope_names[scope as usize].as_str())
    };
    let tensor = find(4_000_012);
    let op = tensor.op.expect("made inside an operation");
    let recorded = profile
        .ops
        .iter()
        .find(|event| event.name == op)
        .expect("the operation was recorded");
    assert_eq!(
        recorded.scopes,
        vec![tensor.scope.unwrap()],
        "{op} ran in scope x"
    );
    assert_eq!(scope_name(tensor), Some("x"));

    let inside = find(777_777);
    assert_eq!(inside.op, None, "allocated between operations");
    assert_eq!(scope_name(inside), Some("x"));

    let outside = find(555_555);
    assert_eq!((outside.op, scope_name(outside)), (None, None));
}

#[test]
fn max_entries_bounds_the_allocation_log_and_counts_the_rest() {
    let _lock = crate::profile::exclusive();
    let full = profiled_step(ProfilerConfig::new());
    let events = (full.ops.len() + full.scopes.len()) as u64;
    assert!(full.allocations.len() > 200);
    let bounded = profiled_step(ProfilerConfig::new().with_max_entries(50));
    assert_eq!(bounded.allocations.len(), 50);
    // More dropped than all the operations and scopes a step records: the allocations past
    // the first 50 are counted too.
    assert!(
        bounded.dropped > events + 100,
        "{} dropped; a step records {events} operations and scopes and {} allocation events",
        bounded.dropped,
        full.allocations.len()
    );
    // The first events are kept, and they still add up (other tests' threads allocate too,
    // all through the same lock).
    assert_eq!(first_inconsistency(&bounded.allocations), None);
}

#[test]
fn the_memory_snapshot_reads_back_as_pytorch_writes_it() {
    crate::own_process::in_own_process(
        "profile_memory::the_memory_snapshot_reads_back_as_pytorch_writes_it",
        snapshot_round_trip,
    );
}

fn snapshot_round_trip() {
    let _lock = crate::profile::exclusive();
    let profile = profiled_step(ProfilerConfig::new());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("snapshot.pickle");
    profile.write_memory_snapshot(&path).unwrap();
    // For a manual check with PyTorch's tools (`python -m torch.cuda._memory_viz`).
    if let Ok(copy) = std::env::var("BURN_MEMORY_SNAPSHOT_COPY") {
        std::fs::copy(&path, copy).unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    let snapshot = pickle::load(&bytes);

    let keys: Vec<&str> = snapshot.dict().iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["segments", "device_traces"]);
    let traces = snapshot.get("device_traces").list();
    assert_eq!(traces.len(), 1, "one device");
    let trace = traces[0].list();

    // One trace entry (two for a free, plus the block's segment event) per logged event,
    // with its address and size.
    let mut expected = Vec::new();
    for event in &profile.allocations {
        let actions: &[&str] = match event.action {
            AllocAction::Alloc => &["segment_alloc", "alloc"],
            AllocAction::Free => &["free_requested", "free_completed", "segment_free"],
        };
        for action in actions {
            expected.push((action.to_string(), event.address as i64, event.size as i64));
        }
    }
    let actual: Vec<(String, i64, i64)> = trace
        .iter()
        .map(|entry| {
            (
                entry.get("action").str().to_owned(),
                entry.get("addr").int(),
                entry.get("size").int(),
            )
        })
        .collect();
    assert_eq!(actual.len(), expected.len());
    assert!(actual == expected, "the trace does not follow the log");

    // Alloc/free pairs: a free of an address allocated in the trace has its size, and an
    // address is not allocated again before it is freed. A free of an address never
    // allocated before it would be a block from before the profiler: none in this run,
    // where the step's own process did nothing else meanwhile.
    let mut live: HashMap<i64, i64> = HashMap::new();
    let mut allocs = 0;
    for entry in trace {
        let (addr, size) = (entry.get("addr").int(), entry.get("size").int());
        assert_eq!(entry.get("stream").int(), 0);
        assert!(entry.get("time_us").int() >= 0);
        let frames = entry.get("frames").list();
        assert_eq!(frames.len(), 1);
        let frame = &frames[0];
        assert!(!frame.get("name").str().is_empty());
        assert!(!frame.get("filename").str().is_empty());
        assert_eq!(frame.get("line").int(), 0);
        match entry.get("action").str() {
            "alloc" => {
                allocs += 1;
                assert_eq!(live.insert(addr, size), None, "{addr:#x} allocated twice");
            }
            "free_completed" => {
                let allocated = live.remove(&addr);
                assert_eq!(
                    allocated,
                    Some(size),
                    "{addr:#x} freed without having been allocated"
                );
            }
            _ => {}
        }
    }
    assert!(allocs > 100, "{allocs} allocations");
    // An operation in a scope reads as PyTorch's viewer prints frames.
    assert!(trace.iter().any(|entry| {
        let frame = &entry.get("frames").list()[0];
        frame.get("filename").str() == "scope: first" && frame.get("name").str() != ""
    }));

    // The segments are exactly the blocks still allocated, one block each.
    let segments = snapshot.get("segments").list();
    let mut alive: HashSet<(i64, i64)> = live.into_iter().collect();
    assert_eq!(segments.len(), alive.len());
    for segment in segments {
        assert_eq!(segment.get("device").int(), 0);
        let blocks = segment.get("blocks").list();
        assert_eq!(blocks.len(), 1);
        let block = &blocks[0];
        assert_eq!(block.get("state").str(), "active_allocated");
        let key = (
            segment.get("address").int(),
            segment.get("total_size").int(),
        );
        assert_eq!(block.get("size").int(), key.1);
        assert!(alive.remove(&key), "segment {key:?} is not a live block");
    }
}

#[test]
fn an_unwritable_snapshot_path_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no such directory").join("snapshot.pickle");
    match Profile::default().write_memory_snapshot(&path) {
        Err(ProfileError::Io { path: reported, .. }) => assert_eq!(reported, path),
        other => panic!("expected an I/O error, got {other:?}"),
    }
    // The empty profile's snapshot is still a valid one.
    let empty = pickle::load(&Profile::default().memory_snapshot());
    assert!(empty.get("segments").list().is_empty());
    assert!(empty.get("device_traces").list()[0].list().is_empty());
}

/// A pickle reader for the opcodes the snapshot uses, and only those: an opcode the writer
/// should not emit (one PyTorch's JavaScript reader may not know) fails the test.
mod pickle {
    #[derive(Debug, Clone, PartialEq)]
    pub enum Value {
        Int(i64),
        Str(String),
        Bool(bool),
        List(Vec<Value>),
        Dict(Vec<(String, Value)>),
    }

    impl Value {
        pub fn int(&self) -> i64 {
            match self {
                Value::Int(n) => *n,
                other => panic!("not an int: {other:?}"),
            }
        }

        pub fn str(&self) -> &str {
            match self {
                Value::Str(s) => s,
                other => panic!("not a string: {other:?}"),
            }
        }

        pub fn list(&self) -> &[Value] {
            match self {
                Value::List(items) => items,
                other => panic!("not a list: {other:?}"),
            }
        }

        pub fn dict(&self) -> &[(String, Value)] {
            match self {
                Value::Dict(entries) => entries,
                other => panic!("not a dict: {other:?}"),
            }
        }

        pub fn get(&self, key: &str) -> &Value {
            self.dict()
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v)
                .unwrap_or_else(|| panic!("no key {key}"))
        }
    }

    pub fn load(bytes: &[u8]) -> Value {
        let mut stack: Vec<Value> = Vec::new();
        let mut marks: Vec<usize> = Vec::new();
        let mut at = 0;
        let take = |n: usize, at: &mut usize| {
            let slice = &bytes[*at..*at + n];
            *at += n;
            slice
        };
        loop {
            let opcode = take(1, &mut at)[0];
            match opcode {
                0x80 => {
                    let protocol = take(1, &mut at)[0];
                    assert!((2..=4).contains(&protocol), "protocol {protocol}");
                }
                b'}' => stack.push(Value::Dict(Vec::new())),
                b']' => stack.push(Value::List(Vec::new())),
                b'(' => marks.push(stack.len()),
                b'e' => {
                    let items = stack.split_off(marks.pop().expect("a mark"));
                    match stack.last_mut() {
                        Some(Value::List(list)) => list.extend(items),
                        other => panic!("APPENDS onto {other:?}"),
                    }
                }
                b'u' => {
                    let items = stack.split_off(marks.pop().expect("a mark"));
                    assert_eq!(items.len() % 2, 0);
                    let Some(Value::Dict(dict)) = stack.last_mut() else {
                        panic!("SETITEMS onto a non-dict");
                    };
                    let mut items = items.into_iter();
                    while let (Some(Value::Str(key)), Some(value)) = (items.next(), items.next()) {
                        dict.push((key, value));
                    }
                }
                b'X' => {
                    let len = u32::from_le_bytes(take(4, &mut at).try_into().unwrap()) as usize;
                    let text = std::str::from_utf8(take(len, &mut at)).unwrap();
                    stack.push(Value::Str(text.to_owned()));
                }
                0x8a => {
                    let len = take(1, &mut at)[0];
                    assert_eq!(len, 8, "integers are written on 8 bytes");
                    let n = i64::from_le_bytes(take(8, &mut at).try_into().unwrap());
                    stack.push(Value::Int(n));
                }
                0x88 => stack.push(Value::Bool(true)),
                0x89 => stack.push(Value::Bool(false)),
                b'.' => {
                    assert_eq!(at, bytes.len(), "bytes after STOP");
                    assert!(marks.is_empty());
                    assert_eq!(stack.len(), 1);
                    return stack.pop().unwrap();
                }
                other => panic!("unexpected opcode {other:#x} at {}", at - 1),
            }
        }
    }
}
