//! Choosing sketch sizes automatically: [`AutoTuner`] tries `(num_terms, low_rank)` for named
//! groups of layers, scores each try with the caller's quality measure and a cost, and keeps the
//! cheapest configuration whose quality passes a threshold (the role of Panther's
//! `SKAutoTuner`). The procedure is documented on [`AutoTuner`].

use std::collections::HashSet;
use std::fmt;
use std::ops::RangeInclusive;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};
use serde::{Deserialize, Deserializer, Serialize};

use super::{Converter, LinearKind, Selection};
use crate::SketchError;
use crate::draws::Draws;

/// The size of a sketched layer: `num_terms` terms of rank `low_rank`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SketchSize {
    /// The number of terms `T`.
    pub num_terms: usize,
    /// The rank `k` of each term.
    pub low_rank: usize,
}

impl SketchSize {
    /// A size of `num_terms` terms of rank `low_rank`.
    pub fn new(num_terms: usize, low_rank: usize) -> Self {
        Self {
            num_terms,
            low_rank,
        }
    }
}

impl From<SketchSize> for LinearKind {
    fn from(size: SketchSize) -> Self {
        LinearKind::Sketched {
            num_terms: size.num_terms,
            low_rank: size.low_rank,
        }
    }
}

impl fmt::Display for SketchSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "T={} k={}", self.num_terms, self.low_rank)
    }
}

/// Which sizes a group tries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Search {
    /// Every pair of the two lists, `num_terms` outer, `low_rank` inner (repeated values are
    /// tried once).
    Grid {
        /// The numbers of terms to try.
        num_terms: Vec<usize>,
        /// The ranks to try.
        low_rank: Vec<usize>,
    },
    /// `trials` distinct pairs drawn uniformly from the two ranges (all of them, in a random
    /// order, when the ranges hold no more than `trials` pairs). The same `seed` draws the
    /// same pairs, on every machine; every group tries the same pairs.
    Random {
        /// The numbers of terms to draw from.
        num_terms: RangeInclusive<usize>,
        /// The ranks to draw from.
        low_rank: RangeInclusive<usize>,
        /// How many pairs to try.
        trials: usize,
        /// The seed of the draws.
        seed: u64,
    },
}

impl Search {
    /// [`Search::Grid`] from any two lists.
    pub fn grid(
        num_terms: impl IntoIterator<Item = usize>,
        low_rank: impl IntoIterator<Item = usize>,
    ) -> Self {
        Self::Grid {
            num_terms: num_terms.into_iter().collect(),
            low_rank: low_rank.into_iter().collect(),
        }
    }

    /// [`Search::Random`].
    pub fn random(
        num_terms: RangeInclusive<usize>,
        low_rank: RangeInclusive<usize>,
        trials: usize,
        seed: u64,
    ) -> Self {
        Self::Random {
            num_terms,
            low_rank,
            trials,
            seed,
        }
    }

    /// The sizes this search tries, in order.
    ///
    /// Errors ([`SketchError::InvalidConfig`]): an empty grid list, a `0` size, an empty range,
    /// `trials = 0`.
    ///
    /// ```
    /// use burn_sketch::nn::{Search, SketchSize};
    ///
    /// let grid = Search::grid([1, 2], [8, 16]).candidates().unwrap();
    /// assert_eq!(grid[1], SketchSize::new(1, 16));
    /// let random = Search::random(1..=3, 4..=64, 5, 42).candidates().unwrap();
    /// assert_eq!(random, Search::random(1..=3, 4..=64, 5, 42).candidates().unwrap());
    /// assert!(random.iter().all(|s| (4..=64).contains(&s.low_rank)));
    /// ```
    pub fn candidates(&self) -> Result<Vec<SketchSize>, SketchError> {
        match self {
            Self::Grid {
                num_terms,
                low_rank,
            } => {
                check_list("grid.num_terms", num_terms)?;
                check_list("grid.low_rank", low_rank)?;
                let mut seen = HashSet::new();
                Ok(num_terms
                    .iter()
                    .flat_map(|&t| low_rank.iter().map(move |&k| SketchSize::new(t, k)))
                    .filter(|size| seen.insert(*size))
                    .collect())
            }
            Self::Random {
                num_terms,
                low_rank,
                trials,
                seed,
            } => {
                check_range("random.num_terms", num_terms)?;
                check_range("random.low_rank", low_rank)?;
                if *trials == 0 {
                    return Err(SketchError::InvalidConfig {
                        name: "random.trials",
                        value: 0,
                        reason: "must be at least 1",
                    });
                }
                Ok(draw(num_terms, low_rank, *trials, *seed))
            }
        }
    }
}

