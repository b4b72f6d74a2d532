//! Where the gateways may send requests of their own, and how: the one check every outbound
//! URL passes (A2A remote agents' card URLs and the endpoints their cards declare,
//! `[a2a] remote_allow`; A2A push webhooks, `[a2a] push_allow`; configured remote MAMP
//! endpoints, each allowed by its own origin), the one way a connection is made, and the one
//! HTTP client ([`client`]) that every gateway's outbound request goes through.
//!
//! Owns: [`AllowList`] (entries parsed once, at start), [`Allowed`] (a URL that passed, in its
//! normalised form: what is checked is what is sent), [`resolve`] and [`connect`] (resolve,
//! check every address, connect to a checked address), and [`is_public`], the address rule
//! that the AIP dialer (`aip/dial.rs`) applies too.
//!
//! The rules, on **parsed and normalised** URLs (WHATWG parsing, the `url` crate: lower-case
//! scheme and host, numeric IPv4 forms such as `0x7f000001` or `2130706433` read as the address
//! they are, default ports, `.`/`..` segments resolved, `%2e` included), never on string
//! prefixes:
//!
//! - an entry is `scheme://host[:port][/path]`; the host may be `*` (any host) or `*.domain`
//!   (its subdomains); a missing port is the scheme's default; the path is a prefix of whole
//!   segments (`/a2a/hooks` allows `/a2a/hooks` and `/a2a/hooks/x`, not `/a2a/hooksx`);
//! - a URL passes when one entry has its scheme, host, port and leading path segments; a URL
//!   with userinfo (`user@`) or a fragment (`#...`) never passes, nor one whose `..` segments
//!   leave the entry's path (they are resolved before the match);
//! - before connecting, the host is resolved once and every address is judged: loopback,
//!   link-local, private (RFC 1918, unique local), shared (100.64/10), unspecified,
//!   multicast, broadcast, reserved, and the IPv6 forms that embed such an IPv4 address
//!   (`::ffff:127.0.0.1`, NAT64, 6to4) are refused, unless the entry that passed the URL
//!   names that host itself (not a `*` pattern): the operator who writes
//!   `http://127.0.0.1:9999/` means that loopback port, and no other;
//! - the connection goes to one of the addresses just judged, never to a name resolved again
//!   (no DNS rebinding between the check and the connect).
//!
//! Failures to reach a host are one [`EgressError::Unreachable`], whose text is the same for
//! a refused connection, a timeout and a failed lookup (the details go to the log): a caller
//! cannot tell an open port from a closed one by the answer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;
use url::{Host, Url};

pub mod client;

/// Longest URL accepted (webhooks and card URLs are short; this bounds what a config keeps).
pub const MAX_URL_BYTES: usize = 2048;

/// The schemes an entry or a URL may have.
const SCHEMES: [&str; 2] = ["http", "https"];

/// Which hosts an entry allows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    /// This host exactly (a name, or an address).
    Exact(Host<String>),
    /// Any subdomain of this domain (`*.example.com`).
    Under(String),
    /// Any host (`*`).
    Any,
}

/// One allow-list entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    scheme: String,
    host: HostPattern,
    port: u16,
    /// The path's segments, without the empty last one of a trailing slash.
    path: Vec<String>,
}

/// A list of URL prefixes (scheme, host, port, path segments) requests may go to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

/// A URL that passed an [`AllowList`], normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    url: Url,
    host: Host<String>,
    port: u16,
    /// Whether the entry named this host itself (so its addresses may be private).
    named: bool,
}

/// Why a URL does not pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// It is not a URL we could call at all.
    #[error("bad URL: {0}")]
    Malformed(String),
    /// It is a URL, but no entry allows it.
    #[error("the URL is not allowed on this router ({0})")]
    NotAllowed(&'static str),
}

/// Why a connection was not made.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// Every address the host has is one the router does not call (loopback, private, ...).
    #[error("the URL's host resolves to an address this router does not call (loopback, private, link-local or similar)")]
    Forbidden,
    /// No connection: refused, timed out, no such host. One text for all, on purpose.
    #[error("remote unreachable")]
    Unreachable,
}

