//! The search space: the sizes a group tries ([`Search`]) and their seeded draws.

use std::collections::HashSet;
use std::fmt;
use std::ops::RangeInclusive;

use burn_randnla::Draws;
use serde::{Deserialize, Serialize};

use crate::{CompressError, LinearKind};

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

    /// The sizes this search tries, in order; [`CompressError::InvalidConfig`] for an empty grid
    /// list, a `0` size, an empty range or `trials = 0`.
    ///
    /// ```
    /// use burn_compress::{Search, SketchSize};
    /// assert_eq!(Search::grid([1, 2], [8, 16]).candidates().unwrap()[1], SketchSize::new(1, 16));
    /// let random = Search::random(1..=3, 4..=64, 5, 42).candidates().unwrap();
    /// assert_eq!(random, Search::random(1..=3, 4..=64, 5, 42).candidates().unwrap());
    /// ```
    pub fn candidates(&self) -> Result<Vec<SketchSize>, CompressError> {
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
                    return Err(CompressError::InvalidConfig {
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

fn check_list(name: &'static str, values: &[usize]) -> Result<(), CompressError> {
    if values.is_empty() {
        return Err(CompressError::InvalidConfig {
            name,
            value: 0,
            reason: "lists no value (it has length 0); give at least one",
        });
    }
    if values.contains(&0) {
        return Err(CompressError::InvalidConfig {
            name,
            value: 0,
            reason: "holds a 0; sizes must be at least 1",
        });
    }
    Ok(())
}

fn check_range(name: &'static str, range: &RangeInclusive<usize>) -> Result<(), CompressError> {
    if range.is_empty() {
        return Err(CompressError::InvalidConfig {
            name,
            value: *range.start(),
            reason: "is the start of an empty range (start > end)",
        });
    }
    if *range.start() == 0 {
        return Err(CompressError::InvalidConfig {
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
