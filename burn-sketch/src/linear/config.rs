//! Configuration of the sketched linear layer.

use burn::config::Config;
use burn::tensor::backend::Backend;

use super::SkLinear;
use crate::SketchError;
use crate::backend::KernelStrategy;

/// Configuration to create a [`SkLinear`] layer with [`init`](SkLinearConfig::init): it
/// replaces a dense `d_input × d_output` weight by `num_terms` pairs of rank-`low_rank` factors.
///
/// ```
/// use burn::backend::NdArray;
/// use burn_sketch::SkLinearConfig;
/// let layer = SkLinearConfig::new(784, 256, 1, 32).init::<NdArray>(&Default::default());
/// assert_eq!(layer.param_counts().trainable, 32 * (784 + 256) + 256);
/// ```
#[derive(Config, Debug)]
pub struct SkLinearConfig {
    /// The size of the input features.
    pub d_input: usize,
    /// The size of the output features.
    pub d_output: usize,
    /// The number of sketched terms `T` averaged in the layer.
    pub num_terms: usize,
    /// The rank `k` of each term.
    pub low_rank: usize,
    /// If a bias should be added after the sketched product.
    #[config(default = true)]
    pub bias: bool,
    /// How backends with several implementations of the product (CubeCL's) pick one; not
    /// part of the layer's record.
    #[config(default = "KernelStrategy::Autotune")]
    pub strategy: KernelStrategy,
    /// Draw the fixed sketches from this seed on the host (the same on every backend) and
    /// record them as the seed, which halves a record's bytes; `None` draws them from the
    /// backend's generator and records them whole, as Panther does.
    #[config(default = "None")]
    pub sketch_seed: Option<u64>,
}

impl SkLinearConfig {
    /// The configuration of Panther's `SKLinear(d_input, d_output, sketch_size=s)` form: one term
    /// whose intermediate width `2·T·k` is `sketch_size`, so `k = sketch_size / 2`.
    ///
    /// Returns an error if `sketch_size` is zero or odd (it could not be split in two halves).
    pub fn from_sketch_size(
        d_input: usize,
        d_output: usize,
        sketch_size: usize,
    ) -> Result<Self, SketchError> {
        if sketch_size == 0 || sketch_size % 2 == 1 {
            return Err(SketchError::InvalidConfig {
                name: "sketch_size",
                value: sketch_size,
                reason: "must be a positive even number (sketch_size = 2 · num_terms · low_rank)",
            });
        }
        Ok(Self::new(d_input, d_output, 1, sketch_size / 2))
    }

    /// Checks every size, returning an error that names the first bad value: a zero, or
    /// sizes whose tensors could not be addressed (their element or byte counts overflow).
    ///
    /// Also warns (through `tracing`, as Panther does) when the sketch is no smaller than the
    /// dense layer it stands for: `2·T·k·(d_in + d_out) ≥ d_in·d_out`. That configuration is
    /// legal but defeats the purpose of the layer.
    pub fn validate(&self) -> Result<(), SketchError> {
        let sizes = [
            ("d_input", self.d_input),
            ("d_output", self.d_output),
            ("num_terms", self.num_terms),
            ("low_rank", self.low_rank),
        ];
        SketchError::first_zero(sizes)?;
        let (t, k, d_in, d_out) = (self.num_terms, self.low_rank, self.d_input, self.d_output);
        // Every tensor `try_init` builds (the dense weight it draws, the factors, the `T·k`
        // rows it multiplies by) must have a byte size that `isize` can hold, or allocating
        // it would fail with a capacity overflow instead of this error.
        let elements = [
            ("d_input × d_output", d_out, d_in.checked_mul(d_out)),
            ("num_terms × low_rank", k, t.checked_mul(k)),
            (
                "num_terms × d_input × low_rank",
                d_in,
                t.checked_mul(d_in).and_then(|n| n.checked_mul(k)),
            ),
            (
                "num_terms × low_rank × d_output",
                d_out,
                t.checked_mul(k).and_then(|n| n.checked_mul(d_out)),
            ),
        ];
        for (name, value, count) in elements {
            let fits = count
                .and_then(|n| n.checked_mul(std::mem::size_of::<f64>()))
                .is_some_and(|bytes| bytes <= isize::MAX as usize);
            if !fits {
                return Err(SketchError::InvalidConfig {
                    name,
                    value,
                    reason: "the layer's tensors would hold more bytes than memory can address",
                });
            }
        }
        let dense = d_in * d_out;
        let sketch = (2 * t * k).checked_mul(d_in + d_out);
        if sketch.is_none_or(|sketch| sketch >= dense) {
            tracing::warn!(
                d_input = d_in,
                d_output = d_out,
                num_terms = t,
                low_rank = k,
                "SkLinear has {} sketch parameters, not fewer than the {dense} of the dense \
                 layer it replaces; a dense `Linear` would be smaller and faster",
                sketch.map_or("more than usize::MAX".to_string(), |n| n.to_string())
            );
        }
        Ok(())
    }

    /// Initializes a new [`SkLinear`] with Panther's initialisation.
    ///
    /// # Panics
    /// If the configuration is invalid (see [`validate`](Self::validate)); the message names
    /// the bad value. Use [`try_init`](Self::try_init) to get the error instead.
    pub fn init<B: Backend>(&self, device: &B::Device) -> SkLinear<B> {
        self.try_init(device)
            .unwrap_or_else(|err| panic!("cannot initialise SkLinear: {err}"))
    }

    /// Initializes a new [`SkLinear`], or returns why the configuration is invalid.
    ///
    /// A dense weight `W` (`[d_input, d_output]`) is drawn Kaiming-uniform in
    /// `±1/√d_output`, the bias in the same bound, and the sketch factors are derived from `W`
    /// so that the layer starts as an unbiased estimate of the dense layer `x·W + b`. Draws use
    /// the backend's random generator, so `B::seed` makes the result reproducible.
    ///
    /// The dense weight is materialised once (`d_input · d_output` elements): sizes whose byte
    /// counts overflow are [`SketchError::InvalidConfig`], but a size that merely exceeds the
    /// device's memory fails in the backend's allocator, as any tensor of that size would.
    pub fn try_init<B: Backend>(&self, device: &B::Device) -> Result<SkLinear<B>, SketchError> {
        self.validate()?;
        let (weight, bias) = super::init::panther_dense(self, device);
        let layer = SkLinear::from_dense_parts(
            weight,
            bias,
            self.num_terms,
            self.low_rank,
            self.sketch_seed,
        );
        Ok(layer.with_strategy(self.strategy))
    }
}
