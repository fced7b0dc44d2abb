//! `FastFlex`: Flex with `bf16`/`f16` operations on the CPU's vector units. Its `f32` path is
//! Flex's (burn-sketch runs its `SkLinear` suite on it); its half-precision operations must give what Flex's
//! `f32` operation gives on the same values, rounded once, and its products what an `f32`
//! accumulation of the `bf16` values gives.

use burn::backend::flex::FlexDevice;
use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module, ModuleMapper, Param};
use burn::nn::{BatchNormConfig, Dropout, DropoutConfig, LinearConfig};
use burn::tensor::activation::{relu, sigmoid, softmax};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Distribution, Int, Tensor, TensorData};
use burn_fast_cpu::FastFlex;
use burn_memory::draw_params;
use half::{bf16, f16};

type AB = Autodiff<FastFlex>;
const DEVICE: FlexDevice = FlexDevice;

#[path = "../../testing/close.rs"]
mod close;
#[path = "fast_flex/ops.rs"]
mod ops;

/// Casts every float parameter to a dtype, as a new leaf (so that its gradient is kept).
/// Parameters are initialised lazily, at first use: cast them only after
/// [`draw_params`], or each cast draws new values.
struct Cast(DType);

impl<B: AutodiffBackend> ModuleMapper<B> for Cast {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let dtype = self.0;
        param.map(|tensor| {
            let tracked = tensor.is_require_grad();
            let cast = Tensor::from_inner(tensor.inner().cast(dtype));
            if tracked { cast.require_grad() } else { cast }
        })
    }
}

/// Values spread over several binades, negative and positive, with some zeros: a pseudo-random
/// sequence so that failures reproduce.
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if i % 17 == 0 {
                return 0.0;
            }
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            (unit * 2.0 - 1.0) * 2f32.powi((state % 7) as i32 - 3)
        })
        .collect()
}

/// The same values as a `dtype` tensor on `FastFlex` and as an `f32` tensor on Flex (the
/// `f32` holding the rounded values exactly).
fn pair<const D: usize>(
    shape: [usize; D],
    seed: u64,
    dtype: DType,
) -> (Tensor<FastFlex, D>, Tensor<Flex, D>) {
    let len = shape.iter().product();
    // Rounded to `dtype` first, so that the f32 copy holds exactly the half values.
    let exact = TensorData::new(values(len, seed), shape)
        .convert_dtype(dtype)
        .convert::<f32>();
    let half = Tensor::<FastFlex, D>::from_data(exact.clone(), &DEVICE).cast(dtype);
    assert_eq!(half.dtype(), dtype);
    (half, Tensor::from_data(exact, &DEVICE))
}

/// The `f32` tensor on Flex holding a half tensor's values exactly.
fn twin<const D: usize>(half: &Tensor<FastFlex, D>) -> Tensor<Flex, D> {
    Tensor::from_data(half.clone().cast(DType::F32).into_data(), &DEVICE)
}

/// `got` (a `dtype` tensor) is `want` (Flex's `f32` result) rounded to `dtype`, bit for bit.
fn assert_rounded<const D: usize>(what: &str, got: Tensor<FastFlex, D>, want: Tensor<Flex, D>) {
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let dtype = got.dtype();
    let got = got.into_data();
    let want = want.into_data().convert_dtype(dtype);
    assert_eq!(got.dtype, dtype, "{what}: dtype");
    let (got_bits, want_bits): (Vec<u16>, Vec<u16>) = match dtype {
        DType::BF16 => (
            got.iter::<bf16>().map(bf16::to_bits).collect(),
            want.iter::<bf16>().map(bf16::to_bits).collect(),
        ),
        DType::F16 => (
            got.to_vec::<f16>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect(),
            want.to_vec::<f16>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect(),
        ),
        other => panic!("{what}: {other:?} is not a half type"),
    };
    let differ = got_bits
        .iter()
        .zip(&want_bits)
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(
        differ,
        0,
        "{what}: {differ} of {} values differ",
        got_bits.len()
    );
}

