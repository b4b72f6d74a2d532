//! Dial-back: the gateway's gRPC channels to the nodes' own servers (`AgentService`,
//! `ToolService`) at their registered addresses, as upstream's gateway opens them, and the
//! allow-list those addresses must pass first (`[aip] dial_allow`), as A2A push URLs pass
//! `push_allow`: the gateway connects where a caller says, so only where the operator allows.
//!
//! An address is a gRPC target `host:port` (upstream never writes a scheme; an `http://`
//! prefix is accepted and dropped). An entry of the list is a host (`localhost`, `10.0.0.7`,
//! `[::1]` or `::1`), a host and port (`127.0.0.1:50051`), an IP network (`10.0.0.0/8`,
//! `fd00::/8`), or `*` (anywhere). The default is loopback only (`127.0.0.0/8`, `::1`,
//! `localhost`).
//!
//! The address passes in two steps, as the other gateways' outbound URLs do (`gateway::egress`):
//! its host as written (names compared in lower case) must match an entry ([`DialAllow::check`]);
//! then, when dialled, the host is resolved **once** and every address judged
//! ([`DialAllow::addresses`]): any address of a host an entry names, an address inside a listed
//! network, or, through `*` only, a public one (`egress::is_public`: `*` never reaches loopback
//! or private addresses the list does not name). The channel connects only to the addresses
//! judged, on every reconnect too: never to a name resolved again (no DNS rebinding between the
//! check and the connect).
//!
//! Owns nothing: a `Channel` is owned by its node (`nodes.rs`).

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

use crate::gateway::egress::is_public;

/// The default `dial_allow`: loopback.
pub fn default_allow() -> Vec<String> {
    vec!["127.0.0.0/8".into(), "::1".into(), "localhost".into()]
}

/// A parsed allow-list.
#[derive(Debug, Clone, Default)]
pub struct DialAllow {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone)]
enum Entry {
    Any,
    Host(String, Option<u16>),
    Net(IpAddr, u8),
}

/// `host:port` of `address` (lower-cased host, brackets dropped).
///
/// # Errors
/// Not of that form.
pub fn split(address: &str) -> Result<(String, u16), String> {
    let a = address
        .strip_prefix("http://")
        .or_else(|| address.strip_prefix("grpc://"))
        .unwrap_or(address)
        .trim_end_matches('/');
    let (host, port) = a
        .rsplit_once(':')
        .ok_or_else(|| format!("address `{address}` is not host:port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("address `{address}` has no valid port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host.contains(['/', '@', '?', '#', ' ']) {
        return Err(format!("address `{address}` has no valid host"));
    }
    Ok((host.to_ascii_lowercase(), port))
}

fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(bits.min(32)))
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(bits.min(128)))
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

impl DialAllow {
    /// Parses the entries (module docs).
    ///
    /// # Errors
    /// An entry of none of the forms.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let mut out = Vec::new();
        for e in entries {
            let e = e.trim();
            if e == "*" {
                out.push(Entry::Any);
            } else if let Some((net, bits)) = e.split_once('/') {
                let ip: IpAddr = net
                    .parse()
                    .map_err(|_| format!("`{e}`: not an IP network"))?;
                let bits: u8 = bits
                    .parse()
                    .map_err(|_| format!("`{e}`: not an IP network"))?;
                out.push(Entry::Net(ip, bits));
            } else if let Ok(ip) = e
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
            {
                out.push(Entry::Net(ip, if ip.is_ipv4() { 32 } else { 128 }));
            } else if let Ok((host, port)) = split(e) {
                out.push(Entry::Host(host, Some(port)));
            } else if !e.is_empty() && !e.contains(['/', ':', ' ']) {
                out.push(Entry::Host(e.to_ascii_lowercase(), None));
            } else {
                return Err(format!("`{e}`: not a host, host:port, IP network or `*`"));
            }
        }
        Ok(Self { entries: out })
    }

    /// Whether the gateway may dial `address` (its host as written: the first step).
    ///
    /// # Errors
    /// Why not (the address is malformed, or no entry allows it).
    pub fn check(&self, address: &str) -> Result<(), String> {
        let (host, port) = split(address)?;
        let ip = host.parse::<IpAddr>().ok();
        let allowed = self.entries.iter().any(|e| match e {
            Entry::Any => true,
            Entry::Host(h, p) => *h == host && p.is_none_or(|p| p == port),
            Entry::Net(net, bits) => ip.is_some_and(|ip| in_net(ip, *net, *bits)),
        });
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "address `{address}` is not in this gateway's dial-back allow-list ([aip] dial_allow)"
            ))
        }
    }

    /// Whether `ip`, an address of `host:port`, may be dialled (the second step): the list
    /// names the host, or has a network holding `ip`, or has `*` and `ip` is public.
    fn admits(&self, host: &str, port: u16, ip: IpAddr) -> bool {
        self.entries.iter().any(|e| match e {
            Entry::Any => is_public(ip),
            Entry::Host(h, p) => *h == host && p.is_none_or(|p| p == port),
            Entry::Net(net, bits) => in_net(ip, *net, *bits),
        })
    }

    /// The addresses `host:port` may be dialled at: resolved once (an IP address is itself),
    /// each judged ([`DialAllow::admits`]).
    ///
    /// # Errors
    /// `PERMISSION_DENIED` when the host has addresses but none may be dialled;
    /// `UNAVAILABLE` when it has none.
    pub async fn addresses(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, Status> {
        let all: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| Status::unavailable(format!("cannot resolve `{host}`: {e}")))?
                .collect(),
        };
        let allowed: Vec<SocketAddr> = all
            .iter()
            .copied()
            .filter(|a| self.admits(host, port, a.ip()))
            .collect();
        if allowed.is_empty() {
            if all.is_empty() {
                return Err(Status::unavailable(format!("`{host}` has no address")));
            }
            tracing::info!(host, addresses = ?all, "aip dial: refused, no address the list allows");
            return Err(Status::permission_denied(format!(
                "`{host}:{port}` resolves to no address this gateway's dial-back allow-list allows ([aip] dial_allow)"
            )));
        }
        Ok(allowed)
    }
}

