//! Training checkpoints that survive the process being killed at any moment.
//!
//! Why: Burn's file recorders delete the old file and write the new one in place, and
//! burn-train writes an epoch's model, optimizer and scheduler records one after the other (on
//! background threads). A run killed during that leaves a truncated file or an epoch with only
//! some of its records, and resuming from it panics in burn-train or loads garbage. Here each
//! file is written under a temporary name, flushed to disk and renamed into place (a file with
//! the final name is always complete), and resuming picks the newest epoch whose three records
//! are all present and decode to their end.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use burn::record::{FileRecorder, Recorder, RecorderError};
use burn::tensor::backend::Backend;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The records burn-train writes for each checkpointed epoch, by file-name prefix.
const RECORDS: [&str; 3] = ["model", "optim", "scheduler"];

/// A file recorder whose writes are atomic: `R` writes to a hidden temporary file beside the
/// target, which is synced and then renamed over it. Loading is `R`'s.
#[derive(Debug, Clone, Default)]
pub struct AtomicFileRecorder<R>(pub R);

impl<B: Backend, R: FileRecorder<B>> Recorder<B> for AtomicFileRecorder<R> {
    type Settings = R::Settings;
    type RecordArgs = PathBuf;
    type RecordOutput = ();
    type LoadArgs = PathBuf;

    fn save_item<I: Serialize>(&self, item: I, mut file: PathBuf) -> Result<(), RecorderError> {
        file.set_extension(<R as FileRecorder<B>>::file_extension());
        let name = file_name(&file);
        let io = |err: std::io::Error| RecorderError::Unknown(format!("{name}: {err}"));
        // `R` sets its extension on the path it is given: `.model-3.mpk.partial` becomes
        // `.model-3.mpk.mpk`, hidden and unlike any checkpoint name.
        let staging = file.with_file_name(format!(".{name}.partial"));
        let written = staging.with_extension(<R as FileRecorder<B>>::file_extension());
        self.0.save_item(item, staging)?;
        File::open(&written)
            .and_then(|f| f.sync_all())
            .map_err(io)?;
        std::fs::rename(&written, &file).map_err(io)?;
        // The rename itself reaches the disk with the directory's metadata.
        if let Some(dir) = file.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
        }
        Ok(())
    }

    fn load_item<I: DeserializeOwned>(&self, file: &mut PathBuf) -> Result<I, RecorderError> {
        self.0.load_item(file)
    }
}

impl<B: Backend, R: FileRecorder<B>> FileRecorder<B> for AtomicFileRecorder<R> {
    fn file_extension() -> &'static str {
        <R as FileRecorder<B>>::file_extension()
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The model checkpoint of epoch `epoch` under the run directory `dir`.
pub fn checkpoint_path(dir: &Path, epoch: usize) -> PathBuf {
    record_path(dir, "model", epoch)
}

fn record_path(dir: &Path, record: &str, epoch: usize) -> PathBuf {
    dir.join("checkpoint").join(format!("{record}-{epoch}.mpk"))
}

/// The newest epoch under `dir` whose checkpoint is complete: its model, optimizer and
/// scheduler records all exist and decode (as MessagePack) to their end. Newer epochs that
/// are incomplete (a run killed while writing them) are skipped with a warning.
pub fn latest_checkpoint(dir: &Path) -> Option<usize> {
    let mut epochs: Vec<usize> = std::fs::read_dir(dir.join("checkpoint"))
        .ok()?
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            RECORDS.iter().find_map(|record| {
                name.strip_prefix(record)?
                    .strip_prefix('-')?
                    .strip_suffix(".mpk")?
                    .parse()
                    .ok()
            })
        })
        .collect();
    epochs.sort_unstable_by(|a, b| b.cmp(a));
    epochs.dedup();
    epochs
        .into_iter()
        .find(|&epoch| match incomplete(dir, epoch) {
            None => true,
            Some(reason) => {
                tracing::warn!("skipping the checkpoint of epoch {epoch}: {reason}");
                false
            }
        })
}

/// Why epoch `epoch`'s checkpoint cannot be resumed from, if it cannot.
fn incomplete(dir: &Path, epoch: usize) -> Option<String> {
    RECORDS.iter().find_map(|record| {
        let path = record_path(dir, record, epoch);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(err) => return Some(format!("{}: {err}", path.display())),
        };
        rmp_serde::decode::from_read::<_, serde::de::IgnoredAny>(BufReader::new(file))
            .err()
            .map(|err| format!("{} does not decode: {err}", path.display()))
    })
}
