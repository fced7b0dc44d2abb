//! The tests of [`attention`](super): each case on the portable path and this CPU's, against
//! the `f64` reference.

use super::*;
use crate::testing::uniform;
use ::half::bf16;

/// The paths every test runs on: the portable one and this CPU's.
fn isas() -> [Isa; 2] {
    [Isa::PORTABLE, Isa::detected()]
}

/// Contiguous inputs: `q` `[b, h, sq, d]`, `k` `[b, h, sk, d]`, `v` `[b, h, sk, dv]`,
/// scaled by `amplitude` (scores of several units: the softmax is far from uniform).
struct Inputs {
    dims: [usize; 6],
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl Inputs {
    fn new([b, h, sq, sk, d, dv]: [usize; 6], seed: u64, amplitude: f32) -> Self {
        let scaled = |s, n| {
            uniform(n, s, [-1.0, 1.0])
                .into_iter()
                .map(|x| x * amplitude)
                .collect()
        };
        Self {
            dims: [b, h, sq, sk, d, dv],
            q: scaled(seed, b * h * sq * d),
            k: scaled(seed + 1, b * h * sk * d),
            v: uniform(b * h * sk * dv, seed + 2, [-1.0, 1.0]),
        }
    }

    fn views(&self) -> [View4<'_, f32>; 3] {
        let [b, h, sq, sk, d, dv] = self.dims;
        [
            View4::contiguous(&self.q, [b, h, sq, d]),
            View4::contiguous(&self.k, [b, h, sk, d]),
            View4::contiguous(&self.v, [b, h, sk, dv]),
        ]
    }
}

/// `forward_on(isa, …)` with the given blocks (`None`: the shape's own).
fn run(
    isa: Isa,
    [q, k, v]: [View4<'_, f32>; 3],
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, f32>>,
    options: Options,
    blocks: Option<Blocks>,
    parallel: bool,
) -> Vec<f32> {
    let [b, h, sq, _] = q.shape();
    let dv = v.shape()[3];
    let mut out = vec![f32::NAN; b * h * sq * dv];
    match blocks {
        None => forward_on(isa, &mut out, q, k, v, mask, bias, options, parallel),
        Some(blocks) => {
            Problem::new(q, k, v, mask, bias, options).run(isa, &mut out, None, blocks, parallel)
        }
    }
    out
}

/// The tolerance: each output is a weighted mean of values in `[-1, 1]`, so its error is
/// stated against that scale, `|got − reference| ≤ 1e-5`.
const TOLERANCE: f64 = 1e-5;

fn assert_close(got: &[f32], expected: &[f64], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    let worst = got
        .iter()
        .zip(expected)
        .map(|(&g, &e)| (g as f64 - e).abs())
        .fold(
            0.0f64,
            |w, e| if e.is_nan() { f64::INFINITY } else { w.max(e) },
        );
    assert!(worst <= TOLERANCE, "{what}: worst error {worst:e}");
}

/// Small blocks, so that several query blocks and several key blocks (the online
/// softmax's rescaling) occur on small shapes, and the default ones.
const BLOCKINGS: [Option<Blocks>; 3] = [
    None,
    Some(Blocks { q: 3, k: 5 }),
    Some(Blocks { q: 8, k: 16 }),
];

fn check(dims: [usize; 6], options: Options, what: &str) {
    let inputs = Inputs::new(dims, dims.iter().sum::<usize>() as u64, 3.0);
    let [q, k, v] = inputs.views();
    let expected = reference(q, k, v, None, None, options);
    for isa in isas() {
        for blocks in BLOCKINGS {
            let got = run(isa, inputs.views(), None, None, options, blocks, true);
            assert_close(
                &got,
                &expected,
                &format!("{what} {dims:?} {isa:?} {blocks:?}"),
            );
        }
    }
}

#[test]
fn the_reference_is_the_formula() {
    // One query, two keys: scores (1·1, 1·3)·0.5 = (0.5, 1.5); weights e^0.5, e^1.5.
    let (q, k, v) = ([1.0f32], [1.0f32, 3.0], [2.0f32, -4.0]);
    fn view(data: &[f32], s: usize) -> View4<'_, f32> {
        View4::contiguous(data, [1, 1, s, 1])
    }
    let options = Options {
        scale: Some(0.5),
        ..Options::default()
    };
    let (a, b) = (0.5f64.exp(), 1.5f64.exp());
    let expected = (2.0 * a - 4.0 * b) / (a + b);
    let got = reference(view(&q, 1), view(&k, 2), view(&v, 2), None, None, options);
    assert!((got[0] - expected).abs() < 1e-12, "{got:?}");
    for isa in isas() {
        let mut out = [0.0f32];
        forward_on(
            isa,
            &mut out,
            view(&q, 1),
            view(&k, 2),
            view(&v, 2),
            None,
            None,
            options,
            false,
        );
        assert!((out[0] as f64 - expected).abs() < 1e-6, "{isa:?} {out:?}");
    }
    // The default scale is 1/√d: d = 4 halves the scores.
    let q4 = [0.5f32; 4];
    let k4 = [0.5f32, 0.5, 0.5, 0.5, 1.5, 1.5, 1.5, 1.5];
    let got = reference(
        View4::contiguous(&q4, [1, 1, 1, 4]),
        View4::contiguous(&k4, [1, 1, 2, 4]),
        view(&v, 2),
        None,
        None,
        Options::default(),
    );
    assert!((got[0] - expected).abs() < 1e-12, "{got:?}");
}

#[test]
fn odd_shapes_match_the_reference() {
    let plain = Options::default();
    for dims in [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 37, 8, 8],
        [2, 3, 17, 1, 4, 5],
        [1, 2, 5, 23, 1, 3],
        [2, 2, 19, 33, 64, 64],
        [1, 1, 7, 9, 16, 3],
        [3, 7, 4, 6, 2, 9],
        [1, 1, 130, 300, 8, 8],
    ] {
        check(dims, plain, "plain");
    }
}

#[test]
fn long_keys_take_several_default_blocks() {
    // 1100 keys: three blocks of 512 with the default sizes; the keys grow with their
    // index so that the running maximum rises from block to block (and falls for `-`).
    for sign in [1.0f32, -1.0] {
        let mut inputs = Inputs::new([1, 2, 70, 1100, 16, 16], 11, 1.0);
        for (j, key) in inputs.k.chunks_exact_mut(16).enumerate() {
            let ramp = sign * ((j % 1100) as f32 / 200.0);
            key.iter_mut().for_each(|x| *x += ramp);
        }
        let [q, k, v] = inputs.views();
        let options = Options::default();
        let expected = reference(q, k, v, None, None, options);
        for isa in isas() {
            let got = run(isa, inputs.views(), None, None, options, None, true);
            assert_close(&got, &expected, &format!("ramp {sign} {isa:?}"));
        }
    }
}

