//! [`RankSearch`]: its settings and the run that tries every group's sizes.

use std::collections::HashSet;

use burn::module::Module;
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

use super::criteria::trainable;
use super::{Cost, Evaluation, GroupResult, LayerGroup, Search, SearchOutcome, SearchReport};
use super::{SketchSize, Threshold, Trial};
use crate::{CompressError, Converter, LinearKind, Selection};

/// Finds, for each named group of [`AnyLinear`](crate::AnyLinear) layers, the cheapest sketch
/// size `(num_terms, low_rank)` whose quality still passes a [`Threshold`] (Panther's
/// `SKAutoTuner`). Which sizes a layer can take depends on the model and the task, so they are
/// measured on trial conversions rather than guessed. Groups are searched one after the other,
/// each on the model holding the earlier winners; a group with no passing size cheaper than
/// keeping it dense stays dense. [`run`](Self::run) returns the very model that was scored and a
/// [`SearchReport`] of every trial. The procedure is in the book ("Transformers and
/// conversion", "Choosing sizes"); an example is in the [module docs](crate::rank_search).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankSearch {
    groups: Vec<LayerGroup>,
    search: Search,
    threshold: Threshold,
}

// JSON through burn's `Config` (serde_json): `save`, `load`, `load_binary`.
impl burn::config::Config for RankSearch {}

impl RankSearch {
    /// A search with no group yet, trying `search`'s sizes and keeping those whose quality
    /// passes `threshold`.
    pub fn new(search: Search, threshold: Threshold) -> Self {
        Self {
            groups: Vec::new(),
            search,
            threshold,
        }
    }

    /// Adds a group, searched after the groups added before it, with the search's sizes.
    pub fn group(self, name: impl Into<String>, selection: Selection) -> Self {
        self.push(name.into(), selection, None)
    }

    /// Adds a group with a search of its own (attention and MLP layers often want different
    /// ranges).
    pub fn group_with_search(
        self,
        name: impl Into<String>,
        selection: Selection,
        search: Search,
    ) -> Self {
        self.push(name.into(), selection, Some(search))
    }

    fn push(mut self, name: String, selection: Selection, search: Option<Search>) -> Self {
        self.groups.push(LayerGroup {
            name,
            selection,
            search,
        });
        self
    }

    /// Replaces the sizes tried (groups with their own keep theirs).
    pub fn with_search(mut self, search: Search) -> Self {
        self.search = search;
        self
    }

    /// Replaces the threshold.
    pub fn with_threshold(mut self, threshold: Threshold) -> Self {
        self.threshold = threshold;
        self
    }

    /// The groups, in tuning order.
    pub fn groups(&self) -> &[LayerGroup] {
        &self.groups
    }

    /// The sizes tried by groups without their own.
    pub fn search(&self) -> &Search {
        &self.search
    }

    /// The threshold.
    pub fn threshold(&self) -> Threshold {
        self.threshold
    }

    /// Checks the settings that do not depend on a model; returns each group's sizes.
    fn validate(&self) -> Result<Vec<Vec<SketchSize>>, CompressError> {
        if self.groups.is_empty() {
            return Err(CompressError::InvalidConfig {
                name: "groups",
                value: 0,
                reason: "no layer group to tune; add one with `RankSearch::group`",
            });
        }
        let mut names = HashSet::new();
        for (index, group) in self.groups.iter().enumerate() {
            if !names.insert(group.name.as_str()) {
                return Err(CompressError::InvalidConfig {
                    name: "groups",
                    value: index,
                    reason: "this group (0-based index) has the name of an earlier one",
                });
            }
        }
        if self.threshold.value().is_nan() {
            return Err(CompressError::Unsupported {
                what: "a NaN quality threshold (no quality can pass it)".into(),
            });
        }
        self.groups
            .iter()
            .map(|group| group.search.as_ref().unwrap_or(&self.search).candidates())
            .collect()
    }

    /// Searches `model`'s groups and returns it with the winners in place, and the report.
    ///
    /// `quality` scores a converted model (its direction is the [`Threshold`]'s); `cost` says
    /// what a model costs. Both are called once on the starting model (the baseline) and once
    /// per trial. Errors: invalid settings ([`CompressError::InvalidConfig`], or
    /// [`CompressError::Unsupported`] for a NaN threshold), a selection that picks nothing
    /// ([`CompressError::NoMatch`]), a picked layer that is not dense
    /// ([`CompressError::Unsupported`]), no group that could be sketched
    /// ([`CompressError::NothingPasses`]), and the errors of a [`Cost::Measured`]. A quality
    /// measure that can fail goes to [`try_run`](Self::try_run).
    pub fn run<B, M>(
        &self,
        model: M,
        mut quality: impl FnMut(&M) -> f64,
        cost: Cost<'_, M, CompressError>,
    ) -> Result<SearchOutcome<M>, CompressError>
    where
        B: Backend,
        M: Module<B>,
    {
        self.try_run(model, |model: &M| Ok(quality(model)), cost)
    }

