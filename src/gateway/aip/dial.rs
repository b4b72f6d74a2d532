//! Dial-back: the gateway's gRPC channels to the nodes' own servers (`AgentService`,
//! `ToolService`) at their registered addresses, as upstream's gateway opens them, and the
//! allow-list those addresses must pass first (`[aip] dial_allow`), as A2A push URLs pass
//! `push_allow`: the gateway connects where a caller says, so only where the operator allows.
//!
//! An address is a gRPC target `host:port` (upstream never writes a scheme; an `http://`
//! prefix is accepted and dropped). An entry of the list is a host (`localhost`, `10.0.0.7`,
//! `[::1]` or `::1`), a host and port (`127.0.0.1:50051`), an IP network (`10.0.0.0/8`,
//! `fd00::/8`), or `*` (anywhere). Names are compared as written (lower case), never resolved:
//! list the names you mean. The default is loopback only (`127.0.0.0/8`, `::1`, `localhost`).
//!
//! Owns nothing: a `Channel` is owned by its node (`nodes.rs`).

use std::net::IpAddr;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

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

    /// Whether the gateway may dial `address`.
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
}

/// A channel to `address`, connected within `timeout` (upstream waits forever).
///
/// # Errors
/// Malformed, or nothing accepted a connection in time.
pub async fn connect(address: &str, timeout: Duration) -> Result<Channel, String> {
    let (host, port) = split(address)?;
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let endpoint = Endpoint::from_shared(format!("http://{host}:{port}"))
        .map_err(|e| format!("address `{address}`: {e}"))?
        .connect_timeout(timeout)
        .tcp_nodelay(true);
    match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(format!("cannot reach `{address}`: {e}")),
        Err(_) => Err(format!(
            "`{address}` did not accept a connection within {timeout:?}"
        )),
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
}
