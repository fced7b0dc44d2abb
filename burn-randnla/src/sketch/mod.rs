//! Sketching operators: random linear maps `S` (`[d, n]`, `d ≪ n`) with `E[SᵀS] = I`, which
//! shrink one side of a matrix while keeping its geometry (Panther's `pr.sketch`).
//!
//! An operator is drawn from a seed on the host, so the same [`SketchConfig`] gives the same
//! operator on every backend, and is then held on the device. It compresses the rows of a
//! matrix ([`apply_left`](SketchOperator::apply_left), `S·A`) or its columns
//! ([`apply_right`](SketchOperator::apply_right), `A·Sᵀ`).
//!
//! | kind | entries of `S` | applied as | cost of `S·A` (`A`: `[n, m]`) |
//! |---|---|---|---|
//! | [`Gaussian`](SketchKind::Gaussian) | `N(0, 1/d)` | a product | `2·d·n·m` |
//! | [`Uniform`](SketchKind::Uniform) | uniform, variance `1/d` | a product | `2·d·n·m` |
//! | [`ScaledSign`](SketchKind::ScaledSign) | `±1/√d` | a product | `2·d·n·m` |
//! | [`SparseSign`](SketchKind::SparseSign) | `s` entries `±1/√s` per column | scatter-add | `s·n·m` |
//! | [`CountSketch`](SketchKind::CountSketch) | one entry `±1` per column | scatter-add | `n·m` |
//! | [`Srht`](SketchKind::Srht) | `√(1/d)·R·H·D` | Walsh–Hadamard transform | `O(n·m·log n)` |
//!
//! ```
//! use burn::backend::Flex;
//! use burn::tensor::{Distribution, Tensor};
//! use burn_randnla::sketch::{SketchConfig, SketchKind};
//!
//! let device = Default::default();
//! let a = Tensor::<Flex, 2>::random([1000, 8], Distribution::Default, &device);
//! let sketch = SketchConfig::new(SketchKind::Srht, 1000, 64).with_seed(7).init::<Flex>(&device);
//! let compressed = sketch.apply_left(a).unwrap();
//! assert_eq!(compressed.dims(), [64, 8]);
//! ```

mod hadamard;

use burn::config::Config;
use burn::tensor::backend::Backend;
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::LinalgError;
use crate::draws::Draws;

/// The distribution of a [`SketchOperator`]; every kind is scaled so that `E[SᵀS] = I`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SketchKind {
    /// Dense, independent `N(0, 1/d)` entries: the best-understood embedding, the dearest to
    /// apply.
    Gaussian,
    /// Dense, independent entries uniform in `±√(3/d)`.
    Uniform,
    /// Dense, independent `±1/√d` entries (Rademacher).
    ScaledSign,
    /// The sparse sign embedding (SJLT): each column holds `nonzeros` entries `±1/√nonzeros` in
    /// distinct rows; applied by scatter-add, without forming `S`.
    SparseSign {
        /// Nonzeros per column, `1..=d` (a handful is enough for a subspace embedding).
        nonzeros: usize,
    },
    /// CountSketch: one `±1` per column, i.e. each input row is added, with a random sign, to
    /// one random output row.
    CountSketch,
    /// The subsampled randomized Hadamard transform: random signs, a Walsh–Hadamard transform
    /// of the input zero-padded to a power of two `n'`, then `d ≤ n'` of its rows.
    Srht,
}

/// Configuration of a [`SketchOperator`] of shape `[sketch_size, input_size]`.
#[derive(Config, Debug)]
pub struct SketchConfig {
    /// The distribution.
    pub kind: SketchKind,
    /// `n`: the size of the side the operator compresses.
    pub input_size: usize,
    /// `d`: the size it compresses to.
    pub sketch_size: usize,
    /// The seed every entry is drawn from.
    #[config(default = 0)]
    pub seed: u64,
}

impl SketchConfig {
    /// Draws the operator and moves it to `device`.
    ///
    /// # Panics
    /// On an invalid size; [`try_init`](Self::try_init) returns the error instead.
    pub fn init<B: Backend>(&self, device: &B::Device) -> SketchOperator<B> {
        self.try_init(device)
            .unwrap_or_else(|err| panic!("cannot initialise the sketch: {err}"))
    }

