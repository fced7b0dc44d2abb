//! Layers placed on devices (model parallelism): a model's outputs, gradients, segment
//! checkpointing and optimizer steps with its layers on two devices equal the same model's on
//! one. The two devices are `Wgpu`'s default device and its CPU device, two CubeCL clients
//! with their own memory pools on Mesa's lavapipe (checked here, not assumed); the placement's
//! errors need no device.

use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Autodiff, NdArray, Wgpu};
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::activation::{gelu, relu};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Bool, Distribution, Tensor};
use burn_memory::{
    Layers, MapLayer, MemoryError, MemoryTracker, Placed, Placement, Segments, ToDevice,
    segmented_backward,
};

use crate::segments::rel_err;

type W = Autodiff<Wgpu>;

/// Two devices of one lavapipe adapter, each its own CubeCL client (`Wgpu`'s device ids 4 and
/// 3). The default device is the one the `wgpu` module's memory tests read, so every test
/// here holds [`crate::wgpu::exclusive`].
fn two_devices() -> [WgpuDevice; 2] {
    burn_memory::wgpu_adapter().expect("a wgpu adapter (Mesa's lavapipe in CI)");
    [WgpuDevice::DefaultDevice, WgpuDevice::Cpu]
}

/// A classifier written as a user would, not for placement: a stem, a batch norm (training
/// mode: batch statistics, running statistics updated), residual blocks and a head that
/// changes the width. Layer `0` is the stem, `1` the norm, `2..2+n` the blocks, the last the
/// head.
#[derive(Module, Debug)]
struct Classifier<B: Backend> {
    stem: Linear<B>,
    norm: BatchNorm<B>,
    blocks: Vec<Linear<B>>,
    head: Linear<B>,
}

impl<B: Backend> Classifier<B> {
    /// Initialised now: Burn's `init` makes lazy parameters, which a clone would initialise
    /// with values of its own.
    fn new(d_in: usize, width: usize, blocks: usize, classes: usize, device: &B::Device) -> Self {
        with_params_drawn(Self {
            stem: LinearConfig::new(d_in, width).init(device),
            norm: BatchNormConfig::new(width).init(device),
            blocks: (0..blocks)
                .map(|_| LinearConfig::new(width, width).init(device))
                .collect(),
            head: LinearConfig::new(width, classes).init(device),
        })
    }

    /// A copy with the same parameters and ids and running statistics of its own (a clone
    /// would share them, and placing one would move the other's).
    fn copy(&self, device: &B::Device) -> Self {
        let [d_in, width] = self.stem.weight.dims();
        let classes = self.head.weight.dims()[1];
        Self::new(d_in, width, self.blocks.len(), classes, device)
            .load_record(self.clone().into_record())
    }
}

impl<B: Backend> Layers<B> for Classifier<B> {
    fn num_layers(&self) -> usize {
        self.blocks.len() + 3
    }

    fn forward_layer(&self, index: usize, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match index {
            0 => gelu(self.stem.forward(x)),
            1 => self.norm.forward(x),
            i if i == self.blocks.len() + 2 => self.head.forward(x),
            i => x.clone() + relu(self.blocks[i - 2].forward(x)),
        }
    }
}

impl<B: Backend> MapLayer<B> for Classifier<B> {
    fn map_layer<Mp: ModuleMapper<B>>(mut self, index: usize, mapper: &mut Mp) -> Self {
        match index {
            0 => self.stem = self.stem.map(mapper),
            1 => self.norm = self.norm.map(mapper),
            i if i == self.blocks.len() + 2 => self.head = self.head.map(mapper),
            i => self.blocks[i - 2] = self.blocks[i - 2].clone().map(mapper),
        }
        self
    }
}

/// `module` with every lazy parameter drawn.
fn with_params_drawn<B: Backend, M: Module<B>>(module: M) -> M {
    burn_memory::draw_params(&module);
    module
}

/// The loss of the tests: squared distance to a target, on the target's device.
fn loss<B: Backend>(out: Tensor<B, 2>, target: &Tensor<B, 2>) -> Tensor<B, 1> {
    (out - target.clone()).powi_scalar(2).mean()
}

