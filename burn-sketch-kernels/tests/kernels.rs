//! The kernels against the plain-Rust reference: on wgpu (in CI, Mesa's lavapipe on the
//! CPU), or on CUDA with `--features cuda` (the binary is built here and run on a GPU machine).
//! One test binary, so the kernels are compiled once per run.

use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_sketch_kernels::reference::HostLayer;
use burn_sketch_kernels::{
    Activation, CubeWeights, ForwardPath, KernelError, Operands, backward, choose_forward_path,
    forward, forward_with,
};

#[cfg(feature = "cuda")]
use cubecl::cuda::{CudaDevice as Device, CudaRuntime as Runtime};
#[cfg(not(feature = "cuda"))]
use cubecl::wgpu::{WgpuDevice as Device, WgpuRuntime as Runtime};

/// The plain CubeCL backend, named explicitly: `burn::backend::Wgpu` becomes a fusion wrapper
/// when any crate in the build enables burn's `fusion` feature.
type B = burn_cubecl::CubeBackend<Runtime, f32, i32, u32>;

fn client() -> cubecl::prelude::ComputeClient<Runtime> {
    Tensor::<B, 1>::zeros([1], &Device::default())
        .into_primitive()
        .tensor()
        .client
}

/// `len` values in `[-1, 1)`, the kernels crate's seeded draws.
fn values(len: usize, seed: u64) -> Vec<f32> {
    burn_cpu_kernels::testing::uniform(len, seed, [-1.0, 1.0])
}

fn upload(data: &[f32], shape: &[usize], dtype: DType) -> CubeTensor<Runtime> {
    let tensor = Tensor::<B, 1>::from_data(
        TensorData::new(data.to_vec(), [data.len()]),
        &Device::default(),
    );
    match shape.len() {
        1 => tensor.cast(dtype).into_primitive().tensor(),
        2 => tensor
            .reshape([shape[0], shape[1]])
            .cast(dtype)
            .into_primitive()
            .tensor(),
        3 => tensor
            .reshape([shape[0], shape[1], shape[2]])
            .cast(dtype)
            .into_primitive()
            .tensor(),
        rank => panic!("rank {rank} not used here"),
    }
}

fn download(tensor: CubeTensor<Runtime>) -> Vec<f32> {
    let numel = tensor.meta.num_elements();
    Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(tensor))
        .reshape([numel])
        .cast(DType::F32)
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

/// Asserts `|actual - expected| ≤ tolerance · (|expected| + max|expected|)` elementwise: a
/// relative bound that does not blow up on entries near zero.
fn assert_close(actual: &[f32], expected: &[f32], tolerance: f32, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    let scale = expected.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(
        scale > 0.0,
        "{what}: the reference is all zeros, the test proves nothing"
    );
    for (index, (a, e)) in actual.iter().zip(expected).enumerate() {
        let bound = tolerance * (e.abs() + scale);
        assert!(
            (a - e).abs() <= bound,
            "{what}: element {index}: kernel {a}, reference {e} (bound {bound})"
        );
    }
}

/// One test problem: a layer, an input and an upstream gradient.
struct Case {
    rows: usize,
    d_in: usize,
    d_out: usize,
    terms: usize,
    rank: usize,
    bias: bool,
}

struct Data {
    x: Vec<f32>,
    s1s: Vec<f32>,
    s2s: Vec<f32>,
    u1s: Vec<f32>,
    u2s: Vec<f32>,
    bias: Vec<f32>,
    grad: Vec<f32>,
}

impl Case {
    fn data(&self, seed: u64) -> Data {
        let input = self.terms * self.d_in * self.rank;
        let output = self.terms * self.rank * self.d_out;
        Data {
            x: values(self.rows * self.d_in, seed),
            s1s: values(input, seed + 1),
            s2s: values(output, seed + 2),
            u1s: values(output, seed + 3),
            u2s: values(input, seed + 4),
            bias: values(self.d_out, seed + 5),
            grad: values(self.rows * self.d_out, seed + 6),
        }
    }

