//! The AIP gateway (seed 003, the Agent Interaction Protocol; `docs/aip.md`): serves
//! `grpc_service.GatewayService` with tonic on a listener of its own (`[aip] listen`,
//! `--aip-listen`), and makes each AIP node a MAP agent, reached through the router like any.
//!
//! Like the other gateways it is a MAP client over in-process sessions and nothing more:
//! - a registered node (`RegisterAgent`, `RegisterTool`) is one MAP session opened as its
//!   registrant's principal, with one agent: the node's id, role `agent` or `tool`, scope
//!   `aip:<domain>`, its AIP info in `metadata.aip` (`nodes.rs`);
//! - what an AIP node sends (`RouteAgentCalling`, `RouteToolCalling`) is a `map/send` from its
//!   agent (`service.rs`); what reaches its agent is delivered to the node's own gRPC server
//!   at its registered address, dialled back as upstream does (`pump.rs`, `dial.rs`);
//! - so an AIP agent reaches MAP agents, MAP agents reach AIP agents and tools (a plain
//!   `map/send` or request; `Client::call_tool`), and AIP nodes reach each other, all through
//!   the router: logged, permission-checked, visible on the dashboard.
//!
//! Files: `proto.rs` (the vendored generated code), `content.rs` (ContentItem ↔ payload
//! parts), `messages.rs` (AgentMessage ↔ `meta.aip`), `dial.rs` (allow-list and channels),
//! `settings.rs` (`[aip]`), `nodes.rs` (a node, its peer info), `state.rs` (the tables,
//! liveness), `service.rs` (the RPCs), `pump.rs` (a node's MAP inbox to its gRPC server),
//! `listener.rs` (the listener, TLS, limits).
//!
//! This file only declares the modules; the tables are `state.rs`'s.

pub mod content;
pub mod dial;
pub mod listener;
pub mod messages;
pub mod nodes;
pub mod proto;
pub mod pump;
pub mod service;
pub mod settings;
pub mod state;

pub use settings::{AipSettings, Silence};
pub use state::{AipGateway, Counters};
