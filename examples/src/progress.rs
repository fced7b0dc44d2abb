//! One readable line per epoch for burn-train runs whose output is not a terminal (logs, CI,
//! pipes), where burn-train's fallback renderer prints a debug structure per iteration.

use std::collections::HashMap;
use std::io::Write;

use burn::train::metric::{MetricDefinition, MetricId};
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};

/// A burn-train renderer that writes, at the end of each epoch, one line with the epoch and
/// the latest value of every training and validation metric:
///
/// ```text
/// epoch 2/8 | train Loss 0.412 Accuracy 88.1 % ... | valid Loss 0.389 Accuracy 89.0 %
/// ```
pub struct EpochLines<W: Write + Send + Sync = PrintStdout> {
    out: W,
    names: HashMap<MetricId, String>,
    /// Latest values, as the metrics update them.
    train: Vec<(MetricId, String)>,
    valid: Vec<(MetricId, String)>,
    /// The values as of the last render of the current epoch: burn-train updates the metrics
    /// of a batch before rendering its progress, so by the time a render shows that the epoch
    /// moved on, the first batch of the next one has already replaced the latest values.
    shown_train: Vec<(MetricId, String)>,
    shown_valid: Vec<(MetricId, String)>,
    /// The epoch being trained or validated and the number of epochs.
    epoch: Option<(usize, usize)>,
}

impl EpochLines {
    /// Lines on standard output.
    pub fn stdout() -> Self {
        Self::new(PrintStdout)
    }
}

/// Standard output through `print!`, which a test harness captures (a direct write to
/// `std::io::stdout()` would bypass the capture and fill the test log).
#[derive(Debug, Clone, Copy, Default)]
pub struct PrintStdout;

impl Write for PrintStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        print!("{}", String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush()
    }
}

impl<W: Write + Send + Sync> EpochLines<W> {
    /// Lines written to `out`.
    pub fn new(out: W) -> Self {
        Self {
            out,
            names: HashMap::new(),
            train: Vec::new(),
            valid: Vec::new(),
            shown_train: Vec::new(),
            shown_valid: Vec::new(),
            epoch: None,
        }
    }

    /// The writer, for tests.
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Notes the epoch `progress` is in; when it moves on, the finished epoch's line is written.
    fn at(&mut self, progress: &TrainingProgress) {
        let epoch = (
            progress.global_progress.items_processed,
            progress.global_progress.items_total,
        );
        if self.epoch.is_some_and(|current| current != epoch) {
            self.finish_epoch();
        }
        self.epoch = Some(epoch);
    }

    fn finish_epoch(&mut self) {
        let Some((epoch, epochs)) = self.epoch.take() else {
            return;
        };
        let values = |entries: &[(MetricId, String)]| {
            entries
                .iter()
                .map(|(id, value)| {
                    let name = self.names.get(id).map_or("?", String::as_str);
                    // Some of burn-train's metrics (CPU use, CPU memory) put their name in
                    // their formatted value already: "CPU Usage: 76.47 %".
                    let value = value
                        .strip_prefix(name)
                        .and_then(|rest| rest.strip_prefix(": "))
                        .unwrap_or(value);
                    format!("{name} {value}")
                })
                .collect::<Vec<_>>()
                .join("  ")
        };
        let mut line = format!(
            "epoch {epoch}/{epochs} | train {}",
            values(&self.shown_train)
        );
        if !self.shown_valid.is_empty() {
            line += &format!(" | valid {}", values(&self.shown_valid));
        }
        // A closed pipe must not stop the training; the line is lost, nothing else.
        let _ = writeln!(self.out, "{line}").and_then(|()| self.out.flush());
        self.shown_train.clear();
        self.shown_valid.clear();
        self.valid.clear();
    }
}