    fn host<'a>(&self, data: &'a Data) -> HostLayer<'a> {
        HostLayer {
            terms: self.terms,
            d_in: self.d_in,
            low_rank: self.rank,
            d_out: self.d_out,
            s1s: &data.s1s,
            s2s: &data.s2s,
            u1s: &data.u1s,
            u2s: &data.u2s,
        }
    }

    fn factors(&self, data: &Data, dtype: DType) -> CubeWeights<Runtime> {
        let input = [self.terms, self.d_in, self.rank];
        let output = [self.terms, self.rank, self.d_out];
        CubeWeights {
            s1s: upload(&data.s1s, &input, dtype),
            s2s: upload(&data.s2s, &output, dtype),
            u1s: upload(&data.u1s, &output, dtype),
            u2s: upload(&data.u2s, &input, dtype),
        }
    }

    fn name(&self) -> String {
        format!(
            "n={} d_in={} d_out={} T={} k={} bias={}",
            self.rows, self.d_in, self.d_out, self.terms, self.rank, self.bias
        )
    }
}

/// The shape grid of the issue: sizes of 1, primes, non-multiples of 16; T ∈ {1,2,3,8};
/// k ∈ {1,7,16,64,128}; ranks 2Tk up to 512 (beyond the fused kernel's limit); depths long
/// enough for the split-depth products.
fn grid() -> Vec<Case> {
    let shapes = [
        // rows, d_in, d_out, terms, rank
        (1, 1, 1, 1, 1),
        (1, 17, 5, 1, 7),
        (3, 31, 29, 2, 7),
        (16, 16, 16, 1, 16),
        (37, 67, 43, 3, 16),
        (5, 130, 97, 8, 1),
        (64, 48, 80, 8, 16),
        (19, 75, 33, 1, 64),
        (7, 129, 61, 2, 64),
        (33, 47, 131, 1, 128),
        (2, 41, 23, 2, 128),
        // Long depths and few output tiles: the products split their depth (see `gemm`).
        (3, 1000, 900, 2, 7),
        (40, 2100, 37, 1, 16),
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(index, &(rows, d_in, d_out, terms, rank))| Case {
            rows,
            d_in,
            d_out,
            terms,
            rank,
            bias: index % 2 == 0,
        })
        .collect()
}

fn run_forward(
    case: &Case,
    data: &Data,
    path: ForwardPath,
    dtype: DType,
    activation: Activation,
) -> Vec<f32> {
    let x = upload(&data.x, &[case.rows, case.d_in], dtype);
    let bias = case.bias.then(|| upload(&data.bias, &[case.d_out], dtype));
    let weights = case.factors(data, dtype);
    download(forward_with(x, &weights, bias, activation, path).unwrap())
}

/// Each case's activation: the grid cycles through all three, so every path meets each.
const ACTIVATIONS: [Activation; 3] = [Activation::Identity, Activation::Relu, Activation::Gelu];

#[test]
fn forward_matches_reference_on_both_paths() {
    for (seed, case) in grid().iter().enumerate() {
        // Seeds whose small ReLU cases keep some positive outputs (the reference check refuses
        // an all-zero one, which would prove nothing).
        let data = case.data(seed as u64 * 10 + 1);
        let activation = ACTIVATIONS[seed % ACTIVATIONS.len()];
        let bias = case.bias.then_some(&data.bias[..]);
        let expected = case
            .host(&data)
            .forward(&data.x, case.rows, bias, activation);
        let rank_width = 2 * case.terms * case.rank;
        let mut paths = vec![ForwardPath::Tiled];
        if rank_width <= burn_sketch_kernels::fused::MAX_FUSED_RANK {
            paths.push(ForwardPath::Fused { column_groups: 1 });
            paths.push(ForwardPath::Fused { column_groups: 3 });
            paths.push(ForwardPath::Split { column_groups: 1 });
            paths.push(ForwardPath::Split { column_groups: 3 });
        }
        for path in paths {
            let actual = run_forward(case, &data, path, DType::F32, activation);
            assert_close(
                &actual,
                &expected,
                1e-4,
                &format!("forward {path:?} {activation:?} {}", case.name()),
            );
        }
    }
}

#[test]
fn forward_path_choice_follows_the_shape() {
    let client = client();
    // Many rows, a short depth: the fused kernel.
    assert!(matches!(
        choose_forward_path(&client, 4096, 256, 32, 8192),
        ForwardPath::Fused { .. }
    ));
    // A rank beyond the fused kernel's shared memory: tiled.
    assert_eq!(
        choose_forward_path(&client, 4096, 256, 512, 8192),
        ForwardPath::Tiled
    );
    // Few rows and a long depth: the projection is split, and the fused kernel adds the
    // slices.
    assert!(matches!(
        choose_forward_path(&client, 256, 8192, 32, 8192),
        ForwardPath::Split { .. }
    ));
    // A tiny output cannot be split into more groups than it has column tiles.
    assert_eq!(
        choose_forward_path(&client, 1, 64, 32, 20),
        ForwardPath::Fused { column_groups: 2 }
    );
}

