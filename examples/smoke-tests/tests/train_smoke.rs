//! A short `train_mnist` run through burn-train: the loss falls, a checkpoint appears each
//! epoch, `resume` continues from it, also after the run was killed at any moment; and the
//! mixed-precision step the learner runs.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::optim::{AdamConfig, GradientsParams, Optimizer};
use burn::tensor::Tolerance;
use burn::tensor::backend::Backend;
use burn::train::TrainStep;
use burn_memory::{LossScale, MixedPrecisionConfig, Precision, Segments};
use burn_sketch::SketchBackend;
use examples::data::{DigitBatch, DigitBatcher, DigitDataset};
use examples::mlp::MlpConfig;
use examples::mnist::Mnist;
use examples::training::{
    TrainingConfig, TrainingError, checkpoint_path, evaluate, latest_checkpoint, train,
};

#[path = "smoke/data_parallel.rs"]
mod data_parallel;
#[path = "smoke/lm.rs"]
mod lm;

type B = Autodiff<NdArray>;

/// NdArray's random generator is global: tests that seed it or draw from it hold this lock, so
/// that another test's draws cannot interleave with theirs (runs with one seed must agree).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The short run the learner tests train: one epoch of 1,024 digits, batch 32, seed 7.
fn short_run(model: MlpConfig) -> TrainingConfig {
    TrainingConfig::new(model)
        .with_epochs(1)
        .with_batch_size(32)
        .with_train_limit(Some(1024))
        .with_learning_rate(3e-3)
        .with_seed(7)
}

/// The loss of `model` untrained, on backend `I` with the short run's seed, over its digits.
fn untrained_loss<I: SketchBackend>(model: &MlpConfig, device: &I::Device) -> f64 {
    I::seed(device, 7);
    let untrained = model.init::<I>(device);
    let data = Mnist::read(&Mnist::embedded_dir(), "train").unwrap();
    evaluate(&untrained, &DigitDataset::new(data.truncate(1024)), device).0
}

#[test]
fn training_lowers_the_loss_checkpoints_and_resumes() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let data = Mnist::embedded_dir();
    let device = Default::default();
    let model = MlpConfig::new().with_hidden(vec![64]).with_low_rank(8);
    let config = short_run(model.clone());

    // The loss of the untrained model on the same digits, same seed, same initialisation.
    let initial_loss = untrained_loss::<NdArray>(&model, &device);

    let first = train::<B>(&config, &data, &run, false, &device).unwrap();
    assert_eq!(first.resumed_from, 0);
    assert!(
        first.train_loss < 0.8 * initial_loss,
        "loss {initial_loss} -> {}",
        first.train_loss
    );
    // 32 steps on 1,024 digits: far from converged, but well above chance (10 %).
    assert!(first.test_accuracy > 0.4, "{}", first.test_accuracy);
    assert!(checkpoint_path(&run, 1).exists());
    assert_eq!(latest_checkpoint(&run), Some(1));
    assert_eq!(first.hidden_trainable_params, 8 * (784 + 64) + 64);

    // A seed fixes the run: the same configuration elsewhere trains to the same model, up to
    // the order in which NdArray's threads add up their partial sums. That order depends on
    // how busy the machine is: alone, the final losses agree to about 1e-7 of the loss; with
    // two more copies of this test binary running beside it, 3 of 15 runs drifted by 3e-4
    // (and by up to 3e-6 with rayon on one thread, so rayon's reductions are not the only
    // source). Another seed, which changes the initialisation and the batch order, moves the
    // loss by far more than the tolerance, so the check still tells the two apart.
    let again = train::<B>(&config, &data, &dir.path().join("again"), false, &device).unwrap();
    let drift = (again.train_loss - first.train_loss).abs() / first.train_loss;
    assert!(drift < 2e-3, "{} vs {}", again.train_loss, first.train_loss);
    let other = train::<B>(
        &config.clone().with_seed(8),
        &data,
        &dir.path().join("other"),
        false,
        &device,
    )
    .unwrap();
    let other_drift = (other.train_loss - first.train_loss).abs() / first.train_loss;
    assert!(
        other_drift > 1e-2,
        "seed 8 trained to {} against seed 7's {}: the seed does not fix the run",
        other.train_loss,
        first.train_loss
    );

    // Resume to two epochs: starts after epoch 1 and writes epoch 2's checkpoint.
    let second = train::<B>(&config.clone().with_epochs(2), &data, &run, true, &device).unwrap();
    assert_eq!(second.resumed_from, 1);
    assert!(checkpoint_path(&run, 2).exists());
    assert!(
        second.train_loss < first.train_loss,
        "{} -> {}",
        first.train_loss,
        second.train_loss
    );

    // A checkpoint cut short (by a crash of an older version, or a full disk) is skipped with
    // a warning: the newest complete one is resumed from.
    let model_2 = checkpoint_path(&run, 2);
    let bytes = std::fs::read(&model_2).unwrap();
    std::fs::write(&model_2, &bytes[..bytes.len() / 2]).unwrap();
    assert_eq!(latest_checkpoint(&run), Some(1));
    std::fs::remove_file(&model_2).unwrap();
    assert_eq!(
        latest_checkpoint(&run),
        Some(1),
        "optim-2 alone is not a checkpoint"
    );

    // A different model cannot resume from this run.
    let other = short_run(model.with_low_rank(4)).with_epochs(3);
    let err = train::<B>(&other, &data, &run, true, &device).unwrap_err();
    assert!(matches!(err, TrainingError::ConfigMismatch { .. }), "{err}");
}

