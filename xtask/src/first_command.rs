//! What the README's first command (`cargo run --release -p examples --example train_mnist`)
//! compiles: the packages of the examples crate's default build, read from `cargo tree`.
//!
//! That command runs on the CPU, so its build must not compile a GPU stack or a network
//! server. `cargo xtask first-command` prints the count; a test fails when it passes the
//! budget or when one of the [`FORBIDDEN`] packages comes back.

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The most packages the first command may compile (408 before the CPU-only defaults; 322 since
/// the examples serve a model, whose HTTP stack every example of the package links).
pub const BUDGET: usize = 330;

/// Packages of the GPU stack (wgpu, its shader compiler and Vulkan bindings, CubeCL's wgpu
/// runtime), of data parallel (burn-collective, and the MPI binding, which needs a system MPI
/// to build) and of its WebSocket server: none belongs in a CPU build of one process. The
/// serving example's HTTP server (axum, hyper, tokio) is allowed: `serve` must run with no
/// `--features`, and an example links every dependency of its package.
pub const FORBIDDEN: [&str; 9] = [
    "wgpu",
    "wgpu-core",
    "naga",
    "ash",
    "cubecl-wgpu",
    "burn-wgpu",
    "burn-collective",
    "mpi-sys",
    "tungstenite",
];

/// The names of the packages that `cargo run -p examples --example train_mnist` compiles for
/// the host: normal and build dependencies, and the examples' own dev-dependencies (an example
/// target links them; `cargo tree` lists dev-dependencies of the root package only, which is
/// what the build does too).
pub fn packages() -> Result<BTreeSet<String>> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let output = Command::new(env!("CARGO"))
        .current_dir(root)
        .args([
            "tree",
            "--locked",
            "-p",
            "examples",
            "-e",
            "normal,build,dev",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .output()
        .context("running `cargo tree`")?;
    if !output.status.success() {
        bail!(
            "`cargo tree` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8(output.stdout).context("`cargo tree` printed non-UTF-8")?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// The [`FORBIDDEN`] packages among `packages`.
pub fn forbidden(packages: &BTreeSet<String>) -> Vec<&'static str> {
    FORBIDDEN
        .into_iter()
        .filter(|name| packages.contains(*name))
        .collect()
}

/// `cargo xtask first-command`: the count, the budget, and any forbidden package.
pub fn run() -> Result<()> {
    let packages = packages()?;
    let forbidden = forbidden(&packages);
    println!(
        "the README's first command compiles {} packages (budget {BUDGET})",
        packages.len()
    );
    if !forbidden.is_empty() {
        bail!("it compiles {}", forbidden.join(", "));
    }
    if packages.len() > BUDGET {
        bail!("{} packages is over the budget of {BUDGET}", packages.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_command_compiles_only_the_cpu_path() {
        let packages = packages().unwrap();
        // The reading itself: the examples and the CPU backend are there.
        for expected in ["examples", "burn-sketch", "burn-memory", "burn-flex"] {
            assert!(packages.contains(expected), "`{expected}` not in the tree");
        }
        let forbidden = forbidden(&packages);
        assert!(
            forbidden.is_empty(),
            "the README's first command compiles {forbidden:?}: a default feature pulls the \
             GPU or WebSocket stack again"
        );
        assert!(
            packages.len() <= BUDGET,
            "the README's first command compiles {} packages, over {BUDGET}",
            packages.len()
        );
    }
}
