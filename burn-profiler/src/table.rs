//! The `key_averages` table: recorded operations and scopes grouped by name (and, on request,
//! by input shapes), with their call counts, times and bytes.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;

use super::Profile;
use super::record::OpEvent;

/// Whether a row is a backend operation or a user scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum RowKind {
    /// A backend operation (`float_matmul`).
    Op,
    /// A [`scope`](super::scope).
    Scope,
}

/// One row of [`KeyAverages`]: every call of one operation (or scope) with one key.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyAveragesRow {
    /// The operation or scope name.
    pub name: String,
    /// Operation or scope.
    pub kind: RowKind,
    /// The input shapes, when grouped by them (`[[64, 32], [32, 16]]`).
    pub shapes: Option<String>,
    /// How many calls.
    pub calls: u64,
    /// Total time of all calls, nanoseconds (device time when measured, else host time).
    pub total_ns: u64,
    /// Total time less the time of what ran inside: the scopes and operations nested in a
    /// scope; for an operation, its total.
    pub self_ns: u64,
    /// Bytes of the tensors the calls produced.
    pub output_bytes: u64,
}

impl KeyAveragesRow {
    /// Mean time per call, nanoseconds.
    pub fn average_ns(&self) -> u64 {
        self.total_ns / self.calls.max(1)
    }
}

/// The column [`KeyAverages::sorted_by`] sorts on, largest first (names: alphabetical).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SortBy {
    /// Total time (PyTorch's `cpu_time_total` / `cuda_time_total`).
    TotalTime,
    /// Self time.
    SelfTime,
    /// Mean time per call.
    AverageTime,
    /// Number of calls.
    Calls,
    /// Bytes produced.
    OutputBytes,
    /// The name, A to Z.
    Name,
}

/// Recorded calls grouped by name (PyTorch's `key_averages()`), ready to sort, cut and print.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyAverages {
    /// The rows, in the current order.
    pub rows: Vec<KeyAveragesRow>,
    /// Rows cut by [`limit`](Self::limit), so the table can say so.
    pub omitted: usize,
}

impl Profile {
    /// Every operation and scope grouped by name, sorted by total time.
    pub fn key_averages(&self) -> KeyAverages {
        self.group(false)
    }

    /// Grouped by name and input shapes (needs [`record_shapes`](super::ProfilerConfig)).
    pub fn key_averages_by_shape(&self) -> KeyAverages {
        self.group(true)
    }

    fn group(&self, by_shape: bool) -> KeyAverages {
        let mut rows: Vec<KeyAveragesRow> = Vec::new();
        let mut index: HashMap<(RowKind, String, Option<String>), usize> = HashMap::new();
        let mut add = |kind, name: &str, shapes: Option<String>, total, own, bytes| {
            let key = (kind, name.to_owned(), shapes.clone());
            let at = *index.entry(key).or_insert_with(|| {
                rows.push(KeyAveragesRow {
                    name: name.to_owned(),
                    kind,
                    shapes,
                    calls: 0,
                    total_ns: 0,
                    self_ns: 0,
                    output_bytes: 0,
                });
                rows.len() - 1
            });
            let row = &mut rows[at];
            row.calls += 1;
            row.total_ns += total;
            row.self_ns += own;
            row.output_bytes += bytes;
        };
        for op in &self.ops {
            let shapes = by_shape.then(|| shapes_of(op));
            add(
                RowKind::Op,
                op.name,
                shapes,
                op.time_ns(),
                op.time_ns(),
                op.output_bytes(),
            );
        }
        let children = self.scope_children_ns();
        for (at, scope) in self.scopes.iter().enumerate() {
            let name = &self.scope_names[scope.name as usize];
            let own = scope.duration_ns.saturating_sub(children[at]);
            add(RowKind::Scope, name, None, scope.duration_ns, own, 0);
        }
        KeyAverages { rows, omitted: 0 }.sorted_by(SortBy::TotalTime)
    }

