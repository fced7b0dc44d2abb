use super::*;

/// Every binade from `1e-40` (denormals) to `1e4`, 2048 values each, both signs, with
/// zeros, infinities, `NaN` and the edges of `exp`'s range.
fn sweep() -> Vec<f32> {
    let mut xs = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
    ];
    xs.extend([
        f32::MIN,
        f32::MIN_POSITIVE,
        1e-45,
        88.72,
        88.73,
        -87.33,
        -103.9,
        -104.0,
    ]);
    let mut x = 1e-40f32;
    while x < 1e4 {
        xs.push(x);
        xs.push(-x);
        x = x * (1.0 + 1.0 / 2048.0) + 1e-45;
    }
    xs
}

/// `(worst relative error, worst error in ulps)` of `f` against `exact` on `xs`, over
/// the results that are normal `f32`s, with special values required to match exactly.
fn worst(xs: &[f32], got: &[f32], exact: impl Fn(f64) -> f64, name: &str) -> (f64, f64) {
    let (mut rel, mut ulps) = (0.0f64, 0.0f64);
    for (&x, &y) in xs.iter().zip(got) {
        let want = exact(x as f64);
        let want32 = want as f32;
        if want.is_nan() {
            assert!(y.is_nan(), "{name}({x}) = {y}, want NaN");
            continue;
        }
        if !want32.is_normal() {
            // Infinite, zero or denormal: exact or within one denormal step.
            let ok = y == want32 || (y as f64 - want).abs() <= f32::from_bits(1) as f64;
            assert!(ok, "{name}({x}) = {y}, want {want}");
            assert_eq!(
                y.is_sign_negative(),
                want32.is_sign_negative(),
                "{name}({x})"
            );
            continue;
        }
        let err = (y as f64 - want).abs();
        let ulp = (want32.abs().to_bits() + 1) as f64;
        let ulp = f32::from_bits(ulp as u32) as f64 - want32.abs() as f64;
        rel = rel.max(err / want.abs());
        ulps = ulps.max(err / ulp);
    }
    (rel, ulps)
}

fn check(func: Func, exact: impl Fn(f64) -> f64 + Copy, bounds: [(f64, f64); 2]) {
    let xs = sweep();
    for (isa, (max_rel, max_ulps)) in [Isa::PORTABLE, Isa::detected()].into_iter().zip(bounds) {
        let mut got = vec![0.0; xs.len()];
        map_to_on(isa, func, &xs, &mut got);
        let mut again = xs.clone();
        map_in_place_on(isa, func, &mut again);
        assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            again.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{func:?}: in place and out of place agree"
        );
        let (rel, ulps) = worst(&xs, &got, exact, &format!("{func:?} {isa:?}"));
        eprintln!("{func:?} {isa:?}: relative {rel:.3e}, {ulps:.2} ulp");
        assert!(
            rel <= max_rel && ulps <= max_ulps,
            "{func:?} {isa:?}: {rel:e}, {ulps} ulp"
        );
    }
}

#[test]
fn exp_follows_libm() {
    check(Func::Exp, libm::exp, [(1e-7, 1.0), (1e-7, 1.0)]);
    assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp(0.0), 1.0);
}

/// Softmax weights: [`exp_f`] bit for bit where it is normal, `0` below, for both
/// choices of `FMA` (a call to `fmaf` here, with the same results as the instruction).
#[test]
fn exp_non_positive_is_exp_without_denormals() {
    for i in 0..=200_000 {
        let x = -(i as f32) / 2_000.0; // [−100, 0]
        let pairs = [
            (exp_non_positive_f::<false>(x), exp_f::<false>(x)),
            (exp_non_positive_f::<true>(x), exp_f::<true>(x)),
        ];
        for (got, exp) in pairs {
            if x >= EXP_NORMAL_MIN {
                assert!(exp.is_normal(), "{x}");
                assert_eq!(got.to_bits(), exp.to_bits(), "{x}");
            } else {
                assert_eq!(got.to_bits(), 0, "{x}");
            }
        }
    }
    for exp in [exp_non_positive_f::<false>, exp_non_positive_f::<true>] {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::MIN), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }
}

#[test]
fn erf_follows_libm() {
    check(Func::Erf, libm::erf, [(1e-7, 1.0), (1e-7, 1.0)]);
    assert_eq!(erf(f32::INFINITY), 1.0);
    assert_eq!(erf(f32::NEG_INFINITY), -1.0);
    assert!(erf(-0.0).is_sign_negative());
}

#[test]
fn tanh_follows_libm() {
    check(Func::Tanh, libm::tanh, [(1.3e-7, 1.25), (1.3e-7, 1.25)]);
    assert_eq!(tanh(f32::INFINITY), 1.0);
    assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
}

#[test]
fn gelu_follows_the_exact_gelu() {
    let xs: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 / 4_000.0).collect();
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let mut got = vec![0.0; xs.len()];
        map_to_on(isa, Func::Gelu, &xs, &mut got);
        for (&x, &y) in xs.iter().zip(&got) {
            let x = x as f64;
            let want = 0.5 * x * (1.0 + libm::erf(x * core::f64::consts::FRAC_1_SQRT_2));
            // Relative, plus where x ≪ 0 the rounding of 1 + erf (an ulp of 1, halved),
            // as in any f32 GELU of this formula.
            let bound = 3e-7 * want.abs() + 3e-8 * x.abs();
            assert!(
                (y as f64 - want).abs() <= bound,
                "{isa:?} {x}: {y}, want {want}"
            );
        }
    }
}

/// Long slices are cut into chunks for rayon: the same results as one pass.
#[test]
fn parallel_maps_agree_with_serial_ones() {
    let xs: Vec<f32> = (0..PARALLEL_MIN * 3 + 17)
        .map(|i| (i as f32).sin() * 6.0)
        .collect();
    for func in [Func::Exp, Func::Erf, Func::Tanh, Func::Gelu] {
        let mut long = vec![0.0; xs.len()];
        map_to_on(Isa::detected(), func, &xs, &mut long);
        for (chunk, want) in xs.chunks(1000).zip(long.chunks(1000)) {
            let mut short = vec![0.0; chunk.len()];
            map_to_on(Isa::detected(), func, chunk, &mut short);
            assert_eq!(short, want, "{func:?}");
        }
    }
}

#[test]
#[should_panic(expected = "one output per input")]
fn mismatched_lengths_are_refused() {
    exp_to(&[1.0, 2.0], &mut [0.0]);
}
