//! `int8` layers ([`Int8Linear`]) against the `f32` layers they come from, saved and loaded,
//! converted inside a model with BatchNorm and Dropout, used from several threads, with their
//! fused activations, and with the kernels' portable paths forced on.

use burn::backend::Flex;
use burn::module::Module;
use burn::nn::LinearConfig;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor, TensorData};
use burn_compress::{
    AnyLinearConfig, CompressError, Converter, Int8Linear, LinearKind, Selection, stored_bytes,
};
use burn_cpu_kernels::Isa;
use burn_memory::draw_params;
use burn_sketch::{Activation, ActivationExt, SkLinear, SkLinearConfig};

use crate::close as common;
use crate::close::{relative_gap, values};

type B = Flex;

#[test]
fn int8_layers_follow_their_f32_layers_on_odd_shapes() {
    let _serial = common::serial();
    let device = Default::default();
    B::seed(&device, 21);
    // (rows, d_in, d_out, T, k): sizes off every tile, batch 1, k = 1.
    for (rows, d_in, d_out, terms, k) in [
        (1, 33, 17, 1, 1),
        (7, 100, 65, 2, 3),
        (64, 257, 31, 1, 16),
        (130, 64, 129, 3, 5),
    ] {
        let x = Tensor::<B, 2>::random([rows, d_in], Distribution::Default, &device);
        let dense = LinearConfig::new(d_in, d_out).init::<B>(&device);
        let q = Int8Linear::from_linear(&dense);
        assert_eq!((q.d_input(), q.d_output(), q.sketch()), (d_in, d_out, None));
        let gap = relative_gap(q.forward(x.clone()), dense.forward(x.clone()));
        assert!(gap < 0.02, "dense {rows}×{d_in}→{d_out}: {gap}");
        assert!(
            gap > 0.0,
            "dense {rows}×{d_in}→{d_out}: exact, so not quantized?"
        );

        let sketched = SkLinearConfig::new(d_in, d_out, terms, k).init::<B>(&device);
        let q = Int8Linear::from_sketched(&sketched);
        assert_eq!(q.sketch(), Some((terms, k)));
        let gap = relative_gap(q.forward(x.clone()), sketched.forward(x.clone()));
        assert!(
            gap < 0.03,
            "sketched {rows}×{d_in}→{d_out} T={terms} k={k}: {gap}"
        );
        // The dense weight the quantized layer stands for is the sketched one's, nearly.
        let gap = relative_gap(q.to_dense_weight(), sketched.to_dense_weight());
        assert!(gap < 0.03, "sketched weight: {gap}");
    }
}

#[test]
fn int8_layers_take_any_leading_dimensions() {
    let device = Default::default();
    let dense = LinearConfig::new(24, 8).init::<B>(&device);
    let q = Int8Linear::from_linear(&dense);
    let x = Tensor::<B, 3>::random([2, 5, 24], Distribution::Default, &device);
    let y = q.forward(x.clone());
    assert_eq!(y.dims(), [2, 5, 8]);
    let flat = q.forward(x.reshape([10, 24])).reshape([2, 5, 8]);
    assert_eq!(values(y), values(flat));
}

#[test]
fn a_quantized_layer_saves_and_loads_bit_exact() {
    let _serial = common::serial();
    let device = Default::default();
    B::seed(&device, 5);
    let sketched = SkLinearConfig::new(300, 70, 2, 8).init::<B>(&device);
    let q = Int8Linear::from_sketched(&sketched);
    let x = Tensor::<B, 2>::random([9, 300], Distribution::Default, &device);
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(q.clone().into_record(), ()).unwrap();
    // int8 weights take one byte each in the file (plus the f32 scales and bias).
    assert!(
        bytes.len() < q.stored_bytes() + 4096,
        "{} bytes saved for {} stored",
        bytes.len(),
        q.stored_bytes()
    );
    // Another layer of the same shape, other values, loaded from the record.
    let other = Int8Linear::from_sketched(&SkLinearConfig::new(300, 70, 2, 8).init::<B>(&device));
    assert_ne!(
        values(other.forward(x.clone())),
        values(q.forward(x.clone()))
    );
    let loaded = other.load_record(recorder.load(bytes, &device).unwrap());
    assert_eq!(values(loaded.forward(x.clone())), values(q.forward(x)));
}

