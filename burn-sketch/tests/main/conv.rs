//! `SkConv2d` on Flex, NdArray and wgpu: its forward is the convolution by its effective kernel
//! (Burn's `conv2d`) for odd shapes, strides, dilations, groups and every padding; gradients
//! under autodiff; Panther checkpoints both ways, against a fixture of Panther's forward; bad
//! configurations as typed errors.

use burn::backend::flex::FlexDevice;
use burn::backend::ndarray::NdArrayDevice;
use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Autodiff, Flex, NdArray, Wgpu};
use burn::nn::PaddingConfig2d;
use burn::tensor::backend::Backend;
use burn::tensor::module::conv2d;
use burn::tensor::ops::{ConvOptions, PadMode};
use burn::tensor::{Distribution, ElementConversion, Tensor, TensorData};
use burn_sketch::panther::{load_skconv2d, save_skconv2d};
use burn_sketch::{SkConv2dConfig, SketchError};

/// A configuration and the zero padding (top, bottom, left, right) it must apply to an input of
/// `size`, worked out by hand.
fn cases() -> Vec<(SkConv2dConfig, [usize; 2], [usize; 4])> {
    vec![
        (
            SkConv2dConfig::new([3, 5], [3, 3], 1, 2),
            [7, 6],
            [0, 0, 0, 0],
        ),
        (
            // Panther's defaults: 3 × 3, padding 1; two terms.
            SkConv2dConfig::new([8, 16], [3, 3], 2, 3)
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1)),
            [9, 9],
            [1, 1, 1, 1],
        ),
        (
            SkConv2dConfig::new([4, 6], [3, 2], 2, 2)
                .with_stride([2, 1])
                .with_dilation([1, 2])
                .with_groups(2)
                .with_padding(PaddingConfig2d::Explicit(1, 0, 2, 1)),
            [8, 7],
            [1, 2, 0, 1],
        ),
        (
            // `Same` with an even kernel: total 1 per side, one more at the bottom and right.
            SkConv2dConfig::new([2, 4], [2, 2], 1, 1).with_padding(PaddingConfig2d::Same),
            [5, 6],
            [0, 1, 0, 1],
        ),
        (
            SkConv2dConfig::new([6, 3], [1, 1], 3, 1)
                .with_groups(3)
                .with_bias(false),
            [4, 5],
            [0, 0, 0, 0],
        ),
    ]
}

/// `x` zero-padded by `[top, bottom, left, right]`.
fn pad<B: Backend>(x: Tensor<B, 4>, [top, bottom, left, right]: [usize; 4]) -> Tensor<B, 4> {
    x.pad((left, right, top, bottom), PadMode::Constant(0.0))
}

fn max_gap<B: Backend>(a: Tensor<B, 4>, b: Tensor<B, 4>) -> f32 {
    let scale: f32 = b.clone().abs().max().into_scalar().elem();
    let gap: f32 = (a - b).abs().max().into_scalar().elem();
    gap / scale.max(1e-6)
}

/// The forward equals Burn's `conv2d` with the effective kernel, on the input padded by hand.
fn forward_is_the_convolution_by_its_kernel<B: Backend>(device: &B::Device) {
    for (config, [h, w], padding) in cases() {
        let layer = config.init::<B>(device);
        let x =
            Tensor::<B, 4>::random([2, config.channels[0], h, w], Distribution::Default, device);
        let ours = layer.forward(x.clone());
        let reference = conv2d(
            pad(x, padding),
            layer.to_dense_kernel(),
            layer.bias.as_ref().map(|b| b.val()),
            ConvOptions::new(config.stride, [0, 0], config.dilation, config.groups),
        );
        assert_eq!(ours.dims(), reference.dims(), "{config:?}");
        let gap = max_gap(ours, reference);
        assert!(gap < 1e-5, "{config:?}: relative gap {gap}");
    }
}

/// Under autodiff, the gradient of a loss with respect to the input is the reference
/// convolution's, and the trained factors get gradients while the sketches get none.
fn gradients_flow<B: burn::tensor::backend::AutodiffBackend>(device: &B::Device) {
    for (config, [h, w], padding) in cases() {
        let layer = config.init::<B>(device);
        let x =
            Tensor::<B, 4>::random([2, config.channels[0], h, w], Distribution::Default, device)
                .require_grad();
        let grads = layer.forward(x.clone()).powi_scalar(2).sum().backward();
        let ours = x.grad(&grads).unwrap();
        assert!(layer.s1s.val().grad(&grads).is_some() && layer.s2s.val().grad(&grads).is_some());
        assert!(
            layer.u1s.val().grad(&grads).is_none(),
            "a sketch got a gradient"
        );

        let x2 = x.clone().detach().require_grad();
        let reference = conv2d(
            pad(x2.clone(), padding),
            layer.to_dense_kernel().detach(),
            layer.bias.as_ref().map(|b| b.val().detach()),
            ConvOptions::new(config.stride, [0, 0], config.dilation, config.groups),
        );
        let grads = reference.powi_scalar(2).sum().backward();
        let expected = x2.grad(&grads).unwrap();
        let gap = max_gap(ours, expected);
        assert!(gap < 1e-4, "{config:?}: input gradients differ by {gap}");
    }
}

