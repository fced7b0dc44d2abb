//! Inputs a careful user can hand the library by mistake, or that a damaged file holds: each
//! is a typed error or the right result, never a panic, an abort or silently wrong weights.

use std::path::{Path, PathBuf};

use burn::backend::NdArray;
use burn::backend::ndarray::NdArrayDevice;
use burn::tensor::Tensor;
use burn_sketch::panther::load_sklinear;
use burn_sketch::{SkLinearConfig, SketchError};
use safetensors::Dtype;

use crate::ndarray::{panther_tensors, write_safetensors};

type B = NdArray;
const DEVICE: NdArrayDevice = NdArrayDevice::Cpu;

pub(crate) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// Entry `i` of the fixture tensor stored at `offset` (see `make_pytorch_fixture.py`).
pub(crate) fn expected(offset: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (i + offset) as f32 * 0.25).collect()
}

fn values<const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor.into_data().to_vec::<f32>().unwrap()
}

/// A layer from `file` must hold exactly the fixture's values.
fn assert_fixture_values(file: &str) {
    let layer = load_sklinear::<B>(&fixture(file), "fc.", &DEVICE)
        .unwrap_or_else(|err| panic!("{file}: {err}"));
    assert_eq!(values(layer.s1s.val()), expected(0, 12), "{file}: S1s");
    assert_eq!(values(layer.s2s.val()), expected(100, 16), "{file}: S2s");
    assert_eq!(values(layer.u1s.val()), expected(200, 16), "{file}: U1s");
    assert_eq!(values(layer.u2s.val()), expected(300, 12), "{file}: U2s");
    let bias = layer.bias.as_ref().unwrap().val();
    assert_eq!(values(bias), expected(400, 4), "{file}: bias");
}

/// Tensors saved as views (a transpose, a storage offset, a stride of 2) load with the values
/// PyTorch shows for them, not their storage's raw order.
#[test]
fn pytorch_views_load_through_their_strides() {
    assert_fixture_values("sklinear_views.pt");
}

/// The pre-1.6 `torch.save` format (one pickle stream, storages after it) loads too.
#[test]
fn legacy_pytorch_files_load() {
    assert_fixture_values("sklinear_legacy.pt");
}

/// Each damaged file is a `Corrupt` error naming the damaged tensor, before anything is
/// allocated for its values: no zeros in place of weights, no abort on a 10⁹-wide layer
/// declared by a 1 KB file.
#[test]
fn damaged_pytorch_files_are_corrupt_errors() {
    for (file, key, reason) in [
        ("sklinear_short_storage.pt", "fc.S1s", "holds 6"),
        (
            "sklinear_short_data.pt",
            "fc.S2s",
            "declares 64 bytes but the file holds 40",
        ),
        ("sklinear_offset_past_end.pt", "fc.U1s", "offset 1000"),
        (
            "sklinear_missing_data.pt",
            "fc.U2s",
            "has no `archive/data/3`",
        ),
        ("sklinear_huge.pt", "fc.S1s", "declares 4000000000 bytes"),
        (
            "sklinear_legacy_truncated.pt",
            "fc.bias",
            "declares 16 bytes but the file holds 10",
        ),
    ] {
        match load_sklinear::<B>(&fixture(file), "fc.", &DEVICE) {
            Err(SketchError::Corrupt { key: k, reason: r }) => {
                assert_eq!(k, key, "{file}: {r}");
                assert!(r.contains(reason), "{file}: `{r}` lacks `{reason}`");
            }
            Err(other) => panic!("{file}: expected a Corrupt error, got {other}"),
            Ok(_) => panic!("{file}: loaded"),
        }
    }
}

/// An `f64` value beyond `f32`'s range is an error naming it, in both formats, not an infinity.
#[test]
fn f64_values_beyond_f32_are_out_of_range_errors() {
    let err = load_sklinear::<B>(&fixture("sklinear_f64.pt"), "fc.", &DEVICE).unwrap_err();
    assert!(
        matches!(&err, SketchError::OutOfRange { key, value } if key == "fc.S2s" && *value == 1e300),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f64.safetensors");
    let mut tensors = panther_tensors(1, 3, 1, 2);
    let mut s2s: Vec<f64> = vec![0.5, -0.25];
    tensors[1].2 = Dtype::F64;
    tensors[1].3 = s2s.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_safetensors(&path, &tensors);
    let layer = load_sklinear::<B>(&path, "", &DEVICE).unwrap();
    assert_eq!(values(layer.s2s.val()), vec![0.5, -0.25]);

    s2s[1] = -1e300;
    tensors[1].3 = s2s.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_safetensors(&path, &tensors);
    let err = load_sklinear::<B>(&path, "", &DEVICE).unwrap_err();
    assert!(
        matches!(&err, SketchError::OutOfRange { key, value } if key == "S2s" && *value == -1e300),
        "{err}"
    );
    assert!(err.to_string().contains("-1e300"), "{err}");
}

/// Sizes whose element or byte counts overflow are `InvalidConfig` from `validate` and
/// `try_init`, not a capacity overflow, an abort or a reshape panic.
#[test]
fn config_sizes_that_overflow_are_invalid() {
    let huge = usize::MAX / 2;
    for (config, name) in [
        (SkLinearConfig::new(huge, 2, 1, 1), "d_input × d_output"),
        (
            SkLinearConfig::new(1 << 40, 1 << 40, 1, 1),
            "d_input × d_output",
        ),
        (SkLinearConfig::new(1 << 61, 1, 1, 1), "d_input × d_output"),
        (SkLinearConfig::new(4, 4, huge, 4), "num_terms × low_rank"),
        (
            SkLinearConfig::new(1 << 30, 1, 1 << 30, 1),
            "num_terms × d_input × low_rank",
        ),
        (
            SkLinearConfig::new(1, 1 << 30, 1 << 15, 1 << 15),
            "num_terms × low_rank × d_output",
        ),
    ] {
        let err = config.validate().unwrap_err();
        assert!(
            matches!(err, SketchError::InvalidConfig { name: n, .. } if n == name),
            "{config:?}: {err}"
        );
        let err = config.try_init::<B>(&DEVICE).unwrap_err();
        assert!(matches!(err, SketchError::InvalidConfig { .. }), "{err}");
    }
}

/// A batch with no rows gives an empty output of the right shape, like `nn::Linear`.
#[test]
fn forward_on_zero_rows_gives_an_empty_output() {
    let layer = SkLinearConfig::new(5, 3, 2, 1).init::<B>(&DEVICE);
    let out = layer.forward(Tensor::<B, 3>::zeros([2, 0, 5], &DEVICE));
    assert_eq!(out.dims(), [2, 0, 3]);
    let out = layer.forward(Tensor::<B, 2>::zeros([0, 5], &DEVICE));
    assert_eq!(out.dims(), [0, 3]);
    assert!(values(out).is_empty());
}