    /// [`init`](Self::init), or the error naming the bad size: a zero size, `nonzeros` outside
    /// `1..=sketch_size`, or an SRHT larger than its padded input.
    pub fn try_init<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<SketchOperator<B>, LinalgError> {
        let (n, d) = (self.input_size, self.sketch_size);
        LinalgError::first_zero([("input_size", n), ("sketch_size", d)])?;
        let mut draws = Draws::new(self.seed);
        let repr = match self.kind {
            SketchKind::Gaussian | SketchKind::Uniform | SketchKind::ScaledSign => {
                let scale = 1.0 / (d as f64).sqrt();
                let entries: Vec<f32> = (0..d * n)
                    .map(|_| {
                        let x = match self.kind {
                            SketchKind::Gaussian => draws.normal(),
                            SketchKind::Uniform => (2.0 * draws.unit() - 1.0) * 3.0f64.sqrt(),
                            _ => draws.sign(),
                        };
                        (x * scale) as f32
                    })
                    .collect();
                Repr::Dense(Tensor::from_data(TensorData::new(entries, [d, n]), device))
            }
            SketchKind::SparseSign { nonzeros } => {
                if nonzeros == 0 || nonzeros > d {
                    return Err(LinalgError::InvalidConfig {
                        name: "nonzeros",
                        value: nonzeros,
                        reason: "must be in 1..=sketch_size",
                    });
                }
                hashed(&mut draws, n, d, nonzeros, device)
            }
            SketchKind::CountSketch => hashed(&mut draws, n, d, 1, device),
            SketchKind::Srht => {
                let padded = n.next_power_of_two();
                if d > padded {
                    return Err(LinalgError::InvalidConfig {
                        name: "sketch_size",
                        value: d,
                        reason: "an SRHT keeps at most the input size rounded up to a power of two",
                    });
                }
                let signs: Vec<f32> = (0..n).map(|_| draws.sign() as f32).collect();
                let rows: Vec<i64> = draws
                    .choose(padded, d)
                    .into_iter()
                    .map(|row| row as i64)
                    .collect();
                Repr::Srht {
                    signs: Tensor::from_data(TensorData::new(signs, [n]), device),
                    rows: Tensor::from_data(TensorData::new(rows, [d]), device),
                    hadamard: hadamard::Hadamard::new(padded, device),
                }
            }
        };
        Ok(SketchOperator {
            kind: self.kind,
            input_size: n,
            sketch_size: d,
            repr,
        })
    }
}

/// A drawn sketching operator `S`, `[sketch_size, input_size]`, held on a device.
#[derive(Clone, Debug)]
pub struct SketchOperator<B: Backend> {
    kind: SketchKind,
    input_size: usize,
    sketch_size: usize,
    repr: Repr<B>,
}

#[derive(Clone, Debug)]
enum Repr<B: Backend> {
    /// `S` itself, `[d, n]`.
    Dense(Tensor<B, 2>),
    /// Column `j`'s `c`-th nonzero is `signs[c][j]`, at row `rows[c][j]`.
    Hashed {
        rows: Vec<Tensor<B, 1, Int>>,
        signs: Vec<Tensor<B, 1>>,
    },
    /// `√(1/d)·R·H·D`: `D = diag(signs)`, `H` the unnormalised transform of size `n'`, `R` the
    /// rows kept.
    Srht {
        signs: Tensor<B, 1>,
        rows: Tensor<B, 1, Int>,
        hadamard: hadamard::Hadamard<B>,
    },
}

/// Draws the rows and signs of a sparse sign sketch with `nonzeros` entries per column.
fn hashed<B: Backend>(
    draws: &mut Draws,
    n: usize,
    d: usize,
    nonzeros: usize,
    device: &B::Device,
) -> Repr<B> {
    let scale = 1.0 / (nonzeros as f64).sqrt();
    // Column by column, so that a column's rows are distinct.
    let mut rows = vec![vec![0i64; n]; nonzeros];
    let mut signs = vec![vec![0f32; n]; nonzeros];
    for j in 0..n {
        for (c, row) in draws.choose(d, nonzeros).into_iter().enumerate() {
            rows[c][j] = row as i64;
            signs[c][j] = (draws.sign() * scale) as f32;
        }
    }
    Repr::Hashed {
        rows: rows
            .into_iter()
            .map(|rows| Tensor::from_data(TensorData::new(rows, [n]), device))
            .collect(),
        signs: signs
            .into_iter()
            .map(|signs| Tensor::from_data(TensorData::new(signs, [n]), device))
            .collect(),
    }
}