#[test]
fn split_depth_matches_one_pass() {
    use burn_sketch_kernels::gemm::{GemmProblem, gemm};
    let (rows, cols, depth) = (5, 19, 1003);
    let lhs = values(rows * depth, 1);
    let rhs = values(depth * cols, 2);
    let bias = values(cols, 3);
    let alpha = 0.5f32;
    let expected: Vec<f32> = (0..rows * cols)
        .map(|index| {
            let (i, j) = (index / cols, index % cols);
            let dot: f64 = (0..depth)
                .map(|m| lhs[i * depth + m] as f64 * rhs[m * cols + j] as f64)
                .sum();
            (alpha as f64 * dot + bias[j] as f64) as f32
        })
        .collect();
    let lhs = upload(&lhs, &[rows, depth], DType::F32);
    let rhs = upload(&rhs, &[depth, cols], DType::F32);
    let bias = upload(&bias, &[cols], DType::F32);
    // 1 is no split; 7 does not divide the 63 depth chunks; 100 asks for more slices than
    // there are chunks.
    for splits in [1, 2, 7, 100] {
        let out = upload(&vec![0.0; rows * cols], &[rows, cols], DType::F32);
        let problem = GemmProblem::new(rows, cols, depth)
            .with_alpha(alpha)
            .with_splits(splits);
        gemm(&problem, (&lhs, &rhs), Some(&bias), &out);
        assert_close(&download(out), &expected, 1e-5, &format!("{splits} splits"));
    }
}

#[test]
fn backward_matches_reference() {
    for (seed, case) in grid().iter().enumerate() {
        let data = case.data(seed as u64 * 10 + 3);
        let expected = case.host(&data).backward(&data.x, case.rows, &data.grad);
        let x = upload(&data.x, &[case.rows, case.d_in], DType::F32);
        let grad = upload(&data.grad, &[case.rows, case.d_out], DType::F32);
        let grads = backward(x, &case.factors(&data, DType::F32), grad, Operands::ALL).unwrap();
        let name = case.name();
        for (actual, expected, what) in [
            (grads.x, &expected.x, "∂x"),
            (grads.s1s, &expected.s1s, "∂S1s"),
            (grads.s2s, &expected.s2s, "∂S2s"),
            (grads.u1s, &expected.u1s, "∂U1s"),
            (grads.u2s, &expected.u2s, "∂U2s"),
        ] {
            let actual = download(actual.unwrap_or_else(|| panic!("{what} was not computed")));
            assert_close(&actual, expected, 1e-4, &format!("{what} {name}"));
        }
    }
}

/// Each gradient alone, the sets `SkLinear` asks for (first layer: `∂S1`, `∂S2`; later
/// layers: and `∂x`), and pairs that read one half of `∂P` or `P` each: the backward computes
/// only the halves of `∂P` and `P` the wanted gradients read, and reads each at its offset.
/// On a short depth (one launch of products) and a long one (split, then added).
#[test]
fn backward_computes_only_what_is_wanted() {
    let flags = |names: &[&str]| Operands {
        x: names.contains(&"x"),
        s1s: names.contains(&"s1s"),
        s2s: names.contains(&"s2s"),
        u1s: names.contains(&"u1s"),
        u2s: names.contains(&"u2s"),
    };
    let sets: [&[&str]; 10] = [
        &["x"],
        &["s1s"],
        &["s2s"],
        &["u1s"],
        &["u2s"],
        &["s1s", "s2s"],
        &["x", "s1s", "s2s"],
        &["s1s", "u1s"],
        &["u2s", "s2s"],
        &["x", "u2s", "u1s"],
    ];
    let cases = [
        Case {
            rows: 9,
            d_in: 20,
            d_out: 12,
            terms: 2,
            rank: 3,
            bias: false,
        },
        Case {
            rows: 6,
            d_in: 1500,
            d_out: 700,
            terms: 1,
            rank: 5,
            bias: false,
        },
    ];
    for case in &cases {
        let data = case.data(99);
        let expected = case.host(&data).backward(&data.x, case.rows, &data.grad);
        for set in sets {
            let wanted = flags(set);
            let x = upload(&data.x, &[case.rows, case.d_in], DType::F32);
            let grad = upload(&data.grad, &[case.rows, case.d_out], DType::F32);
            let grads = backward(x, &case.factors(&data, DType::F32), grad, wanted).unwrap();
            for (name, actual, expected) in [
                ("x", grads.x, &expected.x),
                ("s1s", grads.s1s, &expected.s1s),
                ("s2s", grads.s2s, &expected.s2s),
                ("u1s", grads.u1s, &expected.u1s),
                ("u2s", grads.u2s, &expected.u2s),
            ] {
                let what = format!("∂{name} of {set:?}, {}", case.name());
                match (set.contains(&name), actual) {
                    (true, Some(actual)) => {
                        assert_close(&download(actual), expected, 1e-4, &what);
                    }
                    (false, None) => {}
                    (true, None) => panic!("{what}: wanted, not computed"),
                    (false, Some(_)) => panic!("{what}: computed, not wanted"),
                }
            }
        }
    }
}

