//! Pruning the dense MNIST MLP (784-512-256-10) with burn-compress's `prune`: test accuracy of
//! the trained model, then of (a) magnitude pruning with masks at several sparsities, each
//! fine-tuned for an epoch with the masks on, and (b) structured L2 pruning of half the units
//! of both hidden layers, shrunk into a 784-256-128-10 MLP and fine-tuned; with the forward
//! time of the dense and the shrunk model. "dense + fine-tune" is the dense model trained for
//! the same extra epochs, the fair baseline of the fine-tuned rows.
//!
//! ```text
//! cargo run --release -p examples --example prune_mnist
//! cargo run --release -p examples --example prune_mnist -- --epochs 5 --json
//! ```
//!
//! The data is the 10,000-digit sample embedded in `examples/data/mnist10k` (8,000 train,
//! 2,000 test), on Flex (CPU). The forward times are of the whole model's `forward` on one
//! batch already on the device (no data loading, no loss), the median of `--runs` timed calls
//! after `--runs / 5` untimed ones, dense and shrunk alternating, with the thread pool Flex
//! uses (all cores).

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use burn_compress::prune::{Norm, PruneConfig, PruneMethod};
use clap::Parser;
use examples::data::DigitDataset;
use examples::mlp::{Mlp, MlpConfig};
use examples::mnist::Mnist;
use examples::stats::median;
use examples::training::{PlainTraining, evaluate_logits, train_plain};
use serde::Serialize;

type A = Autodiff<Flex>;

#[derive(Debug, Parser)]
#[command(about = "Prune a trained MNIST MLP: magnitude masks, and structured shrinking")]
struct Args {
    /// Training epochs of the dense model before pruning.
    #[arg(long, default_value_t = 5)]
    epochs: usize,
    /// Fine-tuning epochs after each pruning.
    #[arg(long, default_value_t = 1)]
    fine_tune_epochs: usize,
    /// Sparsities of the magnitude pruning, each from the trained model.
    #[arg(long, value_delimiter = ',', default_value = "0.5,0.8,0.9")]
    amounts: Vec<f64>,
    /// Fraction of the hidden units the structured pruning removes.
    #[arg(long, default_value_t = 0.5)]
    structured: f64,
    /// Timed forward calls per measurement (a fifth as many run first, untimed).
    #[arg(long, default_value_t = 1000)]
    runs: usize,
    /// Adam learning rate, training and fine-tuning.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Seed of the initialisation and the shuffling.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
}

/// One model's line of the table.
#[derive(Debug, Serialize)]
struct Row {
    model: String,
    hidden: Vec<usize>,
    params: usize,
    zeros: usize,
    test_accuracy: f64,
}

/// Milliseconds per forward, dense and shrunk, at one batch size.
#[derive(Debug, Serialize)]
struct Timing {
    batch: usize,
    dense_ms: f64,
    shrunk_ms: f64,
    speedup: f64,
}

fn accuracy(model: &Mlp<Flex>, data: &DigitDataset) -> f64 {
    evaluate_logits(data, &Default::default(), |x| model.forward(x)).1
}

fn row(name: &str, model: &Mlp<Flex>, data: &DigitDataset) -> Row {
    let total = model.sparsity().total();
    Row {
        model: name.into(),
        hidden: model.hidden_widths(),
        params: total.params,
        zeros: total.zeros,
        test_accuracy: accuracy(model, data),
    }
}

