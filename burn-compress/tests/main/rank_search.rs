//! `RankSearch` on Flex: it keeps the cheapest size whose quality passes, tunes groups one
//! after the other on the previous winners, leaves every other layer bit for bit, draws
//! reproducible random searches, and refuses bad settings before evaluating anything.

use std::cell::RefCell;
use std::ops::RangeInclusive;

use burn::backend::Flex;
use burn::backend::flex::FlexDevice;
use burn::config::Config;
use burn::module::Module;
use burn::tensor::TensorData;
use burn::tensor::backend::Backend;
use burn_compress::{
    AnyLinear, AnyLinearConfig, CompressError, Converter, Cost, CostMetric, LinearKind, RankSearch,
    Search, SearchReport, Selection, SketchSize, Threshold,
};

type B = Flex;
const DEVICE: FlexDevice = FlexDevice;

#[derive(Module, Debug)]
struct Block<B: Backend> {
    up: AnyLinear<B>,
    down: AnyLinear<B>,
}

#[derive(Module, Debug)]
struct Net<B: Backend> {
    blocks: Vec<Block<B>>,
    head: AnyLinear<B>,
}

/// Two blocks of 64 → 96 → 64 and a 64 → `head_out` head, all dense, initialised.
fn net(head_out: usize) -> Net<B> {
    let net = Net {
        blocks: (0..2)
            .map(|_| Block {
                up: AnyLinearConfig::new(64, 96).init(&DEVICE),
                down: AnyLinearConfig::new(96, 64).init(&DEVICE),
            })
            .collect(),
        head: AnyLinearConfig::new(64, head_out).init(&DEVICE),
    };
    burn_memory::draw_params(&net);
    net
}

/// Every layer's path and kind.
fn kinds(model: &Net<B>) -> Vec<(String, LinearKind)> {
    Converter::layers::<B, _>(model)
        .into_iter()
        .map(|layer| (layer.path, layer.kind))
        .collect()
}

/// A synthetic quality that rises with the rank: the smallest `low_rank` among the sketched
/// layers (a dense layer counts as rank 1000). `T` does not help it.
fn min_rank(model: &Net<B>) -> f64 {
    kinds(model)
        .into_iter()
        .map(|(_, kind)| match kind {
            LinearKind::Sketched { low_rank, .. } => low_rank as f64,
            _ => 1000.0,
        })
        .fold(f64::INFINITY, f64::min)
}

fn dense_params(d_in: usize, d_out: usize) -> usize {
    LinearKind::Dense.trainable_params(d_in, d_out, true)
}

