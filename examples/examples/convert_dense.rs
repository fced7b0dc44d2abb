//! Dense-to-sketched conversion: trains a dense MLP on MNIST, replaces its hidden `Linear`
//! layers with `SkLinear::from_linear`, and reports the weight and output error of the
//! conversion and the test accuracy before and after fine-tuning the sketched model briefly.
//!
//! ```text
//! cargo run --release -p examples --example convert_dense
//! cargo run --release -p examples --example convert_dense -- --low-rank 64 --finetune-steps 400
//! cargo run --release -p examples --features ndarray --example convert_dense -- --backend ndarray
//! ```
//!
//! A sketch of a trained weight is unbiased but noisy: with `2Tk` far below the layer's
//! width, its relative error is large and accuracy drops at once. Fine-tuning the sketched
//! factors recovers most of it in far fewer steps than training from scratch, which is the
//! point of converting rather than re-initialising.

use std::time::Instant;

use burn::backend::Autodiff;
use burn::data::dataloader::DataLoaderBuilder;
use burn::module::AutodiffModule;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::ElementConversion;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn_sketch::SketchBackend;
use clap::Parser;
use examples::backend::BackendKind;
use examples::data::{DigitBatch, DigitBatcher, DigitDataset};
use examples::mlp::{Mlp, MlpConfig};
use examples::mnist::Mnist;
use examples::training::evaluate;

#[derive(Debug, Parser)]
#[command(about = "Convert a trained dense MLP to sketched layers and fine-tune it")]
struct Args {
    /// Backend to train on.
    #[arg(long, value_enum, default_value = "flex")]
    backend: BackendKind,
    /// Epochs of dense training before the conversion.
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// Sketched layers: number of terms T.
    #[arg(long, default_value_t = 1)]
    num_terms: usize,
    /// Sketched layers: rank k of each term.
    #[arg(long, default_value_t = 32)]
    low_rank: usize,
    /// Optimisation steps of the sketched model after the conversion.
    #[arg(long, default_value_t = 200)]
    finetune_steps: usize,
    /// Seed of the initialisation, the sketches and the shuffling.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    examples::with_backend!(args.backend, |B| run::<Autodiff<B>>(&args))
}

fn run<A: AutodiffBackend + SketchBackend>(args: &Args) -> anyhow::Result<()>
where
    A::InnerBackend: SketchBackend,
{
    let device: A::Device = Default::default();
    let dir = Mnist::embedded_dir();
    let train_data = DigitDataset::new(Mnist::read(&dir, "train")?);
    let test_data = DigitDataset::new(Mnist::read(&dir, "t10k")?);
    <A as Backend>::seed(&device, args.seed);

    let start = Instant::now();
    let dense: Mlp<A> = MlpConfig::new().with_dense(true).init(&device);
    let dense = fit(dense, &train_data, args.epochs, None, args.seed);
    let dense_seconds = start.elapsed().as_secs_f64();
    let (_, dense_accuracy) = evaluate(&dense.valid(), &test_data, &device);

    let sketched = dense.to_sketched(args.num_terms, args.low_rank)?;
    let weight_errors = dense.valid().weight_errors(&sketched.valid());
    let output_error = output_error(&dense.valid(), &sketched.valid(), &test_data, &device);
    let (_, converted_accuracy) = evaluate(&sketched.valid(), &test_data, &device);

    let start = Instant::now();
    let tuned = fit(
        sketched,
        &train_data,
        usize::MAX,
        Some(args.finetune_steps),
        args.seed,
    );
    let tune_seconds = start.elapsed().as_secs_f64();
    let (_, tuned_accuracy) = evaluate(&tuned.valid(), &test_data, &device);

    // The alternative to converting: the same sketched MLP from its own initialisation, trained
    // for the same number of steps.
    let scratch: Mlp<A> = MlpConfig::new()
        .with_num_terms(args.num_terms)
        .with_low_rank(args.low_rank)
        .init(&device);
    let scratch = fit(
        scratch,
        &train_data,
        usize::MAX,
        Some(args.finetune_steps),
        args.seed,
    );
    let (_, scratch_accuracy) = evaluate(&scratch.valid(), &test_data, &device);

    println!(
        "dense MLP [512, 256], {} epochs ({dense_seconds:.1}s)",
        args.epochs
    );
    println!(
        "converted: T={}, k={}; hidden trainable params {} → {}",
        args.num_terms,
        args.low_rank,
        dense.hidden_trainable_params(),
        tuned.hidden_trainable_params()
    );
    for (i, e) in weight_errors.iter().enumerate() {
        println!("hidden layer {i}: relative weight error ‖W − Ŵ‖/‖W‖ = {e:.3}");
    }
    println!("relative logit error on the test set:  {output_error:.3}");
    println!("| model | test accuracy |\n|---|---|");
    println!("| dense | {:.2}% |", 100.0 * dense_accuracy);
    println!(
        "| sketched, converted | {:.2}% |",
        100.0 * converted_accuracy
    );
    println!(
        "| sketched, after {} fine-tuning steps ({tune_seconds:.1}s) | {:.2}% |",
        args.finetune_steps,
        100.0 * tuned_accuracy
    );
    println!(
        "| sketched from scratch, {} steps | {:.2}% |",
        args.finetune_steps,
        100.0 * scratch_accuracy
    );
    Ok(())
}

/// Adam at 1e-3, batch 64, for `epochs` passes or `steps` steps, whichever ends first.
fn fit<A: AutodiffBackend + burn_sketch::SketchBackend>(
    mut model: Mlp<A>,
    data: &DigitDataset,
    epochs: usize,
    steps: Option<usize>,
    seed: u64,
) -> Mlp<A> {
    let loader = DataLoaderBuilder::<A, _, DigitBatch<A>>::new(DigitBatcher)
        .batch_size(64)
        .shuffle(seed)
        .build(data.clone());
    let mut optim = AdamConfig::new().init();
    let mut done = 0;
    let limit = steps.unwrap_or(usize::MAX);
    'epochs: for _ in 0..epochs {
        for batch in loader.iter() {
            if done == limit {
                break 'epochs;
            }
            let loss = model.forward_classification(batch).loss;
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(1e-3, model, grads);
            done += 1;
        }
    }
    model
}

/// `‖logits_dense − logits_sketched‖ / ‖logits_dense‖` over the whole test set.
fn output_error<I: SketchBackend>(
    dense: &Mlp<I>,
    sketched: &Mlp<I>,
    data: &DigitDataset,
    device: &I::Device,
) -> f64 {
    use burn::data::dataloader::batcher::Batcher;
    use burn::data::dataset::Dataset;

    let items = (0..data.len()).filter_map(|i| data.get(i)).collect();
    let batch: DigitBatch<I> = DigitBatcher.batch(items, device);
    let reference = dense.forward(batch.images.clone());
    let diff = reference.clone() - sketched.forward(batch.images);
    let norm = |t: burn::tensor::Tensor<I, 2>| t.square().sum().sqrt().into_scalar().elem::<f64>();
    norm(diff) / norm(reference)
}
