//! A named group of layers, searched as one.

use serde::{Deserialize, Serialize};

use super::Search;
use crate::Selection;

/// A named group of layers that all get one size, searched as one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerGroup {
    /// The group's name, in the report.
    pub name: String,
    /// Its layers.
    pub selection: Selection,
    /// Its own search; `None` takes the [`RankSearch`](super::RankSearch)'s.
    pub search: Option<Search>,
}