fn check_list(name: &'static str, values: &[usize]) -> Result<(), SketchError> {
    if values.is_empty() {
        return Err(SketchError::InvalidConfig {
            name,
            value: 0,
            reason: "lists no value (it has length 0); give at least one",
        });
    }
    if values.contains(&0) {
        return Err(SketchError::InvalidConfig {
            name,
            value: 0,
            reason: "holds a 0; sizes must be at least 1",
        });
    }
    Ok(())
}

fn check_range(name: &'static str, range: &RangeInclusive<usize>) -> Result<(), SketchError> {
    if range.is_empty() {
        return Err(SketchError::InvalidConfig {
            name,
            value: *range.start(),
            reason: "is the start of an empty range (start > end)",
        });
    }
    if *range.start() == 0 {
        return Err(SketchError::InvalidConfig {
            name,
            value: 0,
            reason: "range starts at 0; sizes must be at least 1",
        });
    }
    Ok(())
}

/// The pairs a [`Search::Random`] tries (ranges checked).
fn draw(
    num_terms: &RangeInclusive<usize>,
    low_rank: &RangeInclusive<usize>,
    trials: usize,
    seed: u64,
) -> Vec<SketchSize> {
    let mut rng = Draws::new(seed);
    let terms = (*num_terms.end() - *num_terms.start()) as u128 + 1;
    let ranks = (*low_rank.end() - *low_rank.start()) as u128 + 1;
    let space = terms * ranks;
    // At most the whole space (`take ≤ trials`, a `usize`).
    let take = space.min(trials as u128) as usize;
    let pair = |index: u128| {
        SketchSize::new(
            num_terms.start() + (index / ranks) as usize,
            low_rank.start() + (index % ranks) as usize,
        )
    };
    if space <= 2 * take as u128 && space <= 1 << 20 {
        // A small space, mostly taken: shuffle it (Fisher-Yates, the first `take` places) and
        // keep the head, rather than reject ever more repeats.
        let mut all: Vec<u128> = (0..space).collect();
        for i in 0..take {
            let j = i + rng.below((all.len() - i) as u128) as usize;
            all.swap(i, j);
        }
        return all[..take].iter().map(|&index| pair(index)).collect();
    }
    // Otherwise draw and reject repeats (in a space at least twice `take`, a repeat is rarer
    // than one draw in two).
    let mut seen = HashSet::new();
    let mut sizes = Vec::with_capacity(take);
    while sizes.len() < take {
        let size = SketchSize::new(rng.within(num_terms), rng.within(low_rank));
        if seen.insert(size) {
            sizes.push(size);
        }
    }
    sizes
}

/// When a quality passes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Threshold {
    /// Higher is better; a quality passes at `≥` this value (an accuracy).
    AtLeast(f64),
    /// Lower is better; a quality passes at `≤` this value (a loss, an error).
    AtMost(f64),
}

impl Threshold {
    /// The threshold's value.
    pub fn value(&self) -> f64 {
        match *self {
            Self::AtLeast(value) | Self::AtMost(value) => value,
        }
    }