#[test]
fn permuted_and_flipped_views_are_read_in_place() {
    // q, k, v stored [b, s, h, d] (a projection before `swap_dims(1, 2)`).
    let [b, h, sq, sk, d, dv] = [2, 3, 11, 13, 8, 6];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 5, 2.0);
    let q = View4::contiguous(&inputs.q, [b, sq, h, d]).permute([0, 2, 1, 3]);
    let k = View4::contiguous(&inputs.k, [b, sk, h, d]).permute([0, 2, 1, 3]);
    // v stored [b, h, dv, s] and read transposed; and keys flipped with a negative
    // stride along the sequence (the values in the same order, so the result is the
    // same attention over a reordered set of keys).
    let v = View4::contiguous(&inputs.v, [b, h, dv, sk]).permute([0, 1, 3, 2]);
    let expected = reference(q, k, v, None, None, Options::default());
    fn flip(view: View4<'_, f32>) -> View4<'_, f32> {
        let [s0, s1, s2, s3] = view.strides;
        let offset = view.position([0, 0, view.shape[2] - 1, 0]) as usize;
        View4::strided(view.data, offset, view.shape, [s0, s1, -s2, s3])
    }
    let (kf, vf) = (flip(k), flip(v));
    // And the reference agrees with itself on a contiguous copy.
    let copy = |view: View4<'_, f32>| -> Vec<f32> {
        let s = view.shape();
        let mut out = Vec::new();
        for i0 in 0..s[0] {
            for i1 in 0..s[1] {
                for i2 in 0..s[2] {
                    for i3 in 0..s[3] {
                        out.push(view.at([i0, i1, i2, i3]));
                    }
                }
            }
        }
        out
    };
    let (qc, kc, vc) = (copy(q), copy(k), copy(v));
    for isa in isas() {
        for blocks in BLOCKINGS {
            let got = run(isa, [q, k, v], None, None, Options::default(), blocks, true);
            assert_close(&got, &expected, &format!("permuted {isa:?} {blocks:?}"));
        }
        let got = run(
            isa,
            [q, kf, vf],
            None,
            None,
            Options::default(),
            Some(Blocks { q: 4, k: 5 }),
            true,
        );
        assert_close(&got, &expected, &format!("keys and values flipped {isa:?}"));
        let contiguous = run(
            isa,
            [
                View4::contiguous(&qc, q.shape()),
                View4::contiguous(&kc, k.shape()),
                View4::contiguous(&vc, v.shape()),
            ],
            None,
            None,
            Options::default(),
            None,
            true,
        );
        assert_close(&contiguous, &expected, &format!("contiguous copy {isa:?}"));
    }
}

#[test]
fn padding_and_full_masks_mask_where_true() {
    let [b, h, sq, sk, d, dv] = [3, 2, 9, 21, 8, 4];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 21, 3.0);
    let [q, k, v] = inputs.views();
    // [b, 1, 1, sk]: batch i has 21 − 7i valid keys (batch 2: 7).
    let padding: Vec<u8> = (0..b * sk)
        .map(|n| (n % sk >= sk - 7 * (n / sk)) as u8)
        .collect();
    // [b, h, sq, sk], random, ~1/3 masked.
    let full: Vec<u8> = uniform(b * h * sq * sk, 99, [-1.0, 1.0])
        .iter()
        .map(|&x| (x < -0.33) as u8)
        .collect();
    let masks = [
        View4::contiguous(&padding, [b, 1, 1, sk]),
        View4::contiguous(&full, [b, h, sq, sk]),
    ];
    for mask in masks {
        let expected = reference(q, k, v, Some(mask), None, Options::default());
        let unmasked = reference(q, k, v, None, None, Options::default());
        assert!(
            expected
                .iter()
                .zip(&unmasked)
                .any(|(a, b)| (a - b).abs() > 1e-3),
            "the mask changes the result"
        );
        for isa in isas() {
            for blocks in BLOCKINGS {
                let got = run(
                    isa,
                    inputs.views(),
                    Some(mask),
                    None,
                    Options::default(),
                    blocks,
                    true,
                );
                assert_close(
                    &got,
                    &expected,
                    &format!("mask {:?} {isa:?} {blocks:?}", mask.shape()),
                );
            }
        }
    }
    // Masking the last keys of the padding equals dropping them.
    let valid = 7;
    let k_short: Vec<f32> = inputs
        .k
        .chunks(sk * d)
        .flat_map(|c| &c[..valid * d])
        .copied()
        .collect();
    let v_short: Vec<f32> = inputs
        .v
        .chunks(sk * dv)
        .flat_map(|c| &c[..valid * dv])
        .copied()
        .collect();
    for isa in isas() {
        let dropped = run(
            isa,
            [
                q,
                View4::contiguous(&k_short, [b, h, valid, d]),
                View4::contiguous(&v_short, [b, h, valid, dv]),
            ],
            None,
            None,
            Options::default(),
            None,
            false,
        );
        let masked = run(
            isa,
            inputs.views(),
            Some(masks[0]),
            None,
            Options::default(),
            None,
            false,
        );
        let last = (b - 1) * h * sq * dv;
        for (x, y) in masked[last..].iter().zip(&dropped[last..]) {
            assert!((x - y).abs() < 1e-6, "{isa:?}: {x} vs {y}");
        }
    }
}

#[test]
fn causal_aligns_at_the_bottom_right() {
    for dims in [
        [2, 2, 5, 17, 8, 8], // sq < sk
        [2, 2, 17, 5, 8, 8], // sq > sk: the first 12 queries see no key
        [1, 3, 33, 33, 16, 7],
        [1, 1, 1, 300, 4, 4],
        [1, 1, 300, 300, 4, 4],
    ] {
        check(
            dims,
            Options {
                causal: true,
                ..Options::default()
            },
            "causal",
        );
    }
    // With sq > sk the first sq − sk rows are zeros exactly; the next sees key 0 only.
    let inputs = Inputs::new([1, 1, 6, 2, 3, 2], 3, 1.0);
    let causal = Options {
        causal: true,
        ..Options::default()
    };
    for isa in isas() {
        let got = run(isa, inputs.views(), None, None, causal, None, true);
        assert_eq!(&got[..8], &[0.0; 8], "{isa:?}");
        assert_eq!(&got[8..10], &inputs.v[..2], "{isa:?}");
    }
}