/// Each trained parameter's id, gradient values and the gradient's device.
fn grads_of<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    grads: &GradientsParams,
) -> Vec<(ParamId, Vec<f32>, B::Device)> {
    struct Collect<'a, B: Backend>(&'a GradientsParams, Vec<(ParamId, Vec<f32>, B::Device)>);
    impl<B: AutodiffBackend> ModuleVisitor<B> for Collect<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if !param.val().is_require_grad() {
                return;
            }
            let grad = self
                .0
                .get::<B::InnerBackend, D>(param.id)
                .unwrap_or_else(|| {
                    panic!("no gradient for parameter {} {:?}", param.id, param.dims())
                });
            let device = grad.device();
            let values = grad.into_data().to_vec::<f32>().unwrap();
            self.1.push((param.id, values, device));
        }
    }
    let mut collect = Collect(grads, Vec::new());
    model.visit(&mut collect);
    collect.1
}

/// Each float entry's id, values and device (parameters and running statistics).
fn values_of<B: Backend, M: Module<B>>(model: &M) -> Vec<(ParamId, Vec<f32>, B::Device)> {
    struct Collect<B: Backend>(Vec<(ParamId, Vec<f32>, B::Device)>);
    impl<B: Backend> ModuleVisitor<B> for Collect<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            let device = value.device();
            let values = value.into_data().to_vec::<f32>().unwrap();
            self.0.push((param.id, values, device));
        }
    }
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

/// The placed set equals the reference set entry by entry (same ids in the same order,
/// values within `tol` relative), and each placed entry is on `expected(index)`'s device.
fn assert_same<D: PartialEq + std::fmt::Debug>(
    what: &str,
    placed: &[(ParamId, Vec<f32>, D)],
    reference: &[(ParamId, Vec<f32>, D)],
    tol: f32,
) {
    assert_eq!(placed.len(), reference.len(), "{what}: entry count");
    assert!(!placed.is_empty(), "{what}: nothing compared");
    for ((id, got, _), (ref_id, want, _)) in placed.iter().zip(reference) {
        assert_eq!(id, ref_id, "{what}: the placed model's ids are the model's");
        let err = rel_err(got, want);
        assert!(
            err <= tol,
            "{what}: entry {id} differs by {err:e} (relative)"
        );
    }
}

/// The devices of a classifier's layers' weights, by layer.
fn weight_devices<B: Backend>(model: &Classifier<B>) -> Vec<B::Device> {
    let mut devices = vec![model.stem.weight.device(), model.norm.gamma.device()];
    devices.extend(model.blocks.iter().map(|block| block.weight.device()));
    devices.push(model.head.weight.device());
    devices
}

/// The two wgpu devices are separate: a tensor made on one is counted in that device's memory
/// pools only, and moving it to the other (through the host: Burn 0.21's own `to_device`
/// panics between two wgpu devices) counts it there.
#[test]
fn the_two_wgpu_devices_have_their_own_memory() {
    let _device = crate::wgpu::exclusive();
    let [a, b] = two_devices();
    assert_ne!(a, b);
    let (on_a, on_b) = (MemoryTracker::<W>::new(&a), MemoryTracker::<W>::new(&b));
    let in_use = || (on_a.usage().unwrap().in_use, on_b.usage().unwrap().in_use);
    const BYTES: u64 = 1024 * 1024 * 4;

    let before = in_use();
    let x = Tensor::<W, 2>::random([1024, 1024], Distribution::Default, &b);
    let made = in_use();
    assert!(made.1 >= before.1 + BYTES, "b: {before:?} -> {made:?}");
    assert!(
        made.0 < before.0 + BYTES,
        "a counted b's tensor: {before:?} -> {made:?}"
    );

    let moved = ToDevice::to_device(x.clone(), &a);
    assert_eq!(moved.device(), a);
    let after = in_use();
    assert!(after.0 >= made.0 + BYTES, "a: {made:?} -> {after:?}");
    let (want, got) = (x.into_data(), moved.into_data());
    assert_eq!(want.to_vec::<f32>().unwrap(), got.to_vec::<f32>().unwrap());
}