/// Element-wise arithmetic, reductions and activations on contiguous, transposed, broadcast
/// and sliced operands, odd sizes: Flex's `f32` result rounded once.
#[test]
fn half_operations_are_f32_rounded_once() {
    for dtype in [DType::BF16, DType::F16] {
        let (a, a32) = pair([37, 129], 1, dtype);
        let (b, b32) = pair([37, 129], 2, dtype);
        let (row, row32) = pair([1, 129], 3, dtype);
        let (t, t32) = pair([129, 37], 4, dtype);
        let t = t.swap_dims(0, 1);
        let t32 = t32.swap_dims(0, 1);
        // Each case is one operation on half values: a chain would round in between.
        let positive = b.clone().abs() + 0.5;
        let cases: Vec<(&str, Tensor<FastFlex, 2>, Tensor<Flex, 2>)> = vec![
            ("add", a.clone() + b.clone(), a32.clone() + b32.clone()),
            (
                "sub broadcast row",
                a.clone() - row.clone(),
                a32.clone() - row32.clone(),
            ),
            (
                "mul transposed",
                a.clone() * t.clone(),
                a32.clone() * t32.clone(),
            ),
            (
                "div",
                a.clone() / positive.clone(),
                a32.clone() / twin(&positive),
            ),
            ("mul_scalar", a.clone() * 0.3, a32.clone() * 0.3),
            ("log", positive.clone().log(), twin(&positive).log()),
            ("sqrt", a.clone().abs().sqrt(), a32.clone().abs().sqrt()),
            (
                "powf_scalar",
                a.clone().abs().powf_scalar(1.5),
                a32.clone().abs().powf_scalar(1.5),
            ),
            ("sum_dim", a.clone().sum_dim(1), a32.clone().sum_dim(1)),
            ("mean_dim", a.clone().mean_dim(0), a32.clone().mean_dim(0)),
            ("max_dim", t.clone().max_dim(1), t32.clone().max_dim(1)),
            ("relu", relu(a.clone()), relu(a32.clone())),
            ("sigmoid", sigmoid(a.clone()), sigmoid(a32.clone())),
            (
                "sliced",
                a.clone().slice([3..20, 5..100]) * 2.0,
                a32.clone().slice([3..20, 5..100]) * 2.0,
            ),
            (
                "clamp",
                a.clone().clamp(-0.1, 0.2),
                a32.clone().clamp(-0.1, 0.2),
            ),
            (
                "cast round trip",
                a.clone().cast(DType::F32).cast(dtype),
                a32.clone(),
            ),
        ];
        for (what, got, want) in cases {
            assert_rounded(&format!("{dtype:?} {what}"), got, want);
        }
        let (got, want) = (a.clone().sum(), a32.clone().sum());
        assert_rounded(&format!("{dtype:?} sum"), got, want);
        // Non-float outputs: the same comparisons and indices.
        let got = a.clone().greater(b.clone()).into_data();
        assert_eq!(
            got,
            a32.clone().greater(b32.clone()).into_data(),
            "{dtype:?} greater"
        );
        let got: Tensor<FastFlex, 2, Int> = t.clone().argmax(1);
        assert_eq!(
            got.into_data(),
            t32.clone().argmax(1).into_data(),
            "{dtype:?} argmax"
        );
    }
}

/// `f32 → bf16 → f32` casts agree with `half`'s conversions on special values and a
/// pseudo-random sweep of bit patterns (NaNs, infinities, subnormals, ties).
#[test]
fn casts_round_as_half_does() {
    let mut bits: Vec<u32> = vec![
        0,
        0x8000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x7f80_0001,
        0xffff_ffff,
        0x0000_0001,
        0x0001_8000, // a tie, odd
        0x0000_8000, // a tie, even
        0x7f7f_ffff, // rounds to infinity
        0x3f80_8000,
        0x3f81_8000,
    ];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    bits.extend((0..200_003).map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u32
    }));
    let floats: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    let len = floats.len();
    let x = Tensor::<FastFlex, 1>::from_data(TensorData::new(floats.clone(), [len]), &DEVICE);
    let got = x.cast(DType::BF16).into_data();
    for (i, (value, got)) in floats.iter().zip(got.iter::<bf16>()).enumerate() {
        let want = bf16::from_f32(*value);
        let same = want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan());
        assert!(
            same,
            "value {i} ({:#010x}): {:#06x} against half's {:#06x}",
            bits[i],
            got.to_bits(),
            want.to_bits()
        );
    }
    // Widening is exact: the rounded values come back bit for bit.
    let rounded: Vec<f32> = floats.iter().map(|v| bf16::from_f32(*v).to_f32()).collect();
    let halves = Tensor::<FastFlex, 1>::from_data(TensorData::new(rounded, [len]), &DEVICE)
        .cast(DType::BF16);
    assert_eq!(halves.dtype(), DType::BF16);
    let back = halves.cast(DType::F32).into_data();
    for (value, got) in floats.iter().zip(back.iter::<f32>()) {
        let want = bf16::from_f32(*value).to_f32();
        assert!(want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()));
    }
}