    /// [`run`](Self::run) with a quality measure that can fail: its errors, and those of the
    /// cost, end the run and are returned as they are; the search's own errors come as
    /// `E::from(CompressError)` (so `E` may be `CompressError`, `anyhow::Error` or the
    /// application's error type).
    pub fn try_run<B, M, E, Q>(
        &self,
        model: M,
        mut quality: Q,
        mut cost: Cost<'_, M, E>,
    ) -> Result<SearchOutcome<M>, E>
    where
        B: Backend,
        M: Module<B>,
        E: From<CompressError>,
        Q: FnMut(&M) -> Result<f64, E>,
    {
        let candidates = self.validate()?;
        // Burn initialises parameters lazily, and a clone of a lazy parameter draws values of
        // its own: materialise them, so that every trial shares the model's values.
        burn_memory::draw_params(&model);
        let members = self.members::<B, M>(&model)?;

        let baseline = Evaluation {
            quality: quality(&model)?,
            cost: cost.of::<B>(&model)?,
            trainable: trainable::<B, M>(&model).0,
        };
        tracing::info!(
            quality = baseline.quality,
            cost = baseline.cost,
            trainable = baseline.trainable,
            "rank search: dense baseline"
        );

        let mut report = SearchReport {
            threshold: self.threshold,
            cost_metric: cost.metric(),
            baseline,
            trials: Vec::new(),
            groups: Vec::new(),
        };
        let total: usize = candidates.iter().map(Vec::len).sum();
        let mut current = model;
        let mut incumbent = baseline;
        let mut rules: Vec<(Selection, LinearKind)> = Vec::new();

        for ((group, sizes), layers) in self.groups.iter().zip(&candidates).zip(members) {
            let first_trial = report.trials.len();
            let mut best: Option<(usize, M)> = None;
            for &size in sizes {
                let (trial, trial_model) = self.trial::<B, M, E, Q>(
                    &current,
                    &rules,
                    (group, size),
                    (&mut quality, &mut cost),
                    (report.trials.len() + 1, total),
                )?;
                let wins = self.wins(
                    &trial,
                    best.as_ref().map(|(at, _)| &report.trials[*at]),
                    &incumbent,
                );
                report.trials.push(trial);
                if wins {
                    best = Some((report.trials.len() - 1, trial_model));
                }
            }

            let tried = &report.trials[first_trial..];
            let result = match best {
                Some((at, winner)) => {
                    let trial = &report.trials[at];
                    let size = SketchSize::new(trial.num_terms, trial.low_rank);
                    incumbent = trial.evaluation();
                    current = winner;
                    rules.push((group.selection.clone(), size.into()));
                    tracing::info!(group = %group.name, "rank search: chose {size}");
                    GroupResult {
                        name: group.name.clone(),
                        layers,
                        chosen: Some(size),
                        kept_dense: None,
                        after: incumbent,
                    }
                }
                None => {
                    let reason = self.why_dense(tried, incumbent.cost);
                    tracing::info!(group = %group.name, "rank search: kept dense: {reason}");
                    rules.push((group.selection.clone(), LinearKind::Dense));
                    GroupResult {
                        name: group.name.clone(),
                        layers,
                        chosen: None,
                        kept_dense: Some(reason),
                        after: incumbent,
                    }
                }
            };
            report.groups.push(result);
        }

        if report.groups.iter().all(|group| group.chosen.is_none()) {
            return Err(CompressError::NothingPasses {
                reason: self.nothing_passes(&report),
            }
            .into());
        }
        Ok(SearchOutcome {
            model: current,
            report,
        })
    }