/// A channel to `address`, its host resolved once and judged by `allow`
/// ([`DialAllow::addresses`]), connected within `timeout` (upstream waits forever) to one of
/// the judged addresses.
///
/// # Errors
/// `INVALID_ARGUMENT` for a malformed address, `PERMISSION_DENIED` when no address of the host
/// may be dialled, `UNAVAILABLE` when nothing accepted a connection in time.
pub async fn connect(
    allow: &DialAllow,
    address: &str,
    timeout: Duration,
) -> Result<Channel, Status> {
    let (host, port) = split(address).map_err(Status::invalid_argument)?;
    let addrs = match tokio::time::timeout(timeout, allow.addresses(&host, port)).await {
        Ok(found) => found?,
        Err(_) => {
            return Err(Status::unavailable(format!(
                "`{address}` could not be resolved within {timeout:?}"
            )))
        }
    };
    let authority = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let endpoint = Endpoint::from_shared(format!("http://{authority}:{port}"))
        .map_err(|e| Status::invalid_argument(format!("address `{address}`: {e}")))?
        .connect_timeout(timeout);
    let connector = Judged {
        addrs: addrs.into(),
        timeout,
    };
    match tokio::time::timeout(timeout, endpoint.connect_with_connector(connector)).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(Status::unavailable(format!(
            "cannot reach `{address}`: {e}"
        ))),
        Err(_) => Err(Status::unavailable(format!(
            "`{address}` did not accept a connection within {timeout:?}"
        ))),
    }
}

/// The channel's connector: TCP to the first of the judged addresses that answers (the URI
/// the channel passes is only its `:authority`; its host is never looked up again).
#[derive(Debug, Clone)]
struct Judged {
    addrs: Arc<[SocketAddr]>,
    timeout: Duration,
}

impl tower_service::Service<Uri> for Judged {
    type Response = TokioIo<TcpStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let (addrs, timeout) = (Arc::clone(&self.addrs), self.timeout);
        Box::pin(async move {
            let mut last = std::io::Error::other("no address to dial");
            for addr in addrs.iter() {
                match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
                    Ok(Ok(stream)) => {
                        let _ = stream.set_nodelay(true);
                        return Ok(TokioIo::new(stream));
                    }
                    Ok(Err(e)) => last = e,
                    Err(_) => last = std::io::ErrorKind::TimedOut.into(),
                }
            }
            Err(last)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list() {
        let d = DialAllow::parse(&default_allow()).unwrap();
        assert!(d.check("localhost:50051").is_ok());
        assert!(d.check("127.0.0.1:1").is_ok());
        assert!(d.check("127.9.0.1:1").is_ok());
        assert!(d.check("[::1]:9").is_ok());
        assert!(d.check("10.0.0.1:50051").is_err());
        assert!(d.check("example.com:443").is_err());
        assert!(d.check("127.0.0.1").is_err());
        let d = DialAllow::parse(&["10.0.0.0/8".into(), "h.example:7".into()]).unwrap();
        assert!(d.check("10.2.3.4:1").is_ok());
        assert!(d.check("h.example:7").is_ok());
        assert!(d.check("h.example:8").is_err());
        assert!(DialAllow::parse(&["a b".into()]).is_err());
    }

    #[tokio::test]
    async fn addresses_are_judged_after_one_lookup() {
        let local = DialAllow::parse(&default_allow()).unwrap();
        let found = local.addresses("localhost", 9).await.unwrap();
        assert!(found.iter().all(|a| a.ip().is_loopback()), "{found:?}");
        let any = DialAllow::parse(&["*".into()]).unwrap();
        assert!(
            any.check("127.0.0.1:9").is_ok(),
            "the host as written passes"
        );
        for host in ["127.0.0.1", "localhost", "::1"] {
            let e = any.addresses(host, 9).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::PermissionDenied, "{host}: {e}");
        }
        let net = DialAllow::parse(&["*".into(), "127.0.0.0/8".into()]).unwrap();
        assert!(net.addresses("127.0.0.1", 9).await.is_ok());
        let e = tokio::time::timeout(
            Duration::from_secs(5),
            connect(&any, "127.0.0.1:9", Duration::from_secs(1)),
        )
        .await
        .unwrap()
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");
    }

    #[tokio::test]
    async fn a_channel_connects_to_a_judged_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let allow = DialAllow::parse(&default_allow()).unwrap();
        let channel = tokio::time::timeout(
            Duration::from_secs(5),
            connect(&allow, &format!("localhost:{port}"), Duration::from_secs(2)),
        )
        .await
        .unwrap();
        assert!(channel.is_ok(), "{channel:?}");
        assert!(
            tokio::time::timeout(Duration::from_secs(2), listener.accept())
                .await
                .is_ok()
        );
    }
}
