//! The allocation log as a PyTorch memory snapshot: [`Profile::write_memory_snapshot`].
//!
//! PyTorch users record allocations with `torch.cuda.memory._record_memory_history` and save
//! them with `_dump_snapshot("x.pickle")`, a pickled dict that the memory_viz page
//! (<https://pytorch.org/memory_viz>) and `python -m torch.cuda._memory_viz trace_plot`
//! draw. Writing the same file from a [`Profile`] lets them keep their viewer. The dict
//! holds what those viewers read of `torch.cuda.memory._snapshot()`:
//!
//! - `device_traces`: one list per device (here one) of trace entries
//!   `{action, addr, size, stream, time_us, frames}`. An allocation is `alloc`; a free is
//!   the pair `free_requested`, `free_completed` that the viewer folds into one `free`. On
//!   CPU each heap block is its own "segment" (the allocator's own caching is not seen), so
//!   every allocation is preceded by a `segment_alloc` and every free followed by a
//!   `segment_free` of the same block: the viewer's segment view needs every block it draws
//!   to lie in a segment.
//! - `segments`: the blocks still allocated at the end (allocated while the profiler ran),
//!   each a segment of one `active_allocated` block, on device 0.
//! - `frames`: one frame naming the operation (`name`) and the innermost scope
//!   (`filename`, `scope: <name>`), which the viewers print as `filename:line:name`.
//!
//! A free of a block allocated before the profiler started has no `alloc` before it: the
//! viewers draw such a block as allocated from the start, as they do for PyTorch's traces.
//!
//! The pickle is written here, not by a library: it needs a handful of opcodes, all of them
//! in protocol 2 and in the viewer's JavaScript reader, which knows far fewer than Python's:
//!
//! | opcode | bytes | use |
//! |---|---|---|
//! | `PROTO` | `0x80 0x02` | protocol 2 |
//! | `EMPTY_DICT` | `}` | a dict, filled by `SETITEMS` |
//! | `EMPTY_LIST` | `]` | a list, filled by `APPENDS` |
//! | `MARK` | `(` | start of a batch of items |
//! | `SETITEMS` | `u` | adds the key-value pairs since the mark to the dict below it |
//! | `APPENDS` | `e` | adds the items since the mark to the list below it |
//! | `BINUNICODE` | `X`, u32 LE length, UTF-8 | strings |
//! | `LONG1` | `0x8a 0x08`, i64 LE | integers, always on 8 bytes (two's complement): the JavaScript reader makes exact numbers of them up to 2^53, which covers addresses and sizes |
//! | `NEWFALSE` | `0x89` | `is_expandable` |
//! | `STOP` | `.` | end |
//!
//! Items go in batches of at most 1000 per `MARK`, as Python's pickler writes them: the
//! JavaScript reader spreads a batch into a function's arguments, which fails for very large
//! batches.

use std::collections::HashMap;
use std::path::Path;

use super::Profile;
use crate::ProfileError;
use burn_memory::hooks::{AllocAction, AllocEvent};

/// The most items under one `MARK`.
const BATCH: usize = 1000;