/// Three products in one launch, one of them on a transposed left operand at an offset and
/// one joining two right-hand tensors, each against its own plain product; then the same
/// products' depths split into partial sums and added by one launch for two of them.
#[test]
fn grouped_products_match_separate_ones() {
    use burn_sketch_kernels::gemm::{
        Concat, GemmProblem, Product, gemm, launch_group, reduce_splits, workspace,
    };
    use burn_sketch_kernels::layout::Layout;
    let reference = |lhs: &[f32], rhs: &[f32], (rows, cols, depth): (usize, usize, usize)| {
        (0..rows * cols)
            .map(|index| {
                let (i, j) = (index / cols, index % cols);
                (0..depth)
                    .map(|m| lhs[i * depth + m] as f64 * rhs[m * cols + j] as f64)
                    .sum::<f64>() as f32
            })
            .collect::<Vec<f32>>()
    };
    // Product 0: a [5, 300] by [300, 7] product, scaled.
    let (a, b) = (values(5 * 300, 1), values(300 * 7, 2));
    // Product 1: columns 4.. of a [600, 10] matrix, transposed (6 × 600), by a [600, 9].
    let (c, d) = (values(600 * 10, 3), values(600 * 9, 4));
    let c_cols: Vec<f32> = (0..6)
        .flat_map(|i| (0..600).map(move |m| (i, m)))
        .map(|(i, m)| c[m * 10 + 4 + i])
        .collect();
    // Product 2: [3, 40] by [40, 5 | 40, 6] joined side by side.
    let (e, f, g) = (values(3 * 40, 5), values(40 * 5, 6), values(40 * 6, 7));
    let fg: Vec<f32> = (0..40)
        .flat_map(|m| (0..11).map(move |j| (m, j)))
        .map(|(m, j)| {
            if j < 5 {
                f[m * 5 + j]
            } else {
                g[m * 6 + j - 5]
            }
        })
        .collect();
    let expected = [
        reference(&a, &b, (5, 7, 300))
            .iter()
            .map(|v| 0.5 * v)
            .collect(),
        reference(&c_cols, &d, (6, 9, 600)),
        reference(&e, &fg, (3, 11, 40)),
    ];
    let up = |data: &[f32], shape: [usize; 2]| upload(data, &shape, DType::F32);
    let (a, b) = (up(&a, [5, 300]), up(&b, [300, 7]));
    let (c, d) = (up(&c, [600, 10]), up(&d, [600, 9]));
    let (e, f, g) = (up(&e, [3, 40]), up(&f, [40, 5]), up(&g, [40, 6]));
    let problems = [
        GemmProblem::new(5, 7, 300).with_alpha(0.5),
        GemmProblem::new(6, 9, 600)
            .with_layouts((Layout::Transposed, Layout::RowMajor, Layout::RowMajor), 1)
            .with_offsets(4, 0),
        GemmProblem::new(3, 11, 40),
    ];
    let operands = [
        (&a, &b, None),
        (&c, &d, None),
        (&e, &f, Some((&g, Concat::Cols, 5))),
    ];
    for splits in [1, 3] {
        let outputs: Vec<_> = problems
            .iter()
            .map(|p| up(&vec![0.0; p.rows * p.cols], [p.rows, p.cols]))
            .collect();
        let problems = problems.map(|problem| problem.with_splits(splits));
        let targets: Vec<_> = if splits == 1 {
            outputs.clone()
        } else {
            problems.iter().map(|p| workspace(&outputs[0], p)).collect()
        };
        let products: Vec<_> = (0..3)
            .map(|i| Product {
                problem: problems[i],
                lhs: operands[i].0,
                rhs: operands[i].1,
                tail: operands[i].2,
                out: &targets[i],
            })
            .collect();
        launch_group(&products, None, splits > 1);
        if splits > 1 {
            // Products 0 and 1 in one launch; product 2 through `gemm` on its own.
            let slab = |i: usize| (&problems[i], &targets[i], &outputs[i]);
            reduce_splits(slab(0), Some(slab(1)), None);
            let p = GemmProblem::new(3, 11, 40);
            let out = &outputs[2];
            burn_sketch_kernels::gemm::gemm_concat(
                &p,
                &e,
                (&f, Some((&g, Concat::Cols, 5))),
                None,
                out,
            );
        }
        for (index, output) in outputs.into_iter().enumerate() {
            let what = format!("product {index}, {splits} slices");
            assert_close(&download(output), &expected[index], 1e-5, &what);
        }
    }
    // A single `gemm` with a bias, against the same product plus the bias.
    let bias_values = values(7, 8);
    let bias = upload(&bias_values, &[7], DType::F32);
    let out = up(&[0.0; 35], [5, 7]);
    gemm(&problems[0], (&a, &b), Some(&bias), &out);
    let with_bias: Vec<f32> = expected[0]
        .iter()
        .enumerate()
        .map(|(i, v)| v + bias_values[i % 7])
        .collect();
    assert_close(&download(out), &with_bias, 1e-5, "gemm with a bias");
}

