//! The points the suite measures.

use serde::{Deserialize, Serialize};

/// One layer shape and batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    /// Input features.
    pub d_input: usize,
    /// Output features.
    pub d_output: usize,
    /// Sketched terms `T`.
    pub num_terms: usize,
    /// Rank `k` of each term.
    pub low_rank: usize,
    /// Rows per call.
    pub batch: usize,
}

impl Point {
    /// A stable name, matched by `--filter`: `d4096x1024-t1-k64-b256`.
    pub fn id(&self) -> String {
        format!(
            "d{}x{}-t{}-k{}-b{}",
            self.d_input, self.d_output, self.num_terms, self.low_rank, self.batch
        )
    }

    /// FLOPs of the sketched layer over those of the dense one:
    /// `2Tk·(d_in + d_out) / (d_in·d_out)`.
    pub fn flop_ratio(&self) -> f64 {
        let rank = 2 * self.num_terms * self.low_rank;
        (rank * (self.d_input + self.d_output)) as f64 / (self.d_input * self.d_output) as f64
    }

    /// FLOPs of the sketched forward: `2·batch·2Tk·(d_in + d_out)`.
    pub fn sketch_forward_flops(&self) -> f64 {
        let rank = 2 * self.num_terms * self.low_rank;
        2.0 * (self.batch * rank * (self.d_input + self.d_output)) as f64
    }

    /// FLOPs of the dense forward: `2·batch·d_in·d_out`.
    pub fn dense_forward_flops(&self) -> f64 {
        2.0 * (self.batch * self.d_input * self.d_output) as f64
    }

    /// Elements the sketched forward must move at least once: `x`, the factors `A`
    /// (`d_in × 2Tk`) and `B` (`2Tk × d_out`), the bias and `y`.
    pub fn sketch_forward_elements(&self) -> usize {
        let rank = 2 * self.num_terms * self.low_rank;
        self.batch * (self.d_input + self.d_output)
            + rank * (self.d_input + self.d_output)
            + self.d_output
    }

    /// Elements the dense forward must move at least once: `x`, the weight, the bias and `y`.
    pub fn dense_forward_elements(&self) -> usize {
        self.batch * (self.d_input + self.d_output) + self.d_input * self.d_output + self.d_output
    }
}

const SHAPES: [(usize, usize); 4] = [(1024, 1024), (4096, 4096), (8192, 8192), (4096, 1024)];
const TERMS: [usize; 4] = [1, 2, 4, 8];
const RANKS: [usize; 4] = [16, 32, 64, 128];
const BATCHES: [usize; 2] = [64, 256];

/// The full grid (Panther's benchmark grid: 128 points), or with `quick` a subset of small
/// shapes that runs in well under a minute on a CPU.
pub fn grid(quick: bool) -> Vec<Point> {
    if quick {
        // Two values on each sketch axis, so that the plots have lines and cells to draw.
        return [(1, 16), (1, 64), (2, 16), (2, 64)]
            .into_iter()
            .map(|(num_terms, low_rank)| Point {
                d_input: 1024,
                d_output: 1024,
                num_terms,
                low_rank,
                batch: 64,
            })
            .collect();
    }
    let mut points = Vec::new();
    for (d_input, d_output) in SHAPES {
        for num_terms in TERMS {
            for low_rank in RANKS {
                for batch in BATCHES {
                    points.push(Point {
                        d_input,
                        d_output,
                        num_terms,
                        low_rank,
                        batch,
                    });
                }
            }
        }
    }
    points
}