impl<B: Backend> SketchOperator<B> {
    /// The distribution it was drawn from.
    pub fn kind(&self) -> SketchKind {
        self.kind
    }

    /// `n`, the size it compresses.
    pub fn input_size(&self) -> usize {
        self.input_size
    }

    /// `d`, the size it compresses to.
    pub fn sketch_size(&self) -> usize {
        self.sketch_size
    }

    /// `S·A`: compresses the rows of `a`.
    ///
    /// # Shapes
    /// - a: `[input_size, m]`
    /// - output: `[sketch_size, m]`
    pub fn apply_left(&self, a: Tensor<B, 2>) -> Result<Tensor<B, 2>, LinalgError> {
        let [n, m] = a.dims();
        self.check("SketchOperator::apply_left", [n, m], n)?;
        let d = self.sketch_size;
        Ok(match &self.repr {
            Repr::Dense(s) => s.clone().matmul(a),
            // One scatter-add per copy: a single one over the input repeated `s` times was
            // 12× slower on Flex (8 nonzeros, 4096 × 256).
            Repr::Hashed { rows, signs } => rows.iter().zip(signs).fold(
                Tensor::zeros([d, m], &a.device()),
                |out, (rows, signs)| {
                    let values = a.clone() * signs.clone().unsqueeze_dim(1);
                    out.select_assign(0, rows.clone(), values, IndexingUpdateOp::Add)
                },
            ),
            Repr::Srht {
                signs,
                rows,
                hadamard,
            } => {
                let signed = a * signs.clone().unsqueeze_dim(1);
                let padded = hadamard.size();
                let signed = if padded > n {
                    let device = signed.device();
                    Tensor::cat(vec![signed, Tensor::zeros([padded - n, m], &device)], 0)
                } else {
                    signed
                };
                hadamard
                    .transform_rows(signed)
                    .select(0, rows.clone())
                    .mul_scalar(1.0 / (d as f64).sqrt())
            }
        })
    }

    /// `A·Sᵀ`: compresses the columns of `a`.
    ///
    /// # Shapes
    /// - a: `[m, input_size]`
    /// - output: `[m, sketch_size]`
    pub fn apply_right(&self, a: Tensor<B, 2>) -> Result<Tensor<B, 2>, LinalgError> {
        let [m, n] = a.dims();
        self.check("SketchOperator::apply_right", [m, n], n)?;
        Ok(match &self.repr {
            Repr::Dense(s) => a.matmul(s.clone().transpose()),
            Repr::Hashed { rows, signs } => rows.iter().zip(signs).fold(
                Tensor::zeros([m, self.sketch_size], &a.device()),
                |out, (rows, signs)| {
                    let values = a.clone() * signs.clone().unsqueeze_dim(0);
                    out.select_assign(1, rows.clone(), values, IndexingUpdateOp::Add)
                },
            ),
            Repr::Srht { .. } => self.apply_left(a.transpose())?.transpose(),
        })
    }

    /// `S` as a dense matrix, `[sketch_size, input_size]` (for inspection and tests: the
    /// implicit kinds never form it).
    pub fn to_dense(&self, device: &B::Device) -> Tensor<B, 2> {
        match &self.repr {
            Repr::Dense(s) => s.clone(),
            _ => self
                .apply_left(Tensor::eye(self.input_size, device))
                .expect("the identity has the operator's input size"),
        }
    }

    fn check(
        &self,
        operation: &'static str,
        shape: [usize; 2],
        n: usize,
    ) -> Result<(), LinalgError> {
        if n != self.input_size || shape.contains(&0) {
            return Err(LinalgError::InvalidShape {
                operation,
                shape: shape.to_vec(),
                reason: format!(
                    "does not fit a sketch of input size {} (and no side may be empty)",
                    self.input_size
                ),
            });
        }
        Ok(())
    }
}
