//! `SkLinear` on the NdArray backend: the backend-generic checks, plus the numerical and
//! interoperability checks that need only one backend.

use crate::common;

use std::path::Path;

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, NdArray};
use burn::nn::{LinearConfig, LinearLayout};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use burn_sketch::backend::KernelStrategy;
use burn_sketch::panther::{load_sklinear, save_sklinear};
use burn_sketch::{ParamCounts, SkLinear, SkLinearConfig, SketchError};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

type B = NdArray;
type AB = Autodiff<NdArray>;
const DEVICE: NdArrayDevice = NdArrayDevice::Cpu;
/// NdArray has one implementation of the product; it takes the default strategy and ignores it.
const STRATEGY: KernelStrategy = KernelStrategy::Autotune;

backend_suite!(B, AB, DEVICE, STRATEGY);

/// NdArray's own path (direct matrix products on its arrays) against the tensor-op path in
/// f64, the other float width NdArray stores (the suite checks f32).
#[test]
fn f64_backend_path_matches_tensor_ops() {
    common::backend_path_matches_tensor_ops::<NdArray<f64>>(&DEVICE, STRATEGY);
}

/// The NdArray path reads an input through its strides (a transposed view here), and
/// computes exactly the gradients it is asked for, each equal to the tensor-op path's.
#[test]
fn backend_path_takes_strided_inputs_and_partial_gradients() {
    use burn_sketch::backend::{WantedGradients, tensor_ops};
    use burn_sketch::{Activation, SketchBackend};
    let _serial = common::serial();
    B::seed(&DEVICE, 9);
    let (rows, d_in, d_out) = (6, 11, 7);
    let layer = SkLinearConfig::new(d_in, d_out, 3, 2).init::<B>(&DEVICE);
    let x = Tensor::<B, 2>::random([d_in, rows], Distribution::Default, &DEVICE).transpose();
    let g = Tensor::<B, 2>::random([d_out, rows], Distribution::Default, &DEVICE).transpose();
    let bias = layer.bias.as_ref().map(|b| b.val());
    common::assert_close(
        B::sketched_linear(
            x.clone(),
            layer.weights(),
            bias.clone(),
            Activation::Identity,
            STRATEGY,
        )
        .into_data(),
        tensor_ops::sketched_linear(x.clone(), layer.weights(), bias).into_data(),
        "forward of a transposed input",
    );

    let none = WantedGradients::default();
    for wanted in [
        WantedGradients { x: true, ..none },
        WantedGradients { s1s: true, ..none },
        WantedGradients { s2s: true, ..none },
        WantedGradients {
            u1s: true,
            u2s: true,
            ..none
        },
        none,
    ] {
        let actual =
            B::sketched_linear_backward(x.clone(), layer.weights(), g.clone(), wanted, STRATEGY);
        let expected =
            tensor_ops::sketched_linear_backward(x.clone(), layer.weights(), g.clone(), wanted);
        let what = format!("{wanted:?}");
        let present = [
            actual.x.is_some(),
            actual.s1s.is_some(),
            actual.s2s.is_some(),
            actual.u1s.is_some(),
            actual.u2s.is_some(),
        ];
        assert_eq!(
            present,
            [wanted.x, wanted.s1s, wanted.s2s, wanted.u1s, wanted.u2s],
            "{what}: gradients present"
        );
        if let (Some(a), Some(e)) = (actual.x, expected.x) {
            common::assert_close(a.into_data(), e.into_data(), &format!("∂x, {what}"));
        }
        for (a, e, name) in [
            (actual.s1s, expected.s1s, "∂S1s"),
            (actual.s2s, expected.s2s, "∂S2s"),
            (actual.u1s, expected.u1s, "∂U1s"),
            (actual.u2s, expected.u2s, "∂U2s"),
        ] {
            if let (Some(a), Some(e)) = (a, e) {
                common::assert_close(a.into_data(), e.into_data(), &format!("{name}, {what}"));
            }
        }
    }
}

