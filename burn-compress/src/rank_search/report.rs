//! What a run tried and chose ([`SearchReport`]), and its markdown, CSV and JSON forms.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use super::{CostMetric, SketchSize, Threshold};

/// A model's quality, cost and trainable parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// What the quality measure returned.
    #[serde(deserialize_with = "nan_if_null")]
    pub quality: f64,
    /// What the cost returned.
    #[serde(deserialize_with = "nan_if_null")]
    pub cost: f64,
    /// Trainable parameters of the whole model.
    pub trainable: usize,
}

/// One configuration tried for one group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// The group's name.
    pub group: String,
    /// The number of terms tried.
    pub num_terms: usize,
    /// The rank tried.
    pub low_rank: usize,
    /// The converted model's quality.
    #[serde(deserialize_with = "nan_if_null")]
    pub quality: f64,
    /// The converted model's cost.
    #[serde(deserialize_with = "nan_if_null")]
    pub cost: f64,
    /// If the quality passes the threshold.
    pub passed: bool,
    /// Trainable parameters of the whole converted model.
    pub trainable: usize,
}

impl Trial {
    /// The size tried.
    pub fn size(&self) -> SketchSize {
        SketchSize::new(self.num_terms, self.low_rank)
    }

    pub(super) fn evaluation(&self) -> Evaluation {
        Evaluation {
            quality: self.quality,
            cost: self.cost,
            trainable: self.trainable,
        }
    }
}

/// A group's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupResult {
    /// The group's name.
    pub name: String,
    /// The paths of its layers.
    pub layers: Vec<String>,
    /// The size its layers got; `None` when they were kept dense.
    pub chosen: Option<SketchSize>,
    /// Why the group was kept dense.
    pub kept_dense: Option<String>,
    /// The model after this group: the winning trial's evaluation, or the model it started
    /// from when kept dense.
    pub after: Evaluation,
}

/// Everything a search tried and chose.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchReport {
    /// The threshold qualities were held to.
    pub threshold: Threshold,
    /// What the costs are.
    pub cost_metric: CostMetric,
    /// The starting model.
    pub baseline: Evaluation,
    /// Every trial, in the order run.
    pub trials: Vec<Trial>,
    /// Each group's outcome, in search order.
    pub groups: Vec<GroupResult>,
}

// JSON through burn's `Config` (serde_json): `save`, `load`, `load_binary`.
impl burn::config::Config for SearchReport {}

impl SearchReport {
    /// The size chosen for the group `name` (`None`: kept dense, or no such group).
    pub fn winner(&self, name: &str) -> Option<SketchSize> {
        self.groups
            .iter()
            .find(|group| group.name == name)
            .and_then(|group| group.chosen)
    }

    /// The tuned model's evaluation (the last group's `after`; the baseline if no group).
    pub fn tuned(&self) -> Evaluation {
        self.groups
            .last()
            .map_or(self.baseline, |group| group.after)
    }

    /// If `trial` is its group's winner.
    fn chosen(&self, trial: &Trial) -> bool {
        self.groups
            .iter()
            .any(|group| group.name == trial.group && group.chosen == Some(trial.size()))
    }

    /// The trials as CSV, one row per trial with a header:
    /// `group,num_terms,low_rank,quality,cost,passed,trainable,chosen`.
    pub fn to_csv(&self) -> String {
        let mut csv =
            String::from("group,num_terms,low_rank,quality,cost,passed,trainable,chosen\n");
        for trial in &self.trials {
            csv.push_str(&format!(
                "{},{},{},{},{},{},{},{}\n",
                csv_field(&trial.group),
                trial.num_terms,
                trial.low_rank,
                trial.quality,
                trial.cost,
                trial.passed,
                trial.trainable,
                self.chosen(trial)
            ));
        }
        csv
    }

    /// The report as pretty JSON (the serde form; [`SearchReport::load_binary`] reads it
    /// back).
    ///
    /// [`SearchReport::load_binary`]: burn::config::Config::load_binary
    pub fn to_json(&self) -> String {
        burn::config::config_to_json(self)
    }

    fn cost_text(&self, cost: f64) -> String {
        match self.cost_metric {
            CostMetric::TrainableBytes => format!("{cost:.0}"),
            CostMetric::Measured => format!("{cost:.4e}"),
        }
    }
}

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// The markdown table of every trial, then each group's outcome.
impl fmt::Display for SearchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "| group | num_terms | low_rank | quality | {} | trainable | passed | chosen |",
            self.cost_metric
        )?;
        writeln!(f, "|---|---|---|---|---|---|---|---|")?;
        writeln!(
            f,
            "| (dense baseline) | | | {:.4} | {} | {} | | |",
            self.baseline.quality,
            self.cost_text(self.baseline.cost),
            self.baseline.trainable
        )?;
        for trial in &self.trials {
            writeln!(
                f,
                "| {} | {} | {} | {:.4} | {} | {} | {} | {} |",
                trial.group.replace('|', "\\|"),
                trial.num_terms,
                trial.low_rank,
                trial.quality,
                self.cost_text(trial.cost),
                trial.trainable,
                if trial.passed { "yes" } else { "no" },
                if self.chosen(trial) { "**yes**" } else { "" }
            )?;
        }
        writeln!(f)?;
        writeln!(f, "Threshold: {}.", self.threshold)?;
        for group in &self.groups {
            match (&group.chosen, &group.kept_dense) {
                (Some(size), _) => writeln!(
                    f,
                    "- `{}` ({}): {size}, quality {:.4}, {} {}",
                    group.name,
                    layer_count(group.layers.len()),
                    group.after.quality,
                    self.cost_metric,
                    self.cost_text(group.after.cost)
                )?,
                (None, reason) => writeln!(
                    f,
                    "- `{}` ({}): kept dense: {}",
                    group.name,
                    layer_count(group.layers.len()),
                    reason.as_deref().unwrap_or("")
                )?,
            }
        }
        let tuned = self.tuned();
        write!(
            f,
            "Trainable parameters {} → {}, {} {} → {}.",
            self.baseline.trainable,
            tuned.trainable,
            self.cost_metric,
            self.cost_text(self.baseline.cost),
            self.cost_text(tuned.cost)
        )
    }
}

fn layer_count(count: usize) -> String {
    match count {
        1 => "1 layer".into(),
        n => format!("{n} layers"),
    }
}

/// JSON writes a NaN as `null`; read it back as NaN.
fn nan_if_null<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

/// A searched model and the report of its search.
#[derive(Debug)]
pub struct SearchOutcome<M> {
    /// The model with every group's winner in place (groups kept dense unchanged).
    pub model: M,
    /// What was tried and chosen.
    pub report: SearchReport,
}
