//! Project tasks, run as `cargo xtask <task>`. The benchmark suite (`bench`) is not yet
//! implemented; see the project's issues.

fn main() {
    let task = std::env::args().nth(1);
    eprintln!(
        "cargo xtask: no task {:?}; no tasks are implemented yet (the bench suite is planned)",
        task.unwrap_or_default()
    );
    std::process::exit(2);
}
