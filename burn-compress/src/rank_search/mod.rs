//! Choosing sketch sizes automatically: [`RankSearch`] tries `(num_terms, low_rank)` for named
//! groups of layers, scores each try with the caller's quality measure and a cost, and keeps the
//! cheapest configuration whose quality passes a threshold (the role of Panther's
//! `SKAutoTuner`; not CubeCL's kernel autotuning). The procedure, step by step, is in the book's
//! "Transformers and conversion" chapter, section "Choosing sizes: `RankSearch`".
//!
//! - `space`: [`SketchSize`], and [`Search`], the sizes a group tries (a grid, or seeded draws).
//! - `criteria`: [`Threshold`], when a quality passes; [`Cost`] (and [`Measure`]), what a trial
//!   costs; [`CostMetric`], which cost a report holds.
//! - `group`: [`LayerGroup`], a named [`Selection`](crate::Selection) searched as one.
//! - `run`: [`RankSearch`], its settings and [`run`](RankSearch::run) /
//!   [`try_run`](RankSearch::try_run).
//! - `report`: [`Evaluation`], [`Trial`], [`GroupResult`], [`SearchReport`] (a markdown table
//!   through `Display`, [`to_csv`](SearchReport::to_csv), [`to_json`](SearchReport::to_json)) and
//!   [`SearchOutcome`].
//!
//! # Example
//!
//! ```
//! use burn::backend::Flex;
//! use burn::module::Module;
//! use burn::tensor::backend::Backend;
//! use burn::tensor::{Distribution, Tensor};
//! use burn_compress::{
//!     AnyLinear, AnyLinearConfig, RankSearch, Cost, LinearKind, Search, Selection, Threshold,
//! };
//!
//! #[derive(Module, Debug)]
//! struct Net<B: Backend> {
//!     fc1: AnyLinear<B>,
//!     fc2: AnyLinear<B>,
//! }
//!
//! impl<B: burn_sketch::SketchBackend> Net<B> {
//!     fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
//!         self.fc2.forward(self.fc1.forward(x))
//!     }
//! }
//!
//! let device = Default::default();
//! Flex::seed(&device, 7);
//! let net = Net::<Flex> {
//!     fc1: AnyLinearConfig::new(64, 64).init(&device),
//!     fc2: AnyLinearConfig::new(64, 8).init(&device),
//! };
//! // Quality: how far the outputs move from the dense model's (lower is better). Sketched
//! // straight from dense weights, before any fine-tuning, a layer is a rough estimate of them;
//! // a real quality measure would fine-tune briefly, then score on held-out data.
//! let x = Tensor::<Flex, 2>::random([32, 64], Distribution::Normal(0.0, 1.0), &device);
//! let reference = net.forward(x.clone());
//! let scale = reference.clone().powf_scalar(2.0).sum().into_scalar().sqrt();
//! let relative_error = |candidate: &Net<Flex>| {
//!     let diff = candidate.forward(x.clone()) - reference.clone();
//!     f64::from(diff.powf_scalar(2.0).sum().into_scalar().sqrt() / scale)
//! };
//!
//! let outcome = RankSearch::new(Search::grid([1, 2], [4, 8, 16]), Threshold::AtMost(2.0))
//!     .group("hidden", Selection::paths(["fc1"]))
//!     .run(net, relative_error, Cost::TrainableBytes)
//!     .unwrap();
//! println!("{}", outcome.report); // the markdown table of every trial
//! let chosen = outcome.report.groups[0].chosen.expect("a size passes");
//! assert_eq!(outcome.model.fc1.kind(), LinearKind::from(chosen));
//! assert_eq!(outcome.model.fc2.kind(), LinearKind::Dense); // in no group
//! assert_eq!(outcome.report.trials.len(), 6);
//! ```

mod criteria;
mod group;
mod report;
mod run;
mod space;

pub use criteria::{Cost, CostMetric, Measure, Threshold};
pub use group::LayerGroup;
pub use report::{Evaluation, GroupResult, SearchOutcome, SearchReport, Trial};
pub use run::RankSearch;
pub use space::{Search, SketchSize};
