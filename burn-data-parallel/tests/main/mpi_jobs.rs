//! MPI jobs of two and three processes on loopback under `mpirun`, this test binary being
//! each rank: the learner's steps against one device's (mixed precision's skip included),
//! replicas that differ, a killed rank, and BatchNorm.

use std::time::{Duration, Instant};

use burn::backend::Flex;
use burn::data::dataloader::batcher::Batcher;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn_data_parallel::{DistributedError, Mpi, Peer};
use burn_memory::Precision;

use crate::fixture::{B, Net, RowBatcher, Rows, config, norm_rel, rows, weights};
use crate::gradients::BatchNormCase;
use crate::learner::learner_matches_one_device;

/// The scenario an MPI job's processes run: this test binary under `mpirun`, one test, with
/// this variable naming what to do.
const MPI_SCENARIO: &str = "BURN_DATA_PARALLEL_MPI_SCENARIO";

/// The layout of an MPI job: its processes and the peers in each.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MpiLayout {
    pub(crate) processes: usize,
    pub(crate) local_peers: usize,
}

/// What each rank of a finished `mpirun` printed, by rank, and whether `mpirun` succeeded.
struct MpiJob {
    success: bool,
    ranks: Vec<String>,
    all: String,
}

/// Runs `test` of this binary in an MPI job of `processes` processes on this machine with
/// `scenario`, bounded by `limit` (`mpirun` ends the job 5 s before, and is killed past it).
/// `--enable-recovery` lets the job's other processes go on when one dies, as a killed rank's
/// test needs.
fn mpirun(test: &str, processes: usize, scenario: &str, limit: Duration) -> MpiJob {
    let exe = std::env::current_exe().unwrap();
    let outputs = tempfile::tempdir().unwrap();
    let child = std::process::Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--enable-recovery",
        ])
        .args(["--timeout", &(limit.as_secs() - 5).to_string()])
        .arg("--output-filename")
        .arg(outputs.path())
        .args(["-np", &processes.to_string()])
        .args(["-x", MPI_SCENARIO])
        .arg(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(MPI_SCENARIO, scenario)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| {
            panic!("`mpirun` (Open MPI's `openmpi-bin`) could not start: {error}")
        });
    let start = Instant::now();
    let output = wait_bounded(child, limit);
    let elapsed = start.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let all = format!("{stdout}\n{stderr}");
    assert!(elapsed < limit, "the MPI job ran past {limit:?}:\n{all}");
    // `--output-filename` writes each rank's standard output to `DIR/1/rank.R/stdout`.
    let ranks = (0..processes)
        .map(|rank| {
            let path = outputs.path().join(format!("1/rank.{rank}/stdout"));
            std::fs::read_to_string(path).unwrap_or_default()
        })
        .collect();
    MpiJob {
        success: output.status.success(),
        ranks,
        all,
    }
}

/// `child`'s output, once it exits or is killed past `limit`.
fn wait_bounded(mut child: std::process::Child, limit: Duration) -> std::process::Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The line of `text` that starts with `key`, without it.
fn line(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(key).map(str::to_string))
        .unwrap_or_else(|| panic!("no `{key}` in:\n{text}"))
}

/// This process's scenario when it is one rank of an MPI job.
fn mpi_scenario() -> Option<String> {
    std::env::var(MPI_SCENARIO).ok()
}

/// burn-train's learner with `DataParallel` over the processes of MPI jobs, two and three
/// processes of one peer and two processes of two peers (reduced in the process first, then
/// across processes), ends with the same weights on every rank, equal to K Adam steps of one
/// device over the same rows. Then f16-range mixed precision with an overflow in one rank's
/// batch: every rank skips that step, as one device does.
#[test]
fn mpi_processes_train_as_one_device() {
    const TEST: &str = "mpi_jobs::mpi_processes_train_as_one_device";
    if let Some(scenario) = mpi_scenario() {
        let mpi = Mpi::init().unwrap();
        let parts: Vec<usize> = scenario
            .split(' ')
            .skip(1)
            .map(|v| v.parse().unwrap())
            .collect();
        let layout = MpiLayout {
            processes: mpi.size() as usize,
            local_peers: parts[0],
        };
        let (amp, overflow) = match scenario.split(' ').next() {
            Some("overflow") => (Some(Precision::F32), true),
            _ => (None, false),
        };
        let trained =
            learner_matches_one_device::<B>(Default::default(), amp, overflow, Some(layout));
        let flat: Vec<String> = trained.concat().iter().map(|v| v.to_string()).collect();
        println!("\nWEIGHTS {}", flat.join(","));
        return;
    }
    let jobs = [
        ("agree 1", 2),
        ("agree 1", 3),
        ("agree 2", 2),
        ("overflow 1", 2),
    ];
    for (scenario, processes) in jobs {
        let job = mpirun(TEST, processes, scenario, Duration::from_secs(120));
        assert!(
            job.success,
            "`{scenario}` on {processes} processes:\n{}",
            job.all
        );
        let weights: Vec<String> = job.ranks.iter().map(|out| line(out, "WEIGHTS ")).collect();
        assert!(
            weights.iter().all(|w| *w == weights[0]),
            "`{scenario}` on {processes} processes: the ranks' weights differ"
        );
        for out in &job.ranks {
            assert!(
                out.contains("1 passed"),
                "a rank did not pass:\n{}",
                job.all
            );
        }
    }
}