/// Placed on two devices, the classifier's output, loss, parameter and input gradients and
/// running statistics equal the same classifier's on one device; each parameter and its
/// gradient live on the layer's device, and the second device's memory grows by the
/// parameters placed there.
#[test]
fn placed_forward_and_backward_equal_one_device() {
    let _device = crate::wgpu::exclusive();
    let [a, b] = two_devices();
    let model = Classifier::<W>::new(24, 64, 3, 10, &a);
    let reference = model.copy(&a);
    let x = Tensor::<W, 2>::random([16, 24], Distribution::Default, &a);
    let target = Tensor::<W, 2>::random([16, 10], Distribution::Default, &a);

    // Layers 0..3 (stem, norm, first block) on `a`, 3..6 (two blocks, head) on `b`.
    let placement = Placement::even(model.num_layers(), &[a.clone(), b.clone()]).unwrap();
    assert_eq!(
        placement.groups(),
        vec![(0..3, a.clone()), (3..6, b.clone())]
    );
    let on_b = MemoryTracker::<W>::new(&b);
    let before = on_b.usage().unwrap().in_use;
    let placed = Placed::new(model, placement).unwrap();
    let placed_bytes = 4 * (2 * (64 * 64 + 64) + 64 * 10 + 10) as u64;
    let after = on_b.usage().unwrap().in_use;
    assert!(
        after >= before + placed_bytes,
        "b holds {after} bytes after placing, {before} before: not the {placed_bytes} placed"
    );
    let devices = weight_devices(placed.model());
    assert_eq!(devices, [&a, &a, &a, &b, &b, &b].map(Clone::clone));

    let placed_x = x.clone().require_grad();
    let out = placed.forward(placed_x.clone());
    assert_eq!(out.device(), b, "the output is on the last layer's device");
    let placed_loss = loss(out.clone(), &ToDevice::to_device(target.clone(), &b));
    let mut graph = placed_loss.backward();
    let placed_input = placed_x.grad_remove(&mut graph).unwrap();
    assert_eq!(placed_input.device(), a, "the input's gradient came back");
    let placed_grads = grads_of(&placed, &GradientsParams::from_grads(graph, &placed));
    for (id, _, device) in &placed_grads {
        assert!(*device == a || *device == b, "{id} on {device:?}");
    }
    let param_devices: Vec<_> = values_of(placed.model())
        .into_iter()
        .filter(|(id, ..)| placed_grads.iter().any(|(g, ..)| g == id))
        .map(|(.., device)| device)
        .collect();
    let grad_devices: Vec<_> = placed_grads.iter().map(|(.., d)| d.clone()).collect();
    assert_eq!(
        grad_devices, param_devices,
        "each gradient on its parameter's device"
    );

    let ref_x = x.require_grad();
    let ref_out =
        (0..reference.num_layers()).fold(ref_x.clone(), |h, i| reference.forward_layer(i, h));
    let ref_loss = loss(ref_out.clone(), &target);
    let mut ref_graph = ref_loss.backward();
    let ref_input = ref_x.grad_remove(&mut ref_graph).unwrap();
    let ref_grads = grads_of(
        &reference,
        &GradientsParams::from_grads(ref_graph, &reference),
    );

    let flat = |t: Tensor<Wgpu, 2>| t.into_data().to_vec::<f32>().unwrap();
    let tol = 1e-5;
    let err = rel_err(&flat(out.inner()), &flat(ref_out.inner()));
    assert!(err <= tol, "outputs differ by {err:e}");
    let err = rel_err(&flat(placed_input), &flat(ref_input));
    assert!(err <= tol, "input gradients differ by {err:e}");
    assert_same("parameter gradients", &placed_grads, &ref_grads, tol);
    // One update of the running statistics each, by the batch, on the norm's device.
    assert_same(
        "running statistics",
        &values_of(&placed.valid()),
        &values_of(&reference.valid()),
        tol,
    );
}

