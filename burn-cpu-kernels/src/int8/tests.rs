use super::*;
use crate::testing::uniform;

/// `[−0.3·spread, 0.7·spread)`: values mostly positive but not all, so that each row's zero
/// point is neither 0 nor 255.
fn skewed(spread: f32) -> [f32; 2] {
    [-0.3 * spread, 0.7 * spread]
}

/// The kernel's outputs against [`reference`]'s integer sums with the same epilogue (ReLU
/// without a bias, GELU with one).
fn case(m: usize, k: usize, n: usize, with_bias: bool) {
    let (xv, wv) = (
        uniform(m * k, (m + 7 * k) as u64, skewed(4.0)),
        uniform(k * n, (n + k) as u64, skewed(0.2)),
    );
    let bias = uniform(n, 99, skewed(1.0));
    // Each activation of the store, the identity in the other tests.
    let activation = if with_bias {
        Activation::Gelu
    } else {
        Activation::Relu
    };
    let epilogue = Epilogue {
        alpha: 0.25,
        bias: with_bias.then_some(&bias[..]),
        accumulate: false,
        activation,
    };
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let x = QuantizedRows::quantize_on(isa, MatRef::row_major(&xv, m, k), true);
        let w = QuantizedMatrix::quantize(MatRef::row_major(&wv, k, n));
        let sums = reference(&x, &w);
        for parallel in [false, true] {
            let stride = n + 1;
            let mut y = vec![f32::NAN; m * stride];
            matmul_on(isa, &mut y, stride, &x, &w, epilogue, parallel);
            for i in 0..m {
                for j in 0..n {
                    let sum = finish(&x, &w, i, j, sums[i * n + j], epilogue);
                    let want = activation.apply_f32(sum);
                    let got = y[i * stride + j];
                    // The same integer sum; only the f32 epilogue's fused multiply-add may
                    // round differently.
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                        "{isa:?} {m}×{k}×{n} ({i}, {j}): {got} against {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn products_match_the_integer_reference_on_odd_shapes() {
    for &(m, k, n) in &[
        (1, 1, 1),
        (1, 5, 3),
        (7, 3, 17),
        (13, 33, 33),
        (6, 64, 64),
        (37, 130, 65),
        (256, 257, 32),
        (3, 1000, 129),
    ] {
        case(m, k, n, true);
        case(m, k, n, false);
    }
}

/// The epilogue's GELU is `Activation::apply_to_on`'s on the same `isa`, bit for bit: the
/// fused store against the identity one followed by the activation (the bias before it in
/// both). With AVX-512 kept but the `int8` product portable too, where the GELU is fused
/// although the sums are not vectorised.
#[test]
fn the_fused_gelu_is_the_activation_s_bit_for_bit() {
    let (m, k, n) = (37, 130, 65);
    // Centred, so that the outputs cover both of `erf`'s branches, on both sides of zero.
    let xv = uniform(m * k, 11, [-2.0, 2.0]);
    let wv = uniform(k * n, 12, [-0.5, 0.5]);
    let bias = uniform(n, 13, [-1.0, 1.0]);
    let w = QuantizedMatrix::quantize(MatRef::row_major(&wv, k, n));
    let detected = Isa::detected();
    for isa in [Isa::PORTABLE, detected.without_extensions(), detected] {
        let x = QuantizedRows::quantize_on(isa, MatRef::row_major(&xv, m, k), true);
        let plain = Epilogue {
            alpha: 0.5,
            bias: Some(&bias),
            accumulate: false,
            activation: Activation::Identity,
        };
        let mut fused = vec![0.0f32; m * n];
        let gelu = Epilogue {
            activation: Activation::Gelu,
            ..plain
        };
        matmul_on(isa, &mut fused, n, &x, &w, gelu, true);
        let mut apart = vec![0.0f32; m * n];
        matmul_on(isa, &mut apart, n, &x, &w, plain, true);
        Activation::Gelu.apply_to_on(isa, &mut apart);
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&apart), "{isa:?}");
        // Negative outputs too, where GELU is far from the identity.
        assert!(apart.iter().any(|&v| v < -0.1), "{isa:?}");
    }
}

#[test]
fn the_integer_sums_are_exact() {
    // Values whose products sum far past f32's 24-bit mantissa: an f32 accumulator would
    // round on the way, exact integer sums round once, at the store.
    let (m, k, n) = (5, 4096, 20);
    let x = QuantizedRows {
        rows: m,
        depth: k,
        values: (0..m * k).map(|i| (200 + i * 37 % 56) as u8).collect(),
        scales: vec![1.0; m],
        zeros: vec![0; m],
    };
    let w = QuantizedMatrix::from_parts(
        k,
        n,
        (0..k * n).map(|i| (100 + i * 53 % 28) as i8).collect(),
        vec![1.0; n],
    );
    let sums = reference(&x, &w);
    let e = Epilogue {
        alpha: 1.0,
        bias: None,
        accumulate: false,
        activation: Activation::Identity,
    };
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let mut y = vec![0.0f32; m * n];
        matmul_on(isa, &mut y, n, &x, &w, e, true);
        for (got, want) in y.iter().zip(&sums) {
            assert_eq!(*got, *want as f32, "{isa:?}");
        }
    }
    // And the sums are large: 4096 products of up to 255·127.
    assert!(sums.iter().any(|s| s.abs() > 1 << 24));
}