/// `bf16` products, batched and broadcast, transposed and sliced operands, odd sizes, `k = 1`
/// and batch 1: within `f32` accumulation of the exact `bf16` values (so within one `bf16`
/// rounding of the `f64` product), and close to Flex's own.
#[test]
fn bf16_products_match_f64() {
    let cases: [([usize; 4], [usize; 4], bool); 6] = [
        ([1, 1, 1, 1], [1, 1, 1, 1], false),
        ([1, 1, 7, 3], [1, 1, 3, 5], false),
        ([2, 1, 13, 33], [1, 3, 33, 17], false),
        ([1, 2, 64, 1], [1, 2, 1, 40], false),
        ([1, 1, 37, 130], [1, 1, 65, 130], true), // rhs read transposed
        ([3, 4, 9, 16], [3, 4, 31, 16], true),
    ];
    for (seed, (lhs_shape, rhs_shape, transposed)) in cases.into_iter().enumerate() {
        let (lhs, lhs32) = pair(lhs_shape, 10 + seed as u64, DType::BF16);
        let (rhs, rhs32) = pair(rhs_shape, 20 + seed as u64, DType::BF16);
        let (rhs, rhs32) = if transposed {
            (rhs.swap_dims(2, 3), rhs32.swap_dims(2, 3))
        } else {
            (rhs, rhs32)
        };
        let got = lhs.clone().matmul(rhs.clone());
        assert_eq!(got.dtype(), DType::BF16);
        let want = lhs32
            .cast(DType::F64)
            .matmul(rhs32.cast(DType::F64))
            .into_data();
        assert_eq!(got.dims(), want.shape.as_slice(), "case {seed}: shape");
        let got = got.into_data().convert::<f64>();
        for (g, w) in got.iter::<f64>().zip(want.iter::<f64>()) {
            // One bf16 rounding of the output (2⁻⁸ relative) plus f32 sums.
            assert!(
                (g - w).abs() <= w.abs() * 2f64.powi(-8) + 1e-5,
                "case {seed}: {g} against {w}"
            );
        }
    }
}

/// A user's Burn `nn::Linear` in `bf16` under autodiff: forward and both gradients within
/// `bf16` precision of the `f32` ones (it takes the kernel, not Flex's `f64` copies).
#[test]
fn burn_linear_in_bf16_trains_like_f32() {
    let _serial = crate::close::serial();
    let device = DEVICE;
    <AB as Backend>::seed(&device, 7);
    let layer = LinearConfig::new(96, 40).init::<AB>(&device);
    draw_params(&layer);
    let x = Tensor::<AB, 2>::random([33, 96], Distribution::Default, &device);
    let run = |dtype: DType| {
        let layer = layer.clone().map(&mut Cast(dtype));
        let x = Tensor::<AB, 2>::from_inner(x.clone().inner().cast(dtype)).require_grad();
        let y = layer.forward(x.clone());
        assert_eq!(y.dtype(), dtype);
        let grads = (y.clone() * y.clone()).sum().backward();
        let gx = x.grad(&grads).unwrap().cast(DType::F32);
        let gw = layer.weight.grad(&grads).unwrap().cast(DType::F32);
        (y.cast(DType::F32).inner(), gx, gw)
    };
    let (y16, gx16, gw16) = run(DType::BF16);
    let (y32, gx32, gw32) = run(DType::F32);
    for (what, got, want) in [("y", y16, y32), ("∂x", gx16, gx32), ("∂w", gw16, gw32)] {
        let scale = want.clone().abs().max().into_scalar();
        let gap = (got - want).abs().max().into_scalar();
        assert!(
            gap <= 8.0 * 2f32.powi(-7) * scale,
            "{what}: {gap} of {scale}"
        );
        assert!(gap > 0.0, "{what}: exact, so it ran in f32");
    }
}

