use super::*;

use crate::testing::{largest_error, uniform};

/// The operands' range: [`check`]'s tolerance is for values in [-1, 1).
const UNIT: [f32; 2] = [-1.0, 1.0];

/// `f(reference + bias)`, or `f(before + reference + bias)` with `accumulate`.
fn expected(
    want: &[f64],
    n: usize,
    before: Option<(&[f32], usize)>,
    epilogue: &Epilogue<'_>,
) -> Vec<f64> {
    want.iter()
        .enumerate()
        .map(|(q, &v)| {
            let (i, j) = (q / n, q % n);
            let base = before.map_or(0.0, |(b, stride)| b[i * stride + j] as f64);
            let bias = epilogue.bias.map_or(0.0, |b| b[j] as f64);
            epilogue.activation.apply_f64(base + v + bias)
        })
        .collect()
}

/// Every output within `tolerance·(√k + 1)` of the `f64` value (operands in [-1, 1)),
/// and the padding columns past `n` untouched.
fn check(got: &[f32], stride: usize, want: &[f64], n: usize, k: usize, what: &str) {
    let tolerance = 2e-6 * ((k as f64).sqrt() + 1.0);
    for (i, row) in want.chunks(n).enumerate() {
        for (j, &w) in row.iter().enumerate() {
            let g = got[i * stride + j] as f64;
            assert!(
                (g - w).abs() <= tolerance * w.abs().max(1.0),
                "{what} ({i}, {j}): {g} against {w}"
            );
        }
        for j in n..stride {
            assert_eq!(
                got[i * stride + j].to_bits(),
                7.0f32.to_bits(),
                "{what}: padding"
            );
        }
    }
}

/// `lhs` and `rhs` as views: row-major, transposed (the transposed buffer read through
/// swapped strides) or strided (every other element of a buffer twice as wide).
fn view(data: &[f32], rows: usize, cols: usize, layout: u8, buffer: &mut Vec<f32>) {
    buffer.clear();
    match layout {
        0 => buffer.extend_from_slice(data),
        1 => buffer.extend((0..rows * cols).map(|q| data[(q % rows) * cols + q / rows])),
        _ => buffer.extend(data.iter().flat_map(|&v| [v, -99.0])),
    }
}

fn make(buffer: &[f32], rows: usize, cols: usize, layout: u8) -> MatRef<'_, f32> {
    match layout {
        0 => MatRef::row_major(buffer, rows, cols),
        1 => MatRef::row_major(buffer, cols, rows).t(),
        _ => MatRef::strided(buffer, 0, [rows, cols], [2 * cols as isize, 2]),
    }
}

fn case(m: usize, k: usize, n: usize, layouts: (u8, u8), epilogue: Epilogue<'_>) {
    let (a, b) = (
        uniform(m * k, (m * 31 + k) as u64, UNIT),
        uniform(k * n, (n * 17 + k) as u64, UNIT),
    );
    let (mut ab, mut bb) = (Vec::new(), Vec::new());
    view(&a, m, k, layouts.0, &mut ab);
    view(&b, k, n, layouts.1, &mut bb);
    let (lhs, rhs) = (make(&ab, m, k, layouts.0), make(&bb, k, n, layouts.1));
    let product = reference(lhs, rhs);
    let stride = n + 2;
    let start: Vec<f32> = uniform(m * stride, 5, UNIT)
        .into_iter()
        .enumerate()
        .map(|(q, v)| if q % stride >= n { 7.0 } else { v })
        .collect();
    let before = epilogue.accumulate.then_some((&start[..], stride));
    let want = expected(&product, n, before, &epilogue);
    let what = format!("{m}×{k}×{n} {layouts:?} {epilogue:?}");
    let packed = PackedRhs::pack(rhs);
    assert_eq!(packed.shape(), [k, n]);
    // The kernel sums in the same order whatever the split and the packing: its results
    // are compared bit for bit (where `matmul` routes to `gemm`, only the packed ones).
    let kernel = Isa::detected().avx512() && !gemm_is_faster(lhs, [m, k, n], &epilogue);
    let (mut first, mut first_packed): (Option<Vec<f32>>, Option<Vec<f32>>) = (None, None);
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let path = isa.name();
        for parallel in [false, true] {
            let mut y = start.clone();
            matmul_on(isa, &mut y, stride, lhs, rhs, epilogue, parallel);
            check(
                &y,
                stride,
                &want,
                n,
                k,
                &format!("{what} {path} {parallel}"),
            );
            let mut z = start.clone();
            matmul_packed_on(isa, &mut z, stride, lhs, &packed, epilogue, parallel);
            check(&z, stride, &want, n, k, &format!("{what} packed {path}"));
            if isa.avx512() {
                let same =
                    |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                let first_packed = first_packed.get_or_insert_with(|| z.clone());
                assert!(
                    same(first_packed, &z),
                    "{what}: packed, parallel {parallel}"
                );
                if kernel {
                    let first = first.get_or_insert_with(|| y.clone());
                    assert!(same(first, &y), "{what}: parallel {parallel}");
                    assert!(same(first, &z), "{what}: packed and not");
                }
            }
        }
    }
}