/// Median milliseconds of `dense.forward` and of `shrunk.forward` on the same random batch of
/// `batch` digits. The two alternate call by call, so that a change in the machine's load
/// (other processes, the clock) falls on both alike.
fn time_forward(dense: &Mlp<Flex>, shrunk: &Mlp<Flex>, batch: usize, runs: usize) -> (f64, f64) {
    let device = Default::default();
    let x = Tensor::<Flex, 2>::random([batch, 784], Distribution::Default, &device);
    let time = |model: &Mlp<Flex>| {
        let start = Instant::now();
        let y = model.forward(x.clone());
        let _ = Flex::sync(&device);
        drop(y);
        start.elapsed().as_secs_f64() * 1e3
    };
    let (mut a, mut b) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for i in 0..runs + runs / 5 {
        let (ta, tb) = (time(dense), time(shrunk));
        if i >= runs / 5 {
            a.push(ta);
            b.push(tb);
        }
    }
    (median(a), median(b))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = Mnist::embedded_dir();
    let train_data = DigitDataset::new(Mnist::read(&dir, "train")?);
    let test_data = DigitDataset::new(Mnist::read(&dir, "t10k")?);
    let device = Default::default();
    let say = |line: String| {
        if !args.json {
            println!("{line}");
        }
    };

    A::seed(&device, args.seed);
    let start = Instant::now();
    let dense = train_plain(
        MlpConfig::new().with_dense(true).init::<A>(&device),
        |m: &Mlp<A>, x| m.forward(x),
        &train_data,
        &PlainTraining::new(args.epochs, args.lr, args.seed),
    );
    say(format!(
        "trained the dense MLP for {} epochs in {:.1}s",
        args.epochs,
        start.elapsed().as_secs_f64()
    ));
    let mut rows = vec![row("dense", &dense.valid(), &test_data)];
    // Every fine-tuning sees the same batches, shuffled on from where the training stopped.
    let fine_tune = PlainTraining::new(
        args.fine_tune_epochs,
        args.lr,
        args.seed + args.epochs as u64,
    );
    // The baseline of the fine-tuned models: the dense one trained as long as they were.
    let longer = train_plain(
        dense.clone(),
        |m: &Mlp<A>, x| m.forward(x),
        &train_data,
        &fine_tune,
    );
    rows.push(row("dense + fine-tune", &longer.valid(), &test_data));

    // (a) Magnitude pruning, masks kept through fine-tuning, then made permanent.
    for &amount in &args.amounts {
        let masked = dense.to_masked(&PruneConfig::new(amount))?;
        let pruned = masked.clone().valid().make_permanent();
        rows.push(row(
            &format!("magnitude {:.0}%", 100.0 * amount),
            &pruned,
            &test_data,
        ));
        let tuned = train_plain(masked, |m, x| m.forward(x), &train_data, &fine_tune);
        if !args.json {
            print!("{}", tuned.sparsity());
        }
        rows.push(row(
            &format!("magnitude {:.0}% + fine-tune", 100.0 * amount),
            &tuned.valid().make_permanent(),
            &test_data,
        ));
    }

    // (b) Structured pruning of the hidden units, shrunk, fine-tuned.
    let config = PruneConfig::new(args.structured).with_method(PruneMethod::Structured(Norm::L2));
    let shrunk = dense.shrink_hidden(&config)?;
    let name = format!("structured L2 {:.0}%", 100.0 * args.structured);
    rows.push(row(&format!("{name}, shrunk"), &shrunk.valid(), &test_data));
    let shrunk = train_plain(
        shrunk,
        |m: &Mlp<A>, x| m.forward(x),
        &train_data,
        &fine_tune,
    );
    let shrunk = shrunk.valid();
    rows.push(row(
        &format!("{name}, shrunk + fine-tune"),
        &shrunk,
        &test_data,
    ));

    let dense = dense.valid();
    let timings: Vec<Timing> = [1, 256]
        .into_iter()
        .map(|batch| {
            let (dense_ms, shrunk_ms) = time_forward(&dense, &shrunk, batch, args.runs);
            Timing {
                batch,
                dense_ms,
                shrunk_ms,
                speedup: dense_ms / shrunk_ms,
            }
        })
        .collect();

    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "models": rows,
                "forward": timings,
                "train_epochs": args.epochs,
                "fine_tune_epochs": args.fine_tune_epochs,
            }))?
        );
        return Ok(());
    }
    println!(
        "\n{:<40} {:>15} {:>9} {:>8} {:>9}",
        "model", "hidden", "params", "zeros", "accuracy"
    );
    for r in &rows {
        println!(
            "{:<40} {:>15} {:>9} {:>7.1}% {:>8.2}%",
            r.model,
            format!("{:?}", r.hidden),
            r.params,
            100.0 * r.zeros as f64 / r.params as f64,
            100.0 * r.test_accuracy
        );
    }
    println!(
        "\nforward of the whole model, median of {} calls:",
        args.runs
    );
    println!(
        "{:>6} {:>10} {:>10} {:>8}",
        "batch", "dense ms", "shrunk ms", "speedup"
    );
    for t in &timings {
        println!(
            "{:>6} {:>10.3} {:>10.3} {:>7.2}×",
            t.batch, t.dense_ms, t.shrunk_ms, t.speedup
        );
    }
    Ok(())
}