/// Saved for Panther and loaded back: the same outputs, on any backend.
fn panther_checkpoints_round_trip<B: Backend>(device: &B::Device) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("conv.safetensors");
    let config = SkConv2dConfig::new([3, 4], [3, 3], 2, 2)
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1));
    let layer = config.init::<B>(device);
    save_skconv2d(&layer, &path, "features.0.").unwrap();
    let loaded = load_skconv2d::<B>(&path, "features.0.", &config, device).unwrap();
    let x = Tensor::<B, 4>::random([1, 3, 6, 5], Distribution::Default, device);
    let gap = max_gap(loaded.forward(x.clone()), layer.forward(x));
    assert!(gap < 1e-6, "round trip changed the outputs by {gap}");
}

/// A checkpoint in Panther's layout with the output of Panther's forward for a fixed input,
/// both written by `tests/data/make_skconv2d_fixture.py` (NumPy; Panther's `SKConv2d.forward`:
/// the windows times `(Σ S1_t·U1_t)/T` plus `(Σ U2_tᵀ·S2_t)/T` plus the bias twice): the
/// loaded layer gives that output within 1e-4.
#[test]
fn panther_checkpoint_matches_panthers_forward() {
    let device = FlexDevice;
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/skconv2d.safetensors");
    let config = SkConv2dConfig::new([3, 4], [3, 3], 2, 2)
        .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1));
    let layer = load_skconv2d::<Flex>(&path, "", &config, &device).unwrap();
    let file = std::fs::read(&path).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&file).unwrap();
    let read = |name: &str| -> Tensor<Flex, 4> {
        let view = tensors.tensor(name).unwrap();
        let values: Vec<f32> = view
            .data()
            .chunks(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let shape: [usize; 4] = view.shape().try_into().unwrap();
        Tensor::from_data(TensorData::new(values, shape), &device)
    };
    let gap = max_gap(layer.forward(read("input")), read("output"));
    assert!(gap < 1e-4, "Panther parity: {gap}");
}

#[test]
fn bad_configurations_are_typed_errors() {
    let device = FlexDevice;
    let invalid = |config: SkConv2dConfig, field: &str| match config.try_init::<Flex>(&device) {
        Err(SketchError::InvalidConfig { name, .. }) => assert_eq!(name, field),
        other => panic!("{field}: {:?}", other.map(|_| ())),
    };
    invalid(SkConv2dConfig::new([0, 4], [3, 3], 1, 2), "channels[0]");
    invalid(SkConv2dConfig::new([3, 4], [3, 3], 1, 0), "low_rank");
    invalid(
        SkConv2dConfig::new([3, 4], [3, 3], 1, 2).with_stride([0, 1]),
        "stride[0]",
    );
    invalid(
        SkConv2dConfig::new([3, 4], [3, 3], 1, 2).with_groups(2),
        "channels[0]",
    );
    let grouped = SkConv2dConfig::new([4, 4], [3, 3], 1, 2).with_groups(2);
    let dir = tempfile::tempdir().unwrap();
    let layer = grouped.init::<Flex>(&device);
    assert!(matches!(
        save_skconv2d(&layer, &dir.path().join("x.safetensors"), ""),
        Err(SketchError::Unsupported { .. })
    ));
    // A checkpoint read with the wrong kernel size: a shape mismatch naming the tensor.
    let config = SkConv2dConfig::new([3, 4], [3, 3], 2, 2);
    let path = dir.path().join("y.safetensors");
    save_skconv2d(&config.init::<Flex>(&device), &path, "").unwrap();
    let wrong = SkConv2dConfig::new([3, 4], [2, 2], 2, 2);
    assert!(matches!(
        load_skconv2d::<Flex>(&path, "", &wrong, &device),
        Err(SketchError::ShapeMismatch { .. })
    ));
}

#[test]
#[should_panic(expected = "expects 3 input channels")]
fn wrong_channels_panic() {
    let device = FlexDevice;
    let layer = SkConv2dConfig::new([3, 4], [3, 3], 1, 2).init::<Flex>(&device);
    layer.forward(Tensor::zeros([1, 2, 5, 5], &device));
}

#[test]
fn forward_flex() {
    forward_is_the_convolution_by_its_kernel::<Flex>(&FlexDevice);
}
#[test]
fn forward_ndarray() {
    forward_is_the_convolution_by_its_kernel::<NdArray>(&NdArrayDevice::Cpu);
}
#[test]
fn forward_wgpu() {
    forward_is_the_convolution_by_its_kernel::<Wgpu>(&WgpuDevice::default());
}
#[test]
fn gradients_flex() {
    gradients_flow::<Autodiff<Flex>>(&FlexDevice);
}
#[test]
fn gradients_wgpu() {
    gradients_flow::<Autodiff<Wgpu>>(&WgpuDevice::default());
}
#[test]
fn checkpoints_flex() {
    panther_checkpoints_round_trip::<Flex>(&FlexDevice);
}
#[test]
fn checkpoints_ndarray() {
    panther_checkpoints_round_trip::<NdArray>(&NdArrayDevice::Cpu);
}