impl AllowList {
    /// Reads `entries` (see the module docs for their form).
    ///
    /// # Errors
    /// The first entry that is not `scheme://host[:port][/path]` with a scheme of `http` or
    /// `https`, no userinfo, query or fragment, and no empty port (`http://h:`).
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        let entries = entries
            .iter()
            .map(|e| Entry::parse(e).map_err(|why| format!("{e:?}: {why}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { entries })
    }

    /// The list that allows exactly `url`'s origin (scheme, host, port; any path), naming its
    /// host: what a configured `[[a2a.remote]]` card URL allows for its own agent.
    ///
    /// # Errors
    /// `url` is not an `http(s)://` URL with a host.
    pub fn origin_of(url: &str) -> Result<Self, String> {
        let u = parse_url(url).map_err(|e| e.to_string())?;
        let host = u.host().ok_or("no host")?.to_owned();
        Ok(Self {
            entries: vec![Entry {
                scheme: u.scheme().to_owned(),
                host: HostPattern::Exact(host),
                port: u.port_or_known_default().unwrap_or(80),
                path: Vec::new(),
            }],
        })
    }

    /// Whether it allows nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Checks `url`: `Ok` with the normalised URL when an entry allows it.
    ///
    /// # Errors
    /// [`Refusal`].
    pub fn check(&self, url: &str) -> Result<Allowed, Refusal> {
        let u = parse_url(url)?;
        self.check_parsed(u)
    }

    /// [`AllowList::check`] of an already parsed URL (an endpoint resolved against a card URL).
    ///
    /// # Errors
    /// [`Refusal`].
    pub fn check_parsed(&self, u: Url) -> Result<Allowed, Refusal> {
        refuse_unsafe_parts(&u)?;
        let host = u
            .host()
            .ok_or(Refusal::Malformed("no host".into()))?
            .to_owned();
        let port = u
            .port_or_known_default()
            .ok_or(Refusal::Malformed("no port".into()))?;
        let segments: Vec<&str> = u.path_segments().map(Iterator::collect).unwrap_or_default();
        let entry = self.entries.iter().find(|e| {
            e.scheme == u.scheme()
                && e.port == port
                && e.host.matches(&host)
                && e.path.len() <= segments.len()
                && e.path.iter().zip(&segments).all(|(a, b)| a == b)
        });
        match entry {
            Some(e) => Ok(Allowed {
                named: matches!(e.host, HostPattern::Exact(_)),
                url: u,
                host,
                port,
            }),
            None if self.entries.is_empty() => Err(Refusal::NotAllowed("the allow-list is empty")),
            None => Err(Refusal::NotAllowed(
                "no allow-list entry has its scheme, host, port and path",
            )),
        }
    }
}

/// Parses `url` as a URL we could call: `http(s)://`, a host, at most [`MAX_URL_BYTES`], no
/// control characters or spaces (WHATWG parsing would drop tabs and newlines silently).
fn parse_url(url: &str) -> Result<Url, Refusal> {
    if url.len() > MAX_URL_BYTES {
        return Err(Refusal::Malformed(format!(
            "longer than {MAX_URL_BYTES} bytes"
        )));
    }
    if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(Refusal::Malformed(
            "control characters or spaces in the URL".into(),
        ));
    }
    let u = Url::parse(url).map_err(|e| Refusal::Malformed(e.to_string()))?;
    if !SCHEMES.contains(&u.scheme()) {
        return Err(Refusal::Malformed("not an http:// or https:// URL".into()));
    }
    if u.host().is_none() {
        return Err(Refusal::Malformed("no host".into()));
    }
    Ok(u)
}

/// Userinfo and fragments are never sent (a fragment is not part of what a server sees, and
/// userinfo would be a credential in a log line or a host confusion).
fn refuse_unsafe_parts(u: &Url) -> Result<(), Refusal> {
    if !u.username().is_empty() || u.password().is_some() {
        return Err(Refusal::Malformed("userinfo (user@) in the URL".into()));
    }
    if u.fragment().is_some() {
        return Err(Refusal::Malformed("a fragment (#...) in the URL".into()));
    }
    Ok(())
}

impl Entry {
    fn parse(text: &str) -> Result<Self, String> {
        let (scheme, rest) = text
            .split_once("://")
            .ok_or("not scheme://host[:port][/path]")?;
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        if authority.ends_with(':') {
            return Err("an empty port: name the port (one entry per port)".into());
        }
        // The wildcard is ours, not a URL's: parse the rest with a stand-in host.
        let (pattern, parsed) = if let Some(port_and_rest) = rest.strip_prefix('*') {
            if let Some(domain_rest) = port_and_rest.strip_prefix('.') {
                let u =
                    parse_url(&format!("{scheme}://{domain_rest}")).map_err(|e| e.to_string())?;
                let Some(Host::Domain(d)) = u.host() else {
                    return Err("`*.` must be followed by a domain name".into());
                };
                (Some(HostPattern::Under(d.to_owned())), u)
            } else {
                let u = parse_url(&format!("{scheme}://any.invalid{port_and_rest}"))
                    .map_err(|e| e.to_string())?;
                (Some(HostPattern::Any), u)
            }
        } else {
            (None, parse_url(text).map_err(|e| e.to_string())?)
        };
        refuse_unsafe_parts(&parsed).map_err(|e| e.to_string())?;
        if parsed.query().is_some() {
            return Err("a query in an entry".into());
        }
        let host = match pattern {
            Some(p) => p,
            None => HostPattern::Exact(parsed.host().ok_or("no host")?.to_owned()),
        };
        let mut path: Vec<String> = parsed
            .path_segments()
            .map(|s| s.map(str::to_owned).collect())
            .unwrap_or_default();
        if path.last().is_some_and(String::is_empty) {
            path.pop();
        }
        Ok(Self {
            scheme: parsed.scheme().to_owned(),
            host,
            port: parsed.port_or_known_default().ok_or("no port")?,
            path,
        })
    }
}

impl HostPattern {
    fn matches(&self, host: &Host<String>) -> bool {
        match (self, host) {
            (Self::Any, _) => true,
            (Self::Exact(h), host) => h == host,
            (Self::Under(domain), Host::Domain(d)) => d
                .strip_suffix(domain.as_str())
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            (Self::Under(_), _) => false,
        }
    }
}

impl Allowed {
    /// The normalised URL (what was checked, and what is sent).
    pub fn as_str(&self) -> &str {
        self.url.as_str()
    }

