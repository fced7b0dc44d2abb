//! The profile as one self-contained HTML page: [`Profile::write_viewer`].
//!
//! The page needs no network and no library: its script and style are this crate's
//! (`viewer/viewer.js`, `viewer/viewer.css`, inlined), and the profile is embedded as JSON in
//! a `<script type="application/json" id="profile-data">` element. It draws on `<canvas>`:
//!
//! - the active-memory timeline: every heap block from its allocation to its free, stacked
//!   (a block freed below the others lets them fall), coloured by scope or by operation; when
//!   the profile holds no [`allocations`](Profile::allocations), the per-operation memory
//!   counters as an area instead;
//! - the memory in use and reserved after each operation, as lines;
//! - the [`key_averages`](Profile::key_averages) table, sorted by clicking a column.
//!
//! The data is columnar (one array per field) so that a profile of a hundred thousand
//! allocations stays a few megabytes and parses fast. Allocations and frees are paired here
//! into blocks; the page draws the largest blocks one by one and sums the rest per colour,
//! per pixel column, so that the drawing costs about the same for any number of blocks.
//! When it has drawn, the page sets `window.__viewer` (and the text of the element
//! `#viewer-status`, for `--dump-dom`) to `{ready, mode, blocks, drawnBlocks, rows, ops,
//! peakBytes, peakNs, renderMs, drawnPixels, error}`.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use super::Profile;
use super::table::RowKind;
use crate::ProfileError;
use burn_memory::hooks::AllocAction;

const TEMPLATE: &str = include_str!("viewer/viewer.html");
const SCRIPT: &str = include_str!("viewer/viewer.js");
const STYLE: &str = include_str!("viewer/viewer.css");

/// The embedded data's version, read by the script.
const FORMAT: u32 = 1;

/// The operations, one array per field.
#[derive(Debug, Default, Serialize)]
struct Ops {
    /// Index into [`ViewerData::op_names`].
    name: Vec<u32>,
    start_ns: Vec<u64>,
    time_ns: Vec<u64>,
    /// Index into the scope names of the innermost scope, or -1.
    scope: Vec<i64>,
    /// Bytes in use after the operation, or -1 when not sampled.
    in_use: Vec<i64>,
    /// Bytes reserved after the operation, or -1 when not sampled.
    reserved: Vec<i64>,
}

/// Heap blocks (an allocation paired with its free), one array per field, in allocation order.
#[derive(Debug, Default, Serialize)]
struct Blocks {
    /// When it was allocated (0 for a block freed in the profile but allocated before it).
    start_ns: Vec<u64>,
    /// When it was freed, or -1 when still live at the end.
    end_ns: Vec<i64>,
    size: Vec<u64>,
    /// Index into [`ViewerData::op_names`], or -1.
    op: Vec<i64>,
    /// Index into the scope names, or -1.
    scope: Vec<i64>,
}

/// One row of the operation table.
#[derive(Debug, Serialize)]
struct Row {
    name: String,
    scope: bool,
    calls: u64,
    total_ns: u64,
    self_ns: u64,
    average_ns: u64,
    output_bytes: u64,
}

/// What the page reads.
#[derive(Debug, Serialize)]
struct ViewerData {
    format: u32,
    scope_names: Vec<String>,
    op_names: Vec<String>,
    ops: Ops,
    blocks: Blocks,
    /// Allocation events in the profile (twice the blocks when each is freed).
    allocation_events: usize,
    /// The end of the profile, nanoseconds.
    end_ns: u64,
    table: Vec<Row>,
    dropped: u64,
}

impl Profile {
    /// The viewer page: one HTML document with its script, style and data inline (see
    /// [`write_viewer`](Self::write_viewer)).
    pub fn viewer_html(&self) -> String {
        let data = serde_json::to_string(&self.viewer_data()).expect("the data is plain");
        // Inside a <script> element, `</script>` or `<!--` in a name would end or confuse it:
        // JSON only has these characters in strings, where the escapes mean the same.
        let data = data
            .replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026");
        let mut html = String::with_capacity(TEMPLATE.len() + SCRIPT.len() + data.len() + 4096);
        let mut rest = TEMPLATE;
        while let Some(at) = rest.find("{{") {
            html.push_str(&rest[..at]);
            let end = at
                + rest[at..]
                    .find("}}")
                    .expect("the template closes its marks")
                + 2;
            match &rest[at..end] {
                "{{STYLE}}" => html.push_str(STYLE),
                "{{SCRIPT}}" => html.push_str(SCRIPT),
                "{{DATA}}" => html.push_str(&data),
                mark => panic!("unknown mark {mark} in the viewer template"),
            }
            rest = &rest[end..];
        }
        html.push_str(rest);
        html
    }

