//! `SkLinear` layers placed on two wgpu devices with burn-memory's `Placed`: a two-layer
//! sketched MLP split across `Wgpu`'s default device and its CPU device (two CubeCL clients on
//! Mesa's lavapipe) gives the outputs and gradients of the same MLP on one device, and its
//! fixed sketches move with the layer.

use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Autodiff, Wgpu};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor, TensorData};
use burn_memory::{Layers, MapLayer, Placed, Placement};
use burn_sketch::backend::{KernelStrategy, SketchBackend};
use burn_sketch::{SkLinear, SkLinearConfig};

type AB = Autodiff<Wgpu>;

#[derive(Module, Debug)]
struct SketchedMlp<B: Backend> {
    layers: Vec<SkLinear<B>>,
}

impl<B: SketchBackend> Layers<B> for SketchedMlp<B> {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }
    fn forward_layer(&self, index: usize, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let y = self.layers[index].forward(x);
        if index + 1 < self.layers.len() {
            relu(y)
        } else {
            y
        }
    }
}

impl<B: Backend> MapLayer<B> for SketchedMlp<B> {
    fn map_layer<Mp: ModuleMapper<B>>(mut self, index: usize, mapper: &mut Mp) -> Self {
        self.layers[index] = self.layers[index].clone().map(mapper);
        self
    }
}

/// Every float entry's values (trained or not) and, for trained ones, its gradient.
fn flat<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    grads: &GradientsParams,
) -> Vec<(TensorData, Option<TensorData>)> {
    struct Collect<'a>(&'a GradientsParams, Vec<(TensorData, Option<TensorData>)>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let values = param.val().into_data();
            let grad = self.0.get::<B::InnerBackend, D>(param.id);
            self.1.push((values, grad.map(Tensor::into_data)));
        }
    }
    let mut collect = Collect(grads, Vec::new());
    model.visit(&mut collect);
    collect.1
}

#[test]
fn sketched_layers_placed_on_two_wgpu_devices_match_one_device() {
    burn_memory::wgpu_adapter().expect("a wgpu adapter (Mesa's lavapipe in CI)");
    let _serial = crate::common::serial();
    let (a, b) = (WgpuDevice::DefaultDevice, WgpuDevice::Cpu);
    let config =
        |d_in, d_out| SkLinearConfig::new(d_in, d_out, 2, 8).with_strategy(KernelStrategy::Kernels);
    // Mapped once so that the lazy parameters are initialised before the clone.
    struct Materialize;
    impl<B: Backend> ModuleMapper<B> for Materialize {}
    let model = SketchedMlp::<AB> {
        layers: vec![config(32, 24).init(&a), config(24, 10).init(&a)],
    }
    .map(&mut Materialize);
    let reference = model.clone();

    let placement = Placement::ranges([(0..1, a.clone()), (1..2, b.clone())]).unwrap();
    let placed = Placed::new(model, placement).unwrap();
    let second = &placed.model().layers[1];
    for tensor in [
        second.s1s.val(),
        second.s2s.val(),
        second.u1s.val(),
        second.u2s.val(),
    ] {
        assert_eq!(
            tensor.device(),
            b,
            "the second layer's sketches are on its device"
        );
    }
    assert_eq!(placed.model().layers[0].u1s.device(), a);

    let x = Tensor::<AB, 2>::random([6, 32], Distribution::Default, &a);
    let out = placed.forward(x.clone());
    assert_eq!(out.device(), b);
    let got_out = out.clone().into_data();
    let grads = GradientsParams::from_grads(out.powi_scalar(2).mean().backward(), &placed);
    let got = flat(&placed, &grads);

    let ref_out = (0..2).fold(x, |h, i| reference.forward_layer(i, h));
    let want_out = ref_out.clone().into_data();
    let ref_grads =
        GradientsParams::from_grads(ref_out.powi_scalar(2).mean().backward(), &reference);
    let want = flat(&reference, &ref_grads);

    crate::common::assert_close(got_out, want_out, "placed output");
    assert_eq!(got.len(), want.len());
    let mut trained = 0;
    for ((values, grad), (ref_values, ref_grad)) in got.into_iter().zip(want) {
        crate::common::assert_close(values, ref_values, "parameter values");
        assert_eq!(
            grad.is_some(),
            ref_grad.is_some(),
            "which entries are trained"
        );
        if let (Some(grad), Some(ref_grad)) = (grad, ref_grad) {
            crate::common::assert_close(grad, ref_grad, "placed gradient");
            trained += 1;
        }
    }
    assert_eq!(trained, 6, "S1, S2 and the bias of each layer");
}
