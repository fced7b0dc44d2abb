//! `cargo xtask bench --profile DIR`: where a workload's time and memory go, operation by
//! operation.
//!
//! After every point has been timed, each point's workloads run again on burn-profiler's
//! `Profiled<B>` (the training ones on `Autodiff<Profiled<B>>`) with a `Profiler` recording
//! shapes and memory, and each workload's profile is written by `write_profile` into
//! `DIR/<point id>/<workload>/`. A separate pass, so that the recording costs nothing to the
//! timed numbers; a few runs, each in a scope `run N`, after one unrecorded run (lazy
//! initialisation, kernel compilation and autotuning are not what a profile should show).

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use burn_memory::DeviceMemory;
use burn_profiler::ProfileError;
use burn_profiler::{Profiled, Profiler, ProfilerConfig, scope, write_profile};
use burn_sketch::SketchBackend;

use super::grid::Point;
use super::workloads::Settings;
use super::workloads::{NAMES, Workloads};

/// What the profile pass records.
#[derive(Debug, Clone, Copy)]
pub struct ProfileSettings {
    /// Recorded runs of each workload.
    pub runs: usize,
    /// Sync the device after every operation, so that each records its device time.
    pub sync_each_op: bool,
}

/// Profiles each workload of `point` on `Profiled<B>` and writes its profile to
/// `dir/<point id>/<workload>/`; returns the directories written, in the order of [`NAMES`].
///
/// # Errors
/// The profiler's, when it cannot start (another one is running in the process), and
/// [`ProfileError::Io`] when a file cannot be written.
pub fn profile_point<B: SketchBackend + DeviceMemory>(
    point: Point,
    device: &B::Device,
    settings: Settings,
    profile: ProfileSettings,
    dir: &Path,
) -> Result<Vec<PathBuf>, ProfileError> {
    let workloads = Workloads::<Profiled<B>>::new(point, device, settings);
    let config = ProfilerConfig::new()
        .with_record_shapes(true)
        .with_sync_each_op(profile.sync_each_op);
    let sync = || Profiled::<B>::sync(device).expect("device sync failed");
    let point_dir = dir.join(point.id());
    let mut written = Vec::with_capacity(NAMES.len());
    for (name, mut op) in NAMES.into_iter().zip(workloads.ops()) {
        drop(op());
        sync();
        let profiler = Profiler::start_with_memory::<B>(config, device)?;
        for run in 1..=profile.runs.max(1) {
            let _run = scope(&format!("run {run}"));
            let output = op();
            sync();
            drop(output);
        }
        let recorded = profiler.stop();
        let out = point_dir.join(name);
        write_profile(&recorded, &out)?;
        written.push(out);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::bench::{ActivationArg, BackendKind, BenchArgs, Dtype, Row, Strategy, run};

    /// The calls of the row `name` in a written `operations.json` (0 when it has none).
    fn calls(dir: &Path, name: &str) -> u64 {
        let json: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("operations.json")).unwrap())
                .unwrap();
        json["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["name"] == name)
            .map_or(0, |row| row["calls"].as_u64().unwrap())
    }

    /// `--profile` leaves the results as they were and gives each workload its own directory
    /// with every file of `write_profile`; what each records is that workload's, run the asked
    /// number of times: the sketched layer as one operation (its product, and its backward in
    /// training), the tensor-op path as matrix products, dense `Linear` as Burn's `linear`.
    #[test]
    fn the_profile_pass_writes_each_workloads_profile() {
        let out = tempfile::tempdir().unwrap();
        let profile_dir = out.path().join("profile");
        let args = BenchArgs {
            backend: BackendKind::Ndarray,
            dtype: Dtype::F32,
            device_model: None,
            quick: true,
            strategy: Strategy::Kernels,
            filter: Some("d1024x1024-t1-k16-b64".into()),
            warmup: 0,
            runs: 1,
            out: out.path().join("results"),
            baseline: None,
            fail_on_regression: None,
            profile: Some(profile_dir.clone()),
            profile_runs: 2,
            python: "python3".into(),
            no_torch: true,
            profile_sync: false,
            activation: ActivationArg::Identity,
        };
        let output = run(&args).unwrap();
        let rows: Vec<Row> = serde_json::from_str(
            &std::fs::read_to_string(output.results.join("results.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].sketch_forward.runs, 1);

        let expected: Vec<PathBuf> = NAMES
            .iter()
            .map(|name| profile_dir.join("d1024x1024-t1-k16-b64").join(name))
            .collect();
        assert_eq!(output.profiles, expected);
        for dir in &output.profiles {
            for file in [
                "operations.txt",
                "operations_by_shape.txt",
                "operations.json",
                "trace.json",
                "viewer.html",
                "peak.txt",
                // The test binary's allocator is the bench's counting one: every allocation
                // is logged, and the PyTorch snapshot written.
                "memory_snapshot.pickle",
            ] {
                assert!(dir.join(file).is_file(), "{} has no {file}", dir.display());
            }
            // Two recorded runs, the unrecorded first one left out.
            assert_eq!(calls(dir, "run 1"), 1, "{}", dir.display());
            assert_eq!(calls(dir, "run 2"), 1, "{}", dir.display());
            assert_eq!(calls(dir, "run 3"), 0, "{}", dir.display());
        }
        let [sketch, tensor_ops, dense, sketch_train, dense_train] = &output.profiles[..] else {
            unreachable!("five directories, checked above");
        };
        assert_eq!(calls(sketch, "sketched_linear"), 2);
        assert_eq!(calls(sketch, "float_matmul"), 0);
        assert_eq!(calls(tensor_ops, "sketched_linear"), 0);
        assert!(calls(tensor_ops, "float_matmul") >= 2);
        assert_eq!(calls(dense, "linear"), 2);
        assert_eq!(calls(dense, "sketched_linear"), 0);
        assert_eq!(calls(sketch_train, "sketched_linear"), 2);
        assert_eq!(calls(sketch_train, "sketched_linear_backward"), 2);
        assert_eq!(calls(dense_train, "linear"), 2);
        assert_eq!(calls(dense_train, "linear_weight_backward"), 2);
    }
}