    /// The parsed URL.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &str {
        self.url.scheme()
    }

    /// Whether it is `https://`.
    pub fn is_tls(&self) -> bool {
        self.url.scheme() == "https"
    }

    /// The host as a TLS server name or `Host` header wants it (no brackets for IPv6).
    pub fn host_name(&self) -> String {
        match &self.host {
            Host::Domain(d) => d.clone(),
            Host::Ipv4(a) => a.to_string(),
            Host::Ipv6(a) => a.to_string(),
        }
    }

    /// The `Host` header: host (bracketed for IPv6) and the port when it is not the scheme's
    /// default.
    pub fn authority(&self) -> String {
        let host = match &self.host {
            Host::Ipv6(a) => format!("[{a}]"),
            _ => self.host_name(),
        };
        match self.url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host,
        }
    }

    /// The request target: path and query, as normalised.
    pub fn request_target(&self) -> String {
        match self.url.query() {
            Some(q) => format!("{}?{q}", self.url.path()),
            None => self.url.path().to_owned(),
        }
    }

    /// The port (the scheme's default when the URL has none).
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// The addresses of `target`'s host it may reach: all of them when its entry named the host,
/// else the public ones. One lookup.
///
/// # Errors
/// [`EgressError::Forbidden`] when the host has addresses but none may be reached;
/// [`EgressError::Unreachable`] when the lookup fails.
pub async fn resolve(target: &Allowed) -> Result<Vec<SocketAddr>, EgressError> {
    let addrs: Vec<SocketAddr> = match &target.host {
        Host::Ipv4(a) => vec![SocketAddr::new(IpAddr::V4(*a), target.port)],
        Host::Ipv6(a) => vec![SocketAddr::new(IpAddr::V6(*a), target.port)],
        Host::Domain(d) => tokio::net::lookup_host((d.as_str(), target.port))
            .await
            .map_err(|e| {
                tracing::debug!(host = %d, error = %e, "egress: lookup failed");
                EgressError::Unreachable
            })?
            .collect(),
    };
    let allowed: Vec<SocketAddr> = addrs
        .iter()
        .copied()
        .filter(|a| target.named || is_public(a.ip()))
        .collect();
    if allowed.is_empty() {
        tracing::info!(url = %target.as_str(), addresses = ?addrs, "egress: refused, no address the router calls");
        return Err(if addrs.is_empty() {
            EgressError::Unreachable
        } else {
            EgressError::Forbidden
        });
    }
    Ok(allowed)
}

