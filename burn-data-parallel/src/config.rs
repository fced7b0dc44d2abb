//! How a data-parallel run is laid out: its peers on this machine, the machines, the timeout.

use std::str::FromStr;
use std::time::Duration;

use burn::config::Config;
use burn_collective::{AllReduceStrategy, CollectiveConfig};
use burn_communication::Address;

use crate::DistributedError;

/// A data-parallel run: how long a collective operation may wait, and the machines when there
/// are several.
///
/// The peers on this machine are the devices given to [`DataParallel`](super::DataParallel): one
/// thread each. With [`NodeConfig`], each process is one node of a multi-node run, and the
/// peers of all nodes train one model together.
#[derive(Config, Debug)]
pub struct DataParallelConfig {
    /// How long a collective operation (registration, the replica check, a gradient
    /// all-reduce) may wait for the other peers before the run fails with
    /// [`DistributedError::Timeout`]. It must exceed the longest time a peer spends between
    /// two of them: a training step, and validation on the main peer (the others wait for it
    /// at the next epoch's first all-reduce). PyTorch's default for NCCL is 10 minutes.
    #[config(default = "Duration::from_secs(600)")]
    pub timeout: Duration,
    /// This process's node in a multi-node run; `None` for one machine.
    #[config(default = "None")]
    pub node: Option<NodeConfig>,
    /// Threads of each peer's own rayon pool, the pool CPU backends (Flex, NdArray) compute
    /// on. `None` lets all peers share the process's pool: peers that are threads on one CPU
    /// then compete for the same cores, as processes with the default OpenMP threads do under
    /// PyTorch's DDP. Give `cores / peers`.
    #[config(default = "None")]
    pub threads_per_peer: Option<usize>,
}

/// One process of a multi-node run, as burn-collective's global orchestrator sees it.
///
/// Every node runs the same program with the same seed and configuration; only `rank` and
/// `address`/`data_port` differ. The orchestrator (a WebSocket server, see
/// [`run_orchestrator`](super::run_orchestrator)) introduces the nodes to each other; the
/// gradients then go directly from node to node.
#[derive(Config, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    /// How many nodes train together.
    pub nodes: u32,
    /// This node's rank, from 0. Rank 0's first peer is the main peer: it validates, writes
    /// checkpoints and reports metrics.
    pub rank: u32,
    /// The orchestrator's address, `ws://host:port` (`host:port` is completed).
    pub orchestrator: String,
    /// The host the other nodes reach this node at.
    #[config(default = "String::from(\"127.0.0.1\")")]
    pub host: String,
    /// The first of the two ports this node serves tensors on for the other nodes: it uses
    /// `data_port` and `data_port + 1` in turn (burn-collective 0.21 needs a new registration
    /// per operation; see [`Peer`](super::Peer)). Nodes on one host need ports two apart.
    pub data_port: u16,
}

impl NodeConfig {
    /// The orchestrator's port: the one the node that serves it (see
    /// [`spawn_orchestrator`](super::spawn_orchestrator)) listens on.
    ///
    /// # Errors
    /// [`DistributedError::InvalidConfig`] when the address names no port.
    pub fn orchestrator_port(&self) -> Result<u16, DistributedError> {
        websocket_address_and_port(&self.orchestrator).map(|(_, port)| port)
    }

    /// The orchestrator's address, with the `ws://` scheme.
    pub(crate) fn orchestrator_address(&self) -> Result<Address, DistributedError> {
        websocket_address(&self.orchestrator)
    }

    /// This node's data address, `ws://host:data_port`.
    pub(crate) fn node_address(&self) -> Result<Address, DistributedError> {
        websocket_address(&format!("{}:{}", self.host, self.data_port))
    }
}

/// The longest host name a node may give (a DNS name has at most 253 bytes).
pub(crate) const MAX_HOST_LEN: usize = 253;

/// `address` (`host:port`, with or without `ws://`) as a WebSocket address.
pub(crate) fn websocket_address(address: &str) -> Result<Address, DistributedError> {
    let (address, _) = websocket_address_and_port(address)?;
    Address::from_str(&address).map_err(DistributedError::InvalidConfig)
}