/// A model the feature was not written for, in `f32` and `bf16`: Linear, BatchNorm (training forward
/// differs from inference) and Dropout (random masks, drawn from the same seeded generator):
/// `FastFlex` and Flex agree in training and inference.
#[test]
fn batchnorm_and_dropout_agree_with_flex() {
    let _serial = crate::close::serial();
    for dtype in [DType::F32, DType::BF16] {
        batchnorm_and_dropout_in(dtype);
    }
}

fn batchnorm_and_dropout_in(dtype: DType) {
    #[derive(Module, Debug)]
    struct Net<B: Backend> {
        fc: burn::nn::Linear<B>,
        norm: burn::nn::BatchNorm<B>,
        drop: Dropout,
    }
    impl<B: Backend> Net<B> {
        fn init(device: &B::Device) -> Self {
            Self {
                fc: LinearConfig::new(24, 16).init(device),
                norm: BatchNormConfig::new(16).init(device),
                drop: DropoutConfig::new(0.3).init(),
            }
        }
        fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
            let y = self.fc.forward(x).unsqueeze_dim::<3>(2);
            self.drop.forward(self.norm.forward(y).squeeze_dim(2))
        }
    }
    let outputs = |ours: bool| -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        macro_rules! run {
            ($b:ty) => {{
                <$b as Backend>::seed(&DEVICE, 11);
                let net = Net::<$b>::init(&DEVICE);
                draw_params(&net);
                let net = net.map(&mut Cast(dtype));
                let x =
                    Tensor::<$b, 2>::random([19, 24], Distribution::Default, &DEVICE).cast(dtype);
                let train = net.forward(x.clone());
                let y = net.forward(x.clone()); // updates the running statistics again
                let valid = net.valid().forward(x.clone().inner());
                for t in [train.inner(), y.inner(), valid] {
                    out.push(t.cast(DType::F32).into_data().to_vec::<f32>().unwrap());
                }
            }};
        }
        if ours {
            run!(Autodiff<FastFlex>)
        } else {
            run!(Autodiff<Flex>)
        }
        out
    };
    let (ours, flex) = (outputs(true), outputs(false));
    for (step, (got, want)) in ours.iter().zip(&flex).enumerate() {
        let zeros = |v: &[f32]| v.iter().filter(|x| **x == 0.0).count();
        assert_eq!(
            zeros(got),
            zeros(want),
            "{dtype:?} step {step}: the dropout masks"
        );
        let scale = want.iter().fold(0f32, |s, v| s.max(v.abs()));
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 4.0 * 2f32.powi(-7) * scale,
                "{dtype:?} step {step}: {g} against {w}"
            );
        }
    }
}

/// Several threads run `linear`, GELU, softmax and the products at once, in `bf16` and
/// `f32`: each gets what it gets alone.
#[test]
fn threads_at_once() {
    for dtype in [DType::BF16, DType::F32] {
        let (a, _) = pair([64, 48], 5, dtype);
        let (b, _) = pair([48, 80], 6, dtype);
        let (x, _) = pair([3, 20, 48], 7, dtype);
        let run = || {
            let y = burn::tensor::activation::gelu(burn::tensor::module::linear(
                x.clone(),
                b.clone(),
                None,
            ));
            (
                softmax(a.clone().matmul(b.clone()), 1).into_data(),
                softmax(y, 2).into_data(),
            )
        };
        let alone = run();
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4).map(|_| scope.spawn(run)).collect();
            for handle in handles {
                assert_eq!(handle.join().unwrap(), alone, "{dtype:?}");
            }
        });
    }
}

/// `bf16` values against Flex's `f32` result rounded to `bf16`, bit for bit.
fn assert_bf16_rounded<const D: usize>(what: &str, got: &[bf16], want: Tensor<Flex, D>) {
    let want = want.into_data().convert_dtype(DType::BF16);
    let want: Vec<u16> = want.iter::<bf16>().map(bf16::to_bits).collect();
    let got: Vec<u16> = got.iter().map(|v| v.to_bits()).collect();
    assert_eq!(got.len(), want.len(), "{what}: length");
    let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 0, "{what}: {differ} of {} values differ", got.len());
}

