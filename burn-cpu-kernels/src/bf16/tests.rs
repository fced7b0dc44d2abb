use super::*;
use crate::testing::{assert_close, uniform_bf16};

/// The operands' range.
const RANGE: [f32; 2] = [-1.0, 1.0];

/// The largest error of the first `n` columns of each row of `got` relative to the
/// reference's largest magnitude.
fn check<O: StoredFloat>(got: &[O], stride: usize, want: &[f64], n: usize, tolerance: f64) {
    let got: Vec<f32> = got
        .chunks(stride)
        .flat_map(|row| row[..n].iter().map(|v| v.to_f32()))
        .collect();
    assert_close(&got, want, tolerance, "bf16 product");
}

fn case(m: usize, k: usize, n: usize, transpose_lhs: bool, transpose_rhs: bool) {
    let a = uniform_bf16(m * k, (m * 31 + k) as u64, RANGE);
    let b = uniform_bf16(k * n, (n * 17 + k) as u64, RANGE);
    // Transposed views read the same values from the transposed buffer.
    let (at, bt): (Vec<bf16>, Vec<bf16>) = (
        (0..k * m).map(|q| a[(q % m) * k + q / m]).collect(),
        (0..n * k).map(|q| b[(q % k) * n + q / k]).collect(),
    );
    let lhs = if transpose_lhs {
        MatRef::row_major(&at, k, m).t()
    } else {
        MatRef::row_major(&a, m, k)
    };
    let rhs = if transpose_rhs {
        MatRef::row_major(&bt, n, k).t()
    } else {
        MatRef::row_major(&b, k, n)
    };
    let want = reference(lhs, rhs, 0.5);
    let stride = n + 3;
    for isa in [Isa::PORTABLE, Isa::detected()] {
        for parallel in [false, true] {
            let mut y = vec![0.0f32; m * stride];
            matmul_on(isa, &mut y, stride, lhs, rhs, 0.5, false, parallel);
            check(&y, stride, &want, n, 1e-5);
            // Accumulating adds the same product again.
            matmul_on(isa, &mut y, stride, lhs, rhs, 0.5, true, parallel);
            let twice: Vec<f64> = want.iter().map(|v| 2.0 * v).collect();
            check(&y, stride, &twice, n, 1e-5);
            // Rounded to bf16 on the way out: 8 bits of mantissa.
            let mut y = vec![bf16::ZERO; m * stride];
            matmul_on(isa, &mut y, stride, lhs, rhs, 0.5, false, parallel);
            check(&y, stride, &want, n, 1e-2);
        }
    }
}

#[test]
fn products_match_the_reference_on_odd_shapes() {
    for &(m, k, n) in &[
        (1, 1, 1),
        (1, 64, 1),
        (7, 3, 5),
        (13, 33, 17),
        (6, 64, 64),
        (37, 130, 65),
        (64, 31, 100),
        (256, 512, 32),
        (33, 16, 129),
    ] {
        for (tl, tr) in [(false, false), (true, false), (false, true), (true, true)] {
            case(m, k, n, tl, tr);
        }
    }
}

#[test]
fn the_portable_path_matches_the_kernel() {
    let (m, k, n) = (45, 100, 70);
    let (a, b) = (uniform_bf16(m * k, 3, RANGE), uniform_bf16(k * n, 4, RANGE));
    let (lhs, rhs) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n));
    let want = reference(lhs, rhs, 1.0);
    for isa in [Isa::PORTABLE, Isa::detected()] {
        let mut y = vec![0.0f32; m * n];
        matmul_on(isa, &mut y, n, lhs, rhs, 1.0, false, true);
        check(&y, n, &want, n, 1e-5);
    }
    // And the default form, on this CPU's path.
    let mut y = vec![0.0f32; m * n];
    matmul(&mut y, n, lhs, rhs, 1.0, false, true);
    check(&y, n, &want, n, 1e-5);
}

#[test]
fn several_threads_at_once_get_their_own_results() {
    std::thread::scope(|scope| {
        for t in 0..4 {
            scope.spawn(move || case(50 + t, 70, 90 - t, t % 2 == 0, false));
        }
    });
}