/// A value to pickle.
#[derive(Debug)]
enum Value {
    Str(String),
    Int(i64),
    False,
    List(Vec<Value>),
    Dict(Vec<(&'static str, Value)>),
}

/// The opcodes of the module's table.
mod opcode {
    pub const PROTO: u8 = 0x80;
    pub const EMPTY_DICT: u8 = b'}';
    pub const EMPTY_LIST: u8 = b']';
    pub const MARK: u8 = b'(';
    pub const SETITEMS: u8 = b'u';
    pub const APPENDS: u8 = b'e';
    pub const BINUNICODE: u8 = b'X';
    pub const LONG1: u8 = 0x8a;
    pub const NEWFALSE: u8 = 0x89;
    pub const STOP: u8 = b'.';
}

fn pickle(value: &Value) -> Vec<u8> {
    let mut out = vec![opcode::PROTO, 2];
    write(&mut out, value);
    out.push(opcode::STOP);
    out
}

fn write_str(out: &mut Vec<u8>, text: &str) {
    out.push(opcode::BINUNICODE);
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn write(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Str(text) => write_str(out, text),
        Value::Int(number) => {
            out.extend_from_slice(&[opcode::LONG1, 8]);
            out.extend_from_slice(&number.to_le_bytes());
        }
        Value::False => out.push(opcode::NEWFALSE),
        Value::List(items) => {
            out.push(opcode::EMPTY_LIST);
            for batch in items.chunks(BATCH) {
                out.push(opcode::MARK);
                batch.iter().for_each(|item| write(out, item));
                out.push(opcode::APPENDS);
            }
        }
        Value::Dict(entries) => {
            out.push(opcode::EMPTY_DICT);
            for batch in entries.chunks(BATCH) {
                out.push(opcode::MARK);
                for (key, item) in batch {
                    write_str(out, key);
                    write(out, item);
                }
                out.push(opcode::SETITEMS);
            }
        }
    }
}

fn int(number: u64) -> Value {
    Value::Int(number.min(i64::MAX as u64) as i64)
}

fn text(text: &str) -> Value {
    Value::Str(text.to_owned())
}

impl Profile {
    /// The frames of an event: the operation it ran in, and its innermost scope.
    fn snapshot_frames(&self, event: &AllocEvent) -> Value {
        let name = event.op.unwrap_or("(no operation)");
        let filename = match event.scope {
            Some(scope) => format!("scope: {}", self.scope_names[scope as usize]),
            None => "(no scope)".to_owned(),
        };
        Value::List(vec![Value::Dict(vec![
            ("filename", Value::Str(filename)),
            ("line", Value::Int(0)),
            ("name", text(name)),
        ])])
    }

    fn trace_entry(&self, action: &str, event: &AllocEvent) -> Value {
        Value::Dict(vec![
            ("action", text(action)),
            ("addr", int(event.address)),
            ("size", int(event.size)),
            ("stream", Value::Int(0)),
            ("time_us", int(event.time_ns / 1000)),
            ("frames", self.snapshot_frames(event)),
        ])
    }

    /// The snapshot dict described in the module's documentation.
    fn memory_snapshot_value(&self) -> Value {
        let mut trace = Vec::with_capacity(self.allocations.len() * 5 / 2);
        // Blocks allocated while recording and not yet freed, by address.
        let mut alive: HashMap<u64, &AllocEvent> = HashMap::new();
        for event in &self.allocations {
            match event.action {
                AllocAction::Alloc => {
                    trace.push(self.trace_entry("segment_alloc", event));
                    trace.push(self.trace_entry("alloc", event));
                    alive.insert(event.address, event);
                }
                AllocAction::Free => {
                    trace.push(self.trace_entry("free_requested", event));
                    trace.push(self.trace_entry("free_completed", event));
                    trace.push(self.trace_entry("segment_free", event));
                    alive.remove(&event.address);
                }
            }
        }
        let mut alive: Vec<&AllocEvent> = alive.into_values().collect();
        alive.sort_by_key(|event| event.address);
        let segments = alive
            .into_iter()
            .map(|event| {
                let block = Value::Dict(vec![
                    ("address", int(event.address)),
                    ("size", int(event.size)),
                    ("requested_size", int(event.size)),
                    ("state", text("active_allocated")),
                    ("frames", self.snapshot_frames(event)),
                ]);
                Value::Dict(vec![
                    ("device", Value::Int(0)),
                    ("address", int(event.address)),
                    ("total_size", int(event.size)),
                    ("allocated_size", int(event.size)),
                    ("active_size", int(event.size)),
                    ("requested_size", int(event.size)),
                    ("stream", Value::Int(0)),
                    ("segment_type", text("large")),
                    ("is_expandable", Value::False),
                    ("frames", self.snapshot_frames(event)),
                    ("blocks", Value::List(vec![block])),
                ])
            })
            .collect();
        Value::Dict(vec![
            ("segments", Value::List(segments)),
            ("device_traces", Value::List(vec![Value::List(trace)])),
        ])
    }

    /// The [`allocations`](Self::allocations) as the bytes of a PyTorch memory snapshot
    /// pickle (what `torch.cuda.memory._dump_snapshot` writes); see
    /// [`write_memory_snapshot`](Self::write_memory_snapshot).
    pub fn memory_snapshot(&self) -> Vec<u8> {
        pickle(&self.memory_snapshot_value())
    }

    /// Writes the [`allocations`](Self::allocations) to `path` as a PyTorch memory snapshot
    /// (what `torch.cuda.memory._dump_snapshot` writes), to open in
    /// <https://pytorch.org/memory_viz> or with
    /// `python -m torch.cuda._memory_viz trace_plot <path> -o out.html`. Each allocation's
    /// stack is one frame: its operation (`name`) and innermost scope (`filename`). The
    /// allocations are recorded on CPU backends by [`Profiler::start_with_memory`] with a
    /// [`CountingAllocator`](burn_memory::CountingAllocator); without them the snapshot is empty.
    ///
    /// # Errors
    /// [`ProfileError::Io`] when the file cannot be written.
    ///
    /// [`Profiler::start_with_memory`]: super::Profiler::start_with_memory
    pub fn write_memory_snapshot(&self, path: impl AsRef<Path>) -> Result<(), ProfileError> {
        let path = path.as_ref();
        std::fs::write(path, self.memory_snapshot()).map_err(|source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}
