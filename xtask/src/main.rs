//! Project tasks, run as `cargo xtask <task>` (an alias for this binary, built in release).
//!
//! - `bench`: the benchmark suite of `SkLinear` against dense `nn::Linear`; see
//!   `cargo xtask bench --help`.
//! - `products`: the six matrix products of a sketched training step on each CPU GEMM engine
//!   (Flex's `matmul`, ndarray's, the `gemm` crate direct); see `cargo xtask products --help`.
//! - `overhead`: kernel launches, pool reservations, new device buffers, host reads, device
//!   waits and queue submissions per call of `SkLinear` and dense `nn::Linear` on wgpu,
//!   counted from CubeCL's tracing spans and wgpu-core's API log.
//! - `profiler-cost`: an MNIST training step with and without burn-profiler's profiler
//!   recording, the median step time of each.
//! - `book`: builds the mdBook under `docs/` and checks its pages and links (`--browser`: in
//!   headless Chromium too).
//! - `profile-viewer`: writes burn-profiler's HTML profile viewer for a profiled MLP step and a
//!   synthetic 100 000-allocation profile, and checks in headless Chromium that it draws.
//! - `first-command`: counts the packages the README's first command compiles, and fails when
//!   it passes its budget or compiles the GPU, WebSocket or HTTP stack.
//!
//! The generator of the backend decorators' forwarding is a crate of its own,
//! `xtask/backend-ops` (`cargo backend-ops`), so that it builds without the crates it writes.
//!
//! The binary also runs on its own (`target/release/xtask bench ...`), so it can be copied to a
//! machine without cargo.

mod bench;
mod book;
mod first_command;
mod overhead;
#[cfg(test)]
#[path = "../../testing/own_process.rs"]
mod own_process;
mod products;
mod profiler_cost;
// The examples' medians and megabytes, the same file (xtask does not depend on the examples);
// not every helper there is used here.
#[allow(dead_code)]
#[path = "../../examples/src/stats.rs"]
mod stats;
mod viewer;

/// Benchmarks run on mimalloc. On CPU backends every call allocates its output, and glibc's
/// allocator hands large freed blocks back to the OS and page-faults them in again on the next
/// call; for the sketched layer that costs more than its matrix products (the book's
/// CPU benchmark page has the measurement). Dense and sketched layers
/// run in the same process on the same allocator, so their ratio stays fair, and a caching
/// allocator is what we recommend for CPU training anyway.
///
/// burn-memory's counting wrapper makes the CPU memory column exact heap bytes rather than
/// resident memory, which a caching allocator would blur.
#[global_allocator]
static ALLOCATOR: burn_memory::CountingAllocator<mimalloc::MiMalloc> =
    burn_memory::CountingAllocator::new(mimalloc::MiMalloc);

use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "xtask", about = "burn-sketch project tasks")]
enum Task {
    /// Time SkLinear against dense Linear over a grid of shapes.
    Bench(bench::BenchArgs),
    /// Time a sketched layer's six matrix products on each CPU GEMM engine.
    Products(products::ProductsArgs),
    /// Build the book under docs/ and check its pages and links.
    Book(book::BookArgs),
    /// Count kernel launches and buffer reservations per call of SkLinear and dense Linear.
    Overhead(overhead::OverheadArgs),
    /// Count the packages the README's first command compiles; fail past the budget.
    FirstCommand,
    /// Write the HTML profile viewer for a real and a synthetic profile; check it in Chromium.
    ProfileViewer(viewer::ViewerArgs),
    /// Time an MNIST training step with and without burn-profiler's profiler recording.
    ProfilerCost(profiler_cost::ProfilerCostArgs),
}

fn main() -> ExitCode {
    match Task::parse() {
        Task::Bench(args) => match bench::run(&args) {
            Ok(output) => {
                eprintln!("results written to {}", output.results.display());
                if let Some(dir) = &args.profile {
                    eprintln!(
                        "{} profiles (viewer.html, operations.txt, trace.json, peak.txt) \
                         written under {}:",
                        output.profiles.len(),
                        dir.display()
                    );
                    for profile in &output.profiles {
                        eprintln!("  {}", profile.display());
                    }
                }
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("bench failed: {err}");
                ExitCode::FAILURE
            }
        },
        Task::Products(args) => match products::run(&args) {
            Ok(_) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("products failed: {err}");
                ExitCode::FAILURE
            }
        },
        Task::Overhead(args) => match overhead::run(&args) {
            Ok(_) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("overhead failed: {err:#}");
                ExitCode::FAILURE
            }
        },
        Task::ProfilerCost(args) => match profiler_cost::run(&args) {
            Ok(_) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("profiler-cost failed: {err:#}");
                ExitCode::FAILURE
            }
        },
        Task::ProfileViewer(args) => match viewer::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("profile-viewer failed: {err:#}");
                ExitCode::FAILURE
            }
        },
        Task::FirstCommand => match first_command::run() {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("first-command failed: {err:#}");
                ExitCode::FAILURE
            }
        },
        Task::Book(args) => match book::run(&args) {
            Ok(report) => {
                eprintln!(
                    "{} chapters, {} links between pages checked: {}",
                    report.chapters,
                    report.links_checked,
                    report.out_dir.join("index.html").display()
                );
                if let Some(screenshot) = report.screenshot {
                    eprintln!("screenshot: {}", screenshot.display());
                }
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("book failed: {err:#}");
                ExitCode::FAILURE
            }
        },
    }
}