#[test]
fn keeps_the_cheapest_passing_size_and_leaves_other_layers_alone() {
    let model = net(10);
    let original = model.clone();
    let calls = RefCell::new(0);
    let quality = |m: &Net<B>| {
        *calls.borrow_mut() += 1;
        min_rank(m)
    };
    // Passing: k ≥ 16. (T=2, k=8) costs as much as (1, 16) but fails; (2, 32) passes but costs
    // more than the dense layers; (2, 16) and (1, 32) pass and are cheaper than dense, but cost
    // twice (1, 16), and (2, 16) comes first: the first eligible size is not the answer.
    let outcome = RankSearch::new(
        Search::grid([2, 1], [32, 16, 8, 4]),
        Threshold::AtLeast(16.0),
    )
    .group("blocks", Selection::types(["Block"]))
    .run(model, quality, Cost::TrainableBytes)
    .unwrap();
    let report = &outcome.report;
    let chosen = SketchSize::new(1, 16);
    assert_eq!(report.winner("blocks"), Some(chosen));
    assert_eq!(
        *calls.borrow(),
        1 + 8,
        "the baseline, then one call per trial"
    );
    assert_eq!(report.trials.len(), 8);
    for trial in &report.trials {
        assert_eq!(trial.passed, trial.low_rank >= 16, "{trial:?}");
        assert_eq!(trial.quality, trial.low_rank as f64);
    }
    assert_eq!(
        report.groups[0].layers,
        [
            "blocks.0.up",
            "blocks.0.down",
            "blocks.1.up",
            "blocks.1.down"
        ]
    );

    // The applied model has the winner in every block layer, and the head stays dense.
    for (path, kind) in kinds(&outcome.model) {
        let expected = if path == "head" {
            LinearKind::Dense
        } else {
            chosen.into()
        };
        assert_eq!(kind, expected, "{path}");
    }
    // Untouched layers are bit for bit the original ones.
    assert_eq!(
        outcome.model.head.to_dense_weight().into_data(),
        original.head.to_dense_weight().into_data()
    );
    let (Some(tuned_bias), Some(original_bias)) = (head_bias(&outcome.model), head_bias(&original))
    else {
        panic!("the head has a bias");
    };
    assert_eq!(tuned_bias, original_bias);

    // Trainable bytes: the fixed sketches are not counted, f32 is 4 bytes.
    let blocks_dense = 2 * (dense_params(64, 96) + dense_params(96, 64));
    let blocks_sketched = 2
        * (LinearKind::from(chosen).trainable_params(64, 96, true)
            + LinearKind::from(chosen).trainable_params(96, 64, true));
    let head = dense_params(64, 10);
    assert_eq!(report.baseline.trainable, blocks_dense + head);
    assert_eq!(report.baseline.cost, (4 * (blocks_dense + head)) as f64);
    assert_eq!(report.tuned().trainable, blocks_sketched + head);
    assert_eq!(report.tuned().cost, (4 * (blocks_sketched + head)) as f64);
    assert_eq!(report.cost_metric, CostMetric::TrainableBytes);

    // The three forms of the report.
    let table = report.to_string();
    assert!(table.contains("| blocks | 1 | 16 | 16.0000 |"), "{table}");
    assert_eq!(table.matches("**yes**").count(), 1, "{table}");
    let csv = report.to_csv();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "group,num_terms,low_rank,quality,cost,passed,trainable,chosen"
    );
    assert_eq!(lines.len(), 9);
    assert!(
        lines.contains(
            &format!(
                "blocks,1,16,16,{},true,{},true",
                4 * (blocks_sketched + head),
                blocks_sketched + head
            )
            .as_str()
        ),
        "{csv}"
    );
    let json = report.to_json();
    assert_eq!(&SearchReport::load_binary(json.as_bytes()).unwrap(), report);
}

fn head_bias(model: &Net<B>) -> Option<TensorData> {
    match model.head.layer() {
        burn_compress::LinearLayer::Dense(linear) => {
            linear.bias.as_ref().map(|b| b.val().into_data())
        }
        _ => None,
    }
}

#[test]
fn groups_are_tuned_one_after_the_other_on_the_previous_winners() {
    let model = net(32);
    // What each call of the cost saw: the head's kind and dense weight, the blocks' kinds.
    let seen = RefCell::new(Vec::new());
    let cost = Cost::measured(|m: &Net<B>| {
        let layers = Converter::layers::<B, _>(m);
        let blocks: Vec<LinearKind> = layers[..4].iter().map(|l| l.kind).collect();
        seen.borrow_mut()
            .push((m.head.kind(), m.head.to_dense_weight().into_data(), blocks));
        // A stand-in for a timed step: the trainable parameters.
        Ok::<_, CompressError>(layers.iter().map(|l| l.trainable).sum::<usize>() as f64)
    });
    // The head is tuned first, over ranks of its own; `All` then picks the rest (the layers
    // the head group did not take).
    let outcome = RankSearch::new(Search::grid([1, 2], [4, 12, 16]), Threshold::AtLeast(8.0))
        .group_with_search(
            "head",
            Selection::paths(["head"]),
            Search::grid([1], [2, 4, 8]),
        )
        .group("rest", Selection::All)
        .run(model, |m: &Net<B>| min_rank(m), cost)
        .unwrap();
    let report = &outcome.report;
    assert_eq!(report.cost_metric, CostMetric::Measured);
    assert_eq!(report.winner("head"), Some(SketchSize::new(1, 8)));
    // k = 4 fails; (1, 12) is the cheapest of the rest (the head's k = 8 still passes).
    assert_eq!(report.winner("rest"), Some(SketchSize::new(1, 12)));
    assert_eq!(report.groups[0].layers, ["head"]);
    assert_eq!(report.groups[1].layers.len(), 4);
    assert!(!report.groups[1].layers.contains(&"head".to_string()));
    assert_eq!(report.trials.len(), 3 + 6);
    assert!(report.trials[..3].iter().all(|t| t.group == "head"));

    let seen = seen.into_inner();
    assert_eq!(seen.len(), 1 + 3 + 6);
    let dense_blocks = vec![LinearKind::Dense; 4];
    // Baseline and the head's trials: the blocks are dense.
    for (i, (head, _, blocks)) in seen[..4].iter().enumerate() {
        assert_eq!(blocks, &dense_blocks, "call {i}");
        let expected = match i {
            0 => LinearKind::Dense,
            _ => SketchSize::new(1, [2, 4, 8][i - 1]).into(),
        };
        assert_eq!(*head, expected, "call {i}");
    }
    // The rest's trials: the head holds its winner, the very same sketched layer each time.
    let winner_weight = &seen[4].1;
    for (i, (head, weight, blocks)) in seen[4..].iter().enumerate() {
        assert_eq!(*head, SketchSize::new(1, 8).into(), "trial {i} of the rest");
        assert_eq!(weight, winner_weight, "trial {i} of the rest");
        let size = SketchSize::new([1, 1, 1, 2, 2, 2][i], [4, 12, 16][i % 3]);
        assert_eq!(blocks, &vec![LinearKind::from(size); 4]);
    }
    // The returned model holds both winners, and the head is the one evaluated.
    assert_eq!(outcome.model.head.kind(), SketchSize::new(1, 8).into());
    assert_eq!(
        &outcome.model.head.to_dense_weight().into_data(),
        winner_weight
    );
    for (path, kind) in kinds(&outcome.model) {
        if path != "head" {
            assert_eq!(kind, SketchSize::new(1, 12).into(), "{path}");
        }
    }
}