    /// Trial `index` of `total`: `current` converted by the rules chosen so far and `group` at
    /// `size`, evaluated and logged. Returns the trial and its model.
    fn trial<B, M, E, Q>(
        &self,
        current: &M,
        rules: &[(Selection, LinearKind)],
        (group, size): (&LayerGroup, SketchSize),
        (quality, cost): (&mut Q, &mut Cost<'_, M, E>),
        (index, total): (usize, usize),
    ) -> Result<(Trial, M), E>
    where
        B: Backend,
        M: Module<B>,
        E: From<CompressError>,
        Q: FnMut(&M) -> Result<f64, E>,
    {
        let converter = rules
            .iter()
            .cloned()
            .chain([(group.selection.clone(), size.into())])
            .fold(Converter::new(), |c, (selection, kind)| {
                c.rule(selection, kind)
            });
        let (trial_model, _) = converter.apply::<B, M>(current.clone())?;
        let trial_quality = quality(&trial_model)?;
        let trial = Trial {
            group: group.name.clone(),
            num_terms: size.num_terms,
            low_rank: size.low_rank,
            quality: trial_quality,
            cost: cost.of::<B>(&trial_model)?,
            passed: self.threshold.passes(trial_quality),
            trainable: trainable::<B, M>(&trial_model).0,
        };
        tracing::info!(
            group = %trial.group,
            num_terms = trial.num_terms,
            low_rank = trial.low_rank,
            quality = trial.quality,
            cost = trial.cost,
            trainable = trial.trainable,
            passed = trial.passed,
            "rank search: trial {index} of {total}",
        );
        Ok((trial, trial_model))
    }

    /// Whether `trial` becomes its group's best so far, over `held`. Eligible: it passes, and
    /// is cheaper than the model it was made from (`incumbent`, when that cost is known: a NaN
    /// baseline cost asks for nothing); then the cheaper wins, and at equal cost the better
    /// quality.
    fn wins(&self, trial: &Trial, held: Option<&Trial>, incumbent: &Evaluation) -> bool {
        let eligible = trial.passed
            && !trial.cost.is_nan()
            && (incumbent.cost.is_nan() || trial.cost < incumbent.cost);
        eligible
            && held.is_none_or(|held| {
                trial.cost < held.cost
                    || (trial.cost == held.cost
                        && self.threshold.better(trial.quality, held.quality))
            })
    }

    /// The layer paths of each group (a layer belongs to the first group that picks it), by
    /// converting a clone once with a distinct size per group. The selections' `NoMatch`, and
    /// `Unsupported` for a picked layer that is not dense, come from here.
    fn members<B: Backend, M: Module<B>>(
        &self,
        model: &M,
    ) -> Result<Vec<Vec<String>>, CompressError> {
        let probe =
            self.groups
                .iter()
                .enumerate()
                .fold(Converter::new(), |converter, (index, group)| {
                    converter.rule(
                        group.selection.clone(),
                        SketchSize::new(index + 1, 1).into(),
                    )
                });
        let (_, conversion) = probe
            .apply::<B, M>(model.clone())
            .map_err(|err| match err {
                CompressError::Unsupported { what } => CompressError::Unsupported {
                    what: format!(
                        "tuning a layer that is not dense (the tuner sketches dense layers; \
                         the probe found: {what})"
                    ),
                },
                err => err,
            })?;
        let mut members = vec![Vec::new(); self.groups.len()];
        for layer in conversion.layers {
            if let (LinearKind::Dense, LinearKind::Sketched { num_terms, .. }) =
                (layer.from, layer.to)
            {
                members[num_terms - 1].push(layer.path);
            }
        }
        for (group, layers) in self.groups.iter().zip(&members) {
            if layers.is_empty() {
                return Err(CompressError::NoMatch {
                    pattern: format!(
                        "group `{}` (no layer of its own: its selection picks none, or only \
                         layers of earlier groups)",
                        group.name
                    ),
                    layers: Converter::layers::<B, M>(model)
                        .into_iter()
                        .map(|layer| layer.path)
                        .collect(),
                });
            }
        }
        Ok(members)
    }

    fn why_dense(&self, tried: &[Trial], dense_cost: f64) -> String {
        let passing = tried.iter().filter(|trial| trial.passed);
        match passing.min_by(|a, b| a.cost.total_cmp(&b.cost)) {
            Some(cheapest) => format!(
                "every passing size costs at least as much as keeping the group dense \
                 (cheapest: {} at {} ≥ {})",
                cheapest.size(),
                cheapest.cost,
                dense_cost
            ),
            None => match self.best_of(tried) {
                Some(best) => format!(
                    "no size reaches {} (best: {} at {})",
                    self.threshold,
                    best.quality,
                    best.size()
                ),
                None => format!("no size reaches {} (every quality was NaN)", self.threshold),
            },
        }
    }

    fn best_of<'t>(&self, trials: &'t [Trial]) -> Option<&'t Trial> {
        trials
            .iter()
            .fold(None, |best: Option<&Trial>, trial| match best {
                Some(held) if !self.threshold.better(trial.quality, held.quality) => Some(held),
                _ if trial.quality.is_nan() => best,
                _ => Some(trial),
            })
    }

    fn nothing_passes(&self, report: &SearchReport) -> String {
        let best = match self.best_of(&report.trials) {
            Some(best) => format!(
                "the best quality reached is {} (group `{}`, {})",
                best.quality,
                best.group,
                best.size()
            ),
            None => "every quality was NaN".into(),
        };
        let groups: Vec<String> = report
            .groups
            .iter()
            .map(|group| {
                format!(
                    "`{}`: {}",
                    group.name,
                    group.kept_dense.as_deref().unwrap_or("")
                )
            })
            .collect();
        format!(
            "no group could be sketched with {} in {} trials; {best} (dense baseline: {}); {}",
            self.threshold,
            report.trials.len(),
            report.baseline.quality,
            groups.join("; ")
        )
    }
}
