//! The sketching operators and the randomized linear algebra on Flex, NdArray and wgpu
//! (lavapipe): exact identities (orthogonality, reconstruction, the Hadamard transform's
//! orthogonality, pivots on matrices of known rank), NumPy's singular values, and the typed
//! errors of bad input.

use burn::backend::flex::FlexDevice;
use burn::backend::ndarray::NdArrayDevice;
use burn::backend::wgpu::WgpuDevice;
use burn::backend::{Flex, NdArray, Wgpu};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use burn_randnla::LinalgError;
use burn_randnla::sketch::{SketchConfig, SketchKind};
use burn_randnla::{self as linalg, CqrrptConfig, RandomizedSvdConfig};
use faer::Mat;

const KINDS: [SketchKind; 7] = [
    SketchKind::Gaussian,
    SketchKind::Uniform,
    SketchKind::ScaledSign,
    SketchKind::SparseSign { nonzeros: 3 },
    SketchKind::SparseSign { nonzeros: 1 },
    SketchKind::CountSketch,
    SketchKind::Srht,
];

fn host<const D: usize, B: Backend>(tensor: Tensor<B, D>) -> Vec<f64> {
    tensor.into_data().iter::<f64>().collect()
}

fn to_device<B: Backend>(
    rows: usize,
    cols: usize,
    values: Vec<f64>,
    device: &B::Device,
) -> Tensor<B, 2> {
    let values: Vec<f32> = values.into_iter().map(|x| x as f32).collect();
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}

/// A matrix from a fixed formula (the same on every backend), entries uniform in `±1`: a
/// hash of the entry's index (SplitMix64's finaliser), well conditioned like a random matrix.
fn formula<B: Backend>(rows: usize, cols: usize, salt: f64, device: &B::Device) -> Tensor<B, 2> {
    let salt = salt.to_bits();
    let values = (0..rows * cols)
        .map(|e| {
            let mut z = (e as u64)
                .wrapping_add(salt)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
        })
        .collect();
    to_device(rows, cols, values, device)
}

/// `U·diag(σ)·Vᵀ` with orthonormal `U` (`[m, r]`) and `V` (`[n, r]`) from faer's QR of fixed
/// matrices: a matrix whose singular values are exactly `sigma` (in `f64`, before rounding).
fn with_spectrum<B: Backend>(
    m: usize,
    n: usize,
    sigma: &[f64],
    device: &B::Device,
) -> Tensor<B, 2> {
    let r = sigma.len();
    let basis = |rows: usize, salt: f64| {
        let a = Mat::<f64>::from_fn(rows, r, |i, j| {
            ((i * r + j) as f64 * 0.754_877_666 + salt).fract() - 0.5
        });
        a.qr().compute_thin_Q()
    };
    let (u, v) = (basis(m, 0.1), basis(n, 0.7));
    let a = Mat::<f64>::from_fn(m, n, |i, j| {
        (0..r).map(|t| u[(i, t)] * sigma[t] * v[(j, t)]).sum()
    });
    to_device(
        m,
        n,
        (0..m * n).map(|e| a[(e / n, e % n)]).collect(),
        device,
    )
}