#[test]
fn transposed_input_is_read_in_place() {
    // `x` arrives as the transpose of a `[d_in, n]` tensor: strides (1, n), no copy.
    let case = Case {
        rows: 13,
        d_in: 21,
        d_out: 18,
        terms: 2,
        rank: 5,
        bias: true,
    };
    let data = case.data(7);
    let expected = case
        .host(&data)
        .forward(&data.x, case.rows, Some(&data.bias), Activation::Gelu);
    let transposed: Vec<f32> = (0..case.d_in)
        .flat_map(|m| (0..case.rows).map(move |i| (i, m)))
        .map(|(i, m)| data.x[i * case.d_in + m])
        .collect();
    let x = Tensor::<B, 2>::from_data(
        TensorData::new(transposed, [case.d_in, case.rows]),
        &Device::default(),
    )
    .transpose()
    .into_primitive()
    .tensor();
    assert!(!x.is_contiguous(), "the test needs a strided input");
    let bias = upload(&data.bias, &[case.d_out], DType::F32);
    for path in [
        ForwardPath::Tiled,
        ForwardPath::Fused { column_groups: 2 },
        ForwardPath::Split { column_groups: 2 },
    ] {
        let actual = download(
            forward_with(
                x.clone(),
                &case.factors(&data, DType::F32),
                Some(bias.clone()),
                Activation::Gelu,
                path,
            )
            .unwrap(),
        );
        assert_close(&actual, &expected, 1e-4, &format!("strided x, {path:?}"));
    }
}