#[test]
fn a_group_that_cannot_pass_or_pay_stays_dense() {
    // The head (64 → 4) is smaller sketched at no size tried: a sketch of rank k costs
    // k·68 parameters against 256 dense.
    let model = net(4);
    let original = model.clone();
    let outcome = RankSearch::new(Search::grid([1], [4, 8]), Threshold::AtLeast(4.0))
        .group("blocks", Selection::types(["Block"]))
        .group("head", Selection::paths(["head"]))
        .run(model, |m: &Net<B>| min_rank(m), Cost::TrainableBytes)
        .unwrap();
    let report = &outcome.report;
    assert_eq!(report.winner("blocks"), Some(SketchSize::new(1, 4)));
    assert_eq!(report.winner("head"), None);
    let reason = report.groups[1].kept_dense.as_deref().unwrap();
    assert!(reason.contains("costs at least as much"), "{reason}");
    assert!(report.trials.iter().all(|t| t.passed));
    assert_eq!(outcome.model.head.kind(), LinearKind::Dense);
    assert_eq!(
        outcome.model.head.to_dense_weight().into_data(),
        original.head.to_dense_weight().into_data()
    );
    assert_eq!(report.tuned(), report.groups[0].after);
    assert!(report.to_string().contains("kept dense"));

    // A group whose quality never passes stays dense too; the other is still sketched.
    let original = net(32);
    let outcome = RankSearch::new(Search::grid([1], [4, 8]), Threshold::AtLeast(0.5))
        .group("head", Selection::paths(["head"]))
        .group("blocks", Selection::types(["Block"]))
        .run(
            original.clone(),
            |m: &Net<B>| f64::from(m.head.kind() == LinearKind::Dense),
            Cost::TrainableBytes,
        )
        .unwrap();
    let reason = outcome.report.groups[0].kept_dense.as_deref().unwrap();
    assert!(reason.contains("no size reaches quality ≥ 0.5"), "{reason}");
    assert_eq!(outcome.report.winner("blocks"), Some(SketchSize::new(1, 4)));
    assert_eq!(
        outcome.model.head.to_dense_weight().into_data(),
        original.head.to_dense_weight().into_data()
    );
}

