//! A short `train_mnist` run through burn-train: the loss falls, a checkpoint appears each
//! epoch, and `resume` continues from it.

use burn::backend::{Autodiff, NdArray};
use examples::data::DigitDataset;
use examples::mlp::MlpConfig;
use examples::mnist::Mnist;
use examples::training::{
    TrainingConfig, TrainingError, checkpoint_path, evaluate, latest_checkpoint, train,
};

type B = Autodiff<NdArray>;

#[test]
fn training_lowers_the_loss_checkpoints_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let data = Mnist::embedded_dir();
    let device = Default::default();
    let model = MlpConfig::new().with_hidden(vec![64]).with_low_rank(8);
    let config = TrainingConfig::new(model.clone())
        .with_epochs(1)
        .with_batch_size(32)
        .with_train_limit(Some(1024))
        .with_learning_rate(3e-3)
        .with_seed(7);

    // The loss of the untrained model on the same digits, same seed, same initialisation.
    <NdArray as burn::tensor::backend::Backend>::seed(&device, 7);
    let untrained = model.init::<NdArray>(&device);
    let digits = DigitDataset::new(Mnist::read(&data, "train").unwrap().truncate(1024));
    let (initial_loss, _) = evaluate(&untrained, &digits, &device);

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

    // A different model cannot resume from this run.
    let other = TrainingConfig::new(model.with_low_rank(4))
        .with_epochs(3)
        .with_batch_size(32)
        .with_train_limit(Some(1024))
        .with_learning_rate(3e-3)
        .with_seed(7);
    let err = train::<B>(&other, &data, &run, true, &device).unwrap_err();
    assert!(matches!(err, TrainingError::ConfigMismatch { .. }), "{err}");
}
