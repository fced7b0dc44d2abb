//! `cargo backend-ops`: generates the forwarding of Burn's operation traits
//! (`FloatTensorOps`, `IntTensorOps`, `BoolTensorOps`, `ModuleOps`, `ActivationOps`,
//! `QTensorOps`) for the project's two backend decorators ([`TARGETS`]): burn-profiler's
//! profiling backend `Profiled<B>` and burn-fast-cpu's `FastFlex`. Each gets a folder, its
//! module `ops`, with one file per trait as in burn-backend (`float.rs`, `int.rs`, `bool.rs`,
//! `module.rs`, `activation.rs`, `qtensor.rs`) and a `mod.rs` that declares them.
//!
//! Why generated: a decorator must forward every method of these traits to its inner
//! backend's, those with a default implementation included. A method left to its default would
//! decompose the operation into others (`float_neg` into a multiplication, `conv1d` into a
//! `conv2d`) and so bypass the inner backend's own kernel: a profile would show operations the
//! backend never runs, and the decorated model would compute differently. The traits hold 417
//! methods in burn-backend 0.21.0 and change between Burn releases; written by hand, a
//! forgotten method compiles silently (it has a default). So the forwarding is generated from
//! burn-backend's own sources, found through `cargo metadata`: every `fn` of the six traits,
//! with its signature (the trait's backend parameter becomes `Self`, whose associated types
//! are the inner backend's) and a body that depends on the target ([`Body`](targets::Body)).
//!
//! The test `generated_forwarding_is_current` runs the generator and compares its output with
//! every committed file of the folders byte for byte, and fails on a file there that the
//! generator does not write ([`stale_files`]), so a Burn upgrade or a change here that is not
//! regenerated fails `cargo test -p backend-ops`; another test checks that every trait method
//! was emitted, in its trait's file. The generator is a crate of its own that links none of
//! the crates it writes into: after a Burn upgrade that breaks a generated file, it still
//! builds and regenerates it.
//!
//! The modules: [`targets`] says what is generated (the traits, the two decorators and what
//! their methods do); [`parse`] reads burn-backend's sources (the traits, the types their
//! signatures name, where those are reachable from outside burn-backend) and classifies each
//! parameter and return type ([`parse::classify`]); [`emit`] writes the files, a method's
//! signature and arguments in `emit::method`, its body in `emit::profiled` (`Profiled<B>`)
//! or `emit::fast_flex` (`FastFlex`).

mod emit;
mod parse;
mod targets;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

use emit::{Generated, generate};
use targets::TARGETS;

/// Runs `cargo backend-ops`: writes the files and prints the method counts.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("backend-ops failed: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes every target's folder, removes the files in it that the generator no longer writes,
/// and prints what each trait got.
pub fn run() -> Result<()> {
    let root = workspace_root();
    for target in &TARGETS {
        let generated = generate(&root, target)?;
        let per_trait = generated.counts.iter().zip(&generated.declared);
        for (((name, count), (_, declared)), (_, left)) in per_trait.zip(&generated.defaulted) {
            ensure!(
                count + left.len() == declared.len(),
                "{name}: {count} methods emitted and {} left to the default, {} declared",
                left.len(),
                declared.len()
            );
        }
        let folder = root.join(target.output);
        std::fs::create_dir_all(&folder)
            .with_context(|| format!("could not create {}", folder.display()))?;
        for (name, code) in &generated.files {
            let out = folder.join(name);
            std::fs::write(&out, code)
                .with_context(|| format!("could not write {}", out.display()))?;
        }
        for stale in stale_files(&folder, &generated)? {
            ensure!(
                stale.is_file(),
                "{} is not a file the generator writes: remove it",
                stale.display()
            );
            std::fs::remove_file(&stale)
                .with_context(|| format!("could not remove {}", stale.display()))?;
            println!(
                "removed {}, which the generator no longer writes",
                stale.display()
            );
        }
        let total: usize = generated.counts.iter().map(|(_, count)| count).sum();
        let left: usize = generated.defaulted.iter().map(|(_, left)| left.len()).sum();
        println!(
            "{}: {total} methods ({}), {left} left to the traits' defaults, from burn-backend {}, \
             written to {} ({})",
            target.implementor,
            generated
                .counts
                .iter()
                .map(|(name, count)| format!("{name} {count}"))
                .collect::<Vec<_>>()
                .join(", "),
            generated.version,
            folder.display(),
            generated
                .files
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

/// What lies in or beside the generated folder `folder` and is not [`generate`]'s: the
/// entries of the folder that it does not write (a trait module of a trait no longer
/// forwarded, a file added by hand), and the module's file beside the folder (`ops.rs`, the
/// single file of an older generator, which the compiler refuses next to `ops/mod.rs`).
pub fn stale_files(folder: &Path, generated: &Generated) -> Result<Vec<PathBuf>> {
    let mut stale = Vec::new();
    if folder.is_dir() {
        for entry in std::fs::read_dir(folder)
            .with_context(|| format!("could not list {}", folder.display()))?
        {
            let entry = entry?;
            let name = entry.file_name();
            if !name
                .to_str()
                .is_some_and(|name| generated.files.contains_key(name))
            {
                stale.push(entry.path());
            }
        }
    }
    let beside = folder.with_extension("rs");
    if beside.exists() {
        stale.push(beside);
    }
    stale.sort();
    Ok(stale)
}

/// The workspace root (two folders above this crate's).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("xtask/backend-ops is inside the workspace")
        .to_path_buf()
}