/// The same short run on Flex through the learner, in f32 and with f16 mixed precision (Flex
/// computes in f16 on the CPU, NdArray cannot): the loss falls in both, and the f16 run's
/// steps are not all skipped.
#[test]
fn flex_trains_in_f32_and_in_f16_mixed_precision() {
    type F = Autodiff<Flex>;
    let dir = tempfile::tempdir().unwrap();
    let data = Mnist::embedded_dir();
    let device = Default::default();
    let model = MlpConfig::new().with_hidden(vec![64]).with_low_rank(8);
    let config = short_run(model.clone());
    let initial_loss = untrained_loss::<Flex>(&model, &device);

    for amp in [None, Some(Precision::F16)] {
        let run = dir.path().join(format!("{amp:?}"));
        let report =
            train::<F>(&config.clone().with_amp(amp), &data, &run, false, &device).unwrap();
        assert!(
            report.train_loss < 0.8 * initial_loss,
            "{amp:?}: loss {initial_loss} -> {}",
            report.train_loss
        );
        assert!(
            report.test_accuracy > 0.4,
            "{amp:?}: {}",
            report.test_accuracy
        );
        if let Some(state) = &report.amp {
            assert_eq!(state.precision(), Precision::F16);
            assert!(
                state.skipped_steps() < 8,
                "{} of 32 steps skipped",
                state.skipped_steps()
            );
        }
    }
}

/// The mixed-precision training step the learner runs (`--amp`): with a loss scale, its
/// gradients are the plain step's, and a step whose gradients overflow hands the learner none,
/// so that its optimizer leaves the model alone, and counts as skipped. NdArray computes only
/// in f32, so this checks the scaling and the skipping; on Wgpu the same step runs in f16.
#[test]
fn mixed_precision_steps_unscale_or_skip() {
    let _serial = serial();
    let device = Default::default();
    let digits = DigitDataset::new(Mnist::read(&Mnist::embedded_dir(), "train").unwrap());
    let batch: DigitBatch<B> =
        DigitBatcher.batch((0..64).filter_map(|i| digits.get(i)).collect(), &device);
    <B as Backend>::seed(&device, 3);
    let model = MlpConfig::new()
        .with_hidden(vec![32])
        .with_low_rank(4)
        .init::<B>(&device);
    let amp = |scale| {
        MixedPrecisionConfig::new()
            .with_compute(Precision::F32)
            .with_loss_scale(LossScale::Static(scale))
            .init::<B>(&device)
            .unwrap()
    };
    let step = |grads: GradientsParams| AdamConfig::new().init().step(1e-2, model.clone(), grads);

    let plain = TrainStep::step(&model, batch.clone()).grads;
    let scaled_model = model.clone().with_amp(amp(4096.0));
    let scaled = TrainStep::step(&scaled_model, batch.clone()).grads;
    assert_eq!(scaled.len(), plain.len());
    let after_scaled = step(scaled).forward(batch.images.clone()).into_data();
    let after_plain = step(plain).forward(batch.images.clone()).into_data();
    // NdArray's thread-dependent summation order, through Adam's normalised step, moved
    // outputs by up to 1.24e-5 (at values from 0.09 to 23) in clean-clone CI runs.
    after_scaled.assert_approx_eq::<f32>(&after_plain, Tolerance::rel_abs(1e-5, 1e-4));
    assert_eq!(scaled_model.amp().unwrap().skipped_steps(), 0);

    let overflowing = model.clone().with_amp(amp(f32::MAX));
    let output = TrainStep::step(&overflowing, batch.clone());
    assert!(
        output.grads.is_empty(),
        "an overflowing step must hand over no gradients"
    );
    assert_eq!(overflowing.amp().unwrap().skipped_steps(), 1);
    let before = model.forward(batch.images.clone()).into_data();
    step(output.grads)
        .forward(batch.images)
        .into_data()
        .assert_eq(&before, true);
}