#[test]
fn bias_and_softcap_match_the_reference() {
    let [b, h, sq, sk, d, dv] = [2, 3, 10, 37, 16, 8];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 8, 4.0);
    let [q, k, v] = inputs.views();
    // [1, h, sq, sk], ALiBi-like, with a −∞ that masks too.
    let mut alibi: Vec<f32> = (0..h * sq * sk)
        .map(|n| -((n / (sq * sk) + 1) as f32) * 0.1 * (n % sk) as f32)
        .collect();
    alibi[3] = f32::NEG_INFINITY;
    let bias = View4::contiguous(&alibi, [1, h, sq, sk]);
    let padding: Vec<u8> = (0..b * sk).map(|n| (n % sk > 30) as u8).collect();
    let mask = View4::contiguous(&padding, [b, 1, 1, sk]);
    for options in [
        Options::default(),
        Options {
            softcap: Some(2.0),
            ..Options::default()
        },
        Options {
            softcap: Some(0.7),
            scale: Some(0.3),
            causal: true,
            dropout: None,
        },
    ] {
        for mask in [None, Some(mask)] {
            let expected = reference(q, k, v, mask, Some(bias), options);
            let plain = reference(q, k, v, mask, None, options);
            assert!(
                expected
                    .iter()
                    .zip(&plain)
                    .any(|(a, b)| (a - b).abs() > 1e-3)
            );
            for isa in isas() {
                for blocks in BLOCKINGS {
                    let got = run(isa, inputs.views(), mask, Some(bias), options, blocks, true);
                    assert_close(&got, &expected, &format!("{options:?} {isa:?} {blocks:?}"));
                }
            }
        }
    }
    // Softcap bounds the scores: with cap 0.01 the weights are nearly uniform.
    let capped = Options {
        softcap: Some(0.01),
        ..Options::default()
    };
    let mean: Vec<f64> = (0..dv)
        .map(|c| (0..sk).map(|j| inputs.v[j * dv + c] as f64).sum::<f64>() / sk as f64)
        .collect();
    for isa in isas() {
        let got = run(isa, inputs.views(), None, None, capped, None, true);
        for c in 0..dv {
            assert!(
                (got[c] as f64 - mean[c]).abs() < 0.02,
                "{isa:?}: {} vs {}",
                got[c],
                mean[c]
            );
        }
    }
}

#[test]
fn fully_masked_rows_are_zero() {
    // The fallback's clamps give 0 for a query that sees no key: by the mask, by a
    // −∞ bias, or (sq > sk) by the causal mask. Other rows are unaffected.
    let [b, h, sq, sk, d, dv] = [1, 2, 4, 40, 8, 5];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 4, 3.0);
    let [q, k, v] = inputs.views();
    // Query 1 fully masked, query 2 masked but for key 39 (in the last key block).
    let mut mask = vec![0u8; sq * sk];
    mask[sk..2 * sk].fill(1);
    mask[2 * sk..3 * sk - 1].fill(1);
    let mask = View4::contiguous(&mask, [1, 1, sq, sk]);
    let mut bias = vec![0.0f32; sq * sk];
    bias[3 * sk..].fill(f32::NEG_INFINITY);
    let bias = View4::contiguous(&bias, [1, 1, sq, sk]);
    let expected = reference(q, k, v, Some(mask), Some(bias), Options::default());
    for isa in isas() {
        for blocks in BLOCKINGS {
            let got = run(
                isa,
                inputs.views(),
                Some(mask),
                Some(bias),
                Options::default(),
                blocks,
                true,
            );
            assert_close(&got, &expected, &format!("{isa:?} {blocks:?}"));
            for hi in 0..h {
                let row = |i: usize| &got[(hi * sq + i) * dv..(hi * sq + i + 1) * dv];
                assert_eq!(row(1), &[0.0; 5], "masked by the mask");
                assert_eq!(row(3), &[0.0; 5], "masked by the bias");
                let last_v = &inputs.v[(hi * sk + sk - 1) * dv..(hi * sk + sk) * dv];
                assert_eq!(row(2), last_v, "one key left: its value");
                assert!(row(0).iter().all(|x| x.abs() > 0.0));
            }
        }
    }
}

/// The portable softmax (no FMA, whatever the compiler vectorises) against the one each
/// path dispatches to (AVX-512 where detected), on one block with every option, after a
/// first block.
#[test]
fn the_portable_softmax_matches_the_dispatched_one() {
    let [b, h, sq, sk, d, dv] = [1, 2, 5, 70, 4, 3];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 12, 1.0);
    let [q, k, v] = inputs.views();
    let mask_data: Vec<u8> = uniform(sq * sk, 5, [-1.0, 1.0])
        .iter()
        .map(|&x| (x > 0.5) as u8)
        .collect();
    let bias_data = uniform(sq * sk, 6, [-1.0, 1.0]);
    let options = Options {
        scale: Some(3.0),
        softcap: Some(2.5),
        causal: true,
        dropout: None,
    };
    let problem = Problem::new(
        q,
        k,
        v,
        Some(View4::contiguous(&mask_data, [1, 1, sq, sk])),
        Some(View4::contiguous(&bias_data, [1, 1, sq, sk])),
        options,
    );
    let scores: Vec<f32> = uniform(sq * 37, 7, [-1.0, 1.0])
        .iter()
        .map(|x| 4.0 * x)
        .collect();
    let acc = uniform(sq * dv, 8, [-1.0, 1.0]);
    let maxes = vec![0.5f32, f32::MIN, 3.0, -2.0, 1.0];
    let sums = vec![2.0f32, 0.0, 1.5, 7.0, 1.0];
    for isa in isas() {
        let step = Step {
            problem: &problem,
            isa,
            bi: 0,
            hi: 1,
            q0: 0,
            k0: 33,
            nk: 37,
            first: false,
        };
        let mut fast = (scores.clone(), acc.clone(), maxes.clone(), sums.clone());
        let mut portable = (scores.clone(), acc.clone(), maxes.clone(), sums.clone());
        step.softmax(&mut fast.0, &mut fast.1, &mut fast.2, &mut fast.3);
        step.softmax_rows::<false>(
            &mut portable.0,
            &mut portable.1,
            &mut portable.2,
            &mut portable.3,
        );
        let pairs = [
            (&fast.0, &portable.0),
            (&fast.1, &portable.1),
            (&fast.2, &portable.2),
            (&fast.3, &portable.3),
        ];
        for (x, y) in pairs {
            for (a, b) in x.iter().zip(y) {
                assert!(
                    (a - b).abs() <= 1e-6 * a.abs().max(1.0),
                    "{isa:?}: {a} vs {b}"
                );
            }
        }
        assert!(fast.0.contains(&0.0) && fast.0.iter().any(|&x| x > 0.5));
    }
}

