//! [`Limits`]: every bound the A2A gateway keeps for its callers, in one place, each with the
//! answer a caller gets when it meets it (docs/a2a.md, "Limits"; docs/security.md).
//!
//! Owns the numbers only; the checks live where the work is (the gate every route is built
//! behind, `gateway::guard`, set up in `mod.rs`: credential, rate, content type, body;
//! `tasks/`: what MAP would refuse; `remote/`: remotes; `push.rs`: webhooks).
//!
//! Two kinds:
//! - **the caller's own budget**: requests per second (a token bucket per principal, or per IP
//!   address without authentication: `gateway::guard`), the body's size and arrival time, the
//!   remotes and webhooks it may register. Over one: 429 / 413 / 408 / -32602 with the limit
//!   named, and nobody else's budget is spent.
//! - **what MAP takes** (`[limits]`): the frame size, the nesting depth and a message's payload
//!   size of the router the gateway speaks to. A request that would make the gateway send MAP
//!   a frame the router refuses is refused *before* anything is sent, in milliseconds and with
//!   a message naming the limit (413 / -32600), rather than after a MAP round trip that the
//!   router answers with `id: null` and the gateway's client waits out.

use std::time::Duration;

/// Default requests per second per caller (principal, or IP without authentication): far above
/// an interactive client, low enough that one caller cannot take the gateway's MAP budget.
pub const DEFAULT_RATE_PER_CALLER: u32 = crate::gateway::guard::DEFAULT_RATE.0;
/// Default burst per caller.
pub const DEFAULT_BURST_PER_CALLER: u32 = crate::gateway::guard::DEFAULT_RATE.1;
/// Default remote agents one principal may register (`POST /a2a/remote`): a remote costs a MAP
/// session, its card in memory and its calls; a handful per principal is what anyone needs.
pub const DEFAULT_MAX_REMOTES_PER_PRINCIPAL: usize = 8;
/// Remote agents registered by request, in all (whatever the principals).
pub const MAX_REMOTES: usize = 256;
/// Default webhooks one principal may hold, over all its tasks (16 per task, as before).
pub const DEFAULT_MAX_PUSH_CONFIGS_PER_PRINCIPAL: usize = 64;
/// Longest webhook token or credentials kept (they go into a request header).
pub const MAX_PUSH_SECRET_BYTES: usize = 4096;
/// Bytes the JSON-RPC envelope around a MAP request's params takes at most
/// (`{"jsonrpc":"2.0","id":N,"method":"map/tasks/update","params":…}`).
pub const MAP_ENVELOPE_BYTES: usize = 128;

/// The gateway's limits (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Requests per second and burst per caller (`None`: unlimited).
    pub rate: Option<(u32, u32)>,
    /// Anonymous loopback callers skip the per-address bucket (`[limits] exempt_loopback`, as
    /// for MAP: every local process shares 127.0.0.1). Principals never do.
    pub exempt_loopback: bool,
    /// Longest a request body may take to arrive (`[limits] header_timeout_ms`, as `/map/rpc`).
    pub body_timeout: Duration,
    /// MAP's largest frame (`[limits] max_frame_bytes`).
    pub max_frame_bytes: usize,
    /// MAP's deepest nesting (`[limits] max_depth`).
    pub max_depth: usize,
    /// MAP's largest message payload (`[limits] max_payload_bytes`).
    pub max_payload_bytes: usize,
    /// Remote agents per principal.
    pub max_remotes_per_principal: usize,
    /// Webhooks per principal.
    pub max_push_configs_per_principal: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            rate: Some((DEFAULT_RATE_PER_CALLER, DEFAULT_BURST_PER_CALLER)),
            exempt_loopback: true,
            body_timeout: crate::gateway::guard::DEFAULT_BODY_TIMEOUT,
            max_frame_bytes: 1 << 20,
            max_depth: crate::protocol::jsonrpc::DEFAULT_MAX_DEPTH,
            max_payload_bytes: 256 * 1024,
            max_remotes_per_principal: DEFAULT_MAX_REMOTES_PER_PRINCIPAL,
            max_push_configs_per_principal: DEFAULT_MAX_PUSH_CONFIGS_PER_PRINCIPAL,
        }
    }
}