/// The learner's training step with segment checkpointing (`--checkpoint-segments`) hands the
/// learner the plain step's gradients, for sketched and dense hidden layers and any split; a
/// split that does not fit the layers is refused; and a run with it trains like one without.
#[test]
fn segmented_steps_give_the_plain_gradients_and_train_the_same() {
    let _serial = serial();
    let device = Default::default();
    let digits = DigitDataset::new(Mnist::read(&Mnist::embedded_dir(), "train").unwrap());
    let batch: DigitBatch<B> =
        DigitBatcher.batch((0..64).filter_map(|i| digits.get(i)).collect(), &device);
    for dense in [false, true] {
        <B as Backend>::seed(&device, 4);
        let model = MlpConfig::new()
            .with_hidden(vec![48, 32, 24])
            .with_low_rank(6)
            .with_dense(dense)
            .init::<B>(&device);
        // Equal gradients give equal models after one SGD step (linear in the gradients,
        // unlike Adam, whose normalisation magnifies rounding in near-zero gradients).
        let stepped = |grads: GradientsParams| {
            burn::optim::SgdConfig::new()
                .init()
                .step(1e-3, model.clone(), grads)
                .forward(batch.images.clone())
                .into_data()
        };
        let plain = stepped(TrainStep::step(&model, batch.clone()).grads);
        for count in [1, 2, 4] {
            let segmented = model.clone().with_segments(Segments::Count(count)).unwrap();
            let output = TrainStep::step(&segmented, batch.clone());
            // A small step: NdArray's threads add partial sums in any order, and a large step
            // magnifies that rounding past any tolerance that still tells wrong gradients apart.
            stepped(output.grads).assert_approx_eq::<f32>(&plain, Tolerance::absolute(1e-5));
        }
        // Three hidden layers and the output layer: four layers, not five segments.
        assert!(model.clone().with_segments(Segments::Count(5)).is_err());
    }

    let dir = tempfile::tempdir().unwrap();
    let data = Mnist::embedded_dir();
    let config = TrainingConfig::new(MlpConfig::new().with_hidden(vec![64, 32]).with_low_rank(8))
        .with_epochs(1)
        .with_batch_size(32)
        .with_train_limit(Some(512))
        .with_seed(9);
    let plain = train::<B>(&config, &data, &dir.path().join("plain"), false, &device).unwrap();
    let segmented = config.with_checkpoint_segments(Some(2));
    let segmented = train::<B>(&segmented, &data, &dir.path().join("seg"), false, &device).unwrap();
    let drift = (segmented.train_loss - plain.train_loss).abs() / plain.train_loss;
    assert!(
        drift < 1e-4,
        "{} vs {}",
        segmented.train_loss,
        plain.train_loss
    );
}

/// Under mixed precision, the loss scale and its counters are part of the model's record: the
/// learner's checkpoints hold them and `resume` continues from them instead of starting over.
#[test]
fn mixed_precision_state_is_checkpointed_and_resumed() {
    let _serial = serial();
    use burn::module::Module;
    use burn::record::DefaultRecorder;
    use burn_memory::MixedPrecisionRecord;

    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let data = Mnist::embedded_dir();
    let device = Default::default();
    let model = MlpConfig::new().with_hidden(vec![16]).with_low_rank(4);
    // 256 digits in batches of 32: 8 steps an epoch. NdArray computes in f32, so the run is
    // f32 with a static scale of 1, whose clean-step count grows by one a step.
    let config = TrainingConfig::new(model.clone())
        .with_epochs(1)
        .with_batch_size(32)
        .with_train_limit(Some(256))
        .with_seed(5)
        .with_amp(Some(Precision::F32));
    let first = train::<B>(&config, &data, &run, false, &device).unwrap();
    let expected = MixedPrecisionRecord {
        scale: 1.0,
        clean_steps: 8,
        skipped_steps: 0,
    };
    assert_eq!(first.amp.unwrap().record(), expected);

    // The checkpoint holds the state: a model with a fresh dynamic scale loads it.
    let fresh = MixedPrecisionConfig::new()
        .with_compute(Precision::F32)
        .init::<B>(&device)
        .unwrap();
    assert_eq!(fresh.scale(), 65536.0);
    let checkpoint = checkpoint_path(&run, 1).with_extension("");
    let loaded = model
        .init::<B>(&device)
        .with_amp(fresh)
        .load_file(checkpoint, &DefaultRecorder::new(), &device)
        .unwrap();
    assert_eq!(loaded.amp().unwrap().record(), expected);
    // One readable line in the model's summary, not the debug form of a mutex.
    let summary = loaded.to_string();
    assert!(
        summary.contains("loss scale 1 (dynamic), 0 step(s) skipped") && !summary.contains("Mutex"),
        "{summary}"
    );

    // Resuming continues the count: 16 clean steps after the second epoch, not 8.
    let second = train::<B>(&config.with_epochs(2), &data, &run, true, &device).unwrap();
    assert_eq!(second.resumed_from, 1);
    assert_eq!(second.amp.unwrap().record().clean_steps, 16);
}