fn frobenius<B: Backend>(a: Tensor<B, 2>) -> f64 {
    host(a).iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// `‖QᵀQ − I‖_F`.
fn departure<B: Backend>(q: Tensor<B, 2>) -> f64 {
    let k = q.dims()[1];
    let device = q.device();
    frobenius(q.clone().transpose().matmul(q) - Tensor::eye(k, &device))
}

/// The columns of `a` in the order `pivots`.
fn permuted<B: Backend>(a: Tensor<B, 2>, pivots: &[usize]) -> Tensor<B, 2> {
    let device = a.device();
    let index: Vec<i64> = pivots.iter().map(|&p| p as i64).collect();
    a.select(
        1,
        Tensor::from_data(TensorData::new(index, [pivots.len()]), &device),
    )
}

// ---- Sketching operators -------------------------------------------------------------------

/// Each kind's left and right applications and its dense form agree, on odd sizes; every
/// operator is the one its seed gives on Flex (drawn on the host, so the same everywhere).
fn operators_apply_consistently<B: Backend>(device: &B::Device) {
    for kind in KINDS {
        for (n, d, m) in [(37, 11, 5), (64, 64, 3), (100, 7, 1), (5, 5, 9)] {
            let config = SketchConfig::new(kind, n, d).with_seed(5);
            let sketch = config.init::<B>(device);
            let dense = sketch.to_dense(device);
            let flex = host(config.init::<Flex>(&FlexDevice).to_dense(&FlexDevice));
            let ours = host(dense.clone());
            for (x, y) in ours.iter().zip(&flex) {
                assert!(
                    (x - y).abs() < 1e-5,
                    "{kind:?} {n}→{d}: seeded operator differs from Flex's"
                );
            }
            let a = formula::<B>(n, m, 0.3, device);
            let left = host(sketch.apply_left(a.clone()).unwrap());
            let right = host(
                sketch
                    .apply_right(a.clone().transpose())
                    .unwrap()
                    .transpose(),
            );
            let reference = host(dense.matmul(a));
            for ((l, r), e) in left.iter().zip(&right).zip(&reference) {
                assert!(
                    (l - e).abs() < 1e-4 && (r - e).abs() < 1e-4,
                    "{kind:?} {n}→{d}: {l} {r} vs {e}"
                );
            }
        }
    }
}

/// The structure each kind promises: one `±1` per column for CountSketch, `s` entries
/// `±1/√s` in distinct rows for the sparse sign sketch, and for the SRHT of a power-of-two
/// input `S·Sᵀ = (n/d)·I` exactly (its rows are rows of an orthogonal matrix, scaled).
fn operators_have_their_structure<B: Backend>(device: &B::Device) {
    let (n, d) = (256, 32);
    for (kind, per_column, magnitude) in [
        (SketchKind::CountSketch, 1, 1.0),
        (SketchKind::SparseSign { nonzeros: 4 }, 4, 0.5),
    ] {
        let dense = host(
            SketchConfig::new(kind, n, d)
                .with_seed(9)
                .init::<B>(device)
                .to_dense(device),
        );
        for j in 0..n {
            let column: Vec<f64> = (0..d)
                .map(|i| dense[i * n + j])
                .filter(|x| *x != 0.0)
                .collect();
            assert_eq!(column.len(), per_column, "{kind:?}: column {j}");
            assert!(column.iter().all(|x| (x.abs() - magnitude).abs() < 1e-6));
        }
    }
    let srht = SketchConfig::new(SketchKind::Srht, n, d)
        .with_seed(2)
        .init::<B>(device)
        .to_dense(device);
    let gram = host(srht.clone().matmul(srht.transpose()));
    for i in 0..d {
        for j in 0..d {
            let expected = if i == j { n as f64 / d as f64 } else { 0.0 };
            assert!(
                (gram[i * d + j] - expected).abs() < 1e-3,
                "SRHT S·Sᵀ[{i}][{j}] = {}",
                gram[i * d + j]
            );
        }
    }
}

/// Johnson–Lindenstrauss: over 300 draws, `‖S·x‖²/‖x‖²` has mean 1 (each kind is scaled so
/// that `E[SᵀS] = I`) and leaves `1 ± 0.5` in at most 3 % of draws (the Gaussian bound is
/// `2·exp(−(ε²/4 − ε³/6)·d) ≈ 1 %` at `d = 128`).
#[test]
fn operators_preserve_norms_within_the_jl_bound() {
    let device = FlexDevice;
    let (n, d, draws) = (1000, 128, 300);
    let x = formula::<Flex>(n, 1, 0.9, &device);
    let norm = frobenius(x.clone()).powi(2);
    for kind in KINDS {
        let ratios: Vec<f64> = (0..draws)
            .map(|seed| {
                let sketch = SketchConfig::new(kind, n, d)
                    .with_seed(seed)
                    .init::<Flex>(&device);
                frobenius(sketch.apply_left(x.clone()).unwrap()).powi(2) / norm
            })
            .collect();
        let mean = ratios.iter().sum::<f64>() / draws as f64;
        let outside = ratios.iter().filter(|r| (*r - 1.0).abs() > 0.5).count();
        assert!(
            (mean - 1.0).abs() < 0.04,
            "{kind:?}: mean distortion {mean}"
        );
        assert!(
            outside * 100 <= 3 * draws as usize,
            "{kind:?}: {outside} of {draws} outside 1 ± 0.5"
        );
    }
}

fn operators_refuse_bad_sizes<B: Backend>(device: &B::Device) {
    let invalid = |config: SketchConfig| {
        matches!(
            config.try_init::<B>(device),
            Err(LinalgError::InvalidConfig { .. })
        )
    };
    assert!(invalid(SketchConfig::new(SketchKind::Gaussian, 0, 4)));
    assert!(invalid(SketchConfig::new(SketchKind::Gaussian, 4, 0)));
    assert!(invalid(SketchConfig::new(
        SketchKind::SparseSign { nonzeros: 0 },
        10,
        4
    )));
    assert!(invalid(SketchConfig::new(
        SketchKind::SparseSign { nonzeros: 5 },
        10,
        4
    )));
    assert!(invalid(SketchConfig::new(SketchKind::Srht, 10, 17)));
    let sketch = SketchConfig::new(SketchKind::CountSketch, 10, 4).init::<B>(device);
    let wrong = Tensor::<B, 2>::zeros([9, 3], device);
    assert!(matches!(
        sketch.apply_left(wrong.clone()),
        Err(LinalgError::InvalidShape { .. })
    ));
    assert!(matches!(
        sketch.apply_right(wrong),
        Err(LinalgError::InvalidShape { .. })
    ));
}

// ---- QR ------------------------------------------------------------------------------------

/// Cholesky QR on odd shapes, a square one, one column, and a matrix of condition number 10⁵
/// (beyond plain CholeskyQR2 in `f32`, about 10³: the shifted passes): orthonormal `Q`, upper-triangular
/// `R`, `Q·R = A`.
fn qr_is_orthonormal_and_exact<B: Backend>(device: &B::Device) {
    let mut cases: Vec<(&str, Tensor<B, 2>)> = [(37, 5), (200, 1), (64, 64), (1000, 30)]
        .into_iter()
        .map(|(m, n)| ("formula", formula::<B>(m, n, 0.2, device)))
        .collect();
    let graded: Vec<f64> = (0..20)
        .map(|i| 10f64.powf(-5.0 * i as f64 / 19.0))
        .collect();
    cases.push((
        "condition 1e5",
        with_spectrum::<B>(500, 20, &graded, device),
    ));
    for (what, a) in cases {
        let [m, n] = a.dims();
        let qr = linalg::qr(a.clone()).unwrap();
        assert_eq!(qr.q.dims(), [m, n]);
        let orthogonality = departure(qr.q.clone());
        let residual = frobenius(qr.q.clone().matmul(qr.r.clone()) - a.clone()) / frobenius(a);
        assert!(
            orthogonality < 1e-5,
            "{what} {m}×{n}: ‖QᵀQ − I‖ = {orthogonality}"
        );
        assert!(residual < 1e-5, "{what} {m}×{n}: ‖QR − A‖/‖A‖ = {residual}");
        let r = host(qr.r);
        assert!(
            (0..n).all(|i| (0..i).all(|j| r[i * n + j] == 0.0)),
            "R is not upper triangular"
        );
    }
}

fn qr_refuses_what_it_cannot_factor<B: Backend>(device: &B::Device) {
    let a = formula::<B>(50, 6, 0.4, device);
    let repeated = Tensor::cat(vec![a.clone(), a.clone().slice([0..50, 2..3])], 1);
    assert!(matches!(
        linalg::qr(repeated),
        Err(LinalgError::RankDeficient { columns: 7, .. })
    ));
    assert!(matches!(
        linalg::qr(a.clone().transpose()),
        Err(LinalgError::InvalidShape { .. })
    ));
    assert!(matches!(
        linalg::qr(Tensor::<B, 2>::zeros([0, 3], device)),
        Err(LinalgError::InvalidShape { .. })
    ));
    let nan = a
        .clone()
        .slice_assign([3..4, 1..2], Tensor::full([1, 1], f32::NAN, device));
    assert!(matches!(
        linalg::qr(nan.clone()),
        Err(LinalgError::NonFinite { .. })
    ));
    assert!(matches!(
        linalg::qr_pivoted(nan),
        Err(LinalgError::NonFinite { .. })
    ));
}

/// Pivoted QR finds the rank of a 60 × 40 matrix of rank 9 (its tenth pivot is 10⁻⁵ of the
/// first), its pivots are a permutation, and `A·P = Q·R`; wide matrices too.
fn pivoted_qr_reveals_rank<B: Backend>(device: &B::Device) {
    let sigma: Vec<f64> = (0..9).map(|i| 1.0 + i as f64).collect();
    for (m, n) in [(60, 40), (30, 45)] {
        let a = with_spectrum::<B>(m, n, &sigma, device);
        let qr = linalg::qr_pivoted(a.clone()).unwrap();
        let mut sorted = qr.pivots.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        let r = host(qr.r.clone());
        let diagonal: Vec<f64> = (0..m.min(n)).map(|i| r[i * n + i].abs()).collect();
        assert!(
            diagonal[8] > 1e-2 * diagonal[0] && diagonal[9] < 1e-5 * diagonal[0],
            "{diagonal:?}"
        );
        let residual =
            frobenius(qr.q.matmul(qr.r) - permuted(a.clone(), &qr.pivots)) / frobenius(a);
        assert!(residual < 1e-5, "{m}×{n}: {residual}");
    }
}

// ---- Randomized SVD ------------------------------------------------------------------------

/// NumPy's singular values of the fixture matrix `formula_numpy` (60 × 50), from
/// `numpy.linalg.svd(a, compute_uv=False)[:12]` with NumPy 2.4.6:
/// `i, j = arange(60)[:, None], arange(50)[None, :]`,
/// `a = exp(-((i - 1.2*j) / 9)**2) + 0.01*cos(i + 2*j)`.
const NUMPY_SINGULAR_VALUES: [f64; 12] = [
    13.936535760583396,
    12.219127700685258,
    9.821526689104898,
    7.245927417889626,
    4.914306331821028,
    3.071144371834985,
    1.772147556943861,
    0.9484129558464901,
    0.47156526327998016,
    0.28096923594390066,
    0.26696373303957627,
    0.21197069627303453,
];

fn formula_numpy<B: Backend>(device: &B::Device) -> Tensor<B, 2> {
    let (m, n) = (60, 50);
    let values = (0..m * n)
        .map(|e| {
            let (i, j) = ((e / n) as f64, (e % n) as f64);
            (-((i - 1.2 * j) / 9.0).powi(2)).exp() + 0.01 * (i + 2.0 * j).cos()
        })
        .collect();
    to_device(m, n, values, device)
}

/// The exact singular values (faer, `f64`) equal NumPy's to `f32` rounding of the input, and
/// the randomized SVD's top 6 (`k = 6`, `p = 10`, `q = 2`) equal them to 10⁻⁴.
fn singular_values_match_numpy<B: Backend>(device: &B::Device) {
    let a = formula_numpy::<B>(device);
    let exact = linalg::singular_values(a.clone()).unwrap();
    for (x, y) in exact.iter().zip(NUMPY_SINGULAR_VALUES) {
        assert!(
            (x - y).abs() < 1e-5 * NUMPY_SINGULAR_VALUES[0],
            "faer {x} vs NumPy {y}"
        );
    }
    let svd = RandomizedSvdConfig::new(6).decompose(a).unwrap();
    for (x, y) in host(svd.s).iter().zip(NUMPY_SINGULAR_VALUES) {
        assert!((x - y).abs() < 1e-4 * y, "randomized {x} vs NumPy {y}");
    }
}

/// On matrices with decaying spectra, the rank-`k` error is within 1.1× of the optimal
/// truncated SVD's (`√Σ_{i>k} σᵢ²`), and `U`, `V` are orthonormal: tall and wide, `k = 1`,
/// and `k` above the rank (the reconstruction is then exact).
fn randomized_svd_is_near_optimal<B: Backend>(device: &B::Device) {
    let decaying: Vec<f64> = (0..40).map(|i| 0.8f64.powi(i)).collect();
    let polynomial: Vec<f64> = (0..40).map(|i| 1.0 / (1.0 + i as f64).powi(2)).collect();
    for (what, m, n, sigma, k) in [
        ("geometric", 300, 200, &decaying, 10),
        ("geometric, wide", 120, 310, &decaying, 10),
        ("polynomial", 250, 90, &polynomial, 1),
        ("polynomial", 250, 90, &polynomial, 15),
        ("rank 5, k = 8", 80, 60, &decaying[..5].to_vec(), 8),
    ] {
        let a = with_spectrum::<B>(m, n, sigma, device);
        let svd = RandomizedSvdConfig::new(k)
            .with_seed(3)
            .decompose(a.clone())
            .unwrap();
        assert_eq!(svd.u.dims(), [m, k]);
        assert_eq!(svd.v.dims(), [n, k]);
        let optimal = sigma.iter().skip(k).map(|s| s * s).sum::<f64>().sqrt();
        let error = frobenius(svd.reconstruct() - a.clone());
        let scale = frobenius(a);
        assert!(
            error <= 1.1 * optimal + 2e-6 * scale,
            "{what} {m}×{n}, k = {k}: error {error} against optimal {optimal}"
        );
        assert!(
            departure(svd.u) < 1e-4 && departure(svd.v) < 1e-4,
            "{what}: U or V not orthonormal"
        );
    }
}

fn randomized_svd_refuses_bad_input<B: Backend>(device: &B::Device) {
    let a = formula::<B>(20, 10, 0.1, device);
    for rank in [0, 11] {
        assert!(matches!(
            RandomizedSvdConfig::new(rank).decompose(a.clone()),
            Err(LinalgError::InvalidConfig { name: "rank", .. })
        ));
    }
    let infinite = a.slice_assign([0..1, 0..1], Tensor::full([1, 1], f32::INFINITY, device));
    assert!(matches!(
        RandomizedSvdConfig::new(3).decompose(infinite),
        Err(LinalgError::NonFinite { .. })
    ));
}

// ---- CQRRPT --------------------------------------------------------------------------------

/// CQRRPT on a full-rank tall matrix with columns scaled over three decades, and on matrices of
/// rank 17 and 1 whose rank it must find: `‖A·P − Q·R‖/‖A‖ ≤ 10⁻⁵`, `‖QᵀQ − I‖ ≤ 10⁻⁵`.
fn cqrrpt_factors_and_finds_the_rank<B: Backend>(device: &B::Device) {
    let scaled = formula::<B>(3000, 48, 0.6, device)
        * Tensor::<B, 1>::from_data(
            TensorData::new(
                (0..48)
                    .map(|j| 10f32.powf(j as f32 / 16.0))
                    .collect::<Vec<_>>(),
                [48],
            ),
            device,
        )
        .unsqueeze_dim(0);
    let rank17: Vec<f64> = (0..17).map(|i| 3.0 - 0.1 * i as f64).collect();
    for (what, a, rank) in [
        ("full rank", scaled, 48),
        ("rank 17", with_spectrum::<B>(2000, 40, &rank17, device), 17),
        ("rank 1", with_spectrum::<B>(500, 9, &[2.0], device), 1),
        ("square", formula::<B>(33, 33, 0.8, device), 33),
    ] {
        let [m, n] = a.dims();
        let qr = CqrrptConfig::new().decompose(a.clone()).unwrap();
        assert_eq!(qr.rank, rank, "{what}");
        assert_eq!(qr.q.dims(), [m, rank]);
        assert_eq!(qr.r.dims(), [rank, n]);
        let residual =
            frobenius(qr.q.clone().matmul(qr.r) - permuted(a.clone(), &qr.pivots)) / frobenius(a);
        let orthogonality = departure(qr.q);
        assert!(residual <= 1e-5, "{what}: ‖AP − QR‖/‖A‖ = {residual}");
        assert!(orthogonality <= 1e-5, "{what}: ‖QᵀQ − I‖ = {orthogonality}");
    }
}

fn cqrrpt_refuses_bad_input<B: Backend>(device: &B::Device) {
    let config = CqrrptConfig::new();
    assert!(matches!(
        config.decompose(Tensor::<B, 2>::zeros([30, 4], device)),
        Err(LinalgError::RankDeficient { rank: 0, .. })
    ));
    assert!(matches!(
        config.decompose(formula::<B>(4, 30, 0.1, device)),
        Err(LinalgError::InvalidShape { .. })
    ));
    let nan = formula::<B>(30, 4, 0.1, device)
        .slice_assign([7..8, 2..3], Tensor::full([1, 1], f32::NAN, device));
    assert!(matches!(
        config.decompose(nan),
        Err(LinalgError::NonFinite { .. })
    ));
    assert!(matches!(
        config
            .with_sketch_factor(0.5)
            .decompose(formula::<B>(30, 4, 0.1, device)),
        Err(LinalgError::Unsupported { .. })
    ));
}

macro_rules! linalg_suite {
    ($module:ident, $b:ty, $device:expr) => {
        mod $module {
            use super::*;

            #[test]
            fn operators_apply_consistently() {
                super::operators_apply_consistently::<$b>(&$device);
            }
            #[test]
            fn operators_have_their_structure() {
                super::operators_have_their_structure::<$b>(&$device);
            }
            #[test]
            fn operators_refuse_bad_sizes() {
                super::operators_refuse_bad_sizes::<$b>(&$device);
            }
            #[test]
            fn qr_is_orthonormal_and_exact() {
                super::qr_is_orthonormal_and_exact::<$b>(&$device);
            }
            #[test]
            fn qr_refuses_what_it_cannot_factor() {
                super::qr_refuses_what_it_cannot_factor::<$b>(&$device);
            }
            #[test]
            fn pivoted_qr_reveals_rank() {
                super::pivoted_qr_reveals_rank::<$b>(&$device);
            }
            #[test]
            fn singular_values_match_numpy() {
                super::singular_values_match_numpy::<$b>(&$device);
            }
            #[test]
            fn randomized_svd_is_near_optimal() {
                super::randomized_svd_is_near_optimal::<$b>(&$device);
            }
            #[test]
            fn randomized_svd_refuses_bad_input() {
                super::randomized_svd_refuses_bad_input::<$b>(&$device);
            }
            #[test]
            fn cqrrpt_factors_and_finds_the_rank() {
                super::cqrrpt_factors_and_finds_the_rank::<$b>(&$device);
            }
            #[test]
            fn cqrrpt_refuses_bad_input() {
                super::cqrrpt_refuses_bad_input::<$b>(&$device);
            }
        }
    };
}

linalg_suite!(flex, Flex, FlexDevice);
linalg_suite!(ndarray, NdArray, NdArrayDevice::Cpu);
linalg_suite!(wgpu, Wgpu, WgpuDevice::default());
