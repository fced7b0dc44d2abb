//! The Chrome trace of a [`Profile`]: the JSON "Trace Event Format" that Perfetto
//! (<https://ui.perfetto.dev>) and `chrome://tracing` open.
//!
//! Each thread is a track: its scopes and operations are complete events (`"ph": "X"`),
//! scopes around the operations they contain, so the viewers draw them nested. Operation
//! events carry their input shapes, output bytes and scopes as `args`; when memory was
//! sampled, a counter (`"ph": "C"`) gives the bytes in use and reserved after each
//! operation, drawn as a graph above the tracks. Times are in
//! microseconds, as the format wants, with nanosecond fractions.

use std::path::Path;

use serde_json::{Value, json};

use super::Profile;
use crate::ProfileError;

impl Profile {
    /// The trace as a JSON value: each thread a track of nested scope and operation events.
    pub fn chrome_trace(&self) -> Value {
        let micros = |nanos: u64| nanos as f64 / 1e3;
        let mut events = vec![json!({
            "ph": "M", "pid": 1, "tid": 0, "name": "process_name",
            "args": { "name": "burn (Profiled backend)" },
        })];
        let mut threads: Vec<u32> = self
            .ops
            .iter()
            .map(|op| op.thread)
            .chain(self.scopes.iter().map(|scope| scope.thread))
            .collect();
        threads.sort_unstable();
        threads.dedup();
        for thread in threads {
            events.push(json!({
                "ph": "M", "pid": 1, "tid": thread, "name": "thread_name",
                "args": { "name": format!("thread {thread}") },
            }));
        }
        for scope in &self.scopes {
            events.push(json!({
                "ph": "X", "pid": 1, "tid": scope.thread, "cat": "scope",
                "name": self.scope_names[scope.name as usize],
                "ts": micros(scope.start_ns), "dur": micros(scope.duration_ns),
                "args": { "left_open": scope.left_open },
            }));
        }
        for op in &self.ops {
            let scopes: Vec<&str> = op
                .scopes
                .iter()
                .map(|&name| self.scope_names[name as usize].as_str())
                .collect();
            let inputs: Vec<String> = op
                .inputs
                .iter()
                .map(|input| format!("{:?} {:?}", input.shape, input.dtype))
                .collect();
            events.push(json!({
                "ph": "X", "pid": 1, "tid": op.thread, "cat": "op", "name": op.name,
                "ts": micros(op.start_ns), "dur": micros(op.time_ns()),
                "args": {
                    "inputs": inputs,
                    "output_bytes": op.output_bytes(),
                    "host_ns": op.host_ns,
                    "device_ns": op.device_ns,
                    "scopes": scopes,
                },
            }));
            if let Some(memory) = op.memory {
                events.push(json!({
                    "ph": "C", "pid": 1, "tid": op.thread, "name": "memory",
                    "ts": micros(op.start_ns + op.time_ns()),
                    "args": { "in use": memory.in_use, "reserved": memory.reserved },
                }));
            }
        }
        json!({ "traceEvents": events, "displayTimeUnit": "ms" })
    }

    /// Writes [`chrome_trace`](Self::chrome_trace) to `path`.
    ///
    /// # Errors
    /// [`ProfileError::Io`] when the file cannot be written.
    pub fn write_chrome_trace(&self, path: impl AsRef<Path>) -> Result<(), ProfileError> {
        let path = path.as_ref();
        let text = serde_json::to_string(&self.chrome_trace()).expect("the trace is plain data");
        std::fs::write(path, text).map_err(|source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}