#[test]
fn invalid_configs_are_errors_that_name_the_value() {
    for (config, name) in [
        (SkLinearConfig::new(0, 4, 1, 2), "d_input"),
        (SkLinearConfig::new(4, 0, 1, 2), "d_output"),
        (SkLinearConfig::new(4, 4, 0, 2), "num_terms"),
        (SkLinearConfig::new(4, 4, 1, 0), "low_rank"),
    ] {
        let err = config.try_init::<B>(&DEVICE).unwrap_err();
        assert!(
            matches!(err, SketchError::InvalidConfig { name: n, value: 0, .. } if n == name),
            "{err}"
        );
        assert!(err.to_string().contains(name), "{err}");
    }
    for bad in [0, 7] {
        let err = SkLinearConfig::from_sketch_size(8, 8, bad).unwrap_err();
        assert!(err.to_string().contains("sketch_size"), "{err}");
    }
    let config = SkLinearConfig::from_sketch_size(8, 6, 10).unwrap();
    assert_eq!((config.num_terms, config.low_rank), (1, 5));
}

#[test]
#[should_panic(expected = "invalid `low_rank` = 0")]
fn init_panics_with_the_bad_value() {
    SkLinearConfig::new(4, 4, 1, 0).init::<B>(&DEVICE);
}

#[test]
fn param_counts_separate_trained_and_fixed() {
    let layer = SkLinearConfig::new(784, 256, 2, 16).init::<B>(&DEVICE);
    let factors = 2 * 16 * (784 + 256);
    assert_eq!(
        layer.param_counts(),
        ParamCounts {
            trainable: factors + 256,
            fixed: factors,
            dense: 784 * 256 + 256,
        }
    );
    // Burn's own count includes the fixed sketches.
    use burn::module::Module;
    assert_eq!(layer.num_params(), 2 * factors + 256);
    let no_bias = SkLinearConfig::new(10, 3, 1, 1)
        .with_bias(false)
        .init::<B>(&DEVICE);
    assert_eq!(no_bias.param_counts().trainable, 13);
}

fn rel_error(a: &Tensor<B, 2>, b: &Tensor<B, 2>) -> f32 {
    let diff = (a.clone() - b.clone()).powi_scalar(2).sum().into_scalar();
    let norm = b.clone().powi_scalar(2).sum().into_scalar();
    (diff / norm).sqrt()
}

/// Averaged over many draws of the sketches, the effective weight converges to the dense
/// weight it was built from: the initialisation is unbiased. One draw alone is far from it,
/// so the test would fail if the average did not converge.
#[test]
fn initialisation_is_unbiased() {
    let _serial = common::serial();
    B::seed(&DEVICE, 2024);
    for layout in [LinearLayout::Row, LinearLayout::Col] {
        let linear = LinearConfig::new(12, 10)
            .with_layout(layout)
            .init::<B>(&DEVICE);
        let weight = linear.weight.val();
        assert_eq!(weight.dims(), [12, 10]);
        // The layout only changes storage: Linear still computes x·weight + b.
        let x = Tensor::<B, 2>::random([3, 12], Distribution::Default, &DEVICE);
        let bias = linear.bias.as_ref().unwrap().val();
        common::assert_close(
            linear.forward(x.clone()).into_data(),
            (x.matmul(weight.clone()) + bias.clone().unsqueeze_dim(0)).into_data(),
            "Linear's forward",
        );

        let draws = 800;
        let mut sum = Tensor::<B, 2>::zeros([12, 10], &DEVICE);
        let mut single = f32::MAX;
        for _ in 0..draws {
            let layer = SkLinear::from_linear(&linear, 2, 3);
            assert_eq!(
                layer.bias.as_ref().unwrap().val().into_data(),
                bias.to_data(),
                "bias not copied"
            );
            let effective = layer.to_dense_weight();
            single = single.min(rel_error(&effective, &weight));
            sum = sum + effective;
        }
        let mean = sum.div_scalar(draws as f64);
        let averaged = rel_error(&mean, &weight);
        // One draw (T = 2, k = 3) has a relative error near 1; the mean of 800 about 1/√800 of it.
        assert!(
            single > 0.3,
            "{layout:?}: a single draw is suspiciously exact ({single})"
        );
        assert!(
            averaged < 0.08,
            "{layout:?}: mean of {draws} draws is off by {averaged}"
        );
    }
}

/// A trained dense layer on an autodiff backend converts to a trainable sketched layer: its
/// parameters are fresh leaves that receive gradients, and the dense layer's get none.
#[test]
fn from_linear_on_autodiff_gives_trainable_leaves() {
    let dense = LinearConfig::new(12, 10).init::<AB>(&DEVICE);
    let layer = SkLinear::from_linear(&dense, 1, 4);
    let x = Tensor::<AB, 2>::random([5, 12], Distribution::Default, &DEVICE);
    let grads = layer.forward(x).sum().backward();
    let s1 = layer.s1s.grad(&grads).expect("S1s has a gradient");
    assert_eq!(s1.dims(), [1, 12, 4]);
    assert!(s1.abs().sum().into_scalar() > 0.0);
    assert!(layer.bias.as_ref().unwrap().grad(&grads).is_some());
    assert!(
        dense.weight.grad(&grads).is_none(),
        "gradients leaked to the dense layer"
    );
    assert!(dense.bias.as_ref().unwrap().grad(&grads).is_none());
}