/// Half-precision inputs against the `f64` reference: inputs rounded to the half type
/// (relative 2^-11 for f16, 2^-8 for bf16) dominate, and accumulation in f32 adds little.
/// A device without the type fails the test rather than skipping it.
fn half_precision_accumulates_in_f32(dtype: DType, tolerance: f32) {
    let client = client();
    let storage: cubecl::ir::StorageType = dtype.into();
    assert!(
        client.properties().supports_type(storage),
        "this device does not support {dtype:?}"
    );
    // A long reduction (d_in = 1000) that a half-precision accumulator would visibly round;
    // few rows, so the tiled path splits its depth.
    let case = Case {
        rows: 17,
        d_in: 1000,
        d_out: 40,
        terms: 1,
        rank: 16,
        bias: true,
    };
    let data = case.data(5);
    let host = case.host(&data);
    let expected = host.forward(&data.x, case.rows, Some(&data.bias), Activation::Relu);
    let expected_grads = host.backward(&data.x, case.rows, &data.grad);
    for path in [
        ForwardPath::Tiled,
        ForwardPath::Fused { column_groups: 1 },
        ForwardPath::Split { column_groups: 1 },
    ] {
        let actual = run_forward(&case, &data, path, dtype, Activation::Relu);
        let what = format!("{dtype:?} forward {path:?}");
        assert_close(&actual, &expected, tolerance, &what);
    }
    let x = upload(&data.x, &[case.rows, case.d_in], dtype);
    let grad = upload(&data.grad, &[case.rows, case.d_out], dtype);
    let grads = backward(x, &case.factors(&data, dtype), grad, Operands::ALL).unwrap();
    for (actual, expected, what) in [
        (grads.x, &expected_grads.x, "∂x"),
        (grads.s1s, &expected_grads.s1s, "∂S1s"),
        (grads.s2s, &expected_grads.s2s, "∂S2s"),
    ] {
        let actual = download(actual.unwrap());
        assert_close(&actual, expected, tolerance, &format!("{dtype:?} {what}"));
    }
}

#[test]
fn f16_accumulates_in_f32() {
    half_precision_accumulates_in_f32(DType::F16, 1e-2);
}

/// wgpu has no bf16 (lavapipe, the CI driver, has none), so this runs with `--features cuda`
/// only; elsewhere the harness lists it as ignored rather than passed.
#[test]
#[cfg_attr(
    not(feature = "cuda"),
    ignore = "wgpu devices have no bf16; runs with --features cuda"
)]
fn bf16_accumulates_in_f32() {
    half_precision_accumulates_in_f32(DType::BF16, 3e-2);
}

/// The launchers refuse operands that do not fit together, with an error naming the operand,
/// before anything is launched.
#[test]
fn launchers_refuse_mismatched_operands() {
    let case = Case {
        rows: 4,
        d_in: 9,
        d_out: 6,
        terms: 2,
        rank: 3,
        bias: true,
    };
    let data = case.data(11);
    let weights = case.factors(&data, DType::F32);
    let x = upload(&data.x, &[case.rows, case.d_in], DType::F32);
    let bias = upload(&data.bias, &[case.d_out], DType::F32);

    let narrow = upload(&data.x[..case.rows * 8], &[case.rows, 8], DType::F32);
    match forward(narrow, &weights, None, Activation::Identity) {
        Err(KernelError::Shape {
            operand: "x",
            found,
            ..
        }) => assert_eq!(found, vec![4, 8]),
        other => panic!("x of the wrong width: {other:?}"),
    }
    let mut swapped = weights.clone();
    swapped.u1s = weights.u2s.clone();
    match forward(x.clone(), &swapped, None, Activation::Identity) {
        Err(KernelError::Shape {
            operand: "u1s",
            found,
            ..
        }) => assert_eq!(found, vec![2, 9, 3]),
        other => panic!("u1s in u2s's shape: {other:?}"),
    }
    let short_bias = upload(&data.bias[..5], &[5], DType::F32);
    assert!(matches!(
        forward(x.clone(), &weights, Some(short_bias), Activation::Identity),
        Err(KernelError::Shape {
            operand: "bias",
            ..
        })
    ));
    let half_bias = upload(&data.bias, &[case.d_out], DType::F16);
    match forward(x.clone(), &weights, Some(half_bias), Activation::Identity) {
        Err(KernelError::DType {
            operand,
            found,
            expected,
        }) => {
            assert_eq!((operand, found, expected), ("bias", DType::F16, DType::F32));
        }
        other => panic!("an f16 bias with f32 weights: {other:?}"),
    }
    let short_grad = upload(&data.grad[..6], &[1, 6], DType::F32);
    assert!(matches!(
        backward(x.clone(), &weights, short_grad, Operands::ALL),
        Err(KernelError::Shape {
            operand: "grad_output",
            ..
        })
    ));
    let wide = Case {
        terms: 8,
        rank: 17,
        ..case
    };
    let wide_data = wide.data(12);
    match forward_with(
        x,
        &wide.factors(&wide_data, DType::F32),
        Some(bias),
        Activation::Identity,
        ForwardPath::Fused { column_groups: 1 },
    ) {
        Err(KernelError::FusedRankTooWide {
            rank: 272,
            max: 256,
        }) => {}
        other => panic!("a fused forward of rank 272: {other:?}"),
    }
}