/// Keeps the latest formatted value of the metric `state` reports, in registration order.
fn record(entries: &mut Vec<(MetricId, String)>, state: MetricState) {
    let entry = match state {
        MetricState::Generic(entry) | MetricState::Numeric(entry, _) => entry,
    };
    let value = entry.serialized_entry.formatted;
    match entries.iter_mut().find(|(id, _)| *id == entry.metric_id) {
        Some((_, latest)) => *latest = value,
        None => entries.push((entry.metric_id, value)),
    }
}

impl<W: Write + Send + Sync> MetricsRendererTraining for EpochLines<W> {
    fn update_train(&mut self, state: MetricState) {
        record(&mut self.train, state);
    }

    fn update_valid(&mut self, state: MetricState) {
        record(&mut self.valid, state);
    }

    fn render_train(&mut self, item: TrainingProgress, _indicators: Vec<ProgressType>) {
        self.at(&item);
        self.shown_train.clone_from(&self.train);
    }

    fn render_valid(&mut self, item: TrainingProgress, _indicators: Vec<ProgressType>) {
        self.at(&item);
        self.shown_valid.clone_from(&self.valid);
    }

    fn on_train_end(
        &mut self,
        summary: Option<burn::train::LearnerSummary>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        self.finish_epoch();
        if let Some(summary) = summary {
            writeln!(self.out, "{summary}")?;
        }
        Ok(())
    }
}

impl<W: Write + Send + Sync> MetricsRendererEvaluation for EpochLines<W> {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}

    fn render_test(&mut self, _item: EvaluationProgress, _indicators: Vec<ProgressType>) {}
}

impl<W: Write + Send + Sync> MetricsRenderer for EpochLines<W> {
    fn manual_close(&mut self) {}

    fn register_metric(&mut self, definition: MetricDefinition) {
        self.names.insert(definition.metric_id, definition.name);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use burn::data::dataloader::Progress;
    use burn::train::metric::{MetricEntry, SerializedEntry};

    use super::*;

    fn state(id: &MetricId, value: &str) -> MetricState {
        let serialized = SerializedEntry {
            formatted: value.to_string(),
            serialized: value.to_string(),
        };
        MetricState::Generic(MetricEntry::new(id.clone(), serialized))
    }

    fn progress(epoch: usize) -> TrainingProgress {
        TrainingProgress {
            progress: Some(Progress {
                items_processed: 1,
                items_total: 2,
            }),
            global_progress: Progress {
                items_processed: epoch,
                items_total: 2,
            },
            iteration: None,
        }
    }

    #[test]
    fn one_line_per_epoch_with_the_latest_values() {
        let loss = MetricId::new(Arc::new("loss".into()));
        let mut lines = EpochLines::new(Vec::new());
        lines.names.insert(loss.clone(), "Loss".into());
        for epoch in [1, 2] {
            for value in ["0.9".to_string(), format!("0.{epoch}")] {
                lines.update_train(state(&loss, &value));
                lines.render_train(progress(epoch), Vec::new());
            }
            lines.update_valid(state(&loss, &format!("0.{epoch}5")));
            lines.render_valid(progress(epoch), Vec::new());
        }
        lines.on_train_end(None).unwrap();
        let text = String::from_utf8(lines.into_inner()).unwrap();
        assert_eq!(
            text,
            "epoch 1/2 | train Loss 0.1 | valid Loss 0.15\nepoch 2/2 | train Loss 0.2 | valid Loss 0.25\n"
        );
    }

    #[test]
    fn a_value_that_names_its_metric_is_shown_once() {
        let cpu = MetricId::new(Arc::new("cpu".into()));
        let mut lines = EpochLines::new(Vec::new());
        lines.names.insert(cpu.clone(), "CPU Usage".into());
        lines.update_train(state(&cpu, "CPU Usage: 76.47 %"));
        lines.render_train(progress(1), Vec::new());
        lines.on_train_end(None).unwrap();
        let text = String::from_utf8(lines.into_inner()).unwrap();
        assert_eq!(text, "epoch 1/2 | train CPU Usage 76.47 %\n");
    }
}
