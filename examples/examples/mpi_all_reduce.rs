//! The per-step gradient all-reduce across MPI processes against a bare MPI all-reduce loop on
//! the same bytes, in the same run.
//!
//! ```text
//! cargo build --release -p examples --features mpi --example mpi_all_reduce
//! mpirun -np 2 target/release/examples/mpi_all_reduce [--iterations 200] [--json]
//! ```
//!
//! For each size, every rank builds a model with that many trained values, takes its gradients
//! once, then times, on the same number of f32 values:
//!
//! - `Peer::mean_gradients`, the per-step all-reduce: the gradients packed into one bucket,
//!   MPI's non-blocking all-reduce polled until done (the timeout's way) with the arrival
//!   messages, the bucket unpacked into the mean;
//! - bare `MPI_Iallreduce` polled with `MPI_Test` in a loop: the engine alone;
//! - bare `MPI_Allreduce` in a loop: the reference.
//!
//! Rank 0 prints the medians, the reference's bandwidth (bytes reduced per second) and the
//! ratios to it.

use std::time::{Duration, Instant};

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn_data_parallel::{DataParallelConfig, Mpi, Peer};
use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};

type B = Autodiff<Flex>;

/// Trained values per model: the MNIST MLP's gradients are about 0.1 M values (0.4 MB).
const SIZES: [usize; 4] = [1 << 10, 100_000, 1_000_000, 10_000_000];

#[derive(Module, Debug)]
struct Net<B: burn::tensor::backend::Backend> {
    layer: Linear<B>,
}

struct Row {
    floats: usize,
    peer_ms: f64,
    nonblocking_ms: f64,
    bare_ms: f64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let iterations = args
        .iter()
        .position(|a| a == "--iterations")
        .and_then(|i| args.get(i + 1))
        .map(|n| n.parse::<usize>())
        .transpose()?
        .unwrap_or(100);
    let mpi = Mpi::init()?;
    let world = SimpleCommunicator::world();
    let config = DataParallelConfig::new()
        .with_mpi(true)
        .with_timeout(Duration::from_secs(60));
    let device = Default::default();
    let mut rows = Vec::new();
    for floats in SIZES {
        // One layer of `floats` weights (no bias): 1024 inputs wide.
        let inputs = 1024.min(floats);
        let net = Net::<B> {
            layer: LinearConfig::new(inputs, floats / inputs)
                .with_bias(false)
                .init(&device),
        };
        let x = Tensor::<B, 2>::ones([2, inputs], &device);
        let grads = GradientsParams::from_grads(net.layer.forward(x).sum().backward(), &net);
        let peer = Peer::<Flex>::join(0, 1, device, &config)?;
        // The bucket: the values, a presence flag, the stop flag and the count of peers.
        let bucket = net.num_params() + 1 + 2;
        let mut peer_times = Vec::with_capacity(iterations);
        for _ in 0..iterations + 5 {
            let grads = clone_grads(&grads, &net);
            world.barrier();
            let start = Instant::now();
            let (mean, _) = peer.mean_gradients(&net, grads, false)?;
            peer_times.push(start.elapsed());
            drop(mean);
        }
        peer.leave()?;
        let send = vec![1.0_f32; bucket];
        let mut receive = vec![0.0_f32; bucket];
        let mut bare_times = Vec::with_capacity(iterations);
        let mut nonblocking_times = Vec::with_capacity(iterations);
        for _ in 0..iterations + 5 {
            world.barrier();
            let start = Instant::now();
            world.all_reduce_into(&send[..], &mut receive[..], SystemOperation::sum());
            bare_times.push(start.elapsed());
            world.barrier();
            let start = Instant::now();
            mpi::request::scope(|scope| {
                let sum = SystemOperation::sum();
                let mut request =
                    world.immediate_all_reduce_into(scope, &send[..], &mut receive[..], sum);
                while let Err(pending) = request.test() {
                    request = pending;
                    std::thread::yield_now();
                }
            });
            nonblocking_times.push(start.elapsed());
        }
        assert_eq!(receive[0], world.size() as f32, "the bare loops summed");
        rows.push(Row {
            floats: bucket,
            peer_ms: median_ms(&peer_times[5..]),
            nonblocking_ms: median_ms(&nonblocking_times[5..]),
            bare_ms: median_ms(&bare_times[5..]),
        });
    }
    if mpi.rank() != 0 {
        return Ok(());
    }
    if json {
        let rows: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"floats\":{},\"bytes\":{},\"peer_ms\":{:.4},\"nonblocking_ms\":{:.4},\"bare_ms\":{:.4},\"ratio\":{:.3}}}",
                    r.floats,
                    r.floats * 4,
                    r.peer_ms,
                    r.nonblocking_ms,
                    r.bare_ms,
                    r.peer_ms / r.bare_ms
                )
            })
            .collect();
        println!(
            "{{\"processes\":{},\"iterations\":{iterations},\"rows\":[{}]}}",
            mpi.size(),
            rows.join(",")
        );
        return Ok(());
    }
    println!(
        "{} processes, {iterations} iterations each (median), {}",
        mpi.size(),
        mpi::environment::library_version()
            .unwrap_or_default()
            .trim_end_matches('\0')
            .split(',')
            .next()
            .unwrap_or("")
    );
    println!(
        "| bytes | mean_gradients (ms) | bare MPI_Iallreduce + MPI_Test (ms) | bare MPI_Allreduce \
         (ms) | bandwidth, MPI_Allreduce (GB/s) | mean_gradients / MPI_Allreduce | \
         MPI_Iallreduce / MPI_Allreduce |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let bytes = r.floats * 4;
        println!(
            "| {bytes} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} |",
            r.peer_ms,
            r.nonblocking_ms,
            r.bare_ms,
            bytes as f64 / (r.bare_ms * 1e-3) / 1e9,
            r.peer_ms / r.bare_ms,
            r.nonblocking_ms / r.bare_ms
        );
    }
    Ok(())
}

/// A copy of `grads` (`mean_gradients` consumes its input).
fn clone_grads(grads: &GradientsParams, net: &Net<B>) -> GradientsParams {
    let mut copy = GradientsParams::new();
    let weight = grads
        .get::<Flex, 2>(net.layer.weight.id)
        .expect("a gradient");
    copy.register(net.layer.weight.id, weight);
    copy
}

/// The median of `times`, in milliseconds.
fn median_ms(times: &[Duration]) -> f64 {
    examples::stats::median(times.iter().map(|t| t.as_secs_f64() * 1e3))
}