/// The kill-and-resume run: 3 epochs of the 8,000 embedded training digits, about a second
/// each here, so that kills land at different points of it.
fn killed_run_config() -> TrainingConfig {
    TrainingConfig::new(MlpConfig::new().with_hidden(vec![64]).with_low_rank(8))
        .with_epochs(3)
        .with_batch_size(32)
        .with_seed(11)
}

/// `train_mnist --resume` killed with SIGKILL at several points (while it starts, mid-epoch,
/// and the moment an epoch's checkpoint starts to appear, which is while it is written): every
/// restart resumes from a complete checkpoint, never from a half-written one, and the last
/// restart completes the run. Each run is this test binary again, in a process of its own.
#[test]
fn killed_runs_resume_from_the_newest_complete_checkpoint() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    const CHILD: &str = "TRAIN_SMOKE_KILLED_RUN_DIR";
    const TEST: &str = "killed_runs_resume_from_the_newest_complete_checkpoint";
    if let Ok(run) = std::env::var(CHILD) {
        let report = train::<B>(
            &killed_run_config(),
            &Mnist::embedded_dir(),
            std::path::Path::new(&run),
            true,
            &Default::default(),
        )
        .unwrap();
        println!("resumed from epoch {}", report.resumed_from);
        return;
    }

    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let spawn = || {
        Command::new(std::env::current_exe().unwrap())
            .args([TEST, "--exact", "--test-threads=1", "--nocapture"])
            .env(CHILD, &run)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Files of epochs after `epoch` in the checkpoint directory, staging files included.
    let checkpoint_files_after = |epoch: usize| {
        std::fs::read_dir(run.join("checkpoint"))
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| {
                name.trim_start_matches('.')
                    .split(['-', '.'])
                    .nth(1)
                    .and_then(|n| n.parse::<usize>().ok())
                    .is_some_and(|n| n > epoch)
            })
            .count()
    };

    // The last time anything in the checkpoint directory was written.
    let last_write = || {
        std::fs::read_dir(run.join("checkpoint"))
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.ok()?.metadata().ok()?.modified().ok())
            .max()
    };

    enum Kill {
        After(Duration),
        WhenCheckpointAppears,
    }
    let mut progress = Vec::new();
    for kill in [
        Kill::After(Duration::from_millis(300)),
        Kill::WhenCheckpointAppears,
        Kill::After(Duration::from_millis(1500)),
        Kill::WhenCheckpointAppears,
        Kill::WhenCheckpointAppears,
    ] {
        let before = latest_checkpoint(&run).unwrap_or(0);
        let written = last_write();
        let mut child = spawn();
        let start = Instant::now();
        loop {
            let due = match kill {
                Kill::After(delay) => start.elapsed() >= delay,
                Kill::WhenCheckpointAppears => last_write() > written,
            };
            if due || child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(300), "the run hangs");
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = child.kill();
        child.wait().unwrap();
        // What a restart would resume from is complete (`latest_checkpoint` decodes it), and
        // no older than what the previous restart found.
        let latest = latest_checkpoint(&run).unwrap_or(0);
        assert!(latest >= before, "epoch {before} -> {latest}");
        // What the kill left beyond the complete checkpoint (a partial epoch, staging files):
        // shown with `--nocapture`, for the record of where the kills landed.
        eprintln!(
            "killed after {:?}: complete checkpoint {before} -> {latest}, {} newer file(s) left",
            start.elapsed(),
            checkpoint_files_after(latest)
        );
        progress.push(latest);
    }

    let output = spawn().wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the final resume failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let resumed: usize = stdout
        .split("resumed from epoch ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no report in:\n{stdout}"));
    assert_eq!(resumed, *progress.last().unwrap(), "progress {progress:?}");
    assert_eq!(latest_checkpoint(&run), Some(3));
}