#[test]
fn a_nan_query_gives_a_nan_row() {
    // As in the fallback: a NaN score makes its row's softmax NaN; other rows are
    // untouched.
    let mut inputs = Inputs::new([1, 2, 3, 40, 4, 2], 2, 1.0);
    inputs.q[4 + 1] = f32::NAN; // head 0, query 1
    for isa in isas() {
        let got = run(
            isa,
            inputs.views(),
            None,
            None,
            Options::default(),
            Some(Blocks { q: 2, k: 16 }),
            true,
        );
        for (n, x) in got.iter().enumerate() {
            assert_eq!(x.is_nan(), n / 2 == 1, "{isa:?} {n}: {x}");
        }
    }
}

#[test]
fn parallel_and_serial_are_identical() {
    // 700 keys: two default key blocks.
    let inputs = Inputs::new([3, 5, 77, 700, 32, 24], 6, 3.0);
    let padding: Vec<u8> = (0..3 * 700).map(|n| (n % 700 > 650) as u8).collect();
    let mask = View4::contiguous(&padding, [3, 1, 1, 700]);
    for options in [
        Options::default(),
        Options {
            causal: true,
            softcap: Some(5.0),
            scale: None,
            dropout: None,
        },
    ] {
        for isa in isas() {
            let serial = run(isa, inputs.views(), Some(mask), None, options, None, false);
            let parallel = run(isa, inputs.views(), Some(mask), None, options, None, true);
            assert!(serial.iter().all(|x| x.is_finite()));
            assert_eq!(
                serial.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                parallel.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{isa:?}"
            );
        }
    }
}

#[test]
fn bf16_is_computed_in_f32() {
    let [b, h, sq, sk, d, dv] = [2, 3, 13, 300, 16, 8];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 9, 2.0);
    let narrow = |x: &[f32]| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let (q, k, v) = (narrow(&inputs.q), narrow(&inputs.k), narrow(&inputs.v));
    let q = View4::contiguous(&q, [b, sq, h, d]).permute([0, 2, 1, 3]);
    let k = View4::contiguous(&k, [b, h, sk, d]);
    let v = View4::contiguous(&v, [b, h, sk, dv]);
    let bias_data = narrow(&uniform(sq * sk, 3, [-1.0, 1.0]));
    let bias = View4::contiguous(&bias_data, [1, 1, sq, sk]);
    let options = Options {
        causal: true,
        ..Options::default()
    };
    let expected = reference(q, k, v, None, Some(bias), options);
    for isa in isas() {
        let mut out = vec![bf16::ZERO; b * h * sq * dv];
        forward_on(isa, &mut out, q, k, v, None, Some(bias), options, true);
        // The output's own rounding: half a bf16 ulp, 2^-9 relative.
        for (&got, &e) in out.iter().zip(&expected) {
            let got = got.to_f64();
            assert!(
                (got - e).abs() <= e.abs() / 256.0 + 1e-5,
                "{isa:?}: {got} vs {e}"
            );
        }
    }
}

#[test]
fn blocks_keep_two_cores_busy() {
    assert_eq!(
        Blocks::for_shape(384, 128, 64, 64),
        Blocks { q: 256, k: 512 }
    );
    assert_eq!(Blocks::for_shape(12, 16, 64, 64), Blocks { q: 8, k: 512 });
    assert_eq!(
        Blocks::for_shape(1, 4096, 128, 128),
        Blocks { q: 256, k: 256 }
    );
    assert_eq!(
        Blocks::for_shape(2, 1024, 64, 64),
        Blocks { q: 128, k: 512 }
    );
}

#[test]
#[should_panic(expected = "does not broadcast")]
fn a_mask_of_the_wrong_shape_is_refused() {
    let inputs = Inputs::new([2, 1, 3, 4, 2, 2], 1, 1.0);
    let mask = [0u8; 3];
    run(
        Isa::detected(),
        inputs.views(),
        Some(View4::contiguous(&mask, [1, 1, 1, 3])),
        None,
        Options::default(),
        None,
        true,
    );
}

#[test]
#[should_panic(expected = "are not [b, h, sq, d]")]
fn mismatched_keys_are_refused() {
    let inputs = Inputs::new([1, 1, 3, 4, 2, 2], 1, 1.0);
    let [q, _, v] = inputs.views();
    let k = View4::contiguous(&inputs.k[..6], [1, 1, 3, 2]);
    run(
        Isa::detected(),
        [q, k, v],
        None,
        None,
        Options::default(),
        None,
        true,
    );
}

#[test]
#[should_panic(expected = "softcap must be positive")]
fn a_negative_softcap_is_refused() {
    let inputs = Inputs::new([1, 1, 2, 2, 2, 2], 1, 1.0);
    let softcap = Options {
        softcap: Some(-1.0),
        ..Options::default()
    };
    run(
        Isa::detected(),
        inputs.views(),
        None,
        None,
        softcap,
        None,
        true,
    );
}

// ---- Training: forward_train's log-sum-exp, dropout, the backward. ----

