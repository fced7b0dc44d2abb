//! What a trial is held to: its quality's [`Threshold`] and its [`Cost`].

use std::fmt;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use serde::{Deserialize, Serialize};

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

    pub(super) fn metric(&self) -> CostMetric {
        match self {
            Self::TrainableBytes => CostMetric::TrainableBytes,
            Self::Measured(_) => CostMetric::Measured,
        }
    }

    pub(super) fn of<B: Backend>(&mut self, model: &M) -> Result<f64, E>
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

/// The trainable parameters of `model` and their bytes: every float parameter except the
/// fixed sketches (`u1s`, `u2s`) of sketched layers.
pub(super) fn trainable<B: Backend, M: Module<B>>(model: &M) -> (usize, usize) {
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