/// Segment checkpointing over the placed model (segments that cross the devices, layers
/// going back and forth between them) gives the gradients it gives over the model on one
/// device, and the plain backward's; the loss runs on the output device.
#[test]
fn segmented_backward_over_placed_layers_equals_one_device() {
    let _device = crate::wgpu::exclusive();
    let [a, b] = two_devices();
    let model = Classifier::<W>::new(24, 32, 4, 6, &a);
    let reference = model.copy(&a);
    let x = Tensor::<W, 2>::random([8, 24], Distribution::Default, &a);
    let target = Tensor::<W, 2>::random([8, 6], Distribution::Default, &a);

    // a, b, b, a, a, b, b: four moves in the forward pass, and the output comes back to `a`.
    let placement = Placement::ranges([
        (0..1, a.clone()),
        (1..3, b.clone()),
        (3..5, a.clone()),
        (5..7, b.clone()),
    ])
    .unwrap();
    let placed = Placed::new(model, placement)
        .unwrap()
        .with_output_device(a.clone());
    assert_eq!(
        weight_devices(placed.model()),
        [&a, &b, &b, &a, &a, &b, &b].map(Clone::clone)
    );

    let segments = Segments::Count(3); // 0..3, 3..5, 5..7
    let step = segmented_backward(&placed, x.clone(), &segments, |out| {
        assert_eq!(out.device(), a, "the output device");
        loss(out, &target)
    })
    .unwrap();
    let placed_grads = grads_of(&placed, &step.grads);

    let ref_step =
        segmented_backward(&reference, x.clone(), &segments, |out| loss(out, &target)).unwrap();
    let ref_grads = grads_of(&reference, &ref_step.grads);
    let tol = 1e-5;
    assert_same("segmented gradients", &placed_grads, &ref_grads, tol);
    let (got, want) = (step.loss.into_scalar(), ref_step.loss.into_scalar());
    assert!(
        (got - want).abs() <= tol * want.abs(),
        "loss {got} vs {want}"
    );

    // And the plain backward of the placed model (a fresh copy: the running statistics above
    // were updated once by each segmented step).
    let plain = reference.copy(&a);
    let out = (0..plain.num_layers()).fold(x, |h, i| plain.forward_layer(i, h));
    let plain_grads = grads_of(
        &plain,
        &GradientsParams::from_grads(loss(out, &target).backward(), &plain),
    );
    assert_same("plain gradients", &placed_grads, &plain_grads, tol);
}

/// Two Adam steps on the placed model give the weights two steps give on one device, and
/// leave every parameter on its layer's device (the optimizer's state follows the gradient).
#[test]
fn optimizer_steps_on_the_placed_model_equal_one_device() {
    let _device = crate::wgpu::exclusive();
    let [a, b] = two_devices();
    let model = Classifier::<W>::new(12, 32, 2, 4, &a);
    let mut reference = model.copy(&a);
    let placement = Placement::even(model.num_layers(), &[b.clone(), a.clone()]).unwrap();
    let mut placed = Placed::new(model, placement)
        .unwrap()
        .with_output_device(a.clone());
    let mut placed_optim = AdamConfig::new().init();
    let mut ref_optim = AdamConfig::new().init();

    for _ in 0..2 {
        let x = Tensor::<W, 2>::random([8, 12], Distribution::Default, &a);
        let target = Tensor::<W, 2>::random([8, 4], Distribution::Default, &a);
        let grads = loss(placed.forward(x.clone()), &target).backward();
        let grads = GradientsParams::from_grads(grads, &placed);
        placed = placed_optim.step(1e-2, placed, grads);
        let out = (0..reference.num_layers()).fold(x, |h, i| reference.forward_layer(i, h));
        let grads = GradientsParams::from_grads(loss(out, &target).backward(), &reference);
        reference = ref_optim.step(1e-2, reference, grads);
    }
    assert_eq!(
        weight_devices(placed.model()),
        [&b, &b, &b, &a, &a].map(Clone::clone)
    );
    assert_same(
        "weights after two steps",
        &values_of(&placed.valid()),
        &values_of(&reference.valid()),
        1e-5,
    );
}