mod net {
    use burn::module::Module;
    use burn::nn::{BatchNorm, BatchNormConfig, Dropout, DropoutConfig};
    use burn::tensor::Tensor;
    use burn::tensor::activation::relu;
    use burn::tensor::backend::Backend;
    use burn_compress::{AnyLinear, AnyLinearConfig, LinearKind};
    use burn_sketch::SketchBackend;

    /// A model the int8 conversion was not written for: BatchNorm (whose training forward
    /// differs from its inference one), Dropout, and a layer left in f32.
    #[derive(Module, Debug)]
    pub struct Net<B: Backend> {
        pub first: AnyLinear<B>,
        pub norm: BatchNorm<B>,
        pub dropout: Dropout,
        pub second: AnyLinear<B>,
        pub head: AnyLinear<B>,
    }

    impl<B: SketchBackend> Net<B> {
        pub fn new(device: &B::Device) -> Self {
            let sketched = LinearKind::Sketched {
                num_terms: 1,
                low_rank: 8,
            };
            Self {
                first: AnyLinearConfig::new(40, 64).init(device),
                norm: BatchNormConfig::new(64).init(device),
                dropout: DropoutConfig::new(0.3).init(),
                second: AnyLinearConfig::new(64, 64)
                    .with_kind(sketched)
                    .init(device),
                head: AnyLinearConfig::new(64, 10).init(device),
            }
        }

        pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
            let x = self.first.forward(x);
            let x = self
                .norm
                .forward(x.unsqueeze_dim::<3>(2))
                .squeeze_dim::<2>(2);
            let x = self.dropout.forward(relu(x));
            self.head.forward(relu(self.second.forward(x)))
        }
    }
}
use net::Net;

#[test]
fn the_converter_quantizes_picked_layers_and_reports_bytes() {
    let _serial = common::serial();
    let device = Default::default();
    B::seed(&device, 9);
    let net = Net::<B>::new(&device);
    draw_params::<B, _>(&net);
    let x = Tensor::<B, 2>::random([16, 40], Distribution::Default, &device);
    let before = net.forward(x.clone());
    let (head, norm) = (
        values(net.head.to_dense_weight()),
        values(net.norm.gamma.val()),
    );
    let (quantized, report) = Converter::new()
        .rule(Selection::paths(["first", "second"]), LinearKind::Int8)
        .apply(net)
        .unwrap();
    assert_eq!(report.layers.len(), 2);
    assert_eq!(
        report.layers[1].from,
        LinearKind::Sketched {
            num_terms: 1,
            low_rank: 8
        }
    );
    assert!(
        report
            .layers
            .iter()
            .all(|l| l.to == LinearKind::Int8 && l.trainable_after == 0)
    );
    let (bytes_before, bytes_after) = report.bytes();
    // The dense layer shrinks about 4×; the sketched one less (its fixed signs were f32).
    assert_eq!(report.layers[0].bytes_before, 4 * (40 * 64 + 64));
    assert_eq!(report.layers[0].bytes_after, 40 * 64 + 4 + 4 * 64 + 4 * 64);
    assert!(
        bytes_after * 3 < bytes_before,
        "{bytes_before} → {bytes_after}"
    );
    assert!(report.to_string().contains("bytes"));
    // Untouched layers are bit-exact, BatchNorm included.
    assert_eq!(values(quantized.head.to_dense_weight()), head);
    assert_eq!(values(quantized.norm.gamma.val()), norm);
    assert_eq!(quantized.first.kind(), LinearKind::Int8);
    assert!(stored_bytes::<B, _>(&quantized) < stored_bytes::<B, _>(&Net::<B>::new(&device)));
    // Same outputs within int8's error: Flex is not an autodiff backend, so BatchNorm normalises
    // with the running statistics and Dropout passes through, in both models.
    let gap = relative_gap(quantized.forward(x), before);
    assert!(gap < 0.05, "{gap}");
}

#[test]
fn int8_is_made_by_conversion_not_initialised() {
    let err = AnyLinearConfig::new(4, 4)
        .with_kind(LinearKind::Int8)
        .try_init::<B>(&Default::default())
        .unwrap_err();
    assert!(matches!(err, CompressError::Unsupported { .. }), "{err}");
    // And an int8 layer does not convert further.
    let layer = AnyLinearConfig::new(4, 4).init::<B>(&Default::default());
    let q = layer.try_convert(LinearKind::Int8).unwrap();
    assert!(q.try_convert(LinearKind::Dense).is_err());
}

