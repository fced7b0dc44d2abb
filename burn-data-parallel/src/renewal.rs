//! A multi-node peer's registration, renewed after every global operation, and the barrier
//! that keeps the renewals of all nodes in order.
//!
//! burn-collective 0.21.0's nodes synchronise correctly once per registration: the list of
//! nodes that reached the closing synchronisation of a global all-reduce is never cleared (it
//! clears a copy), so the second global all-reduce of a registration waits forever. A node
//! therefore leaves after each one and registers again before the next (not right after
//! leaving: at the end of a run, a node that registered once more and left at once could not
//! be told from one not serving yet). Its orchestrator then needs every
//! node to have left before any registers again: it numbers a node by how many are registered,
//! so a node that comes back while another has not yet left takes that one's number and
//! address, and is answered at once with a run of its own.
//!
//! burn-collective has no barrier that could order this, so the nodes' data servers are the
//! signal. A node's data server stops only after the orchestrator has acknowledged its leaving,
//! and it serves on one of two ports by the parity of the registration (`data_port` for even
//! ones, `data_port + 1` for odd ones). Before registration `g + 1`, a node waits until every
//! node's port of registration `g` refuses connections: then all have left `g`. None can be in
//! registration `g + 2` yet, which needs this node, so a refused port is never a node that
//! already came back on it. After registering, it waits until every other node's new port
//! accepts connections: burn-communication does not retry a refused one, and a data server
//! starts on its runtime's thread after the registration has been answered. None can have
//! left `g + 1` yet: its one operation needs this node.

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use burn_collective::CollectiveConfig;

use crate::config::{MAX_HOST_LEN, websocket_address};
use crate::{DistributedError, NodeConfig};

/// How long one probe of a port may take.
const PROBE: Duration = Duration::from_millis(200);
/// How long to wait between two probes of a port that has not changed yet.
const PROBE_INTERVAL: Duration = Duration::from_millis(1);
/// Values per node in the exchange of data addresses: the port, the length of the host's
/// name, and the name's bytes (a DNS name has at most 253).
const ADDRESS_VALUES: usize = 2 + MAX_HOST_LEN;

/// A node's data server: the host the others reach it at, and its first port.
#[derive(Clone, Debug, PartialEq, Eq)]
struct DataServer {
    host: String,
    port: u16,
}

impl DataServer {
    /// The port of registration `generation`.
    fn port(&self, generation: u64) -> u16 {
        self.port + (generation % 2) as u16
    }
}

/// What a port answered to a probe.
#[derive(PartialEq, Eq)]
enum Probe {
    Accepted,
    Refused,
    /// No answer in time, or an address that does not resolve yet: probe again.
    Unknown,
}

