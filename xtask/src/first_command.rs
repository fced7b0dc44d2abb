//! What the README's first command (`cargo run --release -p examples --example train_mnist`)
//! compiles: the packages of the examples crate's default build, read from `cargo tree`.
//!
//! That command runs on the CPU, so its build must not compile a GPU stack, a network server
//! or an HTTP client. `cargo xtask first-command` prints the count; a test fails when it passes the
//! budget or when one of the [`FORBIDDEN`] packages comes back.

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The most packages the first command may compile (408 before the CPU-only defaults; 322 while
/// the serving example, and with it the HTTP stack every example of a package links, was in the
/// `examples` package; 288 since it is a package of its own, `examples-serve`).
pub const BUDGET: usize = 300;

/// Packages of the GPU stack (wgpu, its shader compiler and Vulkan bindings, CubeCL's wgpu
/// runtime), of data parallel (burn-collective, and the MPI binding, which needs a system MPI
/// to build), of its WebSocket server, and of serving (burn-serve and its HTTP stack: axum,
/// hyper, tokio; the serving example is the package `examples-serve`): none belongs in a CPU
/// build of one process that trains.
pub const FORBIDDEN: [&str; 13] = [
    "wgpu",
    "wgpu-core",
    "naga",
    "ash",
    "cubecl-wgpu",
    "burn-wgpu",
    "burn-collective",
    "mpi-sys",
    "tungstenite",
    "burn-serve",
    "axum",
    "hyper",
    "tokio",
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
            "the README's first command compiles {forbidden:?}: a default feature or a \
             dependency of the examples pulls the GPU, WebSocket or HTTP stack again"
        );
        assert!(
            packages.len() <= BUDGET,
            "the README's first command compiles {} packages, over {BUDGET}",
            packages.len()
        );
    }
}
