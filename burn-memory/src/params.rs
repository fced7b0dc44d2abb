//! Drawing a module's lazily initialised parameters, and giving a module's parameters autodiff
//! nodes of their own.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
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

/// `module` with every drawn float parameter a new autodiff leaf: the same values (the storage
/// is shared, not copied), ids and `require_grad`, under a graph node no other tensor has.
/// Call it on a model before it trains on a thread while other threads train (models cloned
/// from one trained model, or converted from it, share its parameters' nodes otherwise).
///
/// Why: Burn 0.21's autodiff keeps one process-wide locator of graphs, and a tensor's operation
/// joins the graphs of its inputs. Two trainings that share a parameter's node end up in one
/// graph, and then their threads deadlock: a `backward()` holds that graph's lock and, as it
/// cleans up, waits for the locator's (burn-autodiff 0.21 `runtime/graph.rs`, lines 119 and
/// 189), while the other thread's forward holds the locator's lock and waits for the graph's
/// to merge it with a graph of its own parameters (lines 90 and 272). A lock around
/// `backward()` would not help (the other side is a forward); trainings whose tensors share no
/// node never merge, and their graphs' locks are never waited on in that order. The same
/// family as tracel-ai/burn#5193 (a `backward()` inside a backward step waits for its own
/// graph's lock) and #5573 (a concurrent `backward()` frees another thread's steps).
///
/// Parameters still lazily initialised are left as they are: a clone draws its own values, so
/// it shares no node (and the draw happens when it would have). On a backend without autodiff
/// the module is returned unchanged in effect (`detach` does nothing there).
///
/// ```
/// # use burn::backend::{Autodiff, Flex};
/// # use burn::nn::LinearConfig;
/// type B = Autodiff<Flex>;
/// let trained = LinearConfig::new(4, 2).init::<B>(&Default::default());
/// burn_memory::draw_params(&trained);
/// // A copy that trains on a thread of its own, beside the others.
/// let copy = burn_memory::detach_params(trained.clone());
/// assert_eq!(copy.weight.id, trained.weight.id);
/// assert!(copy.weight.val().is_require_grad());
/// copy.weight.val().into_data().assert_eq(&trained.weight.val().into_data(), true);
/// ```
pub fn detach_params<B: Backend, M: Module<B>>(module: M) -> M {
    module.map(&mut Detach)
}

/// Gives each drawn float parameter a new leaf node.
struct Detach;

impl<B: Backend> ModuleMapper<B> for Detach {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if !param.is_initialized() {
            return param;
        }
        param.map(|tensor| {
            let require_grad = tensor.is_require_grad();
            let tensor = tensor.detach();
            if require_grad {
                tensor.require_grad()
            } else {
                tensor
            }
        })
    }
}
