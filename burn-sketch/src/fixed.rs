//! The fixed sign sketches of a sketched layer, held as a tensor and, when they were drawn
//! from a seed, recorded as that seed.
//!
//! A record of a seeded sketch holds the seed and the rank instead of the tensor. Loading
//! regenerates the same values on the host, then on the layer's device, so the sketches cost
//! no checkpoint bytes: a sketched layer's record is about half as large.

use burn::module::{
    AutodiffModule, Content, HasAutodiffModule, Module, ModuleDisplay, ModuleDisplayDefault,
    ModuleMapper, ModuleVisitor, Param,
};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use burn_randnla::Draws;

/// A fixed (never trained) sign sketch `[T, a, b]` with entries `±1/√rank`. It reads as the
/// `Param` it holds (`val()`, `dims()`, `grad()`), and records its seed instead of its values
/// when it has one.
#[derive(Clone, Debug)]
pub struct FixedSketch<B: Backend> {
    param: Param<Tensor<B, 3>>,
    seed: Option<Seed>,
}

/// How a seeded sketch was drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seed {
    seed: u64,
    rank: usize,
}

impl<B: Backend> FixedSketch<B> {
    /// Holds `sketch` as fixed state: no gradient, so optimizers leave it alone. Its record is
    /// the tensor.
    pub fn new(sketch: Tensor<B, 3>) -> Self {
        Self {
            param: Param::from_tensor(sketch).set_require_grad(false),
            seed: None,
        }
    }

    /// A sign sketch of `shape` with entries `±1/√rank`, drawn from `seed` on the host (the same
    /// on every backend). Its record is the seed.
    pub fn seeded(shape: [usize; 3], rank: usize, seed: u64, device: &B::Device) -> Self {
        Self {
            param: Param::from_tensor(draw(shape, rank, seed, device)).set_require_grad(false),
            seed: Some(Seed { seed, rank }),
        }
    }

    /// The seed it was drawn from, if any.
    pub fn seed(&self) -> Option<u64> {
        self.seed.map(|seed| seed.seed)
    }
}

fn draw<B: Backend>(shape: [usize; 3], rank: usize, seed: u64, device: &B::Device) -> Tensor<B, 3> {
    let scale = 1.0 / (rank as f64).sqrt();
    let mut draws = Draws::new(seed);
    let values: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| (draws.sign() * scale) as f32)
        .collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

impl<B: Backend> std::ops::Deref for FixedSketch<B> {
    type Target = Param<Tensor<B, 3>>;

    fn deref(&self) -> &Self::Target {
        &self.param
    }
}

impl<B: Backend> From<Param<Tensor<B, 3>>> for FixedSketch<B> {
    fn from(param: Param<Tensor<B, 3>>) -> Self {
        Self { param, seed: None }
    }
}

impl<B: Backend> Module<B> for FixedSketch<B> {
    /// The tensor's record, or the seed and rank (and no tensor) of a seeded sketch.
    type Record = (Option<Param<Tensor<B, 3>>>, Option<u64>, Option<usize>);

    fn collect_devices(&self, devices: Vec<B::Device>) -> Vec<B::Device> {
        Module::<B>::collect_devices(&self.param, devices)
    }

    fn fork(self, device: &B::Device) -> Self {
        Self {
            param: Module::<B>::fork(self.param, device),
            ..self
        }
    }

    fn to_device(self, device: &B::Device) -> Self {
        Self {
            param: Module::<B>::to_device(self.param, device),
            ..self
        }
    }

    fn visit<V: ModuleVisitor<B>>(&self, visitor: &mut V) {
        Module::<B>::visit(&self.param, visitor)
    }

    fn map<M: ModuleMapper<B>>(self, mapper: &mut M) -> Self {
        Self {
            param: Module::<B>::map(self.param, mapper),
            ..self
        }
    }

    fn load_record(self, record: Self::Record) -> Self {
        match record {
            (Some(tensor), _, _) => Self {
                param: Module::<B>::load_record(self.param, tensor),
                seed: None,
            },
            (None, Some(seed), Some(rank)) => {
                let tensor = draw(self.param.dims(), rank, seed, &self.param.device());
                Self {
                    param: Param::initialized(self.param.id, tensor.set_require_grad(false)),
                    seed: Some(Seed { seed, rank }),
                }
            }
            _ => panic!("a fixed sketch's record holds neither its tensor nor its seed and rank"),
        }
    }

    fn into_record(self) -> Self::Record {
        match self.seed {
            Some(Seed { seed, rank }) => (None, Some(seed), Some(rank)),
            None => (Some(Module::<B>::into_record(self.param)), None, None),
        }
    }
}

impl<B: Backend> ModuleDisplayDefault for FixedSketch<B> {
    fn content(&self, content: Content) -> Option<Content> {
        let content = self.param.content(content)?;
        match self.seed {
            Some(seed) => content.add("seed", &seed.seed).optional(),
            None => Some(content),
        }
    }
}

impl<B: Backend> ModuleDisplay for FixedSketch<B> {}

impl<B: AutodiffBackend> AutodiffModule<B> for FixedSketch<B> {
    type InnerModule = FixedSketch<B::InnerBackend>;

    fn valid(&self) -> Self::InnerModule {
        FixedSketch {
            param: self.param.valid(),
            seed: self.seed,
        }
    }

    fn from_inner(module: Self::InnerModule) -> Self {
        FixedSketch {
            param: <Param<Tensor<B, 3>> as AutodiffModule<B>>::from_inner(module.param),
            seed: module.seed,
        }
    }
}

impl<B: AutodiffBackend> HasAutodiffModule<B> for FixedSketch<B::InnerBackend> {
    type TrainModule = FixedSketch<B>;
}