/// Resolves `target`'s host once ([`resolve`]) and connects to the first of its reachable
/// addresses that answers, all within `timeout`: never to a name resolved again.
///
/// # Errors
/// [`EgressError::Forbidden`] when no address may be reached; [`EgressError::Unreachable`]
/// for everything else (logged with the cause).
pub async fn connect(target: &Allowed, timeout: Duration) -> Result<TcpStream, EgressError> {
    let attempt = async {
        let mut last = None;
        for addr in resolve(target).await? {
            match TcpStream::connect(addr).await {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Err(e) => last = Some((addr, e)),
            }
        }
        if let Some((addr, e)) = last {
            tracing::debug!(url = %target.as_str(), %addr, error = %e, "egress: cannot connect");
        }
        Err(EgressError::Unreachable)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => {
            tracing::debug!(url = %target.as_str(), ?timeout, "egress: connecting timed out");
            Err(EgressError::Unreachable)
        }
    }
}

/// Whether `ip` is an ordinary public unicast address (not one of the ranges the module docs
/// list, in any of its IPv6 spellings).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => is_public_v4(a),
        IpAddr::V6(a) => is_public_v6(a),
    }
}

fn is_public_v4(a: Ipv4Addr) -> bool {
    let [b0, b1, b2, _] = a.octets();
    !(b0 == 0                                   // "this network", 0.0.0.0
        || b0 == 10                             // private
        || (b0 == 100 && (64..128).contains(&b1)) // shared (CGNAT)
        || b0 == 127                            // loopback
        || (b0 == 169 && b1 == 254)             // link-local (cloud metadata)
        || (b0 == 172 && (16..32).contains(&b1)) // private
        || (b0 == 192 && b1 == 0 && b2 == 0)    // IETF protocol assignments
        || (b0 == 192 && b1 == 0 && b2 == 2)    // documentation
        || (b0 == 192 && b1 == 168)             // private
        || (b0 == 198 && (18..20).contains(&b1)) // benchmarking
        || (b0 == 198 && b1 == 51 && b2 == 100) // documentation
        || (b0 == 203 && b1 == 0 && b2 == 113)  // documentation
        || b0 >= 224) // multicast, reserved, broadcast
}