    /// For each scope, the time of what ran directly inside it on its thread: operations
    /// whose innermost scope it is, and scopes one level deeper, within its interval.
    fn scope_children_ns(&self) -> Vec<u64> {
        self.scopes
            .iter()
            .map(|scope| {
                let end = scope.start_ns + scope.duration_ns;
                let inside = |start: u64, thread: u32| {
                    thread == scope.thread && start >= scope.start_ns && start < end
                };
                let ops: u64 = self
                    .ops
                    .iter()
                    .filter(|op| {
                        inside(op.start_ns, op.thread)
                            && op.scopes.len() == scope.depth as usize + 1
                    })
                    .map(OpEvent::time_ns)
                    .sum();
                let scopes: u64 = self
                    .scopes
                    .iter()
                    .filter(|inner| {
                        inner.depth == scope.depth + 1 && inside(inner.start_ns, inner.thread)
                    })
                    .map(|inner| inner.duration_ns)
                    .sum();
                ops + scopes
            })
            .collect()
    }
}

fn shapes_of(op: &OpEvent) -> String {
    let shapes: Vec<String> = op
        .inputs
        .iter()
        .map(|input| format!("{:?}", input.shape))
        .collect();
    format!("[{}]", shapes.join(", "))
}

impl KeyAverages {
    /// The rows in `column`'s order, largest first.
    pub fn sorted_by(mut self, column: SortBy) -> Self {
        let key = |row: &KeyAveragesRow| match column {
            SortBy::TotalTime => row.total_ns,
            SortBy::SelfTime => row.self_ns,
            SortBy::AverageTime => row.average_ns(),
            SortBy::Calls => row.calls,
            SortBy::OutputBytes => row.output_bytes,
            SortBy::Name => 0,
        };
        if column == SortBy::Name {
            self.rows.sort_by(|a, b| a.name.cmp(&b.name));
        } else {
            self.rows
                .sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| a.name.cmp(&b.name)));
        }
        self
    }

    /// Keeps the first `rows` rows (PyTorch's `row_limit`).
    pub fn limit(mut self, rows: usize) -> Self {
        if self.rows.len() > rows {
            self.omitted += self.rows.len() - rows;
            self.rows.truncate(rows);
        }
        self
    }

    /// The first row named `name` (an operation before a scope of the same name).
    pub fn row(&self, name: &str) -> Option<&KeyAveragesRow> {
        self.rows.iter().find(|row| row.name == name)
    }

    /// The table as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("the rows are plain data")
    }
}

/// Nanoseconds as a short human figure (`812 ns`, `4.31 µs`, `12.9 ms`, `1.52 s`).
fn time(nanos: u64) -> String {
    let value = nanos as f64;
    if nanos < 1_000 {
        format!("{nanos} ns")
    } else if nanos < 1_000_000 {
        format!("{:.2} µs", value / 1e3)
    } else if nanos < 1_000_000_000 {
        format!("{:.2} ms", value / 1e6)
    } else {
        format!("{:.2} s", value / 1e9)
    }
}

impl fmt::Display for KeyAverages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let with_shapes = self.rows.iter().any(|row| row.shapes.is_some());
        let name_width = self
            .rows
            .iter()
            .map(|row| row.name.chars().count() + 2 * (row.kind == RowKind::Scope) as usize)
            .max()
            .unwrap_or(4)
            .max(4);
        write!(f, "{:<name_width$}", "name")?;
        writeln!(
            f,
            "  {:>8}  {:>11}  {:>11}  {:>11}  {:>12}{}",
            "calls",
            "total",
            "self",
            "average",
            "output",
            if with_shapes { "  input shapes" } else { "" }
        )?;
        let total_ns: u64 = self
            .rows
            .iter()
            .filter(|row| row.kind == RowKind::Op)
            .map(|row| row.self_ns)
            .sum();
        for row in &self.rows {
            let name = match row.kind {
                RowKind::Op => row.name.clone(),
                RowKind::Scope => format!("[{}]", row.name),
            };
            write!(f, "{name:<name_width$}")?;
            write!(
                f,
                "  {:>8}  {:>11}  {:>11}  {:>11}  {:>12}",
                row.calls,
                time(row.total_ns),
                time(row.self_ns),
                time(row.average_ns()),
                burn_memory::Bytes(row.output_bytes).to_string(),
            )?;
            if let Some(shapes) = &row.shapes {
                write!(f, "  {shapes}")?;
            }
            writeln!(f)?;
        }
        if self.omitted > 0 {
            writeln!(f, "… {} more rows", self.omitted)?;
        }
        write!(
            f,
            "operations' self time in these rows: {}; scopes in [brackets]",
            time(total_ns)
        )
    }
}