    /// If `quality` passes (a NaN quality never does).
    pub fn passes(&self, quality: f64) -> bool {
        match *self {
            Self::AtLeast(value) => quality >= value,
            Self::AtMost(value) => quality <= value,
        }
    }

    /// If `a` is a strictly better quality than `b` (a NaN is worse than any number).
    pub fn better(&self, a: f64, b: f64) -> bool {
        match (a.is_nan(), b.is_nan()) {
            (true, _) => false,
            (false, true) => true,
            _ => match self {
                Self::AtLeast(_) => a > b,
                Self::AtMost(_) => a < b,
            },
        }
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AtLeast(value) => write!(f, "quality ≥ {value}"),
            Self::AtMost(value) => write!(f, "quality ≤ {value}"),
        }
    }
}

/// What a trial costs, lower being better.
pub enum Cost<'a, M, E> {
    /// The bytes of the model's trainable parameters (element count × element size, summed
    /// over every parameter of the model except the fixed sketches of sketched layers).
    /// Computed, not measured: free and repeatable.
    TrainableBytes,
    /// The caller's measure of a converted model: typically the seconds of a timed training
    /// step or forward pass. A NaN cost never wins.
    Measured(Measure<'a, M, E>),
}

/// The closure of a [`Cost::Measured`].
pub type Measure<'a, M, E> = Box<dyn FnMut(&M) -> Result<f64, E> + 'a>;

impl<'a, M, E> Cost<'a, M, E> {
    /// [`Cost::Measured`] from a closure.
    pub fn measured(measure: impl FnMut(&M) -> Result<f64, E> + 'a) -> Self {
        Self::Measured(Box::new(measure))
    }

    fn metric(&self) -> CostMetric {
        match self {
            Self::TrainableBytes => CostMetric::TrainableBytes,
            Self::Measured(_) => CostMetric::Measured,
        }
    }

    fn of<B: Backend>(&mut self, model: &M) -> Result<f64, E>
    where
        M: Module<B>,
    {
        match self {
            Self::TrainableBytes => Ok(trainable::<B, M>(model).1 as f64),
            Self::Measured(measure) => measure(model),
        }
    }
}

impl<M, E> fmt::Debug for Cost<'_, M, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TrainableBytes => write!(f, "TrainableBytes"),
            Self::Measured(_) => write!(f, "Measured(..)"),
        }
    }
}

/// Which [`Cost`] a report's costs are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CostMetric {
    /// [`Cost::TrainableBytes`].
    TrainableBytes,
    /// [`Cost::Measured`].
    Measured,
}

impl fmt::Display for CostMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TrainableBytes => write!(f, "trainable bytes"),
            Self::Measured => write!(f, "measured cost"),
        }
    }
}

/// A named group of layers tuned to one size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerGroup {
    /// The group's name, in the report.
    pub name: String,
    /// Its layers.
    pub selection: Selection,
    /// Its own search; `None` takes the tuner's.
    pub search: Option<Search>,
}