/// `forward_train_on(isa, …)` with the given forward blocks (`None`: the shape's own): the
/// output and the log-sum-exp.
fn run_train<E: StoredFloat>(
    isa: Isa,
    [q, k, v]: [View4<'_, E>; 3],
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, E>>,
    options: Options,
    blocks: Option<Blocks>,
    parallel: bool,
) -> (Vec<E>, Vec<f32>) {
    let [b, h, sq, _] = q.shape();
    let dv = v.shape()[3];
    let mut out = vec![E::from_f32(f32::NAN); b * h * sq * dv];
    let mut lse = vec![f32::NAN; b * h * sq];
    match blocks {
        None => forward_train_on(
            isa, &mut out, &mut lse, q, k, v, mask, bias, options, parallel,
        ),
        Some(blocks) => Problem::new(q, k, v, mask, bias, options).run(
            isa,
            &mut out,
            Some(&mut lse),
            blocks,
            parallel,
        ),
    }
    (out, lse)
}

/// `forward_train_on` then `backward_on` (or the backward with `blocks`) on `isa`: the
/// output, the log-sum-exp and `[dq, dk, dv]`, all as `f32`.
#[allow(clippy::too_many_arguments)]
fn train<E: StoredFloat>(
    isa: Isa,
    [q, k, v]: [View4<'_, E>; 3],
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, E>>,
    grad_out: View4<'_, E>,
    options: Options,
    blocks: Option<Blocks>,
    parallel: bool,
) -> (Vec<f32>, Vec<f32>, [Vec<f32>; 3]) {
    let ([b, h, sq, d], sk, dv) = (q.shape(), k.shape()[2], v.shape()[3]);
    let (out, lse) = run_train(isa, [q, k, v], mask, bias, options, None, parallel);
    let nan = E::from_f32(f32::NAN);
    let mut dq = vec![nan; b * h * sq * d];
    let mut dk = vec![nan; b * h * sk * d];
    let mut dvv = vec![nan; b * h * sk * dv];
    let out_view = View4::contiguous(&out, [b, h, sq, dv]);
    match blocks {
        None => backward_on(
            isa, q, k, v, mask, bias, out_view, &lse, grad_out, options, &mut dq, &mut dk,
            &mut dvv, parallel,
        ),
        Some(blocks) => Problem::new(q, k, v, mask, bias, options).backward(
            isa,
            backward::Gradients {
                out: out_view,
                lse: &lse,
                grad_out,
            },
            [&mut dq, &mut dk, &mut dvv],
            blocks,
            parallel,
        ),
    }
    let wide = |x: &[E]| x.iter().map(|e| e.to_f32()).collect::<Vec<f32>>();
    (wide(&out), lse, [wide(&dq), wide(&dk), wide(&dvv)])
}

/// The backward's blockings: the defaults (128 × 128) and small ones, so that several query
/// and key blocks (and partly masked causal blocks) occur on small shapes.
const BACK_BLOCKINGS: [Option<Blocks>; 3] = [
    None,
    Some(Blocks { q: 3, k: 5 }),
    Some(Blocks { q: 8, k: 16 }),
];

/// Gradients relative to the largest reference gradient.
const GRAD_TOLERANCE: f64 = 2e-5;

/// A gradient within `tolerance` of the reference, relative to its largest magnitude or 1,
/// whichever is larger (a gradient that is 0 exactly, as with one key, comes out of `f32`
/// cancellations as a few ulps of 1).
fn assert_grad(got: &[f32], want: &[f64], tolerance: f64, what: &str) {
    assert!(
        got.iter().all(|g| g.is_finite()),
        "{what}: a gradient is not finite"
    );
    let error = crate::testing::largest_error(got, want);
    let scale = want.iter().fold(1.0f64, |s, w| s.max(w.abs()));
    assert!(
        error <= tolerance * scale,
        "{what}: error {error:e} above {tolerance:e} × {scale}"
    );
}

/// `lse` against the reference: `+∞` exactly where the reference has it, otherwise within
/// `1e-5` relative (at least absolute).
fn assert_lse(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (n, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w == f64::INFINITY {
            assert_eq!(g, f32::INFINITY, "{what}: lse {n}");
        } else {
            assert!(
                (g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{what}: lse {n}: {g} vs {w}"
            );
        }
    }
}

/// The training pair on `inputs` against the `f64` references, on both paths and every
/// backward blocking.
fn check_train(
    inputs: &Inputs,
    mask: Option<View4<'_, u8>>,
    bias: Option<View4<'_, f32>>,
    options: Options,
    what: &str,
) {
    let [b, h, sq, _, _, dv] = inputs.dims;
    let grad_data = uniform(b * h * sq * dv, 77, [-1.0, 1.0]);
    let grad_out = View4::contiguous(&grad_data, [b, h, sq, dv]);
    let [q, k, v] = inputs.views();
    let (out, lse) = reference_train(q, k, v, mask, bias, options);
    let grads = reference_backward(q, k, v, mask, bias, grad_out, options);
    for isa in isas() {
        for blocks in BACK_BLOCKINGS {
            let what = format!("{what} {:?} {isa:?} {blocks:?}", inputs.dims);
            let (got_out, got_lse, got) =
                train(isa, [q, k, v], mask, bias, grad_out, options, blocks, true);
            assert_close(&got_out, &out, &what);
            assert_lse(&got_lse, &lse, &what);
            for (name, (g, w)) in ["dq", "dk", "dv"].iter().zip(got.iter().zip(&grads)) {
                assert_grad(g, w, GRAD_TOLERANCE, &format!("{what} {name}"));
            }
        }
    }
}

#[test]
fn forward_train_is_forward_bit_for_bit() {
    let [b, h, sq, sk, d, dv] = [2, 3, 19, 41, 8, 5];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 31, 3.0);
    let padding: Vec<u8> = (0..b * sk).map(|n| (n % sk > 30) as u8).collect();
    let mask = View4::contiguous(&padding, [b, 1, 1, sk]);
    let bias_data = uniform(sq * sk, 4, [-1.0, 1.0]);
    let bias = View4::contiguous(&bias_data, [1, 1, sq, sk]);
    let dropout = Some(AttentionDropout { prob: 0.2, seed: 5 });
    for options in [
        Options::default(),
        Options {
            causal: true,
            softcap: Some(2.0),
            ..Options::default()
        },
        Options {
            dropout,
            ..Options::default()
        },
    ] {
        for isa in isas() {
            for blocks in BLOCKINGS {
                let plain = run(
                    isa,
                    inputs.views(),
                    Some(mask),
                    Some(bias),
                    options,
                    blocks,
                    true,
                );
                let (out, _) = run_train(
                    isa,
                    inputs.views(),
                    Some(mask),
                    Some(bias),
                    options,
                    blocks,
                    true,
                );
                let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&plain), bits(&out), "{options:?} {isa:?} {blocks:?}");
            }
        }
    }
}

#[test]
fn lse_matches_the_reference() {
    let [b, h, sq, sk, d, dv] = [2, 2, 9, 700, 8, 4];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 13, 3.0);
    let [q, k, v] = inputs.views();
    // Query 1 fully masked; causal with sq > sk for the second options.
    let mut mask = vec![0u8; sq * sk];
    mask[sk..2 * sk].fill(1);
    let mask = View4::contiguous(&mask, [1, 1, sq, sk]);
    for options in [
        Options::default(),
        Options {
            softcap: Some(3.0),
            scale: Some(0.7),
            ..Options::default()
        },
    ] {
        let (_, want) = reference_train(q, k, v, Some(mask), None, options);
        assert!(want.contains(&f64::INFINITY));
        for isa in isas() {
            for blocks in BLOCKINGS {
                let (_, lse) =
                    run_train(isa, inputs.views(), Some(mask), None, options, blocks, true);
                assert_lse(&lse, &want, &format!("{options:?} {isa:?} {blocks:?}"));
            }
        }
    }
    // sq > sk causal: the first sq − sk queries see no key; sk = 0: none does.
    let inputs = Inputs::new([1, 2, 6, 2, 3, 2], 3, 1.0);
    let causal = Options {
        causal: true,
        ..Options::default()
    };
    let (_, want) = reference_train(
        inputs.views()[0],
        inputs.views()[1],
        inputs.views()[2],
        None,
        None,
        causal,
    );
    for isa in isas() {
        let (_, lse) = run_train(isa, inputs.views(), None, None, causal, None, false);
        assert_lse(&lse, &want, "causal sq > sk");
        assert_eq!(&lse[..4], &[f32::INFINITY; 4]);
    }
}