fn is_public_v6(a: Ipv6Addr) -> bool {
    let s = a.segments();
    // Embedded IPv4: mapped (::ffff:a.b.c.d), compatible (::a.b.c.d), NAT64 (64:ff9b::/96).
    if let Some(v4) = a.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    if s[..6] == [0, 0, 0, 0, 0, 0] {
        // ::, ::1 and the deprecated IPv4-compatible form.
        return a.segments()[6] != 0 && is_public_v4(v4_of(s[6], s[7]));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(v4_of(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        // 6to4: the IPv4 address is in the next 32 bits.
        return is_public_v4(v4_of(s[1], s[2]));
    }
    !((s[0] & 0xfe00) == 0xfc00      // unique local
        || (s[0] & 0xffc0) == 0xfe80 // link-local
        || (s[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || (s[0] & 0xff00) == 0xff00 // multicast
        || (s[0] == 0x2001 && s[1] == 0) // Teredo (hides an address)
        || (s[0] == 0x2001 && s[1] == 0xdb8) // documentation
        || (s[0] == 0x100 && s[1..4] == [0, 0, 0])) // discard
}

fn v4_of(hi: u16, lo: u16) -> Ipv4Addr {
    let [a, b] = hi.to_be_bytes();
    let [c, d] = lo.to_be_bytes();
    Ipv4Addr::new(a, b, c, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(&entries.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn entries_are_urls_with_a_port_and_no_more() {
        for bad in [
            "http://127.0.0.1:",
            "127.0.0.1:9",
            "ftp://h/",
            "http://u@h/",
            "http://h/#x",
            "http://h/?q=1",
            "http://*./",
        ] {
            assert!(
                AllowList::parse(&[bad.to_owned()]).is_err(),
                "{bad} is refused"
            );
        }
        assert!(AllowList::parse(&["http://127.0.0.1:9999/".into()]).is_ok());
        assert!(AllowList::parse(&["https://*.example.com/a2a/".into()]).is_ok());
        assert!(AllowList::parse(&["http://*:8080".into()]).is_ok());
    }

    #[test]
    fn paths_match_by_whole_segments_after_normalisation() {
        let l = list(&["http://127.0.0.1:9999/hook/"]);
        assert!(l.check("http://127.0.0.1:9999/hook").is_ok());
        assert!(l.check("http://127.0.0.1:9999/hook/a?x=1").is_ok());
        assert_eq!(
            l.check("http://127.0.0.1:9999/hook/a/../b")
                .unwrap()
                .as_str(),
            "http://127.0.0.1:9999/hook/b"
        );
        for bad in [
            "http://127.0.0.1:9999/hook/../admin",
            "http://127.0.0.1:9999/hook/%2e%2e/admin",
            "http://127.0.0.1:9999/hook/.%2E/admin",
            "http://127.0.0.1:9999/hookx",
            "http://127.0.0.1:9999/hook#frag",
            "http://127.0.0.1:9999/hook/#",
            "http://a@127.0.0.1:9999/hook/",
            "http://127.0.0.1:9998/hook/",
            "https://127.0.0.1:9999/hook/",
            "http://127.0.0.1/hook/",
            "http://127.0.0.1:9999/ho\nok/",
        ] {
            assert!(l.check(bad).is_err(), "{bad} is refused");
        }
    }

    #[test]
    fn numeric_hosts_are_the_addresses_they_spell() {
        let l = list(&["http://127.0.0.1:9/"]);
        for same in [
            "http://0x7f000001:9/",
            "http://2130706433:9/",
            "http://0177.0.0.1:9/",
            "http://127.1:9/",
        ] {
            assert_eq!(
                l.check(same).unwrap().as_str(),
                "http://127.0.0.1:9/",
                "{same}"
            );
        }
        // Another spelling of loopback is another host: not the entry's.
        assert!(l.check("http://[::ffff:127.0.0.1]:9/").is_err());
        assert!(l.check("http://localhost:9/").is_err());
        // A wildcard entry takes them, but does not name them.
        let any = list(&["http://*:9/"]);
        assert!(!any.check("http://0x7f000001:9/").unwrap().named);
        assert!(
            list(&["http://localhost:9/"])
                .check("http://LOCALHOST:9/x")
                .unwrap()
                .named
        );
    }

    #[test]
    fn subdomain_patterns() {
        let l = list(&["https://*.example.com/"]);
        assert!(l.check("https://a.example.com/x").is_ok());
        assert!(l.check("https://a.b.example.com/").is_ok());
        assert!(l.check("https://example.com/").is_err());
        assert!(l.check("https://badexample.com/").is_err());
        assert!(l.check("https://a.example.com.evil.net/").is_err());
    }

    #[test]
    fn special_addresses_in_every_spelling() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "2002:7f00:1::",
            "fe80::1",
            "fd00::1",
            "ff02::1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip} is not public");
        }
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(is_public(ip.parse().unwrap()), "{ip} is public");
        }
    }

    #[tokio::test]
    async fn unnamed_private_addresses_are_never_connected() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let any = AllowList::parse(&[format!("http://*:{port}/")]).unwrap();
        let target = any.check(&format!("http://0x7f000001:{port}/")).unwrap();
        assert!(matches!(
            connect(&target, Duration::from_secs(1)).await,
            Err(EgressError::Forbidden)
        ));
        let target = any.check(&format!("http://localhost:{port}/")).unwrap();
        assert!(matches!(
            connect(&target, Duration::from_secs(1)).await,
            Err(EgressError::Forbidden)
        ));
        let named = AllowList::parse(&[format!("http://127.0.0.1:{port}/")]).unwrap();
        let target = named.check(&format!("http://2130706433:{port}/x")).unwrap();
        assert!(connect(&target, Duration::from_secs(1)).await.is_ok());
        assert!(
            tokio::time::timeout(Duration::from_millis(200), listener.accept())
                .await
                .is_ok()
        );
        // Refused and unreachable read the same.
        drop(listener);
        let err = connect(&target, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(err.to_string(), "remote unreachable");
    }
}