#[test]
fn one_int8_layer_serves_several_threads() {
    let device = Default::default();
    let layer: SkLinear<B> = SkLinearConfig::new(96, 48, 2, 4).init(&device);
    let q = Int8Linear::from_sketched(&layer);
    let inputs: Vec<Tensor<B, 2>> = (0..4)
        .map(|i| Tensor::random([5 + i, 96], Distribution::Default, &device))
        .collect();
    let alone: Vec<Vec<f32>> = inputs
        .iter()
        .map(|x| values(q.forward(x.clone())))
        .collect();
    // A clone shares the packing; a fresh load would pack again. All give the same values.
    std::thread::scope(|scope| {
        let handles: Vec<_> = inputs
            .iter()
            .map(|x| {
                let (q, x) = (q.clone(), x.clone());
                scope.spawn(move || {
                    (0..20)
                        .map(|_| values(q.forward(x.clone())))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (handle, want) in handles.into_iter().zip(&alone) {
            for got in handle.join().unwrap() {
                assert_eq!(&got, want);
            }
        }
    });
}

/// The `int8` layers' fused activations, dense and sketched, against Burn's own after the
/// layer, on a shape of several output tiles per thread.
#[test]
fn int8_fused_activations_match_burns_own() {
    let _serial = common::serial();
    let device = Default::default();
    B::seed(&device, 23);
    let sketched = SkLinearConfig::new(40, 1100, 2, 8).init::<B>(&device);
    let x = Tensor::<B, 2>::random([600, 40], Distribution::Default, &device);
    let dense = LinearConfig::new(40, 70).init::<B>(&device);
    let int8 = [
        Int8Linear::from_linear(&dense),
        Int8Linear::from_sketched(&sketched),
    ];
    for activation in [Activation::Relu, Activation::Gelu] {
        for layer in &int8 {
            let fused = layer.forward_activated(x.clone(), activation);
            let gap = relative_gap(fused, activation.apply(layer.forward(x.clone())));
            assert!(
                gap <= 1e-6,
                "int8 {:?} {activation:?}: {gap}",
                layer.sketch()
            );
        }
    }
}

/// The `int8` layer on the portable product ([`Isa::PORTABLE`], in this process) stays within
/// its tolerance of its `f32` layer, as on the detected path, dense and sketched, plain and
/// with a fused activation; the two paths agree with each other within the same tolerance.
#[test]
fn the_portable_int8_layer_follows_its_f32_layer() {
    let _serial = common::serial();
    let (m, k, n) = (19, 37, 23);
    let xs: Vec<f32> = (0..m * k).map(|i| ((i * 31) % 17) as f32 - 8.0).collect();
    let device = Default::default();
    B::seed(&device, 23);
    let dense = LinearConfig::new(k, n).init::<B>(&device);
    let sketched = SkLinearConfig::new(k, n, 2, 3).init::<B>(&device);
    let x = Tensor::<B, 2>::from_data(TensorData::new(xs, [m, k]), &device);
    let cases = [
        (
            "dense",
            0.02,
            Int8Linear::from_linear(&dense),
            dense.forward(x.clone()),
        ),
        (
            "sketched",
            0.03,
            Int8Linear::from_sketched(&sketched),
            sketched.forward(x.clone()),
        ),
    ];
    for (what, tolerance, layer, want) in cases {
        for isa in [Isa::PORTABLE, Isa::detected()] {
            let gap = relative_gap(layer.forward_on(isa, x.clone()), want.clone());
            assert!(gap < tolerance, "{what} {isa:?}: {gap}");
            let fused = layer.forward_activated_on(isa, x.clone(), Activation::Gelu);
            let gap = relative_gap(
                fused,
                Activation::Gelu.apply(layer.forward_on(isa, x.clone())),
            );
            assert!(gap <= 1e-6, "{what} {isa:?} GELU: {gap}");
        }
        let gap = relative_gap(
            layer.forward_on(Isa::PORTABLE, x.clone()),
            layer.forward_on(Isa::detected(), x.clone()),
        );
        assert!(gap < tolerance, "{what}: portable against detected: {gap}");
    }
}
