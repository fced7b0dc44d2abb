//! Two trainings at once on two threads, from copies of one drawn model: with
//! `detach_params`, they finish (without it, Burn 0.21's autodiff deadlocks: the copies share
//! their parameters' graph nodes).

use std::sync::mpsc;
use std::time::Duration;

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use burn_memory::{detach_params, draw_params};

type B = Autodiff<Flex>;

const WIDTH: usize = 256;
const LAYERS: usize = 8;
const ROUNDS: u64 = 40;
const STEPS: usize = 3;
/// Far longer than a round takes (about a tenth of a second in debug), even on a busy machine.
const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Module, Debug)]
struct Net<B: Backend> {
    layers: Vec<Linear<B>>,
}

fn net() -> Net<B> {
    let device = Default::default();
    Net {
        layers: (0..LAYERS)
            .map(|_| LinearConfig::new(WIDTH, WIDTH).init(&device))
            .collect(),
    }
}

fn train<B: AutodiffBackend>(mut model: Net<B>) {
    let device = Default::default();
    let mut optim = AdamConfig::new().init::<B, Net<B>>();
    for _ in 0..STEPS {
        let x = Tensor::<B, 2>::random([64, WIDTH], Distribution::Default, &device);
        let out = model.layers.iter().fold(x, |h, l| l.forward(h).tanh());
        let grads = GradientsParams::from_grads(out.powi_scalar(2).mean().backward(), &model);
        model = optim.step(1e-3, model, grads);
    }
}

/// Each round, two threads fine-tune copies of a drawn model (even rounds), or models that
/// share its first layer and have layers of their own (odd rounds: as the language-model
/// study's conversions of one trained model share its embeddings), the second thread a little
/// behind the first so that its forward meets the first's backward. A deadlock fails the test (the process aborts: its blocked threads
/// hold Burn's process-wide lock, so nothing in it could go on); hence a process of its own.
#[test]
fn two_trainings_at_once_finish() {
    crate::own_process::in_own_process("threads::two_trainings_at_once_finish", || {
        for round in 0..ROUNDS {
            let base = net();
            draw_params(&base);
            let (done, finished) = mpsc::channel();
            for thread in 0..2u64 {
                let model = if round % 2 == 0 {
                    base.clone()
                } else {
                    let mut own = net();
                    own.layers[0] = base.layers[0].clone();
                    own
                };
                let model = detach_params(model);
                let done = done.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_micros(thread * (round % 40) * 25));
                    train(model);
                    done.send(()).expect("the test waits");
                });
            }
            for _ in 0..2 {
                if finished.recv_timeout(TIMEOUT).is_err() {
                    eprintln!("round {round}: two trainings at once deadlocked");
                    std::process::abort();
                }
            }
        }
    });
}