const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (7, 13, 5),
    (33, 65, 17),
    (100, 1, 300),
    (5, 0, 9),
    (0, 4, 3),
    (12, 300, 32),
    (13, 257, 33),
    (64, 40, 100),
    (65, 520, 47),
    (300, 70, 64),
];

#[test]
fn products_match_the_reference_on_odd_shapes() {
    for &(m, k, n) in SHAPES {
        case(m, k, n, (0, 0), Epilogue::default());
    }
}

#[test]
fn transposed_and_strided_views_are_read_through_their_strides() {
    for &(m, k, n) in SHAPES {
        for layouts in [(1, 0), (0, 1), (1, 1), (2, 2), (2, 1)] {
            case(m, k, n, layouts, Epilogue::default());
        }
    }
}

#[test]
fn the_epilogue_adds_the_bias_accumulates_and_activates() {
    for &(m, k, n) in SHAPES {
        let bias = uniform(n, 11, UNIT);
        for activation in [Activation::Identity, Activation::Relu, Activation::Gelu] {
            for accumulate in [false, true] {
                for bias in [None, Some(&bias[..])] {
                    let e = Epilogue {
                        bias,
                        activation,
                        accumulate,
                    };
                    case(m, k, n, (0, 0), e);
                }
            }
        }
    }
}

/// Deep enough for two blocks of depth (the second accumulates onto the first), tall
/// enough for several blocks of rows on both threads.
#[test]
fn blocked_products_match() {
    let k = KC + 77;
    let bias = uniform(70, 3, UNIT);
    let e = Epilogue {
        bias: Some(&bias),
        activation: Activation::Gelu,
        accumulate: true,
    };
    case(2 * MC + 5, k, 70, (0, 0), e);
    case(2 * MC + 5, k, 70, (1, 0), Epilogue::default());
    case(40, k, 70, (0, 1), e);
    case(40, k, 70, (1, 1), Epilogue::default());
}