pub(crate) fn write_safetensors(path: &Path, tensors: &[(&str, Vec<usize>, Dtype, Vec<u8>)]) {
    let views = tensors
        .iter()
        .map(|(name, shape, dtype, bytes)| {
            (
                name.to_string(),
                TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect::<Vec<_>>();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn f32_bytes(len: usize) -> Vec<u8> {
    (0..len)
        .flat_map(|i| (i as f32 * 0.25).to_le_bytes())
        .collect()
}

/// A Panther-layout tensor list for T, d_in, k, d_out, with a way to break one entry.
pub(crate) fn panther_tensors(
    t: usize,
    d_in: usize,
    k: usize,
    d_out: usize,
) -> Vec<(&'static str, Vec<usize>, Dtype, Vec<u8>)> {
    [
        ("S1s", vec![t, d_in, k]),
        ("S2s", vec![t, k, d_out]),
        ("U1s", vec![t, k, d_out]),
        ("U2s", vec![t, d_in, k]),
        ("bias", vec![d_out]),
    ]
    .into_iter()
    .map(|(name, shape)| {
        let len = shape.iter().product();
        (name, shape, Dtype::F32, f32_bytes(len))
    })
    .collect()
}

#[test]
fn a_safetensors_header_whose_length_starts_like_a_pickle_still_loads() {
    // A safetensors file starts with its header's length; when its low byte is 0x80 (the
    // pickle PROTO opcode) the file must still load as safetensors. The prefix's length moves
    // the header's length through every multiple of 8 until one lands on it.
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sk.safetensors");
    let layer = SkLinearConfig::new(64, 32, 2, 8).init::<B>(&DEVICE);
    let mut hit = false;
    for extra in 0..40 {
        let prefix = format!("fc{}.", "x".repeat(extra));
        save_sklinear(&layer, &path, &prefix).unwrap();
        if std::fs::read(&path).unwrap()[0] != 0x80 {
            continue;
        }
        hit = true;
        let loaded = load_sklinear::<B>(&path, &prefix, &DEVICE)
            .unwrap_or_else(|err| panic!("prefix {prefix:?}: {err}"));
        let x = Tensor::<B, 2>::random([3, 64], Distribution::Default, &DEVICE);
        assert_eq!(
            layer.forward(x.clone()).into_data(),
            loaded.forward(x).into_data()
        );
    }
    assert!(hit, "no prefix gave a header length with low byte 0x80");
}

#[test]
fn panther_round_trip_reproduces_outputs() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sk.safetensors");
    for bias in [true, false] {
        let layer = SkLinearConfig::new(9, 6, 3, 2)
            .with_bias(bias)
            .init::<B>(&DEVICE);
        save_sklinear(&layer, &path, "encoder.0.").unwrap();
        let loaded = load_sklinear::<B>(&path, "encoder.0.", &DEVICE).unwrap();
        assert_eq!(loaded.bias.is_some(), bias);
        assert!(!loaded.u1s.is_require_grad() && !loaded.u2s.is_require_grad());
        let x = Tensor::<B, 2>::random([4, 9], Distribution::Default, &DEVICE);
        assert_eq!(
            layer.forward(x.clone()).into_data(),
            loaded.forward(x).into_data()
        );
        // The file holds exactly Panther's keys under the prefix.
        let bytes = std::fs::read(&path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names = file.names();
        names.sort();
        let mut expected = vec![
            "encoder.0.S1s",
            "encoder.0.S2s",
            "encoder.0.U1s",
            "encoder.0.U2s",
        ];
        if bias {
            expected.insert(0, "encoder.0.bias");
            expected.sort();
        }
        assert_eq!(names, expected);
    }
}

#[test]
fn panther_half_precision_files_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("half.safetensors");
    let mut tensors = panther_tensors(1, 3, 2, 4);
    for (_, shape, dtype, bytes) in tensors.iter_mut() {
        let len: usize = shape.iter().product();
        *dtype = Dtype::BF16;
        *bytes = (0..len)
            .flat_map(|i| half::bf16::from_f32(i as f32 * 0.25).to_le_bytes())
            .collect();
    }
    write_safetensors(&path, &tensors);
    let layer = load_sklinear::<B>(&path, "", &DEVICE).unwrap();
    let expected: Vec<f32> = (0..6).map(|i| i as f32 * 0.25).collect();
    assert_eq!(
        layer.s1s.val().into_data().to_vec::<f32>().unwrap(),
        expected
    );
}

#[test]
fn malformed_panther_files_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.safetensors");
    let load = |tensors: &[(&str, Vec<usize>, Dtype, Vec<u8>)]| {
        write_safetensors(&path, tensors);
        load_sklinear::<B>(&path, "", &DEVICE)
            .map(|_| ())
            .unwrap_err()
    };
    let with = |index: usize, shape: Vec<usize>| {
        let mut tensors = panther_tensors(2, 5, 3, 4);
        let len = shape.iter().product();
        tensors[index].1 = shape;
        tensors[index].3 = f32_bytes(len);
        tensors
    };

    let mut missing = panther_tensors(2, 5, 3, 4);
    missing.remove(1);
    assert!(matches!(load(&missing), SketchError::MissingKey { key } if key == "S2s"));

    for (case, tensors, key) in [
        ("S1s not rank 3", with(0, vec![5, 3]), "S1s"),
        ("S2s with another k", with(1, vec![2, 4, 4]), "S2s"),
        ("U1s with another T", with(2, vec![3, 3, 4]), "U1s"),
        ("U2s with another d_in", with(3, vec![2, 6, 3]), "U2s"),
        ("bias of the wrong length", with(4, vec![5]), "bias"),
        ("zero rank", panther_tensors(2, 5, 0, 4), "S1s"),
    ] {
        match load(&tensors) {
            SketchError::ShapeMismatch { key: k, .. } => assert_eq!(k, key, "{case}"),
            other => panic!("{case}: unexpected error {other}"),
        }
    }

    let mut ints = panther_tensors(1, 2, 1, 2);
    ints[2].2 = Dtype::I32;
    assert!(matches!(load(&ints), SketchError::UnsupportedDtype { .. }));

    std::fs::write(&path, b"not a safetensors file").unwrap();
    assert!(matches!(
        load_sklinear::<B>(&path, "", &DEVICE),
        Err(SketchError::Format { .. })
    ));
    assert!(matches!(
        load_sklinear::<B>(&dir.path().join("absent"), "", &DEVICE),
        Err(SketchError::Io { .. })
    ));
    // A prefix that matches nothing is a missing key, not a panic.
    write_safetensors(&path, &panther_tensors(1, 2, 1, 2));
    assert!(matches!(
        load_sklinear::<B>(&path, "layer.", &DEVICE),
        Err(SketchError::MissingKey { .. })
    ));
}

/// A PyTorch `torch.save` state dict (written by `tests/data/make_pytorch_fixture.py` in
/// PyTorch's zip format) loads with the values it holds.
#[test]
fn panther_pytorch_files_load() {
    let path = crate::bad_input::fixture("sklinear.pt");
    let layer = load_sklinear::<B>(&path, "fc.", &DEVICE).unwrap();
    assert_eq!(
        (
            layer.num_terms(),
            layer.d_input(),
            layer.low_rank(),
            layer.d_output()
        ),
        (2, 3, 2, 4)
    );
    let expected = crate::bad_input::expected;
    let values = |t: Tensor<B, 3>| t.into_data().to_vec::<f32>().unwrap();
    assert_eq!(values(layer.s1s.val()), expected(0, 12));
    assert_eq!(values(layer.s2s.val()), expected(100, 16));
    assert_eq!(values(layer.u1s.val()), expected(200, 16));
    assert_eq!(values(layer.u2s.val()), expected(300, 12));
    let bias = layer.bias.as_ref().unwrap().val();
    assert_eq!(bias.into_data().to_vec::<f32>().unwrap(), expected(400, 4));
    assert!(!layer.u1s.is_require_grad());

    assert!(matches!(
        load_sklinear::<B>(&path, "", &DEVICE),
        Err(SketchError::MissingKey { key }) if key == "S1s"
    ));
    let dir = tempfile::tempdir().unwrap();
    let truncated = dir.path().join("truncated.pt");
    std::fs::write(&truncated, &std::fs::read(&path).unwrap()[..200]).unwrap();
    assert!(matches!(
        load_sklinear::<B>(&truncated, "fc.", &DEVICE),
        Err(SketchError::Format { .. })
    ));
}
