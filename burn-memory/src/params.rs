//! Drawing a module's lazily initialised parameters.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};

/// Draws, in place, every parameter of `module` that is still lazily initialised.
///
/// Burn's `init` makes lazy parameters, and a clone made before a parameter is drawn draws
/// values of its own. Call this before cloning a model whose copies must hold the same
/// weights: mixed precision's compute copy, a served model's replicas, data-parallel peers.
///
/// ```
/// # use burn::backend::Flex;
/// # use burn::nn::LinearConfig;
/// let layer = LinearConfig::new(4, 2).init::<Flex>(&Default::default());
/// burn_memory::draw_params(&layer);
/// let copy = layer.clone();
/// copy.weight.val().into_data().assert_eq(&layer.weight.val().into_data(), true);
/// ```
pub fn draw_params<B: Backend, M: Module<B>>(module: &M) {
    module.visit(&mut Draw);
}

/// Reads every parameter, which runs the initialiser of a lazy one.
struct Draw;

impl<B: Backend> ModuleVisitor<B> for Draw {
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
