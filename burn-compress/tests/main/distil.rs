//! Distillation (`burn_compress::distil`) on a model that is not a pretrained encoder: two
//! pre-norm transformer blocks whose MLPs are made low-rank, then trained to reproduce the
//! dense blocks' states. The loss must fall and the output's fidelity to the original rise
//! on inputs the training never saw; bad configurations and mismatched states are errors.

use std::ops::ControlFlow;

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use burn_compress::{
    CompressError, Converter, DistilConfig, DistilLoss, DistilStates, Distillable, LinearKind,
    Selection, TransformerBlock, TransformerBlockConfig, distil, output_cosine,
};
use burn_memory::draw_params;
use burn_sketch::SketchBackend;

use crate::close::serial;

type A = Autodiff<Flex>;

/// Two blocks in sequence, without dropout: the first block's output is the matched
/// intermediate state, the second's the output.
#[derive(Module, Debug)]
struct Stack<B: Backend> {
    blocks: Vec<TransformerBlock<B>>,
}

impl<B: SketchBackend> Distillable<B> for Stack<B> {
    type Input = Tensor<B, 3>;
    fn distil_states(&self, input: &Tensor<B, 3>) -> DistilStates<B> {
        let mut x = input.clone();
        let mut layers = Vec::new();
        for block in &self.blocks {
            x = block.forward(x, None);
            layers.push(x.clone());
        }
        let output = layers.pop().expect("two blocks");
        DistilStates {
            layers,
            output,
            weights: None,
        }
    }
}

const WIDTH: usize = 32;
const STEPS: usize = 200;

/// The dense teacher (on Flex) and its copy with every MLP layer low-rank at rank 4 (a
/// quarter of the `32 → 128` layer's rank), on `Autodiff<Flex>`.
fn teacher_and_student() -> (Stack<Flex>, Stack<A>) {
    let device = Default::default();
    A::seed(&device, 7);
    let config = TransformerBlockConfig::new(WIDTH, 4, 4 * WIDTH)
        .with_dropout(0.0)
        .with_causal(false);
    let model = Stack::<A> {
        blocks: (0..2).map(|_| config.init(&device)).collect(),
    };
    draw_params(&model);
    let teacher = model.valid();
    let (student, report) = Converter::new()
        .rule(
            Selection::paths(["blocks.*.mlp"]),
            LinearKind::LowRank { rank: 4 },
        )
        .apply(model)
        .expect("the MLPs convert");
    assert_eq!(report.layers.len(), 4);
    (teacher, student)
}

fn random_batch<B: Backend>(device: &B::Device) -> Tensor<B, 3> {
    Tensor::random([4, 6, WIDTH], Distribution::Normal(0.0, 1.0), device)
}

#[test]
fn distillation_lowers_the_loss_and_raises_the_fidelity() {
    let _serial = serial();
    let (teacher, student) = teacher_and_student();
    let device = Default::default();
    let held_out = random_batch::<Flex>(&device);
    let fidelity = |model: &Stack<Flex>| {
        output_cosine(
            &model.distil_states(&held_out),
            &teacher.distil_states(&held_out),
        )
    };
    let before = fidelity(&student.valid());

    let config = DistilConfig::new()
        .with_learning_rate(5e-3)
        .with_warmup_steps(5)
        .with_max_steps(Some(STEPS));
    let mut seen = 0;
    let (student, report) = distil(
        &teacher,
        student,
        &config,
        // A fresh batch each step: unlimited unlabeled data, as text is for an encoder.
        |_| random_batch(&device),
        |info, _| {
            seen = info.step;
            ControlFlow::Continue(())
        },
    )
    .expect("distillation runs");
    let after = fidelity(&student.valid());

    assert_eq!(report.steps, STEPS);
    assert_eq!(seen, STEPS);
    assert_eq!(report.losses.len(), STEPS);
    let (first, last) = report.first_last(10).expect("losses recorded");
    assert!(last < 0.6 * first, "loss {first} -> {last}");
    assert!(
        after > before && 1.0 - after < 0.6 * (1.0 - before),
        "held-out output cosine {before} -> {after}, loss {first} -> {last}"
    );
}

#[test]
fn cosine_loss_trains_and_the_callback_stops_the_run() {
    let _serial = serial();
    let (teacher, student) = teacher_and_student();
    let device = Default::default();
    let train: Vec<Tensor<A, 3>> = (0..4).map(|_| random_batch(&device)).collect();
    let config = DistilConfig::new()
        .with_learning_rate(3e-3)
        .with_loss(DistilLoss::Cosine)
        .with_layer_weight(0.0)
        .with_max_seconds(Some(600.0));
    let (_, report) = distil(
        &teacher,
        student,
        &config,
        |step| train[step % train.len()].clone(),
        |info, _| match info.step {
            40 => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        },
    )
    .expect("distillation runs");
    assert_eq!(report.steps, 40);
    let (first, last) = report.first_last(5).expect("losses recorded");
    assert!(first > 0.0 && last < first, "1 - cosine {first} -> {last}");
}

#[test]
fn a_run_without_budget_and_mismatched_states_are_errors() {
    let _serial = serial();
    let (teacher, student) = teacher_and_student();
    let device = Default::default();
    let batch = random_batch::<A>(&device);
    let unbounded = distil(
        &teacher,
        student.clone(),
        &DistilConfig::new(),
        |_| batch.clone(),
        |_, _| ControlFlow::Continue(()),
    );
    assert!(
        matches!(unbounded, Err(CompressError::Unsupported { .. })),
        "{unbounded:?}"
    );

    // A teacher with one block has no intermediate state where the student has one.
    let short = Stack::<Flex> {
        blocks: teacher.blocks[..1].to_vec(),
    };
    let config = DistilConfig::new().with_max_steps(Some(3));
    let mismatched = distil(
        &short,
        student,
        &config,
        |_| batch.clone(),
        |_, _| ControlFlow::Continue(()),
    );
    assert!(
        matches!(mismatched, Err(CompressError::ShapeMismatch { .. })),
        "{mismatched:?}"
    );
}
