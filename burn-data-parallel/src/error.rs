//! What can go wrong when peers train together.

use std::time::Duration;

/// Why data-parallel training could not start or go on.
///
/// Every collective operation is bounded in time: a peer that dies, hangs or never arrives makes
/// the others fail with [`Timeout`](Self::Timeout) instead of waiting forever.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DistributedError {
    /// The configuration cannot describe a run (no device, `mpi` without MPI initialised, more
    /// than 256 peers...).
    #[error("invalid data-parallel configuration: {0}")]
    InvalidConfig(String),
    /// Another data-parallel run is going on in this process: burn-collective keeps one
    /// collective per process and backend.
    #[error("another data-parallel run is already going on in this process")]
    Busy,
    /// A collective operation did not complete within the configured timeout: another peer
    /// died, hangs, never arrived, or spends longer between two collective operations than the
    /// timeout allows (validation runs on the main peer only).
    #[error(
        "peer {peer}: `{operation}` did not complete within {timeout:?} (a peer died, hangs or never arrived)"
    )]
    Timeout {
        /// The global rank of the peer that gave up.
        peer: u32,
        /// The collective operation.
        operation: &'static str,
        /// The configured timeout.
        timeout: Duration,
    },
    /// A collective operation completed without every peer of the run: a peer that joined
    /// another run, or a count the reduction lost.
    #[error("peer {peer}: `{operation}` counted {found} of the run's {expected} peers")]
    PeersMissing {
        /// The global rank of the peer that noticed.
        peer: u32,
        /// The collective operation.
        operation: &'static str,
        /// The peers of the run.
        expected: usize,
        /// The peers the operation counted.
        found: usize,
    },
    /// An all-reduce across the processes of an MPI job did not complete within the timeout,
    /// and these MPI ranks never reached it: they died, hang, or spend longer than the timeout
    /// between two operations. (Launch with `mpirun --enable-recovery` for the others to see
    /// this error: by default Open MPI ends the whole job when one process dies.) MPI must
    /// not be finalised afterwards (it would wait for the lost process): `Mpi` skips it; a
    /// program that initialised MPI itself should exit without finalising.
    #[error(
        "peer {peer}: `{operation}` did not complete within {timeout:?}: MPI rank(s) {} never reached it (dead or hung)",
        ranks.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )]
    ProcessesLost {
        /// The global rank of the peer that gave up.
        peer: u32,
        /// The collective operation.
        operation: &'static str,
        /// The MPI ranks (processes) that never arrived.
        ranks: Vec<u32>,
        /// The configured timeout.
        timeout: Duration,
    },
    /// burn-collective refused or failed an operation.
    #[error("peer {peer}: `{operation}` failed in burn-collective: {message}")]
    Collective {
        /// The global rank of the peer.
        peer: u32,
        /// The collective operation.
        operation: &'static str,
        /// burn-collective's error.
        message: String,
    },
    /// The replicas do not hold the same parameters at the start: the fixed sketches or the
    /// initial weights differ (another seed, another configuration or another checkpoint on
    /// some peer). Training them together would average gradients of different models.
    #[error("the replicas differ at the start in {} parameter(s): {}", parameters.len(), parameters.join(", "))]
    ReplicasDiffer {
        /// The module paths of the parameters that differ (`layers.0.u1s`, ...).
        parameters: Vec<String>,
    },
    /// A peer's thread panicked.
    #[error("peer {peer} panicked: {message}")]
    PeerPanicked {
        /// The global rank of the peer.
        peer: u32,
        /// The panic's message.
        message: String,
    },
    /// MPI could not be initialised as data parallel needs it.
    #[error("MPI: {0}")]
    Mpi(String),
}
