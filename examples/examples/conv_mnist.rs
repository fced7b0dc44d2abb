//! A small convolutional network on MNIST, with its second convolution dense (Burn's `Conv2d`)
//! or sketched (`SkConv2d`): test accuracy, convolution parameters and training time of each,
//! trained alike in the same run.
//!
//! ```text
//! cargo run --release -p examples --example conv_mnist
//! cargo run --release -p examples --example conv_mnist -- --epochs 3 --num-terms 1 --low-rank 4 --json
//! ```
//!
//! The network: `conv 1→32 (3×3, same) → ReLU → max-pool 2 → conv 32→64 (3×3, same) → ReLU →
//! max-pool 2 → linear 3136→10`. The first convolution has 288 weights and stays dense in both
//! arms; the second (18,432) is the one a sketch replaces. Then one wide layer's forward is
//! timed, dense against sketched (`--layer-channels 2048 --layer-pixels 64` is Panther's
//! published setting).

use std::time::Instant;

use burn::backend::{Autodiff, Flex};
use burn::data::dataset::Dataset;
use burn::module::{AutodiffModule, Module};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d, Relu};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use burn_sketch::{SkConv2d, SkConv2dConfig};
use clap::Parser;
use examples::data::DigitDataset;
use examples::mnist::Mnist;
use examples::stats::median_seconds;
use examples::training::{PlainTraining, evaluate_logits, train_plain};
use serde::Serialize;

type A = Autodiff<Flex>;

#[derive(Debug, Parser)]
#[command(about = "A CNN on MNIST with a dense or a sketched convolution")]
struct Args {
    /// Training epochs of each arm.
    #[arg(long, default_value_t = 2)]
    epochs: usize,
    /// Sketched convolution: terms T.
    #[arg(long, default_value_t = 1)]
    num_terms: usize,
    /// Sketched convolution: rank k.
    #[arg(long, default_value_t = 4)]
    low_rank: usize,
    /// Seed of the initialisation and the shuffling.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
    /// Then time one layer's forward, dense and sketched (same `T` and `k`), with this many
    /// input and output channels (Panther's figure is 2048, at 64 px); 0 skips it.
    #[arg(long, default_value_t = 512)]
    layer_channels: usize,
    /// The layer timing's image side, in pixels.
    #[arg(long, default_value_t = 32)]
    layer_pixels: usize,
}

/// The second convolution, dense or sketched.
// One per model: the variants' sizes do not matter, and Burn's `Module` derive has no boxed
// form.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
enum Conv<B: Backend> {
    Dense(Conv2d<B>),
    Sketched(SkConv2d<B>),
}

impl<B: Backend> Conv<B> {
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        match self {
            Conv::Dense(conv) => conv.forward(x),
            Conv::Sketched(conv) => conv.forward(x),
        }
    }

    fn weights(&self) -> usize {
        match self {
            Conv::Dense(conv) => conv.weight.val().shape().num_elements(),
            Conv::Sketched(conv) => conv.num_trainable() - conv.channels_out(),
        }
    }
}

#[derive(Module, Debug)]
struct Cnn<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv<B>,
    pool: MaxPool2d,
    relu: Relu,
    head: Linear<B>,
}

impl<B: Backend> Cnn<B> {
    fn new(sketch: Option<(usize, usize)>, device: &B::Device) -> Self {
        let same = PaddingConfig2d::Same;
        let conv2 = match sketch {
            None => Conv::Dense(
                Conv2dConfig::new([32, 64], [3, 3])
                    .with_padding(same.clone())
                    .init(device),
            ),
            Some((num_terms, low_rank)) => Conv::Sketched(
                SkConv2dConfig::new([32, 64], [3, 3], num_terms, low_rank)
                    .with_padding(same.clone())
                    .init(device),
            ),
        };
        Self {
            conv1: Conv2dConfig::new([1, 32], [3, 3])
                .with_padding(same)
                .init(device),
            conv2,
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
            relu: Relu::new(),
            head: LinearConfig::new(64 * 7 * 7, 10).init(device),
        }
    }

    /// Logits, `[batch, 10]`, of images flattened as `[batch, 784]`.
    fn forward(&self, images: Tensor<B, 2>) -> Tensor<B, 2> {
        let [batch, _] = images.dims();
        let x = images.reshape([batch, 1, 28, 28]);
        let x = self.pool.forward(self.relu.forward(self.conv1.forward(x)));
        let x = self.pool.forward(self.relu.forward(self.conv2.forward(x)));
        self.head.forward(x.reshape([batch, 64 * 7 * 7]))
    }