    /// Writes the profile as one self-contained HTML page that opens offline in any
    /// browser: the active-memory timeline (heap blocks stacked over time, coloured by scope
    /// or operation, the peak marked, each block's size, operation and scope on hover), the
    /// memory in use and reserved after each operation, and the sortable
    /// [`key_averages`](Self::key_averages) table.
    ///
    /// # Errors
    /// [`ProfileError::Io`] when the file cannot be written.
    pub fn write_viewer(&self, path: impl AsRef<Path>) -> Result<(), ProfileError> {
        let path = path.as_ref();
        std::fs::write(path, self.viewer_html()).map_err(|source| ProfileError::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    fn viewer_data(&self) -> ViewerData {
        let mut op_names: Vec<String> = Vec::new();
        let mut op_index: HashMap<&str, u32> = HashMap::new();
        let mut intern = |name: &'static str| {
            *op_index.entry(name).or_insert_with(|| {
                op_names.push(name.to_owned());
                (op_names.len() - 1) as u32
            })
        };
        let mut ops = Ops::default();
        let mut end_ns = 0;
        for op in &self.ops {
            ops.name.push(intern(op.name));
            ops.start_ns.push(op.start_ns);
            ops.time_ns.push(op.time_ns());
            ops.scope
                .push(op.scopes.last().map_or(-1, |&scope| i64::from(scope)));
            ops.in_use
                .push(op.memory.map_or(-1, |memory| clamp(memory.in_use)));
            ops.reserved
                .push(op.memory.map_or(-1, |memory| clamp(memory.reserved)));
            end_ns = end_ns.max(op.start_ns + op.time_ns());
        }
        for scope in &self.scopes {
            end_ns = end_ns.max(scope.start_ns + scope.duration_ns);
        }

        let mut blocks = Blocks::default();
        // Live blocks by address.
        let mut live: HashMap<u64, usize> = HashMap::new();
        for event in &self.allocations {
            end_ns = end_ns.max(event.time_ns);
            let op = event.op.map_or(-1, |name| i64::from(intern(name)));
            let scope = event.scope.map_or(-1, i64::from);
            match event.action {
                AllocAction::Alloc => {
                    live.insert(event.address, blocks.size.len());
                    blocks.start_ns.push(event.time_ns);
                    blocks.end_ns.push(-1);
                    blocks.size.push(event.size);
                    blocks.op.push(op);
                    blocks.scope.push(scope);
                }
                AllocAction::Free => match live.remove(&event.address) {
                    Some(block) => blocks.end_ns[block] = clamp(event.time_ns),
                    // Allocated before the profile started: live from its start.
                    None => {
                        blocks.start_ns.push(0);
                        blocks.end_ns.push(clamp(event.time_ns));
                        blocks.size.push(event.size);
                        blocks.op.push(op);
                        blocks.scope.push(scope);
                    }
                },
            }
        }

        let table = self
            .key_averages()
            .rows
            .into_iter()
            .map(|row| Row {
                average_ns: row.average_ns(),
                name: row.name,
                scope: row.kind == RowKind::Scope,
                calls: row.calls,
                total_ns: row.total_ns,
                self_ns: row.self_ns,
                output_bytes: row.output_bytes,
            })
            .collect();
        ViewerData {
            format: FORMAT,
            scope_names: self.scope_names.clone(),
            op_names,
            ops,
            blocks,
            allocation_events: self.allocations.len(),
            end_ns,
            table,
            dropped: self.dropped,
        }
    }
}

/// A byte count or time as a JSON number the page reads exactly (below 2^53).
fn clamp(value: u64) -> i64 {
    value.min(1 << 53) as i64
}
