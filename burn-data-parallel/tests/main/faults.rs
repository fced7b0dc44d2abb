//! Faults, each bounded in time: a peer that stops (a timeout on the others), a peer that
//! panics (the run ends with its error), and layouts refused before anything starts.

use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::data::dataloader::batcher::Batcher;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::GradientsParams;
use burn::tensor::backend::Backend;
use burn_data_parallel::{DataParallel, DistributedError, Peer};

use crate::fixture::{B, Net, Row, RowBatcher, Rows, config, on_peers, replica, rows};
use crate::learner::fit_on_peers;
use crate::own_process::in_own_process;

/// A peer that stops taking part (it died, or hangs) makes the other's next all-reduce fail
/// with a timeout, within the configured time. Own process: the collective stays blocked.
#[test]
fn a_peer_that_stops_is_a_timeout_on_the_others() {
    in_own_process(
        "faults::a_peer_that_stops_is_a_timeout_on_the_others",
        || {
            let device = Default::default();
            let model = Net::<B>::new(&device);
            let timeout = Duration::from_millis(1500);
            let results = on_peers(2, |rank| {
                let model = replica(&model, &device);
                let peer = Peer::<Flex>::join(rank, 2, device, &config(1500)).unwrap();
                for step in 0..3 {
                    if rank == 1 && step == 2 {
                        return Ok(Duration::ZERO); // gone
                    }
                    let batch: Rows<B> = RowBatcher.batch(rows(4), &device);
                    let loss =
                        MseLoss::new().forward(model.forward(batch.x), batch.y, Reduction::Mean);
                    let grads = GradientsParams::from_grads(loss.backward(), &model);
                    let start = Instant::now();
                    if let Err(error) = peer.mean_gradients(&model, grads, false) {
                        return Err((error, start.elapsed()));
                    }
                }
                Ok(Duration::ZERO)
            });
            match &results[0] {
                Err((
                    DistributedError::Timeout {
                        peer: 0, operation, ..
                    },
                    waited,
                )) => {
                    assert_eq!(*operation, "all-reduce gradients");
                    assert!(*waited >= timeout && *waited < timeout + Duration::from_secs(2));
                }
                other => panic!("peer 0 should time out, got {other:?}"),
            }
        },
    );
}

/// A step that panics on one peer ends the learner's run within the timeout; the report names
/// the panic rather than the others' timeouts.
#[test]
fn a_peer_that_panics_ends_the_run_with_its_error() {
    in_own_process(
        "faults::a_peer_that_panics_ends_the_run_with_its_error",
        || {
            let device = Default::default();
            // Row 13 has a NaN feature: the batcher of the peer that gets it panics.
            #[derive(Clone)]
            struct Picky;
            impl<B: Backend> Batcher<B, Row, Rows<B>> for Picky {
                fn batch(&self, items: Vec<Row>, device: &B::Device) -> Rows<B> {
                    assert!(items.iter().all(|(x, _)| !x[0].is_nan()), "a NaN feature");
                    RowBatcher.batch(items, device)
                }
            }
            let mut data = rows(32);
            data[21].0[0] = f32::NAN; // peer 1's third batch
            let start = Instant::now();
            let (_, parallel) = fit_on_peers(
                Picky,
                data,
                4,
                2,
                &device,
                config(2000),
                Net::<B>::new(&device),
            );
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "bounded: {:?}",
                start.elapsed()
            );
            match parallel.report() {
                Err(DistributedError::PeerPanicked { peer: 1, message }) => {
                    assert!(message.contains("NaN"), "{message}")
                }
                other => panic!("expected peer 1's panic, got {other:?}"),
            }
        },
    );
}

/// `mpi` without MPI initialised, and layouts that cannot be, are refused before anything
/// starts. (No test initialises MPI in this process: the MPI jobs below run in `mpirun`'s.)
#[test]
fn invalid_layouts_are_refused() {
    match DataParallel::<B>::new(vec![Default::default()], config(1000).with_mpi(true)) {
        Err(DistributedError::InvalidConfig(message)) => {
            assert!(message.contains("Mpi::init"), "{message}")
        }
        other => panic!("expected InvalidConfig, got {:?}", other.map(|_| ())),
    }
    assert!(matches!(
        DataParallel::<B>::new(vec![], config(1000)),
        Err(DistributedError::InvalidConfig(_))
    ));
    assert!(matches!(
        DataParallel::<B>::new(vec![Default::default()], config(0)),
        Err(DistributedError::InvalidConfig(_))
    ));
    assert!(matches!(
        Peer::<Flex>::join(2, 2, Default::default(), &config(1000)),
        Err(DistributedError::InvalidConfig(_))
    ));
}