#[test]
fn dropout_decisions_are_seeded_and_keep_one_minus_p() {
    let shape = [2, 3, 50, 70];
    let count = shape.iter().product::<usize>();
    let a = AttentionDropout { prob: 0.3, seed: 1 };
    let mask = dropout_mask(a, shape);
    assert_eq!(mask.len(), count);
    assert_eq!(mask, dropout_mask(a, shape));
    for index in [0usize, 1, 69, 70, 12_345, count - 1] {
        assert_eq!(mask[index], dropout_keep(a, index as u64));
    }
    let kept = mask.iter().filter(|&&k| k).count() as f64 / count as f64;
    assert!((kept - 0.7).abs() < 0.02, "kept {kept}");
    let other = dropout_mask(AttentionDropout { seed: 2, ..a }, shape);
    let differ = mask.iter().zip(&other).filter(|(x, y)| x != y).count();
    // Independent masks differ in 2·0.3·0.7 = 42% of places.
    assert!(
        (differ as f64 / count as f64 - 0.42).abs() < 0.03,
        "{differ}"
    );
    // Probability 0 keeps everything; a high one keeps little.
    assert!(
        dropout_mask(AttentionDropout { prob: 0.0, ..a }, shape)
            .iter()
            .all(|&k| k)
    );
    let few = dropout_mask(AttentionDropout { prob: 0.9, ..a }, shape);
    let kept = few.iter().filter(|&&k| k).count() as f64 / count as f64;
    assert!((kept - 0.1).abs() < 0.02, "kept {kept}");
}

#[test]
#[should_panic(expected = "must be in [0, 1)")]
fn a_dropout_probability_of_one_is_refused() {
    let inputs = Inputs::new([1, 1, 2, 2, 2, 2], 1, 1.0);
    let options = Options {
        dropout: Some(AttentionDropout { prob: 1.0, seed: 0 }),
        ..Options::default()
    };
    run(
        Isa::detected(),
        inputs.views(),
        None,
        None,
        options,
        None,
        true,
    );
}

#[test]
#[should_panic(expected = "must be in [0, 1)")]
fn a_negative_dropout_probability_is_refused() {
    dropout_mask(
        AttentionDropout {
            prob: -0.1,
            seed: 0,
        },
        [1, 1, 1, 1],
    );
}

#[test]
fn backward_matches_the_reference_on_odd_shapes() {
    for dims in [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 37, 8, 8],
        [2, 3, 17, 1, 4, 5],
        [1, 2, 5, 23, 1, 3],
        [1, 1, 7, 9, 16, 3],
        [3, 2, 4, 6, 2, 9],
        [2, 2, 19, 33, 64, 64],
        // Several default blocks of 128 queries and of 128 keys.
        [1, 1, 150, 300, 8, 8],
    ] {
        let inputs = Inputs::new(dims, dims.iter().sum::<usize>() as u64, 3.0);
        check_train(&inputs, None, None, Options::default(), "plain");
    }
}

#[test]
fn backward_is_causal_at_the_bottom_right() {
    let causal = Options {
        causal: true,
        ..Options::default()
    };
    for dims in [
        [2, 2, 5, 17, 8, 8], // sq < sk
        [2, 2, 17, 5, 8, 8], // sq > sk: the first 12 queries see no key
        [1, 3, 33, 33, 16, 7],
        [1, 1, 1, 300, 4, 4],
        [1, 1, 300, 300, 4, 4], // key blocks past the boundary skipped
        [1, 1, 300, 150, 4, 6],
    ] {
        let inputs = Inputs::new(dims, dims.iter().sum::<usize>() as u64, 3.0);
        check_train(&inputs, None, None, causal, "causal");
    }
}

#[test]
fn backward_with_padding_bias_and_softcap_matches_the_reference() {
    let [b, h, sq, sk, d, dv] = [3, 2, 10, 37, 16, 8];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 8, 4.0);
    // [1, h, sq, sk], ALiBi-like, with a −∞ that masks too.
    let mut alibi: Vec<f32> = (0..h * sq * sk)
        .map(|n| -((n / (sq * sk) + 1) as f32) * 0.1 * (n % sk) as f32)
        .collect();
    alibi[3] = f32::NEG_INFINITY;
    let bias = View4::contiguous(&alibi, [1, h, sq, sk]);
    // [b, 1, 1, sk]: batch i has 37 − 9i valid keys.
    let padding: Vec<u8> = (0..b * sk)
        .map(|n| (n % sk >= sk - 9 * (n / sk)) as u8)
        .collect();
    let mask = View4::contiguous(&padding, [b, 1, 1, sk]);
    for options in [
        Options::default(),
        Options {
            softcap: Some(2.0),
            ..Options::default()
        },
        Options {
            softcap: Some(0.7),
            scale: Some(0.3),
            causal: true,
            dropout: None,
        },
    ] {
        for (mask, bias) in [
            (Some(mask), None),
            (None, Some(bias)),
            (Some(mask), Some(bias)),
        ] {
            check_train(&inputs, mask, bias, options, &format!("{options:?}"));
        }
    }
}

