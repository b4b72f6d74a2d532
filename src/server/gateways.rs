//! What the server's gateways are built from, for the live node (`Server::start`) and a
//! cluster standby (`server::cluster`), which serves them too: the in-process links they open
//! their MAP sessions with ([`GatewayLinks`], [`connect_as`]), the context the MAMP, IM and
//! AIP gateways share ([`gateway_context`]), the HTTP routes of the MAMP, IM and A2A
//! gateways ([`gateway_routes`]: each behind its group's gate, `gateway::guard`, and their list
//! recorded in the context for tests and operators), and the AIP gateway ([`aip_gateway`]).
//!
//! Owns nothing past the start: each gateway owns its own state (`crate::gateway`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router as HttpRouter;
use tokio::sync::watch;

use crate::protocol::methods::session::Principal;
use crate::router::sessions::table::ConnOrigin;
use crate::server::config::Config;
use crate::transport::connection::ConnectionOptions;
use crate::transport::in_process::{self, InProcessLink};
use crate::transport::TransportContext;

/// How the gateways open their MAP sessions: in-process connections to this server's router
/// (origin `InProcess`, as [`Server::connect_in_process`]). The gateways get this rather than
/// the [`Server`], which does not exist yet while the routes are built.
#[derive(Debug)]
pub(super) struct GatewayLinks {
    pub(super) ctx: TransportContext,
    pub(super) options: ConnectionOptions,
}

impl in_process::InProcessLinks for GatewayLinks {
    fn connect_in_process(&self) -> InProcessLink {
        in_process::connect(&self.ctx, self.options.clone())
    }

    fn connect_as(&self, principal: Principal) -> InProcessLink {
        connect_as(&self.ctx, &self.options, principal)
    }
}

/// An in-process link admitted as `principal` (origin `Delegated`), without its expiry.
pub(super) fn connect_as(
    ctx: &TransportContext,
    options: &ConnectionOptions,
    principal: Principal,
) -> InProcessLink {
    let options = ConnectionOptions {
        origin: ConnOrigin::Delegated(Principal {
            expires_at: None,
            ..principal
        }),
        ..options.clone()
    };
    in_process::connect(ctx, options)
}

/// The A2A gateway's outbound allow-lists, read before anything starts (a bad entry stops the
/// start, as a bad config file does).
#[derive(Debug)]
pub(super) struct A2aAllow {
    push: crate::gateway::egress::AllowList,
    remote: crate::gateway::egress::AllowList,
}

impl A2aAllow {
    pub(super) fn of(config: &Config) -> std::io::Result<Self> {
        use crate::gateway::egress::AllowList;
        let read = |key: &str, entries: &[String]| {
            AllowList::parse(entries).map_err(|e| std::io::Error::other(format!("a2a.{key}: {e}")))
        };
        Ok(Self {
            push: read("push_allow", &config.a2a.push_allow)?,
            remote: read("remote_allow", &config.a2a.remote_allow)?,
        })
    }
}

/// What the MAMP, IM and AIP gateways share (`gateway::context`), opening their sessions on
/// `ctx`'s router.
pub(super) fn gateway_context(
    config: &Config,
    ctx: &TransportContext,
    options: &ConnectionOptions,
    auth: Option<Arc<crate::auth::Authenticator>>,
    addrs: &[SocketAddr],
) -> Arc<crate::gateway::GatewayContext> {
    Arc::new(crate::gateway::GatewayContext::new(
        config.gateways.clone(),
        auth,
        config.router.name.clone(),
        addrs
            .first()
            .map_or_else(|| config.router.name.clone(), ToString::to_string),
        Arc::new(GatewayLinks {
            ctx: ctx.clone(),
            options: ConnectionOptions {
                origin: ConnOrigin::InProcess,
                ..options.clone()
            },
        }),
        crate::gateway::config::RouterFacts {
            max_payload_bytes: config.limits.max_payload_bytes,
            max_frame_bytes: options.max_frame_bytes,
            exempt_loopback: config.limits.exempt_loopback,
            listen_ports: addrs.iter().map(|a| a.port()).collect(),
        },
    ))
}

/// The AIP gateway over `gateways` and the TLS of its listener (the router's `[tls]`
/// certificate with ALPN `h2`, when set).
pub(super) fn aip_gateway(
    config: &Config,
    gateways: &Arc<crate::gateway::GatewayContext>,
) -> std::io::Result<(
    Arc<crate::gateway::aip::AipGateway>,
    Option<tokio_rustls::TlsAcceptor>,
)> {
    let gateway = crate::gateway::aip::AipGateway::new(Arc::clone(gateways), config.aip.clone())
        .map_err(|e| std::io::Error::other(format!("aip: {e}")))?;
    let tls = config
        .tls
        .files()
        .map(|f| crate::server::tls::acceptor_alpn(&f, vec![b"h2".to_vec()]))
        .transpose()?;
    Ok((gateway, tls))
}

/// The HTTP routes of the MAMP and IM gateways (over `gateways`) and of the A2A gateway, those
/// enabled, on `ctx`'s router: the server's, or a cluster standby's follower router (`node`:
/// the standby's name; docs/cluster.md, "Gateways on every node").
#[allow(clippy::too_many_arguments)]
pub(super) fn gateway_routes(
    config: &Config,
    ctx: &TransportContext,
    options: &ConnectionOptions,
    gateways: &Arc<crate::gateway::GatewayContext>,
    a2a_auth: Option<Arc<crate::auth::Authenticator>>,
    a2a_allow: A2aAllow,
    shutdown: &watch::Receiver<bool>,
    node: Option<&str>,
) -> HttpRouter {
    let mut gated = crate::gateway::routes(Arc::clone(gateways));
    if config.a2a.enabled {
        gated = gated.merge(a2a_routes(
            config,
            ctx,
            options,
            a2a_auth,
            a2a_allow,
            shutdown,
            node,
            gateways.traffic(),
        ));
    }
    gateways.record_routes(gated.routes);
    gated.router
}

/// The A2A gateway's routes (docs/a2a.md).
#[allow(clippy::too_many_arguments)]
fn a2a_routes(
    config: &Config,
    ctx: &TransportContext,
    options: &ConnectionOptions,
    auth: Option<Arc<crate::auth::Authenticator>>,
    allow: A2aAllow,
    shutdown: &watch::Receiver<bool>,
    node: Option<&str>,
    traffic: Arc<crate::gateway::traffic::Traffic>,
) -> crate::gateway::guard::Gated {
    use crate::auth::config::AuthMethodName;
    use crate::gateway::a2a;
    let enabled = if auth.is_some() {
        config.auth.enabled()
    } else {
        Vec::new()
    };
    let links = GatewayLinks {
        ctx: ctx.clone(),
        options: ConnectionOptions {
            origin: ConnOrigin::InProcess,
            ..options.clone()
        },
    };
    let gateway = a2a::A2aGateway::new(
        Arc::new(links),
        a2a::Settings {
            router_name: config.router.name.clone(),
            tls: config.tls.files().is_some(),
            max_body_bytes: config.a2a.max_body_bytes,
            auth,
            security: a2a::card::Security {
                bearer_jwt: enabled.contains(&AuthMethodName::Jwt),
                api_key: enabled.contains(&AuthMethodName::ApiKey),
            },
            push_allow: allow.push,
            remote_allow: allow.remote,
            remotes: config.a2a.remote.clone(),
            limits: config.a2a.limits(&config.limits),
            default_agent: config.a2a.default_agent.clone(),
            node: node.map(str::to_owned),
            traffic: Some(traffic),
        },
        shutdown.clone(),
    );
    a2a::routes(gateway)
}