#[test]
fn seeded_random_search_is_reproducible_and_in_range() {
    let search = Search::random(1..=3, 5..=40, 12, 42);
    let drawn = search.candidates().unwrap();
    assert_eq!(drawn, search.candidates().unwrap());
    assert_eq!(drawn.len(), 12);
    for size in &drawn {
        assert!((1..=3).contains(&size.num_terms), "{size}");
        assert!((5..=40).contains(&size.low_rank), "{size}");
    }
    let mut distinct = drawn.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), drawn.len(), "no size is tried twice");
    // The draws spread over the ranges.
    assert!(drawn.iter().any(|s| s.num_terms != drawn[0].num_terms));
    assert!(drawn.iter().any(|s| s.low_rank != drawn[0].low_rank));
    assert_ne!(
        drawn,
        Search::random(1..=3, 5..=40, 12, 43).candidates().unwrap()
    );
    // SplitMix64 depends only on the seed: the same pairs on every machine and build.
    assert_eq!(&drawn[..3], PINNED);

    // A space no larger than `trials` is tried whole, each pair once.
    let mut all = Search::random(1..=2, 7..=9, 50, 1).candidates().unwrap();
    all.sort();
    let grid = Search::grid([1, 2], [7, 8, 9]).candidates().unwrap();
    assert_eq!(all, grid);

    // The search tries the drawn pairs, in order.
    let outcome = RankSearch::new(search, Threshold::AtLeast(0.0))
        .group("blocks", Selection::types(["Block"]))
        .run(net(10), |m: &Net<B>| min_rank(m), Cost::TrainableBytes)
        .unwrap();
    let tried: Vec<SketchSize> = outcome.report.trials.iter().map(|t| t.size()).collect();
    assert_eq!(tried, drawn);
}

const PINNED: &[SketchSize] = &[
    SketchSize {
        num_terms: 3,
        low_rank: 10,
    },
    SketchSize {
        num_terms: 1,
        low_rank: 17,
    },
    SketchSize {
        num_terms: 1,
        low_rank: 36,
    },
];

/// Runs `search` on a fresh model with a quality that counts its calls; returns the error and
/// the number of calls.
fn run_err(search: RankSearch) -> (CompressError, usize) {
    let mut calls = 0;
    let err = search
        .run(
            net(10),
            |m: &Net<B>| {
                calls += 1;
                min_rank(m)
            },
            Cost::TrainableBytes,
        )
        .expect_err("the settings are bad");
    (err, calls)
}

#[test]
fn bad_settings_are_typed_errors_before_any_evaluation() {
    let grid = || Search::grid([1], [8, 16]);
    let blocks = || Selection::types(["Block"]);

    // A path that names no layer.
    let (err, calls) = run_err(
        RankSearch::new(grid(), Threshold::AtLeast(1.0))
            .group("blocks", Selection::paths(["blocks.7.up"])),
    );
    assert!(
        matches!(&err, CompressError::NoMatch { pattern, .. } if pattern == "blocks.7.up"),
        "{err}"
    );
    assert_eq!(calls, 0);

    // k = 0, T = 0 in a grid or a range.
    for (search, field) in [
        (Search::grid([1], [0, 8]), "grid.low_rank"),
        (Search::grid([0], [8]), "grid.num_terms"),
        (Search::random(1..=2, 0..=8, 4, 1), "random.low_rank"),
        (Search::random(0..=2, 1..=8, 4, 1), "random.num_terms"),
    ] {
        let (err, calls) =
            run_err(RankSearch::new(search, Threshold::AtLeast(1.0)).group("blocks", blocks()));
        assert!(
            matches!(err, CompressError::InvalidConfig { name, value: 0, .. } if name == field),
            "{field}: {err}"
        );
        assert_eq!(calls, 0);
    }

    // An empty grid, an empty range, no trials.
    for (search, field) in [
        (Search::grid([], [8]), "grid.num_terms"),
        (Search::grid([1], []), "grid.low_rank"),
        (
            Search::random(1..=2, RangeInclusive::new(9, 8), 4, 1),
            "random.low_rank",
        ),
        (Search::random(1..=2, 1..=8, 0, 1), "random.trials"),
    ] {
        let (err, _) =
            run_err(RankSearch::new(search, Threshold::AtLeast(1.0)).group("blocks", blocks()));
        assert!(
            matches!(err, CompressError::InvalidConfig { name, .. } if name == field),
            "{field}: {err}"
        );
    }
    // A group's own search is checked too, before the first group runs.
    let (err, calls) = run_err(
        RankSearch::new(grid(), Threshold::AtLeast(1.0))
            .group("blocks", blocks())
            .group_with_search("head", Selection::paths(["head"]), Search::grid([1], [])),
    );
    assert!(matches!(err, CompressError::InvalidConfig { .. }), "{err}");
    assert_eq!(calls, 0);

    // No group; two groups of one name; a NaN threshold.
    let (err, _) = run_err(RankSearch::new(grid(), Threshold::AtLeast(1.0)));
    assert!(
        matches!(err, CompressError::InvalidConfig { name: "groups", .. }),
        "{err}"
    );
    let (err, _) = run_err(
        RankSearch::new(grid(), Threshold::AtLeast(1.0))
            .group("g", blocks())
            .group("g", Selection::paths(["head"])),
    );
    assert!(
        matches!(
            err,
            CompressError::InvalidConfig {
                name: "groups",
                value: 1,
                ..
            }
        ),
        "{err}"
    );
    let (err, calls) =
        run_err(RankSearch::new(grid(), Threshold::AtMost(f64::NAN)).group("blocks", blocks()));
    assert!(matches!(err, CompressError::Unsupported { .. }), "{err}");
    assert_eq!(calls, 0);

    // A group left with no layer of its own.
    let (err, calls) = run_err(
        RankSearch::new(grid(), Threshold::AtLeast(1.0))
            .group("all", Selection::All)
            .group("blocks", blocks()),
    );
    assert!(
        matches!(&err, CompressError::NoMatch { pattern, .. } if pattern.contains("`blocks`")),
        "{err}"
    );
    assert_eq!(calls, 0);
}