#[test]
fn quantization_round_trips_within_half_a_step() {
    let (m, k) = (9, 77);
    let xv = uniform(m * k, 5, skewed(6.0));
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let x = QuantizedRows::quantize_on(isa, MatRef::row_major(&xv, m, k), false);
        for i in 0..m {
            for p in 0..k {
                let back = x.scales[i] * (x.value(i, p) as i32 - x.zeros[i]) as f32;
                assert!(
                    (back - xv[i * k + p]).abs() <= 0.5 * x.scales[i] + 1e-6,
                    "{isa:?}"
                );
            }
        }
        // A zero row stays zero, with a usable scale.
        let zeros = QuantizedRows::quantize_on(isa, MatRef::row_major(&[0.0; 8], 2, 4), false);
        assert_eq!(zeros.scales, [1.0, 1.0]);
        assert!(zeros.values.iter().all(|&q| q as i32 == zeros.zeros[0]));
    }
    let w = QuantizedMatrix::quantize(MatRef::row_major(&xv, m, k));
    for (q, (v, d)) in xv.iter().zip(w.dequantize()).enumerate() {
        assert!((v - d).abs() <= 0.5 * w.scales[q % k] + 1e-6);
    }
}

/// Both paths quantize alike: the same range (non-finite values left out) and the same
/// rounding.
#[test]
fn the_vector_range_is_the_scalar_one_non_finite_values_left_out() {
    let mut x = uniform(1000, 8, skewed(10.0));
    x[3] = f32::NAN;
    x[500] = f32::INFINITY;
    x[999] = f32::NEG_INFINITY;
    x[17] = -1e6;
    for len in [0, 1, 5, 16, 17, 999, 1000] {
        let want = min_max_on(Isa::PORTABLE, &x[..len]);
        assert_eq!(min_max_on(Isa::detected(), &x[..len]), want, "{len} values");
        assert!(want.0.is_finite() && want.1.is_finite());
    }
    assert_eq!(min_max_on(Isa::PORTABLE, &x).0, -1e6);
    let (m, k) = (7, 143);
    let xv = uniform(m * k, 9, skewed(3.0));
    let view = MatRef::row_major(&xv, m, k);
    assert_eq!(
        QuantizedRows::quantize_on(Isa::PORTABLE, view, false),
        QuantizedRows::quantize_on(Isa::detected(), view, false)
    );
}

#[test]
fn a_sum_of_products_is_the_products_accumulated() {
    let (m, n) = (29, 70);
    let (k1, k2) = (13, 40);
    let (xv1, xv2) = (
        uniform(m * k1, 1, skewed(2.0)),
        uniform(m * k2, 2, skewed(9.0)),
    );
    let w1 = QuantizedMatrix::quantize(MatRef::row_major(&uniform(k1 * n, 3, skewed(1.0)), k1, n));
    let w2 = QuantizedMatrix::quantize(MatRef::row_major(&uniform(k2 * n, 4, skewed(0.1)), k2, n));
    let bias = uniform(n, 5, skewed(1.0));
    let e = Epilogue {
        alpha: 0.5,
        bias: Some(&bias),
        accumulate: false,
        activation: Activation::Identity,
    };
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let x1 = QuantizedRows::quantize_on(isa, MatRef::row_major(&xv1, m, k1), true);
        let x2 = QuantizedRows::quantize_on(isa, MatRef::row_major(&xv2, m, k2), true);
        let mut fused = vec![0.0f32; m * n];
        matmul_sum_on(isa, &mut fused, n, &[(&x1, &w1), (&x2, &w2)], e, true);
        let mut apart = vec![0.0f32; m * n];
        matmul_on(
            isa,
            &mut apart,
            n,
            &x1,
            &w1,
            Epilogue { bias: None, ..e },
            false,
        );
        matmul_on(
            isa,
            &mut apart,
            n,
            &x2,
            &w2,
            Epilogue {
                accumulate: true,
                ..e
            },
            false,
        );
        assert_eq!(fused, apart, "{isa:?}");
    }
}

#[test]
fn accumulate_adds_to_the_destination() {
    let (m, k, n) = (4, 10, 6);
    let xv = uniform(m * k, 1, skewed(1.0));
    let w = QuantizedMatrix::quantize(MatRef::row_major(&uniform(k * n, 2, skewed(1.0)), k, n));
    let e = Epilogue {
        alpha: 1.0,
        bias: None,
        accumulate: false,
        activation: Activation::Identity,
    };
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let x = QuantizedRows::quantize_on(isa, MatRef::row_major(&xv, m, k), false);
        let mut once = vec![0.0f32; m * n];
        matmul_on(isa, &mut once, n, &x, &w, e, false);
        let mut twice = once.clone();
        matmul_on(
            isa,
            &mut twice,
            n,
            &x,
            &w,
            Epilogue {
                accumulate: true,
                ..e
            },
            false,
        );
        for (a, b) in once.iter().zip(&twice) {
            assert!((2.0 * a - b).abs() <= 1e-5 * a.abs().max(1.0), "{isa:?}");
        }
    }
}