/// Tunes the sketch size of groups of [`AnyLinear`](super::AnyLinear) layers in any model
/// built from them: tries `(num_terms, low_rank)` for each named group, scores each try with
/// the caller's quality measure and a [`Cost`], and keeps the cheapest size whose quality
/// passes a [`Threshold`] (the role of Panther's `SKAutoTuner`).
///
/// # How a tuning run goes
///
/// 1. The settings are checked before anything is evaluated: at least one group, distinct
///    group names, a valid search (no empty grid, no `0` size, no empty range, at least one
///    trial), a threshold that is not NaN, and every group's [`Selection`] must pick layers of
///    the model ([`SketchError::NoMatch`] otherwise, from the [`Converter`]). A layer picked by
///    several groups belongs to the first of them (a last group `Selection::All` tunes "the
///    rest"); a group left with no layer of its own is an error too.
/// 2. The starting (dense) model is evaluated once, the *baseline*: its quality and cost.
/// 3. Groups are tuned one after the other, as Panther does: group `i` is tuned on the model
///    that holds the winners of groups `0..i`, its own layers are converted from dense for
///    each candidate `(num_terms, low_rank)` (one shared size for all the layers of the group)
///    and the later groups stay dense. Each trial converts a clone of that model with the
///    [`Converter`], then calls the quality measure and the cost on it.
/// 4. A group's winner is its cheapest trial whose quality passes the [`Threshold`] and that
///    costs less than the model it started from (sketching a group must pay for itself);
///    equal costs go to the better quality, then to the earlier trial (a NaN quality never
///    passes, a NaN cost never wins). A group with no such trial is kept dense and the
///    report says why; later groups carry on.
/// 5. If no group gets a winner, the call is [`SketchError::NothingPasses`], whose message
///    gives the best quality reached; otherwise it returns the model with every winner in
///    place ([`TuneOutcome`]).
///
/// The [`TuneReport`] lists every trial (a markdown table through `Display`,
/// [`to_csv`](TuneReport::to_csv), [`to_json`](TuneReport::to_json)) and each group's winner
/// or why it stayed dense; each trial is also logged with `tracing::info!` as it ends.
///
/// The returned model is the winning trial's model itself, not a fresh conversion: the
/// sketches a [`SkLinear`](crate::SkLinear) draws at conversion are random, so the model you
/// get is exactly the one whose quality the report shows. The draws come from the backend's
/// generator: call `B::seed` before tuning for a repeatable run.
///
/// Layers outside every group, and every other tensor of the model, are never touched (bit
/// for bit the original ones), as are the layers of groups kept dense. (Burn initialises a
/// parameter lazily, on first use, and a clone of a parameter not yet used draws values of
/// its own: the tuner initialises the model it is given before cloning it, so a copy you
/// cloned from a freshly built, never-used model beforehand holds other values.)
///
/// # Example
///
/// ```
/// use burn::backend::Flex;
/// use burn::module::Module;
/// use burn::tensor::backend::Backend;
/// use burn::tensor::{Distribution, Tensor};
/// use burn_sketch::nn::{
///     AnyLinear, AnyLinearConfig, AutoTuner, Cost, LinearKind, Search, Selection, Threshold,
/// };
///
/// #[derive(Module, Debug)]
/// struct Net<B: Backend> {
///     fc1: AnyLinear<B>,
///     fc2: AnyLinear<B>,
/// }
///
/// impl<B: burn_sketch::SketchBackend> Net<B> {
///     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
///         self.fc2.forward(self.fc1.forward(x))
///     }
/// }
///
/// let device = Default::default();
/// Flex::seed(&device, 7);
/// let net = Net::<Flex> {
///     fc1: AnyLinearConfig::new(64, 64).init(&device),
///     fc2: AnyLinearConfig::new(64, 8).init(&device),
/// };
/// // Quality: how far the outputs move from the dense model's (lower is better). Sketched
/// // straight from dense weights, before any fine-tuning, a layer is a rough estimate of them;
/// // a real quality measure would fine-tune briefly, then score on held-out data.
/// let x = Tensor::<Flex, 2>::random([32, 64], Distribution::Normal(0.0, 1.0), &device);
/// let reference = net.forward(x.clone());
/// let scale = reference.clone().powf_scalar(2.0).sum().into_scalar().sqrt();
/// let relative_error = |candidate: &Net<Flex>| {
///     let diff = candidate.forward(x.clone()) - reference.clone();
///     f64::from(diff.powf_scalar(2.0).sum().into_scalar().sqrt() / scale)
/// };
///
/// let outcome = AutoTuner::new(Search::grid([1, 2], [4, 8, 16]), Threshold::AtMost(2.0))
///     .group("hidden", Selection::paths(["fc1"]))
///     .tune(net, relative_error, Cost::TrainableBytes)
///     .unwrap();
/// println!("{}", outcome.report); // the markdown table of every trial
/// let chosen = outcome.report.groups[0].chosen.expect("a size passes");
/// assert_eq!(outcome.model.fc1.kind(), LinearKind::from(chosen));
/// assert_eq!(outcome.model.fc2.kind(), LinearKind::Dense); // in no group
/// assert_eq!(outcome.report.trials.len(), 6);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AutoTuner {
    groups: Vec<LayerGroup>,
    search: Search,
    threshold: Threshold,
}