#[test]
fn fully_masked_rows_have_zero_gradients() {
    let [b, h, sq, sk, d, dv] = [1, 2, 4, 40, 8, 5];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 4, 3.0);
    // Query 1 fully masked by the mask, query 3 by a −∞ bias; key 7 masked for every query.
    let mut mask = vec![0u8; sq * sk];
    mask[sk..2 * sk].fill(1);
    for i in 0..sq {
        mask[i * sk + 7] = 1;
    }
    let mask = View4::contiguous(&mask, [1, 1, sq, sk]);
    let mut bias = vec![0.0f32; sq * sk];
    bias[3 * sk..].fill(f32::NEG_INFINITY);
    let bias = View4::contiguous(&bias, [1, 1, sq, sk]);
    check_train(
        &inputs,
        Some(mask),
        Some(bias),
        Options::default(),
        "masked",
    );
    let grad_data = uniform(b * h * sq * dv, 7, [-1.0, 1.0]);
    let grad_out = View4::contiguous(&grad_data, [b, h, sq, dv]);
    for isa in isas() {
        for blocks in BACK_BLOCKINGS {
            let (_, _, [dq, dk, dvv]) = train(
                isa,
                inputs.views(),
                Some(mask),
                Some(bias),
                grad_out,
                Options::default(),
                blocks,
                true,
            );
            assert!(dq.iter().chain(&dk).chain(&dvv).all(|x| x.is_finite()));
            for hi in 0..h {
                for i in [1, 3] {
                    let row = &dq[(hi * sq + i) * d..(hi * sq + i + 1) * d];
                    assert_eq!(row, &[0.0; 8], "{isa:?} {blocks:?} query {i}");
                }
                let key = (hi * sk + 7) * d;
                assert_eq!(&dk[key..key + d], &[0.0; 8], "masked key");
                assert_eq!(&dvv[(hi * sk + 7) * dv..][..dv], &[0.0; 5], "masked value");
            }
        }
    }
    // Causal with sq > sk: the first sq − sk queries' gradients are 0.
    let inputs = Inputs::new([1, 1, 6, 2, 3, 2], 3, 1.0);
    let causal = Options {
        causal: true,
        ..Options::default()
    };
    check_train(&inputs, None, None, causal, "causal sq > sk");
    let grad_data = uniform(12, 7, [-1.0, 1.0]);
    let grad_out = View4::contiguous(&grad_data, [1, 1, 6, 2]);
    for isa in isas() {
        let (_, _, [dq, ..]) = train(
            isa,
            inputs.views(),
            None,
            None,
            grad_out,
            causal,
            None,
            true,
        );
        assert_eq!(&dq[..12], &[0.0; 12], "{isa:?}");
    }
}

#[test]
fn backward_reproduces_the_forwards_dropout() {
    let dims = [2, 3, 21, 45, 8, 6];
    let inputs = Inputs::new(dims, 17, 2.0);
    let padding: Vec<u8> = (0..2 * 45).map(|n| (n % 45 > 40) as u8).collect();
    let mask = View4::contiguous(&padding, [2, 1, 1, 45]);
    let dropout = AttentionDropout {
        prob: 0.25,
        seed: 0xDEAD_BEEF,
    };
    for options in [
        Options {
            dropout: Some(dropout),
            ..Options::default()
        },
        Options {
            dropout: Some(dropout),
            causal: true,
            softcap: Some(3.0),
            scale: None,
        },
    ] {
        check_train(&inputs, Some(mask), None, options, "dropout");
        // Dropout changes the output and another seed changes it again.
        let [q, k, v] = inputs.views();
        let plain = reference(
            q,
            k,
            v,
            Some(mask),
            None,
            Options {
                dropout: None,
                ..options
            },
        );
        let dropped = reference(q, k, v, Some(mask), None, options);
        let reseeded = reference(
            q,
            k,
            v,
            Some(mask),
            None,
            Options {
                dropout: Some(AttentionDropout { seed: 1, ..dropout }),
                ..options
            },
        );
        let far = |x: &[f64], y: &[f64]| x.iter().zip(y).any(|(a, b)| (a - b).abs() > 1e-2);
        assert!(far(&plain, &dropped) && far(&dropped, &reseeded));
    }
    // Larger than a default block both ways.
    let inputs = Inputs::new([1, 1, 140, 260, 8, 8], 2, 2.0);
    let options = Options {
        dropout: Some(AttentionDropout { prob: 0.5, seed: 3 }),
        ..Options::default()
    };
    check_train(&inputs, None, None, options, "dropout long");
}

#[test]
fn backward_reads_permuted_views_in_place() {
    let [b, h, sq, sk, d, dv] = [2, 3, 11, 13, 8, 6];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 5, 2.0);
    // q, k stored [b, s, h, d]; v stored [b, h, dv, s]; the output and its gradient stored
    // [b, s, h, dv].
    let q = View4::contiguous(&inputs.q, [b, sq, h, d]).permute([0, 2, 1, 3]);
    let k = View4::contiguous(&inputs.k, [b, sk, h, d]).permute([0, 2, 1, 3]);
    let v = View4::contiguous(&inputs.v, [b, h, dv, sk]).permute([0, 1, 3, 2]);
    let grad_data = uniform(b * sq * h * dv, 9, [-1.0, 1.0]);
    let grad_out = View4::contiguous(&grad_data, [b, sq, h, dv]).permute([0, 2, 1, 3]);
    let options = Options {
        causal: true,
        ..Options::default()
    };
    let want = reference_backward(q, k, v, None, None, grad_out, options);
    for isa in isas() {
        let mut out = vec![0.0f32; b * h * sq * dv];
        let mut lse = vec![0.0f32; b * h * sq];
        forward_train_on(isa, &mut out, &mut lse, q, k, v, None, None, options, true);
        // The output moved to [b, s, h, dv] and read back permuted.
        let mut moved = vec![0.0f32; out.len()];
        for bi in 0..b {
            for hi in 0..h {
                for i in 0..sq {
                    let from = ((bi * h + hi) * sq + i) * dv;
                    let to = ((bi * sq + i) * h + hi) * dv;
                    moved[to..to + dv].copy_from_slice(&out[from..from + dv]);
                }
            }
        }
        let out_view = View4::contiguous(&moved, [b, sq, h, dv]).permute([0, 2, 1, 3]);
        let mut dq = vec![f32::NAN; b * h * sq * d];
        let mut dk = vec![f32::NAN; b * h * sk * d];
        let mut dvv = vec![f32::NAN; b * h * sk * dv];
        backward_on(
            isa, q, k, v, None, None, out_view, &lse, grad_out, options, &mut dq, &mut dk,
            &mut dvv, true,
        );
        for (name, (g, w)) in ["dq", "dk", "dv"]
            .iter()
            .zip([&dq, &dk, &dvv].iter().zip(&want))
        {
            assert_grad(g, w, GRAD_TOLERANCE, &format!("{isa:?} {name}"));
        }
    }
}

#[test]
fn backward_in_bf16_is_computed_in_f32() {
    let [b, h, sq, sk, d, dv] = [2, 3, 13, 150, 16, 8];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 9, 2.0);
    let narrow = |x: &[f32]| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let (q, k, v) = (narrow(&inputs.q), narrow(&inputs.k), narrow(&inputs.v));
    let q = View4::contiguous(&q, [b, sq, h, d]).permute([0, 2, 1, 3]);
    let k = View4::contiguous(&k, [b, h, sk, d]);
    let v = View4::contiguous(&v, [b, h, sk, dv]);
    let grad_data = narrow(&uniform(b * h * sq * dv, 4, [-1.0, 1.0]));
    let grad_out = View4::contiguous(&grad_data, [b, h, sq, dv]);
    let options = Options {
        causal: true,
        dropout: Some(AttentionDropout { prob: 0.1, seed: 8 }),
        ..Options::default()
    };
    let want = reference_backward(q, k, v, None, None, grad_out, options);
    for isa in isas() {
        for blocks in BACK_BLOCKINGS {
            let (_, _, got) = train(isa, [q, k, v], None, None, grad_out, options, blocks, true);
            // The stored output's rounding (2⁻⁹ relative) enters D; the gradients round once.
            for (name, (g, w)) in ["dq", "dk", "dv"].iter().zip(got.iter().zip(&want)) {
                assert_grad(g, w, 1e-2, &format!("bf16 {isa:?} {blocks:?} {name}"));
            }
        }
    }
}