    fn conv_weights(&self) -> usize {
        self.conv1.weight.val().shape().num_elements() + self.conv2.weights()
    }
}

#[derive(Serialize)]
struct LayerTiming {
    channels: usize,
    pixels: usize,
    dense_ms: f64,
    sketched_ms: f64,
}

/// Median forward time of a dense and a sketched 3 × 3 convolution, `channels → channels`, on a
/// `[1, channels, pixels, pixels]` input (no autodiff).
fn layer_timing(args: &Args) -> LayerTiming {
    let device = Default::default();
    let (c, p) = (args.layer_channels, args.layer_pixels);
    let x = Tensor::<Flex, 4>::random([1, c, p, p], burn::tensor::Distribution::Default, &device);
    let dense = Conv2dConfig::new([c, c], [3, 3])
        .with_padding(PaddingConfig2d::Same)
        .init::<Flex>(&device);
    let sketched = SkConv2dConfig::new([c, c], [3, 3], args.num_terms, args.low_rank)
        .with_padding(PaddingConfig2d::Same)
        .init::<Flex>(&device);
    // One warm-up, then the median of 5; reading the output waits for the work.
    let median = |forward: &dyn Fn() -> Tensor<Flex, 4>| {
        1e3 * median_seconds(1, 5, || drop(forward().into_data()))
    };
    LayerTiming {
        channels: c,
        pixels: p,
        dense_ms: median(&|| dense.forward(x.clone())),
        sketched_ms: median(&|| sketched.forward(x.clone())),
    }
}

#[derive(Serialize)]
struct Arm {
    name: String,
    conv_weights: usize,
    test_accuracy: f64,
    train_seconds: f64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = Mnist::embedded_dir();
    let train_data = DigitDataset::new(Mnist::read(&dir, "train")?);
    let test_data = DigitDataset::new(Mnist::read(&dir, "t10k")?);
    let device = Default::default();
    let mut arms = Vec::new();
    for (name, sketch) in [
        ("dense".to_string(), None),
        (
            format!("sketched (T = {}, k = {})", args.num_terms, args.low_rank),
            Some((args.num_terms, args.low_rank)),
        ),
    ] {
        <A as Backend>::seed(&device, args.seed);
        let model = Cnn::<A>::new(sketch, &device);
        let start = Instant::now();
        let training = PlainTraining::new(args.epochs, 1e-3, args.seed);
        let model = train_plain(model, |m: &Cnn<A>, x| m.forward(x), &train_data, &training);
        let train_seconds = start.elapsed().as_secs_f64();
        arms.push(Arm {
            name,
            conv_weights: model.conv_weights(),
            test_accuracy: {
                let valid = model.valid();
                evaluate_logits(&test_data, &device, |x| valid.forward(x)).1
            },
            train_seconds,
        });
    }
    let timing = (args.layer_channels > 0).then(|| layer_timing(&args));
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "arms": arms, "layer": timing }))?
        );
        return Ok(());
    }
    println!(
        "MNIST ({} train, {} test digits), {} epochs, Flex\n",
        train_data.len(),
        test_data.len(),
        args.epochs
    );
    println!("| arm | convolution weights | test accuracy | training time |");
    println!("|---|---:|---:|---:|");
    let dense_weights = arms[0].conv_weights as f64;
    for arm in &arms {
        println!(
            "| {} | {} ({:.0} %) | {:.2} % | {:.1} s |",
            arm.name,
            arm.conv_weights,
            100.0 * arm.conv_weights as f64 / dense_weights,
            100.0 * arm.test_accuracy,
            arm.train_seconds
        );
    }
    if let Some(t) = timing {
        println!(
            "\none layer's forward, {c} → {c} channels, 3 × 3, {p} × {p} px, batch 1 (median of 5): \
             dense {:.1} ms, sketched (T = {}, k = {}) {:.1} ms, {:.1}× faster",
            t.dense_ms,
            args.num_terms,
            args.low_rank,
            t.sketched_ms,
            t.dense_ms / t.sketched_ms,
            c = t.channels,
            p = t.pixels,
        );
    }
    Ok(())
}