fn probe(host: &str, port: u16) -> Probe {
    let Some(address): Option<SocketAddr> = (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
    else {
        return Probe::Unknown;
    };
    match TcpStream::connect_timeout(&address, PROBE) {
        Ok(_) => Probe::Accepted,
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Refused,
        Err(_) => Probe::Unknown,
    }
}

/// The registration of a multi-node peer (one per node), renewed after every global operation.
pub(crate) struct Renewal {
    collective: CollectiveConfig,
    this: DataServer,
    rank: usize,
    state: Mutex<State>,
}

struct State {
    /// How many times the node has registered, minus one.
    generation: u64,
    /// Whether the node is registered (between a registration and its one operation).
    registered: bool,
    /// Every node's data server, by rank, once exchanged.
    nodes: Vec<DataServer>,
}

impl Renewal {
    /// The first registration is `collective`, on `node.data_port`.
    pub(crate) fn new(collective: CollectiveConfig, node: &NodeConfig) -> Self {
        Self {
            collective,
            this: DataServer {
                host: node.host.clone(),
                port: node.data_port,
            },
            rank: node.rank as usize,
            state: Mutex::new(State {
                generation: 0,
                registered: true,
                nodes: Vec::new(),
            }),
        }
    }

    /// This node's contribution to the exchange of data addresses among `nodes` nodes: its
    /// port and name in its own slot, zeros elsewhere, so that the sum over nodes holds all.
    pub(crate) fn address_values(&self, nodes: usize) -> Vec<f32> {
        let mut values = vec![0.0; nodes * ADDRESS_VALUES];
        let slot = &mut values[self.rank * ADDRESS_VALUES..][..ADDRESS_VALUES];
        slot[0] = f32::from(self.this.port);
        slot[1] = self.this.host.len() as f32;
        for (value, byte) in slot[2..].iter_mut().zip(self.this.host.bytes()) {
            *value = f32::from(byte);
        }
        values
    }

    /// Reads every node's data server from the summed `values` of the exchange.
    pub(crate) fn learn_addresses(&self, values: &[f32]) -> Result<(), DistributedError> {
        let nodes = values
            .chunks_exact(ADDRESS_VALUES)
            .enumerate()
            .map(|(rank, slot)| {
                let length = (slot[1] as usize).min(MAX_HOST_LEN);
                let host: Vec<u8> = slot[2..2 + length].iter().map(|&v| v as u8).collect();
                String::from_utf8(host)
                    .map(|host| DataServer {
                        host,
                        port: slot[0] as u16,
                    })
                    .map_err(|_| {
                        DistributedError::InvalidConfig(format!(
                            "node {rank}'s host name did not arrive intact: two nodes share a rank?"
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.state.lock().expect("not poisoned").nodes = nodes;
        Ok(())
    }

    /// Waits until every node has left registration `g` (its port of `g` refuses
    /// connections; this node's own port binds again), at most `timeout`.
    pub(crate) fn wait_all_left(&self, timeout: Duration) -> Result<(), WaitError> {
        let state = self.state.lock().expect("not poisoned");
        let start = Instant::now();
        for (rank, node) in state.nodes.iter().enumerate() {
            let port = node.port(state.generation);
            loop {
                let left = if rank == self.rank {
                    // Our new data server will bind every interface.
                    TcpListener::bind(("0.0.0.0", port)).is_ok()
                } else {
                    probe(&node.host, port) == Probe::Refused
                };
                if left {
                    break;
                }
                if start.elapsed() > timeout {
                    return Err(WaitError { rank });
                }
                std::thread::sleep(PROBE_INTERVAL);
            }
        }
        Ok(())
    }

    /// Whether the node is registered: from a registration to the end of its operation.
    pub(crate) fn is_registered(&self) -> bool {
        self.state.lock().expect("not poisoned").registered
    }

    /// The node leaves its registration.
    pub(crate) fn mark_left(&self) {
        self.state.lock().expect("not poisoned").registered = false;
    }

    /// The configuration of the next registration, on the other port.
    pub(crate) fn next(&self) -> Result<CollectiveConfig, DistributedError> {
        let mut state = self.state.lock().expect("not poisoned");
        state.generation += 1;
        state.registered = true;
        let port = self.this.port(state.generation);
        let address = websocket_address(&format!("{}:{port}", self.this.host))?;
        Ok(self
            .collective
            .clone()
            .with_node_address(address)
            .with_data_service_port(port))
    }

    /// Waits until every other node's data server of the current registration accepts
    /// connections, at most `timeout`.
    pub(crate) fn wait_all_serving(&self, timeout: Duration) -> Result<(), WaitError> {
        let state = self.state.lock().expect("not poisoned");
        let start = Instant::now();
        for (rank, node) in state.nodes.iter().enumerate() {
            if rank == self.rank {
                continue;
            }
            let port = node.port(state.generation);
            while probe(&node.host, port) != Probe::Accepted {
                if start.elapsed() > timeout {
                    return Err(WaitError { rank });
                }
                std::thread::sleep(PROBE_INTERVAL);
            }
        }
        Ok(())
    }
}

/// The node a wait of [`Renewal`] gave up on.
#[derive(Debug)]
pub(crate) struct WaitError {
    pub(crate) rank: usize,
}