// JSON through burn's `Config` (serde_json): `save`, `load`, `load_binary`.
impl burn::config::Config for AutoTuner {}

impl AutoTuner {
    /// A tuner with no group yet, trying `search`'s sizes and keeping those whose quality
    /// passes `threshold`.
    pub fn new(search: Search, threshold: Threshold) -> Self {
        Self {
            groups: Vec::new(),
            search,
            threshold,
        }
    }

    /// Adds a group, tuned after the groups added before it, with the tuner's search.
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

    /// Replaces the tuner's search (groups with their own keep theirs).
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

    /// The tuner's search.
    pub fn search(&self) -> &Search {
        &self.search
    }

    /// The threshold.
    pub fn threshold(&self) -> Threshold {
        self.threshold
    }

    /// Checks the settings that do not depend on a model; returns each group's sizes.
    fn validate(&self) -> Result<Vec<Vec<SketchSize>>, SketchError> {
        if self.groups.is_empty() {
            return Err(SketchError::InvalidConfig {
                name: "groups",
                value: 0,
                reason: "no layer group to tune; add one with `AutoTuner::group`",
            });
        }
        let mut names = HashSet::new();
        for (index, group) in self.groups.iter().enumerate() {
            if !names.insert(group.name.as_str()) {
                return Err(SketchError::InvalidConfig {
                    name: "groups",
                    value: index,
                    reason: "this group (0-based index) has the name of an earlier one",
                });
            }
        }
        if self.threshold.value().is_nan() {
            return Err(SketchError::Unsupported {
                what: "a NaN quality threshold (no quality can pass it)".into(),
            });
        }
        self.groups
            .iter()
            .map(|group| group.search.as_ref().unwrap_or(&self.search).candidates())
            .collect()
    }

    /// Tunes `model`'s groups and returns it with the winners in place, and the report.
    ///
    /// `quality` scores a converted model (its direction is the [`Threshold`]'s); `cost` says
    /// what a model costs. Both are called once on the starting model (the baseline) and once
    /// per trial. Errors: invalid settings ([`SketchError::InvalidConfig`], or
    /// [`SketchError::Unsupported`] for a NaN threshold), a selection that picks nothing
    /// ([`SketchError::NoMatch`]), a picked layer that is not dense
    /// ([`SketchError::Unsupported`]), no group that could be sketched
    /// ([`SketchError::NothingPasses`]), and the errors of a [`Cost::Measured`]. A quality
    /// measure that can fail goes to [`try_tune`](Self::try_tune).
    pub fn tune<B, M>(
        &self,
        model: M,
        mut quality: impl FnMut(&M) -> f64,
        cost: Cost<'_, M, SketchError>,
    ) -> Result<TuneOutcome<M>, SketchError>
    where
        B: Backend,
        M: Module<B>,
    {
        self.try_tune(model, |model: &M| Ok(quality(model)), cost)
    }

    /// [`tune`](Self::tune) with a quality measure that can fail: its errors, and those of the
    /// cost, end the run and are returned as they are; the tuner's own errors come as
    /// `E::from(SketchError)` (so `E` may be `SketchError`, `anyhow::Error` or the
    /// application's error type).
    pub fn try_tune<B, M, E, Q>(
        &self,
        model: M,
        mut quality: Q,
        mut cost: Cost<'_, M, E>,
    ) -> Result<TuneOutcome<M>, E>
    where
        B: Backend,
        M: Module<B>,
        E: From<SketchError>,
        Q: FnMut(&M) -> Result<f64, E>,
    {
        let candidates = self.validate()?;
        // Burn initialises parameters lazily, and a clone of a lazy parameter draws values of
        // its own: materialise them, so that every trial shares the model's values.
        model.visit(&mut Materialise);
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
            "autotune: dense baseline"
        );

