//! Trains an MLP classifier on MNIST with sketched (`SkLinear`) hidden layers, or with dense
//! ones for comparison (`--dense`), and reports test accuracy, parameter counts and time.
//!
//! ```text
//! cargo run --release -p examples --example train_mnist              # sketched, CPU
//! cargo run --release -p examples --example train_mnist -- --dense   # the dense baseline
//! ```
//!
//! The data is the 10,000-digit sample embedded in `examples/data/mnist10k` (8,000 train,
//! 2,000 test); `--data DIR` reads a full MNIST in the same IDX format.

use std::path::PathBuf;
use std::time::Instant;

use burn::backend::{Autodiff, NdArray, Wgpu};
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn_sketch::SketchBackend;
use clap::{Parser, ValueEnum};
use examples::mlp::{Mlp, MlpConfig};
use examples::mnist::Mnist;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BackendKind {
    /// CPU, through ndarray.
    Ndarray,
    /// GPU (or a CPU Vulkan driver), through wgpu.
    Wgpu,
}

#[derive(Debug, Parser)]
#[command(about = "Train an MNIST MLP with sketched hidden layers")]
struct Args {
    /// Backend to train on.
    #[arg(long, value_enum, default_value = "ndarray")]
    backend: BackendKind,
    /// Passes over the training set.
    #[arg(long, default_value_t = 8)]
    epochs: usize,
    /// Digits per optimisation step.
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Adam learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f64,
    /// Hidden layer widths.
    #[arg(long, value_delimiter = ',', default_value = "512,256")]
    hidden: Vec<usize>,
    /// Sketched layers: number of terms T.
    #[arg(long, default_value_t = 1)]
    num_terms: usize,
    /// Sketched layers: rank k of each term.
    #[arg(long, default_value_t = 32)]
    low_rank: usize,
    /// Train the same MLP with dense `nn::Linear` hidden layers instead.
    #[arg(long)]
    dense: bool,
    /// Directory with MNIST IDX files (`train-*`, `t10k-*`), default the embedded sample.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Use only the first N training digits (quick runs).
    #[arg(long)]
    train_limit: Option<usize>,
    /// Seed of the initialisation and the shuffling.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let dir = args.data.clone().unwrap_or_else(Mnist::embedded_dir);
    let mut train = Mnist::read(&dir, "train")?;
    if let Some(limit) = args.train_limit {
        train = train.truncate(limit);
    }
    let test = Mnist::read(&dir, "t10k")?;
    match args.backend {
        BackendKind::Ndarray => run::<Autodiff<NdArray>>(&args, &train, &test, &Default::default()),
        BackendKind::Wgpu => run::<Autodiff<Wgpu>>(&args, &train, &test, &Default::default()),
    }
    Ok(())
}

/// Normalised pixels `[n, 784]` and labels `[n]` of the digits at `indices`.
fn batch<B: burn::tensor::backend::Backend>(
    data: &Mnist,
    indices: &[usize],
    device: &B::Device,
) -> (Tensor<B, 2>, Tensor<B, 1, Int>) {
    let size = data.rows * data.cols;
    let mut pixels = Vec::with_capacity(indices.len() * size);
    for &i in indices {
        let image = &data.images[i * size..(i + 1) * size];
        pixels.extend(image.iter().map(|&p| (p as f32 / 255.0 - 0.1307) / 0.3081));
    }
    let labels: Vec<i64> = indices.iter().map(|&i| data.labels[i] as i64).collect();
    (
        Tensor::from_data(TensorData::new(pixels, [indices.len(), size]), device),
        Tensor::from_data(TensorData::new(labels, [indices.len()]), device),
    )
}

/// A reproducible Fisher-Yates shuffle (SplitMix64), so runs with one seed are comparable.
fn shuffle(indices: &mut [usize], state: &mut u64) {
    for i in (1..indices.len()).rev() {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        indices.swap(i, (z % (i as u64 + 1)) as usize);
    }
}

fn accuracy<B: SketchBackend>(model: &Mlp<B>, data: &Mnist, device: &B::Device) -> f64 {
    let indices: Vec<usize> = (0..data.len()).collect();
    let correct: i64 = indices
        .chunks(500)
        .map(|chunk| {
            let (x, y) = batch::<B>(data, chunk, device);
            let predicted = model.forward(x).argmax(1).reshape([chunk.len()]);
            predicted.equal(y).int().sum().into_scalar().elem::<i64>()
        })
        .sum();
    correct as f64 / data.len() as f64
}

fn run<B>(args: &Args, train: &Mnist, test: &Mnist, device: &B::Device)
where
    B: AutodiffBackend + SketchBackend,
    B::InnerBackend: SketchBackend,
{
    B::seed(device, args.seed);
    let config = MlpConfig::new()
        .with_d_input(train.rows * train.cols)
        .with_hidden(args.hidden.clone())
        .with_num_terms(args.num_terms)
        .with_low_rank(args.low_rank)
        .with_dense(args.dense);
    let mut model: Mlp<B> = config.init(device);
    let kind = if args.dense {
        "dense".to_string()
    } else {
        format!("sketched (T={}, k={})", args.num_terms, args.low_rank)
    };
    tracing::info!(
        "training a {kind} MLP {:?} on {} digits ({} test), {} epochs",
        args.hidden,
        train.len(),
        test.len(),
        args.epochs
    );

    let mut optim = AdamConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(device);
    let mut order: Vec<usize> = (0..train.len()).collect();
    let mut rng = args.seed;
    let start = Instant::now();
    for epoch in 1..=args.epochs {
        shuffle(&mut order, &mut rng);
        let (mut loss_sum, mut steps) = (0.0, 0);
        for chunk in order.chunks(args.batch_size) {
            let (x, y) = batch::<B>(train, chunk, device);
            let loss = loss_fn.forward(model.forward(x), y);
            loss_sum += loss.clone().into_scalar().elem::<f64>();
            steps += 1;
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optim.step(args.lr, model, grads);
        }
        let test_accuracy = accuracy(&model.valid(), test, device);
        tracing::info!(
            "epoch {epoch}/{}: train loss {:.4}, test accuracy {:.2}%, {:.1}s",
            args.epochs,
            loss_sum / steps as f64,
            100.0 * test_accuracy,
            start.elapsed().as_secs_f64()
        );
    }
    let elapsed = start.elapsed().as_secs_f64();
    let test_accuracy = accuracy(&model.valid(), test, device);
    println!("model:                    {kind} MLP {:?}", args.hidden);
    println!("test accuracy:            {:.2}%", 100.0 * test_accuracy);
    println!(
        "hidden trainable params:  {}",
        model.hidden_trainable_params()
    );
    println!("total trainable params:   {}", model.trainable_params());
    println!(
        "training time:            {elapsed:.1}s ({} epochs)",
        args.epochs
    );
}
