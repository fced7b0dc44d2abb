//! The orchestrator of a multi-node run: burn-collective's WebSocket server that introduces
//! the nodes to each other and plans their collective operations.

use std::net::TcpListener;

use crate::DistributedError;

/// Serves burn-collective's global orchestrator on `port` (all interfaces) until the process
/// receives Ctrl-C or SIGTERM. Every node of a run points its
/// [`NodeConfig::orchestrator`](super::NodeConfig::orchestrator) at it; it carries no
/// tensors, only the nodes' requests.
///
/// # Errors
/// [`DistributedError::Orchestrator`] when the port cannot be bound or the runtime cannot
/// start.
pub fn run_orchestrator(port: u16) -> Result<(), DistributedError> {
    let runtime = check_and_build(port)?;
    runtime.block_on(burn_collective::start_global_orchestrator(port));
    Ok(())
}

/// [`run_orchestrator`] on a background thread of this process, for the node that hosts it
/// (as `torchrun`'s rank 0 hosts its store). The orchestrator lives as long as the process.
///
/// # Errors
/// As [`run_orchestrator`], for what can be checked before the thread starts.
pub fn spawn_orchestrator(port: u16) -> Result<(), DistributedError> {
    let runtime = check_and_build(port)?;
    std::thread::Builder::new()
        .name("collective orchestrator".into())
        .spawn(move || runtime.block_on(burn_collective::start_global_orchestrator(port)))
        .map_err(|error| DistributedError::Orchestrator(error.to_string()))?;
    Ok(())
}

/// Fails early on a port that cannot be bound: burn-collective would only log it.
fn check_and_build(port: u16) -> Result<tokio::runtime::Runtime, DistributedError> {
    TcpListener::bind(("0.0.0.0", port))
        .map_err(|error| DistributedError::Orchestrator(format!("port {port}: {error}")))?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()
        .map_err(|error| DistributedError::Orchestrator(error.to_string()))
}
