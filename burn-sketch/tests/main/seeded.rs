//! Sketches kept as a seed: a sketched model's record holds the seed instead of the fixed
//! sketches (about half the bytes), the sketches are the same on every backend, survive
//! autodiff and training, and Panther checkpoints still carry the full tensors.

use burn::backend::flex::FlexDevice;
use burn::backend::ndarray::NdArrayDevice;
use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Autodiff, Flex, NdArray, Wgpu};
use burn::module::{AutodiffModule, Module};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::record::{BinFileRecorder, FullPrecisionSettings};
use burn::tensor::{Distribution, Tensor};
use burn_sketch::panther::{load_skconv2d, load_sklinear, save_skconv2d, save_sklinear};
use burn_sketch::{SkConv2dConfig, SkLinearConfig};

fn record_bytes<M: Module<Flex>>(module: M) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model");
    module
        .save_file(
            path.clone(),
            &BinFileRecorder::<FullPrecisionSettings>::new(),
        )
        .unwrap();
    std::fs::metadata(path.with_extension("bin")).unwrap().len()
}

/// A square layer with `T = 1` stores as many sketch values as trained ones: recorded as a
/// seed, its file is at most 52 % of the whole one (the bias and the header are the rest).
#[test]
fn a_seeded_record_is_half_the_bytes() {
    let device = FlexDevice;
    let linear = SkLinearConfig::new(256, 256, 1, 16).with_bias(false);
    let whole = record_bytes(linear.init::<Flex>(&device));
    let seeded = record_bytes(linear.with_sketch_seed(Some(3)).init::<Flex>(&device));
    assert!(
        seeded * 100 <= whole * 52,
        "SkLinear: {seeded} bytes seeded against {whole}"
    );
    // A convolution's second sketch is larger than its first factor (k·kh·kw × C·kh·kw): the
    // saving is larger still.
    let conv = SkConv2dConfig::new([32, 32], [3, 3], 1, 4).with_bias(false);
    let whole = record_bytes(conv.init::<Flex>(&device));
    let seeded = record_bytes(conv.with_sketch_seed(Some(3)).init::<Flex>(&device));
    assert!(
        seeded * 100 <= whole * 52,
        "SkConv2d: {seeded} bytes seeded against {whole}"
    );
}

/// The same seed gives the same sketches on Flex, NdArray and wgpu (drawn on the host), and
/// different seeds different ones.
#[test]
fn seeded_sketches_are_the_same_on_every_backend() {
    let config = SkLinearConfig::new(20, 12, 2, 3).with_sketch_seed(Some(11));
    let flex = config.init::<Flex>(&FlexDevice);
    let ndarray = config.init::<NdArray>(&NdArrayDevice::Cpu);
    let wgpu = config.init::<Wgpu>(&WgpuDevice::default());
    for (a, b) in [
        (flex.u1s.val().into_data(), ndarray.u1s.val().into_data()),
        (flex.u2s.val().into_data(), ndarray.u2s.val().into_data()),
        (flex.u1s.val().into_data(), wgpu.u1s.val().into_data()),
        (flex.u2s.val().into_data(), wgpu.u2s.val().into_data()),
    ] {
        assert_eq!(a, b);
    }
    let other = config.with_sketch_seed(Some(12)).init::<Flex>(&FlexDevice);
    assert_ne!(other.u1s.val().into_data(), flex.u1s.val().into_data());
    let conv = SkConv2dConfig::new([4, 6], [3, 3], 1, 2)
        .with_groups(2)
        .with_sketch_seed(Some(5));
    assert_eq!(
        conv.init::<Flex>(&FlexDevice).u2s.val().into_data(),
        conv.init::<NdArray>(&NdArrayDevice::Cpu)
            .u2s
            .val()
            .into_data()
    );
}

/// Under autodiff: a training step leaves the seeded sketches as they were, `valid()` keeps
/// the seed, and the trained layer's record (seeded) loads back to the same outputs.
#[test]
fn seeded_sketches_train_and_reload() {
    type A = Autodiff<Flex>;
    let device = FlexDevice;
    let config = SkLinearConfig::new(16, 8, 2, 4).with_sketch_seed(Some(21));
    let mut layer = config.init::<A>(&device);
    let before = layer.u1s.val().into_data();
    let mut optimizer = AdamConfig::new().init();
    for _ in 0..3 {
        let x = Tensor::<A, 2>::random([5, 16], Distribution::Default, &device);
        let grads =
            GradientsParams::from_grads(layer.forward(x).powi_scalar(2).sum().backward(), &layer);
        layer = optimizer.step(1e-2, layer, grads);
    }
    assert_eq!(layer.u1s.val().into_data(), before);
    let valid = layer.valid();
    assert_eq!(valid.u1s.seed(), Some(42));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trained");
    let recorder = BinFileRecorder::<FullPrecisionSettings>::new();
    valid.clone().save_file(path.clone(), &recorder).unwrap();
    let loaded = SkLinearConfig::new(16, 8, 2, 4)
        .init::<Flex>(&device)
        .load_file(path, &recorder, &device)
        .unwrap();
    let x = Tensor::<Flex, 2>::random([3, 16], Distribution::Default, &device);
    assert_eq!(
        valid.forward(x.clone()).into_data(),
        loaded.forward(x).into_data()
    );
}

/// Panther checkpoints of seeded layers carry the full sketches: they load into unseeded
/// layers with the same values.
#[test]
fn panther_checkpoints_of_seeded_layers_hold_the_full_sketches() {
    let device = FlexDevice;
    let dir = tempfile::tempdir().unwrap();
    let layer = SkLinearConfig::new(12, 10, 1, 3)
        .with_sketch_seed(Some(4))
        .init::<Flex>(&device);
    let path = dir.path().join("linear.safetensors");
    save_sklinear(&layer, &path, "").unwrap();
    let loaded = load_sklinear::<Flex>(&path, "", &device).unwrap();
    assert_eq!(loaded.u2s.val().into_data(), layer.u2s.val().into_data());
    assert_eq!(loaded.u2s.seed(), None);

    let config = SkConv2dConfig::new([3, 4], [3, 3], 1, 2);
    let conv = config
        .clone()
        .with_sketch_seed(Some(4))
        .init::<Flex>(&device);
    let path = dir.path().join("conv.safetensors");
    save_skconv2d(&conv, &path, "").unwrap();
    let loaded = load_skconv2d::<Flex>(&path, "", &config, &device).unwrap();
    assert_eq!(loaded.u1s.val().into_data(), conv.u1s.val().into_data());
}