/// The fused GELU is the product with an identity epilogue followed by
/// [`Activation::apply_to_on`] on the same `isa`, bit for bit (the bias, and the sum with
/// `accumulate`, added before the activation in both): on an `Isa` with AVX-512 this checks
/// the kernel's store, on the portable one `gemm`'s second pass.
#[test]
fn the_fused_gelu_is_the_activation_pass_bit_for_bit() {
    // Few rows (split by columns, the weight read in place), a transposed left operand
    // (packed into row tiles), and many rows over two blocks of depth.
    for (m, k, n, layout) in [
        (16, 300, 70, 0),
        (40, 300, 33, 1),
        (2 * MC + 5, KC + 77, 70, 0),
    ] {
        let (a, b) = (uniform(m * k, 21, UNIT), uniform(k * n, 22, UNIT));
        let mut ab = Vec::new();
        view(&a, m, k, layout, &mut ab);
        let (lhs, rhs) = (make(&ab, m, k, layout), MatRef::row_major(&b, k, n));
        let packed = PackedRhs::pack(rhs);
        let bias = uniform(n, 23, UNIT);
        let stride = n + 2;
        let start = uniform(m * stride, 24, UNIT);
        for isa in [Isa::PORTABLE, Isa::detected()] {
            for bias in [None, Some(&bias[..])] {
                for accumulate in [false, true] {
                    let gelu = Epilogue {
                        bias,
                        activation: Activation::Gelu,
                        accumulate,
                    };
                    let identity = Epilogue {
                        activation: Activation::Identity,
                        ..gelu
                    };
                    if isa.avx512() {
                        for e in [&gelu, &identity] {
                            assert!(
                                !gemm_is_faster(lhs, [m, k, n], e),
                                "{m}×{k}×{n}: the kernel"
                            );
                        }
                    }
                    for on_packed in [false, true] {
                        let run = |epilogue| {
                            let mut y = start.clone();
                            if on_packed {
                                matmul_packed_on(isa, &mut y, stride, lhs, &packed, epilogue, true);
                            } else {
                                matmul_on(isa, &mut y, stride, lhs, rhs, epilogue, true);
                            }
                            y
                        };
                        let fused = run(gelu);
                        let mut unfused = run(identity);
                        for row in unfused.chunks_exact_mut(stride) {
                            Activation::Gelu.apply_to_on(isa, &mut row[..n]);
                        }
                        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&fused),
                            bits(&unfused),
                            "{m}×{k}×{n} {} {gelu:?} packed {on_packed}",
                            isa.name()
                        );
                    }
                }
            }
        }
    }
}

/// The portable path and the kernel agree (the reference checks both; here they are
/// compared directly, within the `f32` rounding of a depth of 384).
#[test]
fn the_portable_path_matches_the_kernel() {
    let (m, k, n) = (97, 384, 130);
    let (a, b) = (uniform(m * k, 1, UNIT), uniform(k * n, 2, UNIT));
    let (lhs, rhs) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n));
    let (mut fast, mut slow) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
    let plain = Epilogue::default();
    matmul_on(Isa::detected(), &mut fast, n, lhs, rhs, plain, true);
    matmul_on(Isa::PORTABLE, &mut slow, n, lhs, rhs, plain, true);
    let slow: Vec<f64> = slow.iter().map(|&v| v as f64).collect();
    let worst = largest_error(&fast, &slow);
    assert!(worst <= 1e-4, "{worst}");
}

/// The routing rule itself: a transposed left operand of many rows, a plain shallow and
/// narrow product of many rows, or fewer than 8 rows go to `gemm`; 8 to 64 rows, or an
/// epilogue, keep the kernel.
#[test]
fn the_products_gemm_wins_are_routed_to_it() {
    let a = vec![0.0f32; 100 * 8];
    let plain = Epilogue::default();
    let bias = [0.0f32; 2000];
    let relu = Epilogue {
        activation: Activation::Relu,
        ..plain
    };
    let biased = Epilogue {
        bias: Some(&bias),
        ..plain
    };
    let x = MatRef::row_major(&a, 100, 8);
    let xt = MatRef::row_major(&a, 8, 100).t();
    assert!(gemm_is_faster(xt, [100, 8, 2000], &biased));
    assert!(!gemm_is_faster(xt.rows(0, 64), [64, 8, 2000], &plain));
    assert!(gemm_is_faster(x, [100, 8, 1152], &plain));
    assert!(!gemm_is_faster(x, [100, 8, 1153], &plain));
    assert!(!gemm_is_faster(x, [100, 8, 1152], &relu));
    assert!(!gemm_is_faster(x, [100, 8, 1152], &biased));
    assert!(!gemm_is_faster(x.rows(0, 64), [64, 8, 1152], &plain));
    assert!(gemm_is_faster(x.rows(0, 7), [7, 8, 1152], &relu));
    assert!(!gemm_is_faster(x.rows(0, 8), [8, 8, 1152], &relu));
}

#[test]
#[should_panic(expected = "inner dimensions")]
fn mismatched_depths_are_refused() {
    let (a, b) = (vec![0.0f32; 6], vec![0.0f32; 8]);
    let mut y = vec![0.0f32; 8];
    let (lhs, rhs) = (MatRef::row_major(&a, 2, 3), MatRef::row_major(&b, 2, 4));
    matmul(&mut y, 4, lhs, rhs, Epilogue::default(), false);
}