/// Ranks whose models differ (another seed on rank 1) are refused on every rank, naming the
/// parameter that differs; a rank killed mid-run makes the others end with `ProcessesLost`
/// naming it, within the timeout.
#[test]
fn mpi_replicas_that_differ_and_a_killed_rank_are_typed_errors() {
    const TEST: &str = "mpi_jobs::mpi_replicas_that_differ_and_a_killed_rank_are_typed_errors";
    const TIMEOUT_MS: u64 = 3000;
    if let Some(scenario) = mpi_scenario() {
        let mpi = Mpi::init().unwrap();
        let rank = mpi.rank() as usize;
        let device = Default::default();
        let seed = match scenario.as_str() {
            "differ" => 7 + rank as u64,
            _ => 7,
        };
        <Flex as Backend>::seed(&device, seed);
        let mut model = Net::<B>::new(&device);
        let _ = weights(&model);
        let peer = Peer::<Flex>::join(0, 1, device, &config(TIMEOUT_MS).with_mpi(true)).unwrap();
        if scenario == "differ" {
            match peer.check_replicas(&model) {
                Err(DistributedError::ReplicasDiffer { parameters }) => {
                    println!("\nDIFFER {}", parameters.join(","))
                }
                other => panic!("expected ReplicasDiffer, got {other:?}"),
            }
            return;
        }
        peer.check_replicas(&model).unwrap();
        let mut optim = AdamConfig::new().init();
        let data = rows(64);
        let processes = mpi.size() as usize;
        for step in 0..8 {
            if rank == processes - 1 && step == 3 {
                std::process::exit(3);
            }
            let mine = (step * processes + rank) * 4;
            let batch: Rows<B> = RowBatcher.batch(data[mine..mine + 4].to_vec(), &device);
            let loss = MseLoss::new().forward(model.forward(batch.x), batch.y, Reduction::Mean);
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            let start = Instant::now();
            match peer.mean_gradients(&model, grads, false) {
                Ok((grads, _)) => model = optim.step(1e-2, model, grads),
                Err(DistributedError::ProcessesLost { ranks, .. }) => {
                    let ms = start.elapsed().as_millis();
                    println!("\nLOST {ranks:?} AT {step} AFTER {ms}");
                    return;
                }
                Err(other) => panic!("expected ProcessesLost, got {other:?}"),
            }
        }
        panic!("rank {rank} trained on after a rank was killed");
    }
    let job = mpirun(TEST, 2, "differ", Duration::from_secs(60));
    assert!(job.success, "{}", job.all);
    let differ: Vec<String> = job.ranks.iter().map(|out| line(out, "DIFFER ")).collect();
    assert_eq!(differ[0], differ[1], "every rank names the same parameters");
    assert!(differ[0].split(',').any(|p| p == "fixed"), "{}", differ[0]);

    let job = mpirun(TEST, 3, "killed", Duration::from_secs(60));
    // (Under `--enable-recovery`, `mpirun` itself succeeds when a rank dies.)
    assert!(
        !job.ranks[2].contains("test result"),
        "rank 2 exited mid-run:\n{}",
        job.all
    );
    for out in &job.ranks[..2] {
        let lost = line(out, "LOST ");
        let (ranks, rest) = lost.split_once(" AT ").unwrap();
        assert_eq!(ranks, "[2]", "{}", job.all);
        let (step, ms) = rest.split_once(" AFTER ").unwrap();
        assert_eq!(step, "3", "{}", job.all);
        let ms: u64 = ms.parse().unwrap();
        assert!(
            (TIMEOUT_MS..=TIMEOUT_MS + 2000).contains(&ms),
            "bounded by the timeout: {ms} ms"
        );
        assert!(out.contains("1 passed"), "{}", job.all);
    }
}

/// The BatchNorm case as two MPI processes: each rank normalises its own shard, and both end
/// with the mean of one device's gradients over each shard.
#[test]
fn mpi_batch_norm_ranks_average_their_shards_gradients() {
    const TEST: &str = "mpi_jobs::mpi_batch_norm_ranks_average_their_shards_gradients";
    if mpi_scenario().is_some() {
        let mpi = Mpi::init().unwrap();
        let device = Default::default();
        // Every process draws the same model.
        <Flex as Backend>::seed(&device, 7);
        let case = BatchNormCase::new(&device);
        let peer = Peer::<Flex>::join(0, 1, device, &config(20_000).with_mpi(true)).unwrap();
        let got = case.peer_mean(&peer, &case.copy(), mpi.rank() as usize);
        let err = norm_rel(&got, &case.expected);
        assert!(err <= 1e-5, "rank {}: relative error {err}", mpi.rank());
        println!("\nERROR {err:e}");
        return;
    }
    let job = mpirun(TEST, 2, "batch-norm", Duration::from_secs(60));
    assert!(job.success, "{}", job.all);
    for out in &job.ranks {
        line(out, "ERROR ");
        assert!(out.contains("1 passed"), "{}", job.all);
    }
}
