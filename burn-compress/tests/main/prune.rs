//! `burn_sketch::prune`: exact mask counts and tie order, masks that hold through Adam,
//! permanence, structured shrinking that computes what the masked pair did (Linear, Conv2d,
//! SkLinear, on odd shapes), on Flex and NdArray; and typed errors for bad input.

use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::{AutodiffModule, Module};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNormConfig, DropoutConfig, Linear, LinearConfig, PaddingConfig2d};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::activation::relu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use burn_compress::CompressError;
use burn_compress::prune::{
    MaskedLinear, Norm, PruneConfig, PruneMethod, Shrink, Sparsity, SparsityReport, shrink_pair,
};
use burn_sketch::{SkLinearConfig, SketchBackend};

fn values<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

fn zeros<B: Backend, const D: usize>(tensor: Tensor<B, D>) -> usize {
    values(tensor).iter().filter(|&&v| v == 0.0).count()
}

fn max_gap<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f32 {
    assert_eq!(a.dims(), b.dims());
    values(a)
        .iter()
        .zip(values(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn structured(amount: f64, norm: Norm) -> PruneConfig {
    PruneConfig::new(amount).with_method(PruneMethod::Structured(norm))
}

fn linear<B: Backend>(d_in: usize, d_out: usize, device: &B::Device) -> Linear<B> {
    LinearConfig::new(d_in, d_out).init(device)
}

/// `round(amount · n)` weights of smallest magnitude are zero, no more, for several amounts
/// on an odd shape; the bias is left alone.
fn magnitude_counts_are_exact<B: Backend>(device: &B::Device) {
    let layer = linear::<B>(37, 23, device);
    for (amount, expected) in [(0.0, 0), (0.5, 426), (0.8, 681), (0.9, 766), (1.0, 851)] {
        let masked = PruneConfig::new(amount).prune(layer.clone()).unwrap();
        assert_eq!(zeros(masked.weight()), expected, "amount {amount}");
        assert_eq!(zeros(masked.bias().unwrap()), 0, "amount {amount}: bias");
        // Every kept weight is at least as large as every pruned one.
        let original = values(layer.weight.val());
        let mask = values(masked.weight_mask.val());
        let largest_pruned = (0..original.len())
            .filter(|&i| mask[i] == 0.0)
            .map(|i| original[i].abs())
            .fold(0.0, f32::max);
        let smallest_kept = (0..original.len())
            .filter(|&i| mask[i] == 1.0)
            .map(|i| original[i].abs())
            .fold(f32::INFINITY, f32::min);
        assert!(largest_pruned <= smallest_kept, "amount {amount}");
    }
}

/// Ties go to the lower index, so the mask of equal magnitudes is known in advance.
fn ties_are_deterministic<B: Backend>(device: &B::Device) {
    let weight = Tensor::<B, 2>::from_data([[1.0, -1.0, 1.0], [2.0, 0.5, -1.0]], device);
    let layer = Linear {
        weight: burn::module::Param::from_tensor(weight),
        bias: None,
    };
    let masked = PruneConfig::new(0.5).prune(layer).unwrap();
    assert_eq!(
        values(masked.weight_mask.val()),
        vec![0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    );
    // Rows of equal norm: the first ones go.
    let weight = Tensor::<B, 2>::from_data([[1.0, -1.0, 1.0, 3.0], [1.0, 1.0, -1.0, 0.0]], device);
    let layer = Linear {
        weight: burn::module::Param::from_tensor(weight),
        bias: None,
    };
    let masked = structured(0.5, Norm::L1).prune(layer.clone()).unwrap();
    assert_eq!(masked.kept_outputs().unwrap(), Some(vec![2, 3]));
    let masked = structured(0.25, Norm::Inf).prune(layer).unwrap();
    assert_eq!(masked.kept_outputs().unwrap(), Some(vec![1, 2, 3]));
}

/// Three Adam steps on a masked layer: the pruned weights stay exactly zero, every kept one
/// moves; `make_permanent` then gives a plain `Linear` computing the same.
fn mask_holds_through_adam<B: AutodiffBackend>(device: &B::Device) {
    let layer = linear::<B>(37, 23, device);
    let mut masked = PruneConfig::new(0.6).prune(layer).unwrap();
    let before = values(masked.weight());
    let mask = values(masked.weight_mask.val());
    let mut optim = AdamConfig::new().init();
    let x = Tensor::<B, 2>::random([16, 37], Distribution::Default, device);
    for _ in 0..3 {
        let loss = masked.forward(x.clone()).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &masked);
        masked = optim.step(1e-2, masked, grads);
    }
    let after = values(masked.weight());
    let mut changed = 0;
    for i in 0..mask.len() {
        if mask[i] == 0.0 {
            assert_eq!(after[i], 0.0, "pruned weight {i} came back");
        } else if after[i] != before[i] {
            changed += 1;
        }
    }
    let kept = mask.iter().filter(|&&m| m == 1.0).count();
    assert_eq!(kept, 851 - 511);
    assert_eq!(changed, kept, "every kept weight trains");
    // The masks are state, not trained: still the same.
    assert_eq!(values(masked.weight_mask.val()), mask);

    let x = x.inner();
    let valid = masked.valid();
    let expected = valid.forward(x.clone());
    let plain: Linear<B::InnerBackend> = valid.make_permanent();
    assert!(max_gap(plain.forward(x), expected) <= 1e-6);
    assert_eq!(zeros(plain.weight.val()), 511);
}

/// The masked pair (rows and bias of the first zeroed, a ReLU between) against the shrunk
/// one, on 37 → 23 → 11 with each norm.
fn linear_pair_shrinks<B: Backend>(device: &B::Device) {
    let first = linear::<B>(37, 23, device);
    let second = linear::<B>(23, 11, device);
    let x = Tensor::<B, 2>::random([5, 37], Distribution::Default, device);
    for norm in [Norm::L1, Norm::L2, Norm::Inf] {
        let masked = structured(0.5, norm).prune(first.clone()).unwrap();
        let keep = masked.kept_outputs().unwrap().unwrap();
        // round(11.5) = 12 of 23 rows removed.
        assert_eq!(keep.len(), 11, "{norm:?}");
        let expected = second.forward(relu(masked.forward(x.clone())));
        let (small_first, small_second) =
            shrink_pair(&masked.make_permanent(), &second, &keep).unwrap();
        assert_eq!(small_first.weight.dims(), [37, 11]);
        assert_eq!(small_first.bias.as_ref().unwrap().dims(), [11]);
        assert_eq!(small_second.weight.dims(), [11, 11]);
        assert_eq!(small_second.bias.as_ref().unwrap().dims(), [11]);
        let actual = small_second.forward(relu(small_first.forward(x.clone())));
        assert!(max_gap(actual, expected) <= 1e-5, "{norm:?}");
    }
}

fn conv<B: Backend>(channels: [usize; 2], kernel: usize, device: &B::Device) -> Conv2d<B> {
    Conv2dConfig::new(channels, [kernel, kernel])
        .with_padding(PaddingConfig2d::Same)
        .init(device)
}

/// Conv2d → Conv2d (groups = 1, odd kernels): magnitude counts, permanence, and the shrunk
/// pair against the masked one.
fn conv_pair_shrinks<B: Backend>(device: &B::Device) {
    let first = conv::<B>([3, 7], 3, device);
    let second = conv::<B>([7, 5], 5, device);
    let x = Tensor::<B, 4>::random([2, 3, 9, 11], Distribution::Default, device);

    let masked = PruneConfig::new(0.7).prune(first.clone()).unwrap();
    // round(0.7 · 7·3·3·3 = 132.3) = 132.
    assert_eq!(zeros(masked.weight()), 132);
    let expected = masked.forward(x.clone());
    let plain = masked.make_permanent();
    assert!(max_gap(plain.forward(x.clone()), expected) <= 1e-6);
    assert_eq!(zeros(plain.weight.val()), 132);

    let masked = structured(0.4, Norm::L2).prune(first).unwrap();
    let keep = masked.kept_outputs().unwrap().unwrap();
    assert_eq!(keep.len(), 4); // round(2.8) = 3 of 7 removed
    let expected = second.forward(relu(masked.forward(x.clone())));
    let (small_first, small_second) =
        shrink_pair(&masked.make_permanent(), &second, &keep).unwrap();
    assert_eq!(small_first.weight.dims(), [4, 3, 3, 3]);
    assert_eq!(small_second.weight.dims(), [5, 4, 5, 5]);
    let actual = small_second.forward(relu(small_first.forward(x)));
    assert_eq!(actual.dims(), [2, 5, 9, 11]);
    assert!(max_gap(actual, expected) <= 1e-5);
}

/// SkLinear: magnitude pruning masks only the trained factors, exactly; structured pruning
/// zeroes whole columns of the applied weight; the shrunk pairs (SkLinear → SkLinear and
/// SkLinear → Linear) compute what the masked ones did.
fn sklinear_prunes_and_shrinks<B: SketchBackend>(device: &B::Device) {
    let layer = SkLinearConfig::new(37, 23, 2, 4).init::<B>(device);
    let masked = PruneConfig::new(0.5).prune(layer.clone()).unwrap();
    // S1s: 2·37·4 = 296 → 148; S2s: 2·4·23 = 184 → 92.
    assert_eq!(zeros(masked.layer.s1s.val()), 148);
    assert_eq!(zeros(masked.layer.s2s.val()), 92);
    assert_eq!(masked.sparsity().zeros, 240);
    assert_eq!(values(masked.layer.u1s.val()), values(layer.u1s.val()));
    assert_eq!(values(masked.layer.u2s.val()), values(layer.u2s.val()));
    let x = Tensor::<B, 2>::random([5, 37], Distribution::Default, device);
    let expected = masked.forward(x.clone());
    let plain = masked.make_permanent();
    assert!(max_gap(plain.forward(x.clone()), expected) <= 1e-5);

    let masked = structured(0.5, Norm::L2).prune(layer).unwrap();
    let keep = masked.kept_outputs().unwrap().unwrap();
    assert_eq!(keep.len(), 11);
    let columns = masked.to_dense_weight().abs().sum_dim(0);
    let columns = values(columns);
    for (j, norm) in columns.iter().enumerate() {
        assert_eq!(*norm == 0.0, !keep.contains(&j), "column {j}");
    }
    let hidden = relu(masked.forward(x.clone()));
    let permanent = masked.make_permanent();

    let next = SkLinearConfig::new(23, 11, 1, 3).init::<B>(device);
    let (a, b) = shrink_pair(&permanent, &next, &keep).unwrap();
    assert_eq!(
        (a.d_input(), a.d_output(), b.d_input(), b.d_output()),
        (37, 11, 11, 11)
    );
    let actual = b.forward(relu(a.forward(x.clone())));
    assert!(max_gap(actual, next.forward(hidden.clone())) <= 1e-5);

    let dense_next = linear::<B>(23, 11, device);
    let (a, b) = shrink_pair(&permanent, &dense_next, &keep).unwrap();
    let actual = b.forward(relu(a.forward(x)));
    assert!(max_gap(actual, dense_next.forward(hidden)) <= 1e-5);
}

/// A model the feature was not designed around: Linear → BatchNorm → Dropout, trained in
/// training mode. The Linear's pruned weights stay zero.
fn linear_before_batchnorm_and_dropout<B: AutodiffBackend>(device: &B::Device) {
    let mut masked: MaskedLinear<B> = PruneConfig::new(0.5)
        .prune(linear::<B>(19, 13, device))
        .unwrap();
    let norm = BatchNormConfig::new(13).init::<B>(device);
    let dropout = DropoutConfig::new(0.3).init();
    let mask = values(masked.weight_mask.val());
    let mut optim = AdamConfig::new().init();
    let x = Tensor::<B, 2>::random([8, 19], Distribution::Default, device);
    for _ in 0..3 {
        let y = dropout.forward(norm.forward(masked.forward(x.clone())));
        let loss = (y - 1.0).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &masked);
        masked = optim.step(1e-2, masked, grads);
    }
    let after = values(masked.weight());
    assert_eq!(
        (0..mask.len())
            .filter(|&i| mask[i] == 0.0 && after[i] != 0.0)
            .count(),
        0
    );
    assert_eq!(zeros(masked.weight()), 124); // round(0.5 · 247 = 123.5)
}

/// A report of a half-pruned model adds up, and prints its totals.
fn report_counts<B: Backend>(device: &B::Device) {
    let first = linear::<B>(37, 23, device);
    let second = LinearConfig::new(23, 11).with_bias(false).init::<B>(device);
    let masked = PruneConfig::new(0.9).prune(second).unwrap();
    let report = SparsityReport::new()
        .with("first", &first)
        .with("second", &masked);
    assert_eq!(report.layers[0].params, 37 * 23 + 23);
    assert_eq!(report.layers[0].zeros, 0);
    assert_eq!(report.layers[1].params, 253);
    assert_eq!(report.layers[1].zeros, 228); // round(227.7)
    let total = report.total();
    assert_eq!((total.params, total.zeros), (874 + 253, 228));
    let text = report.to_string();
    assert!(text.contains("second") && text.contains("total"), "{text}");
    assert!(text.contains("90.12%"), "{text}");
}

macro_rules! prune_suite {
    ($name:ident, $backend:ty, $device:expr) => {
        mod $name {
            use super::*;
            type B = $backend;
            type AB = Autodiff<$backend>;

            #[test]
            fn magnitude_counts_are_exact() {
                super::magnitude_counts_are_exact::<B>(&$device);
            }
            #[test]
            fn ties_are_deterministic() {
                super::ties_are_deterministic::<B>(&$device);
            }
            #[test]
            fn mask_holds_through_adam() {
                super::mask_holds_through_adam::<AB>(&$device);
            }
            #[test]
            fn linear_pair_shrinks() {
                super::linear_pair_shrinks::<B>(&$device);
            }
            #[test]
            fn conv_pair_shrinks() {
                super::conv_pair_shrinks::<B>(&$device);
            }
            #[test]
            fn sklinear_prunes_and_shrinks() {
                super::sklinear_prunes_and_shrinks::<B>(&$device);
            }
            #[test]
            fn sklinear_masks_hold_under_autodiff() {
                super::sklinear_prunes_and_shrinks::<AB>(&$device);
            }
            #[test]
            fn linear_before_batchnorm_and_dropout() {
                super::linear_before_batchnorm_and_dropout::<AB>(&$device);
            }
            #[test]
            fn report_counts() {
                super::report_counts::<B>(&$device);
            }
        }
    };
}

prune_suite!(flex, Flex, Default::default());
prune_suite!(ndarray, NdArray, NdArrayDevice::Cpu);

/// A SkLinear pruned by magnitude and trained with Adam keeps its zeros in both factors.
#[test]
fn sklinear_mask_holds_through_adam() {
    type AB = Autodiff<Flex>;
    let device = Default::default();
    let layer = SkLinearConfig::new(21, 13, 2, 4).init::<AB>(&device);
    let mut masked = PruneConfig::new(0.7).prune(layer).unwrap();
    let mask1 = values(masked.s1s_mask.as_ref().unwrap().val());
    let before = values(masked.layer.s1s.val());
    let mut optim = AdamConfig::new().init();
    let x = Tensor::<AB, 2>::random([8, 21], Distribution::Default, &device);
    for _ in 0..3 {
        let loss = masked.forward(x.clone()).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &masked);
        masked = optim.step(1e-2, masked, grads);
    }
    let after = values(masked.layer.s1s.val());
    for i in 0..mask1.len() {
        if mask1[i] == 0.0 {
            assert_eq!(after[i], 0.0, "S1s entry {i}");
        } else {
            assert_ne!(after[i], before[i], "S1s entry {i} did not train");
        }
    }
    // round(0.7 · 168) = 118 and round(0.7 · 104) = 73.
    assert_eq!(masked.sparsity().zeros, 118 + 73);
}

#[test]
fn bad_amounts_are_typed_errors() {
    let device = Default::default();
    let layer = linear::<Flex>(4, 3, &device);
    for amount in [-0.1, 1.5, f64::NAN] {
        let err = PruneConfig::new(amount).prune(layer.clone()).unwrap_err();
        assert!(
            matches!(err, CompressError::InvalidFraction { name: "amount", .. }),
            "{amount}: {err}"
        );
    }
    for order in [0.0, 3.0, -1.0, f64::NAN] {
        let err = Norm::from_order(order).unwrap_err();
        assert!(matches!(err, CompressError::Unsupported { .. }), "{err}");
    }
    assert_eq!(Norm::from_order(f64::INFINITY).unwrap(), Norm::Inf);
    assert_eq!(Norm::from_order(1.0).unwrap(), Norm::L1);
}

#[test]
fn bad_shrinks_are_typed_errors() {
    let device = Default::default();
    let first = linear::<Flex>(6, 5, &device);
    let second = linear::<Flex>(4, 3, &device);
    let err = shrink_pair(&first, &second, &[0, 1]).unwrap_err();
    assert!(matches!(err, CompressError::InvalidShape { .. }), "{err}");
    let second = linear::<Flex>(5, 3, &device);
    for keep in [&[][..], &[0, 5][..], &[2, 1][..], &[1, 1][..]] {
        let err = shrink_pair(&first, &second, keep).unwrap_err();
        assert!(
            matches!(err, CompressError::InvalidShape { .. }),
            "{keep:?}: {err}"
        );
    }
    // All rows pruned: nothing left to shrink to.
    let masked = structured(1.0, Norm::L2).prune(first).unwrap();
    let keep = masked.kept_outputs().unwrap().unwrap();
    assert!(keep.is_empty());
    assert!(shrink_pair(&masked.make_permanent(), &second, &keep).is_err());
    // Grouped convolutions cannot drop channels.
    let grouped = Conv2dConfig::new([4, 4], [3, 3])
        .with_groups(2)
        .init::<Flex>(&device);
    let err = grouped.keep_outputs(&[0, 1]).unwrap_err();
    assert!(matches!(err, CompressError::Unsupported { .. }), "{err}");
    // A mask of the wrong shape.
    let layer = linear::<Flex>(6, 5, &device);
    let err = MaskedLinear::new(layer, Tensor::ones([5, 6], &device), None).unwrap_err();
    assert!(matches!(err, CompressError::ShapeMismatch { .. }), "{err}");
}

/// The masks are recorded: a masked layer saved and loaded into a fresh masked layer of the
/// same shape computes the same.
#[test]
fn masks_round_trip_through_records() {
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    let device = NdArrayDevice::Cpu;
    let masked = PruneConfig::new(0.5)
        .prune(linear::<NdArray>(9, 7, &device))
        .unwrap();
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::new();
    let bytes = recorder.record(masked.clone().into_record(), ()).unwrap();
    let fresh = PruneConfig::new(0.0)
        .prune(linear::<NdArray>(9, 7, &device))
        .unwrap();
    let loaded = fresh.load_record(recorder.load(bytes, &device).unwrap());
    assert_eq!(
        values(loaded.weight_mask.val()),
        values(masked.weight_mask.val())
    );
    let x = Tensor::<NdArray, 2>::random([3, 9], Distribution::Default, &device);
    assert_eq!(
        loaded.forward(x.clone()).into_data(),
        masked.forward(x).into_data()
    );
}