/// `address` with the `ws://` scheme, and its port.
fn websocket_address_and_port(address: &str) -> Result<(String, u16), DistributedError> {
    let address = if address.contains("://") {
        address.to_string()
    } else {
        format!("ws://{address}")
    };
    let Some(rest) = address.strip_prefix("ws://") else {
        return Err(DistributedError::InvalidConfig(format!(
            "`{address}`: only `ws://host:port` addresses are served"
        )));
    };
    let port = rest
        .rsplit_once(':')
        .and_then(|(_, port)| port.trim_end_matches('/').parse::<u16>().ok());
    match port {
        Some(port) => Ok((address, port)),
        None => Err(DistributedError::InvalidConfig(format!(
            "`{address}` names no port (`ws://host:port`)"
        ))),
    }
}

impl DataParallelConfig {
    /// Checks the configuration for `local_peers` peers on this machine.
    pub(crate) fn validate(&self, local_peers: usize) -> Result<(), DistributedError> {
        let invalid = |message: String| Err(DistributedError::InvalidConfig(message));
        if local_peers == 0 {
            return invalid("no device: give at least one".into());
        }
        if self.threads_per_peer == Some(0) {
            return invalid("`threads_per_peer` is 0".into());
        }
        if self.timeout.is_zero() {
            return invalid("a timeout of zero lets no collective operation complete".into());
        }
        if let Some(node) = &self.node {
            if node.nodes == 0 {
                return invalid("`nodes` is 0".into());
            }
            if node.rank >= node.nodes {
                return invalid(format!(
                    "rank {} is outside the {} node(s) (ranks start at 0)",
                    node.rank, node.nodes
                ));
            }
            node.orchestrator_address()?;
            node.node_address()?;
            if node.data_port == u16::MAX {
                return invalid(format!(
                    "data port {}: a node serves on `data_port` and `data_port + 1`",
                    node.data_port
                ));
            }
            if node.host.len() > MAX_HOST_LEN {
                return invalid(format!(
                    "host `{}` is longer than {MAX_HOST_LEN} bytes",
                    node.host
                ));
            }
            if local_peers > 1 {
                return invalid(format!(
                    "{local_peers} peers on a node of a multi-node run: burn-collective 0.21.0 \
                     supports one (see `Peer`); run one process per device"
                ));
            }
        }
        // The replica check sums bytes and their squares in f32, exact up to 256 peers.
        if self.world_size(local_peers) > 256 {
            return invalid(format!(
                "{} peers: at most 256 are supported",
                self.world_size(local_peers)
            ));
        }
        Ok(())
    }

    /// All peers of the run, on every node.
    pub(crate) fn world_size(&self, local_peers: usize) -> usize {
        local_peers * self.node.as_ref().map_or(1, |node| node.nodes as usize)
    }

    /// The global rank of this machine's peer `local`.
    pub(crate) fn global_rank(&self, local_peers: usize, local: usize) -> u32 {
        let node = self.node.as_ref().map_or(0, |node| node.rank as usize);
        (node * local_peers + local) as u32
    }

    /// burn-collective's configuration for `local_peers` peers on this machine.
    pub(crate) fn collective(
        &self,
        local_peers: usize,
    ) -> Result<CollectiveConfig, DistributedError> {
        // Threads on one machine share memory: the centralised all-reduce adds the tensors on
        // one peer and hands the sum back, with the fewest copies.
        let mut config = CollectiveConfig::default()
            .with_num_devices(local_peers)
            .with_local_all_reduce_strategy(AllReduceStrategy::Centralized);
        if let Some(node) = &self.node {
            config = config
                .with_num_nodes(node.nodes)
                .with_global_address(node.orchestrator_address()?)
                .with_node_address(node.node_address()?)
                .with_data_service_port(node.data_port)
                .with_global_all_reduce_strategy(AllReduceStrategy::Ring);
        }
        Ok(config)
    }
}