/// What `FastFlex` computes, on the kernels' portable paths, in this process (their `_on`
/// forms on `Isa::PORTABLE`; `FastFlex` itself runs this CPU's): the `f32` functions and
/// rows against Flex's, `FastFlex`'s `f32` `linear` (whose 21 rows take the `gemm` path on
/// every CPU) against Flex's, the `bf16` element-wise path (widened, computed and rounded
/// through `f32` on the portable conversions) against Flex's `f32` result rounded once, and
/// `FastFlex`'s casts against the portable conversions, bit for bit.
#[test]
fn the_portable_paths_match_the_references() {
    use burn::tensor::activation::gelu;
    use burn_cpu_kernels::{Isa, convert, math};
    let shape = [3, 7, 40];
    let data = TensorData::new(values(3 * 7 * 40, 60), shape);
    let x = Tensor::<FastFlex, 3>::from_data(data.clone(), &DEVICE) * 4.0;
    let x32 = Tensor::<Flex, 3>::from_data(data, &DEVICE) * 4.0;
    let w = TensorData::new(values(40 * 9, 61), [40, 9]);
    let linear = burn::tensor::module::linear(x, Tensor::from_data(w.clone(), &DEVICE), None);
    let linear32 = burn::tensor::module::linear(x32.clone(), Tensor::from_data(w, &DEVICE), None);
    crate::close::assert_close_within(linear.into_data(), linear32.into_data(), 1e-5, "linear");
    let x_values: Vec<f32> = x32.clone().into_data().to_vec().unwrap();
    let portable = |f: &dyn Fn(&mut [f32])| {
        let mut v = x_values.clone();
        f(&mut v);
        TensorData::new(v, shape)
    };
    let map = |func| move |v: &mut [f32]| math::map_in_place_on(Isa::PORTABLE, func, v);
    let cases: [(&str, TensorData, Tensor<Flex, 3>); 3] = [
        ("gelu", portable(&map(math::Func::Gelu)), gelu(x32.clone())),
        ("exp", portable(&map(math::Func::Exp)), x32.clone().exp()),
        (
            "softmax",
            portable(&|v| {
                burn_cpu_kernels::softmax::forward_rows_on(Isa::PORTABLE, false, None, v, 40, None)
            }),
            softmax(x32.clone(), 2),
        ),
    ];
    for (what, got, want) in cases {
        crate::close::assert_close_within(got, want.into_data(), 1e-5, what);
    }

    let (a, a32) = pair([19, 37], 30, DType::BF16);
    let halves: Vec<bf16> = a.clone().into_data().to_vec().unwrap();
    let through = |f: &dyn Fn(&mut [f32])| {
        let mut v = halves.clone();
        convert::through_f32_on(Isa::PORTABLE, &mut v, f);
        v
    };
    let sum = through(&|v| v.iter_mut().for_each(|v| *v += *v));
    assert_bf16_rounded("portable add", &sum, a32.clone() + a32.clone());
    let exp = through(&map(math::Func::Exp));
    assert_bf16_rounded("portable exp", &exp, a32.clone().exp());

    // FastFlex's casts are the portable conversions' bits.
    let wide: Vec<f32> = a.clone().cast(DType::F32).into_data().to_vec().unwrap();
    let mut want = vec![0.0f32; halves.len()];
    convert::bf16_to_f32_on(Isa::PORTABLE, &halves, &mut want);
    assert!(
        wide.iter()
            .zip(&want)
            .all(|(g, w)| g.to_bits() == w.to_bits())
    );
    let scaled = (a.cast(DType::F32) * 1.375).cast(DType::BF16);
    let got: Vec<bf16> = scaled.into_data().to_vec().unwrap();
    let unrounded: Vec<f32> = wide.iter().map(|v| v * 1.375).collect();
    let mut want = vec![bf16::ZERO; unrounded.len()];
    convert::f32_to_bf16_on(Isa::PORTABLE, &unrounded, &mut want);
    assert!(
        got.iter()
            .zip(&want)
            .all(|(g, w)| g.to_bits() == w.to_bits())
    );
}