#[test]
fn no_passing_size_anywhere_is_nothing_passes_with_the_best_quality() {
    let (err, calls) = run_err(
        RankSearch::new(Search::grid([1, 2], [8, 32]), Threshold::AtLeast(100.0))
            .group("blocks", Selection::types(["Block"]))
            .group("head", Selection::paths(["head"])),
    );
    let CompressError::NothingPasses { reason } = &err else {
        panic!("expected NothingPasses, got {err}");
    };
    assert!(
        reason.contains("the best quality reached is 32 (group `blocks`, T=1 k=32)"),
        "{reason}"
    );
    assert!(reason.contains("quality ≥ 100"), "{reason}");
    assert_eq!(calls, 1 + 4 + 4, "every group is tried before giving up");
}

/// The caller's error type carries both its own errors and the search's.
#[derive(Debug)]
enum AppError {
    Tuner(CompressError),
    Eval(&'static str),
}

impl From<CompressError> for AppError {
    fn from(err: CompressError) -> Self {
        Self::Tuner(err)
    }
}

#[test]
fn the_callers_errors_end_the_run_unchanged() {
    let mut calls = 0;
    let result = RankSearch::new(Search::grid([1], [4, 8, 16]), Threshold::AtLeast(1.0))
        .group("blocks", Selection::types(["Block"]))
        .try_run(
            net(10),
            |m: &Net<B>| {
                calls += 1;
                if calls == 3 {
                    return Err(AppError::Eval("out of data"));
                }
                Ok(min_rank(m))
            },
            Cost::TrainableBytes,
        );
    assert!(matches!(result, Err(AppError::Eval("out of data"))));
    assert_eq!(calls, 3);
    let result = RankSearch::new(Search::grid([1], [4]), Threshold::AtLeast(1.0))
        .group("blocks", Selection::paths(["nowhere"]))
        .try_run(net(10), |m: &Net<B>| Ok(min_rank(m)), Cost::TrainableBytes);
    assert!(matches!(
        result,
        Err(AppError::Tuner(CompressError::NoMatch { .. }))
    ));
}

#[test]
fn a_never_used_model_keeps_its_untouched_layers_through_every_trial() {
    // Built and handed over without a use: its parameters are still lazy.
    let model = Net::<B> {
        blocks: vec![Block {
            up: AnyLinearConfig::new(16, 16).init(&DEVICE),
            down: AnyLinearConfig::new(16, 16).init(&DEVICE),
        }],
        head: AnyLinearConfig::new(16, 16).init(&DEVICE),
    };
    let heads = RefCell::new(Vec::new());
    let outcome = RankSearch::new(Search::grid([1], [2, 4]), Threshold::AtLeast(0.0))
        .group("blocks", Selection::types(["Block"]))
        .run(
            model,
            |m: &Net<B>| {
                heads
                    .borrow_mut()
                    .push(m.head.to_dense_weight().into_data());
                min_rank(m)
            },
            Cost::TrainableBytes,
        )
        .unwrap();
    let heads = heads.into_inner();
    assert_eq!(heads.len(), 3);
    assert!(heads.iter().all(|head| *head == heads[0]));
    assert_eq!(outcome.model.head.to_dense_weight().into_data(), heads[0]);
}