        let mut report = TuneReport {
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
                    tracing::info!(group = %group.name, "autotune: chose {size}");
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
                    tracing::info!(group = %group.name, "autotune: kept dense: {reason}");
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
            return Err(SketchError::NothingPasses {
                reason: self.nothing_passes(&report),
            }
            .into());
        }
        Ok(TuneOutcome {
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
        E: From<SketchError>,
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
            "autotune: trial {index} of {total}",
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
    ) -> Result<Vec<Vec<String>>, SketchError> {
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
                SketchError::Unsupported { what } => SketchError::Unsupported {
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
                return Err(SketchError::NoMatch {
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

    fn nothing_passes(&self, report: &TuneReport) -> String {
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

/// Initialises every lazy parameter of a model (in place: the values are then shared by its
/// clones).
struct Materialise;

impl<B: Backend> ModuleVisitor<B> for Materialise {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let _ = param.val();
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        let _ = param.val();
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        let _ = param.val();
    }
}

/// The trainable parameters of `model` and their bytes: every float parameter except the
/// fixed sketches (`u1s`, `u2s`) of sketched layers.
fn trainable<B: Backend, M: Module<B>>(model: &M) -> (usize, usize) {
    let mut counter = TrainableCounter::<B> {
        stack: Vec::new(),
        params: 0,
        bytes: 0,
        _backend: std::marker::PhantomData,
    };
    model.visit(&mut counter);
    (counter.params, counter.bytes)
}

struct TrainableCounter<B> {
    stack: Vec<(String, String)>,
    params: usize,
    bytes: usize,
    _backend: std::marker::PhantomData<B>,
}

impl<B: Backend> ModuleVisitor<B> for TrainableCounter<B> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.stack.push((name.into(), container_type.into()));
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.stack.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        // A sketched `AnyLinear`'s parameters sit under [.., ("Sketched", LinearLayer), field].
        let fixed_sketch = self.stack.windows(2).any(|pair| {
            pair[0] == ("Sketched".into(), "Enum:LinearLayer".into())
                && matches!(pair[1].0.as_str(), "u1s" | "u2s")
        });
        if fixed_sketch {
            return;
        }
        let value = param.val();
        let elements = value.shape().num_elements();
        self.params += elements;
        self.bytes += elements * value.dtype().size();
    }
}

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

    fn evaluation(&self) -> Evaluation {
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

/// Everything a tuning run tried and chose.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneReport {
    /// The threshold qualities were held to.
    pub threshold: Threshold,
    /// What the costs are.
    pub cost_metric: CostMetric,
    /// The starting model.
    pub baseline: Evaluation,
    /// Every trial, in the order run.
    pub trials: Vec<Trial>,
    /// Each group's outcome, in tuning order.
    pub groups: Vec<GroupResult>,
}

// JSON through burn's `Config` (serde_json): `save`, `load`, `load_binary`.
impl burn::config::Config for TuneReport {}

impl TuneReport {
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

    /// The report as pretty JSON (the serde form; [`TuneReport::load_binary`] reads it
    /// back).
    ///
    /// [`TuneReport::load_binary`]: burn::config::Config::load_binary
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
impl fmt::Display for TuneReport {
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

/// A tuned model and the report of its tuning.
#[derive(Debug)]
pub struct TuneOutcome<M> {
    /// The model with every group's winner in place (groups kept dense unchanged).
    pub model: M,
    /// What was tried and chosen.
    pub report: TuneReport,
}