#[test]
fn empty_problems_give_zero_gradients() {
    // [b, h, sq, sk, d, dv] with sk = 0, sq = 0, dv = 0, b = 0.
    for dims in [
        [1, 2, 3, 0, 4, 5],
        [1, 2, 0, 3, 4, 5],
        [2, 1, 3, 4, 2, 0],
        [0, 2, 3, 4, 2, 2],
    ] {
        let inputs = Inputs::new(dims, 1, 1.0);
        let [b, h, sq, _, _, dv] = dims;
        let grad_data = uniform(b * h * sq * dv, 2, [-1.0, 1.0]);
        let grad_out = View4::contiguous(&grad_data, [b, h, sq, dv]);
        for isa in isas() {
            for parallel in [false, true] {
                let (out, lse, grads) = train(
                    isa,
                    inputs.views(),
                    None,
                    None,
                    grad_out,
                    Options::default(),
                    None,
                    parallel,
                );
                assert!(out.iter().all(|&x| x == 0.0), "{dims:?}");
                for g in &grads {
                    assert!(g.iter().all(|&x| x == 0.0), "{dims:?} {isa:?}");
                }
                if dims[3] == 0 {
                    assert!(lse.iter().all(|&x| x == f32::INFINITY), "{dims:?}");
                }
            }
        }
    }
}

#[test]
fn backward_parallel_and_serial_are_identical() {
    // 3·5 heads of 77 queries by 300 keys: above the threshold of the parallel loop.
    let inputs = Inputs::new([3, 5, 77, 300, 32, 24], 6, 3.0);
    let padding: Vec<u8> = (0..3 * 300).map(|n| (n % 300 > 250) as u8).collect();
    let mask = View4::contiguous(&padding, [3, 1, 1, 300]);
    let grad_data = uniform(3 * 5 * 77 * 24, 3, [-1.0, 1.0]);
    let grad_out = View4::contiguous(&grad_data, [3, 5, 77, 24]);
    let options = Options {
        causal: true,
        softcap: Some(5.0),
        dropout: Some(AttentionDropout {
            prob: 0.1,
            seed: 11,
        }),
        scale: None,
    };
    for isa in isas() {
        let serial = train(
            isa,
            inputs.views(),
            Some(mask),
            None,
            grad_out,
            options,
            None,
            false,
        );
        let parallel = train(
            isa,
            inputs.views(),
            Some(mask),
            None,
            grad_out,
            options,
            None,
            true,
        );
        let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (s, p) in serial.2.iter().zip(&parallel.2) {
            assert!(s.iter().all(|x| x.is_finite()));
            assert_eq!(bits(s), bits(p), "{isa:?}");
        }
    }
}

#[test]
fn backward_matches_finite_differences() {
    // L = Σ grad_out ∘ out, differentiated numerically on the f64 reference (each input
    // moved by ±1e-3 as f32, the step taken as the rounded one), against the reference
    // backward and the kernels.
    let [b, h, sq, sk, d, dv] = [1, 2, 4, 5, 3, 2];
    let inputs = Inputs::new([b, h, sq, sk, d, dv], 23, 1.5);
    let grad_data = uniform(b * h * sq * dv, 24, [-1.0, 1.0]);
    let mut mask_data = vec![0u8; sq * sk];
    mask_data[2] = 1;
    let bias_data = uniform(sq * sk, 25, [-0.5, 0.5]);
    let options = Options {
        causal: true,
        softcap: Some(1.5),
        scale: Some(0.8),
        dropout: Some(AttentionDropout {
            prob: 0.25,
            seed: 9,
        }),
    };
    let grad_out = View4::contiguous(&grad_data, [b, h, sq, dv]);
    let mask = View4::contiguous(&mask_data, [1, 1, sq, sk]);
    let bias = View4::contiguous(&bias_data, [1, 1, sq, sk]);
    let loss = |q: &[f32], k: &[f32], v: &[f32]| -> f64 {
        let out = reference(
            View4::contiguous(q, [b, h, sq, d]),
            View4::contiguous(k, [b, h, sk, d]),
            View4::contiguous(v, [b, h, sk, dv]),
            Some(mask),
            Some(bias),
            options,
        );
        out.iter().zip(&grad_data).map(|(o, &g)| o * g as f64).sum()
    };
    let mut numeric: [Vec<f64>; 3] = Default::default();
    for (which, grads) in numeric.iter_mut().enumerate() {
        let base = [&inputs.q, &inputs.k, &inputs.v][which];
        for n in 0..base.len() {
            let moved = |delta: f32| {
                let mut x = [inputs.q.clone(), inputs.k.clone(), inputs.v.clone()];
                x[which][n] += delta;
                let step = x[which][n] as f64 - base[n] as f64;
                (loss(&x[0], &x[1], &x[2]), step)
            };
            let ((up, step_up), (down, step_down)) = (moved(1e-3), moved(-1e-3));
            grads.push((up - down) / (step_up - step_down));
        }
    }
    let want = reference_backward(
        inputs.views()[0],
        inputs.views()[1],
        inputs.views()[2],
        Some(mask),
        Some(bias),
        grad_out,
        options,
    );
    let narrow = |x: &[f64]| x.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    for (name, (n, w)) in ["dq", "dk", "dv"].iter().zip(numeric.iter().zip(&want)) {
        assert!(w.iter().any(|&x| x.abs() > 1e-2), "{name} is not trivial");
        assert_grad(&narrow(w), n, 1e-5, &format!("reference {name}"));
    }
    for isa in isas() {
        let (_, _, got) = train(
            isa,
            inputs.views(),
            Some(mask),
            Some(bias),
            grad_out,
            options,
            Some(Blocks { q: 3, k: 2 }),
            false,
        );
        for (name, (g, n)) in ["dq", "dk", "dv"].iter().zip(got.iter().zip(&numeric)) {
            assert_grad(g, n, 1e-4, &format!("{isa:?} {name}"));
        }
    }
}
