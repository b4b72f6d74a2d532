//! The ids of the gateway's own participants and agents: the agent `a2a-gateway` and the
//! books pool `a2a-gateway-tasks` …, node-qualified on a cluster's standby. Names only: the
//! sessions are opened by `Core::start` (`mod.rs`), and `gateway::RESERVED_IDS` reserves them.

/// The id (and name) of the gateway's agent participant and of its agent (on a cluster's
/// standby, qualified with the node's name: [`node_id`]).
pub const GATEWAY_AGENT: &str = "a2a-gateway";

/// The id of one of the gateway's sessions on `node`: `id` itself on a single router or the
/// cluster's live node, `id@node` on a standby, whose gateway is a second one with sessions
/// of its own (relayed to the live node; `gateway::RESERVED_IDS` covers these forms too).
pub fn node_id(id: &str, node: Option<&str>) -> String {
    match node {
        Some(node) => format!("{id}@{node}"),
        None => id.to_owned(),
    }
}

/// Whether `id` is the gateway's agent, on any node (not an A2A agent of its own).
pub fn is_gateway_agent(id: &str) -> bool {
    id.split_once('@').map_or(id, |(base, _)| base) == GATEWAY_AGENT
}

/// The id of the gateway's bookkeeping participant (a `system` session with no agent).
pub const GATEWAY_BOOKS: &str = "a2a-gateway-tasks";

/// The participant ids of the books pool: [`GATEWAY_BOOKS`] (which also holds the feed) and
/// three more. Each carries the calls of a quarter of the tasks, so the gateway's bookkeeping
/// has four times a connection's request rate (`[limits] rate_per_connection`).
pub const BOOKS: [&str; 4] = [
    GATEWAY_BOOKS,
    "a2a-gateway-tasks-1",
    "a2a-gateway-tasks-2",
    "a2a-gateway-tasks-3",
];