/// A state of two tensors, one of them a mask, moves between the devices part by part.
#[test]
fn tuple_states_move_between_devices() {
    #[derive(Module, Debug)]
    struct Masked<B: Backend> {
        layers: Vec<Linear<B>>,
    }
    type State<B> = (Tensor<B, 2>, Tensor<B, 2, Bool>);
    impl<B: Backend> Layers<B, State<B>> for Masked<B> {
        fn num_layers(&self) -> usize {
            self.layers.len()
        }
        fn forward_layer(&self, index: usize, (x, mask): State<B>) -> State<B> {
            (
                self.layers[index].forward(x).mask_fill(mask.clone(), 0.0),
                mask,
            )
        }
    }
    impl<B: Backend> MapLayer<B> for Masked<B> {
        fn map_layer<Mp: ModuleMapper<B>>(mut self, index: usize, mapper: &mut Mp) -> Self {
            self.layers[index] = self.layers[index].clone().map(mapper);
            self
        }
    }

    let _device = crate::wgpu::exclusive();
    let [a, b] = two_devices();
    let model = with_params_drawn(Masked::<W> {
        layers: (0..3).map(|_| LinearConfig::new(8, 8).init(&a)).collect(),
    });
    let reference = model.clone();
    let x = Tensor::<W, 2>::random([4, 8], Distribution::Default, &a);
    let mask = Tensor::<W, 2>::random([4, 8], Distribution::Default, &a).greater_elem(0.5);
    let placed = Placed::new(
        model,
        Placement::ranges([(0..1, a.clone()), (1..3, b.clone())]).unwrap(),
    )
    .unwrap();
    let (out, out_mask) = placed.forward((x.clone(), mask.clone()));
    assert_eq!((out.device(), out_mask.device()), (b.clone(), b));
    let (want, _) = (0..3).fold((x, mask), |s, i| reference.forward_layer(i, s));
    let flat = |t: Tensor<W, 2>| t.into_data().to_vec::<f32>().unwrap();
    let err = rel_err(&flat(out), &flat(want));
    assert!(err <= 1e-5, "outputs differ by {err:e}");
}

/// Bad placements are typed errors before anything moves.
#[test]
fn bad_placements_are_errors() {
    fn invalid<T: std::fmt::Debug>(result: Result<T, MemoryError>, name: &str) {
        match result {
            Err(MemoryError::Invalid { name: got, message }) => {
                assert_eq!(got, name, "{message}");
            }
            other => panic!("expected an invalid {name}, got {other:?}"),
        }
    }
    invalid(Placement::even(4, &[] as &[u8]), "devices");
    invalid(Placement::even(2, &[0, 1, 2]), "devices");
    invalid(Placement::even(0, &[0]), "layers");
    invalid(Placement::<u8>::ranges([]), "placement ranges");
    invalid(Placement::ranges([(1..3, 0)]), "placement ranges"); // does not start at 0
    invalid(
        Placement::ranges([(0..2, 0), (3..4, 1)]),
        "placement ranges",
    ); // a gap
    invalid(
        Placement::ranges([(0..2, 0), (1..4, 1)]),
        "placement ranges",
    ); // an overlap
    invalid(
        Placement::ranges([(0..2, 0), (2..2, 1)]),
        "placement ranges",
    ); // empty

    // Uneven counts: the larger groups first; one device listed twice is allowed.
    let placement = Placement::even(7, &['a', 'b', 'a']).unwrap();
    assert_eq!(
        placement.groups(),
        vec![(0..3, 'a'), (3..5, 'b'), (5..7, 'a')]
    );
    assert_eq!(placement.device(6), Some(&'a'));
    assert_eq!(placement.device(7), None);
    let again = Placement::ranges(placement.groups()).unwrap();
    assert_eq!(again, placement);

    // A placement for another layer count.
    let device = Default::default();
    let model = Classifier::<Autodiff<NdArray>>::new(4, 8, 1, 2, &device);
    invalid(
        Placed::new(model, Placement::even(5, &[device, device]).unwrap()),
        "placement",
    );
}
