//! Client-side TLS for `wss://`: which certificates a client trusts, the rustls configuration
//! built from them, and the words for a handshake that failed.
//!
//! - Trust: the platform's root certificates (`rustls-native-certs`: the OpenSSL locations on
//!   Linux, `SSL_CERT_FILE` / `SSL_CERT_DIR` when set; read once per process), plus the
//!   certificates of an optional CA file in PEM ([`ClientOptions::ca_file`]), read when a client
//!   is created and kept for its reconnects.
//! - Crypto: rustls with ring, TLS 1.2 and 1.3, the same as the server (`server::tls`); no
//!   process-wide default provider is installed or needed.
//! - Errors: a certificate the client does not trust becomes
//!   [`ClientError::UntrustedCertificate`]; an unusable CA file [`ClientError::CaFile`]; any
//!   other handshake failure a [`ClientError::Transport`] that says it was TLS.
//!
//! Owns no socket: `client::transport` opens the connection with the configuration built here.
//!
//! [`ClientOptions::ca_file`]: super::ClientOptions::ca_file

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;
use tokio_tungstenite::tungstenite;

use crate::client::error::ClientError;

/// What `wss://` connections of one client trust: built once, shared by every reconnect.
#[derive(Clone)]
pub(crate) struct Trust {
    /// The rustls configuration handed to the WebSocket connector.
    pub(crate) config: Arc<rustls::ClientConfig>,
    /// Whether the client trusts nothing at all (no system roots were found and no CA file was
    /// given): an untrusted-certificate error says so, as the likely cause.
    pub(crate) trusts_nothing: bool,
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trust")
            .field("trusts_nothing", &self.trusts_nothing)
            .finish_non_exhaustive()
    }
}

/// Builds the trust for `wss://`: the system's roots plus the certificates in `ca_file`.
///
/// # Errors
/// [`ClientError::CaFile`] when `ca_file` cannot be read, is not PEM, holds no certificate, or
/// holds a certificate rustls cannot use as a trust anchor.
pub(crate) fn trust(ca_file: Option<&Path>) -> Result<Trust, ClientError> {
    let mut roots = system_roots().clone();
    if let Some(path) = ca_file {
        for cert in read_ca_file(path)? {
            roots
                .add(cert)
                .map_err(|e| ca_file_error(path, format!("not a usable CA certificate: {e}")))?;
        }
    }
    let trusts_nothing = roots.is_empty();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::Transport(format!("TLS set-up: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Trust {
        config: Arc::new(config),
        trusts_nothing,
    })
}

/// The platform's root certificates, read on first use and kept for the life of the process
/// (a process that creates many clients reads the system's bundle once).
fn system_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::debug!(error = %e, "a source of system root certificates was unusable");
        }
        let mut store = RootCertStore::empty();
        let (added, ignored) = store.add_parsable_certificates(found.certs);
        tracing::debug!(added, ignored, "system root certificates loaded");
        store
    })
}

/// The certificates of a PEM file (one or more `-----BEGIN CERTIFICATE-----` sections; other
/// sections, such as a key, are skipped).
fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let bytes =
        std::fs::read(path).map_err(|e| ca_file_error(path, format!("cannot read it: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ca_file_error(path, format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(ca_file_error(
            path,
            "no certificate in it (expected PEM: -----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(certs)
}

fn ca_file_error(path: &Path, reason: String) -> ClientError {
    ClientError::CaFile {
        path: path.to_owned(),
        reason,
    }
}

/// How a WebSocket connection failed, when TLS was the cause.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum TlsFailure {
    /// The router's certificate was refused (unknown issuer, expired, another host name, ...):
    /// rustls's reason.
    Untrusted(String),
    /// The peer did not speak TLS (a plain-text router on a `wss://` URL): rustls's reason.
    NotTls(String),
    /// Any other handshake failure: rustls's reason.
    Handshake(String),
}

/// Classifies a connection error: `None` when TLS had no part in it (refused, unreachable, a
/// WebSocket upgrade the router declined, ...).
pub(crate) fn classify(error: &tungstenite::Error) -> Option<TlsFailure> {
    let tungstenite::Error::Io(io) = error else {
        return None;
    };
    let rustls_error = io.get_ref()?.downcast_ref::<rustls::Error>()?;
    let reason = rustls_error.to_string();
    Some(match rustls_error {
        rustls::Error::InvalidCertificate(_) => TlsFailure::Untrusted(reason),
        rustls::Error::InvalidMessage(_) => TlsFailure::NotTls(reason),
        _ => TlsFailure::Handshake(reason),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, contents: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "map-router-client-tls-{}-{}",
            std::process::id(),
            crate::protocol::ids::random_u128()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    fn ca_error_of(path: &Path) -> String {
        match trust(Some(path)) {
            Err(e @ ClientError::CaFile { .. }) => e.to_string(),
            Err(other) => panic!("wrong error for {}: {other}", path.display()),
            Ok(_) => panic!("{} was accepted as a CA file", path.display()),
        }
    }

    #[test]
    fn an_unusable_ca_file_is_an_error_naming_the_file() {
        let missing = std::env::temp_dir().join("map-router-no-such-ca.pem");
        let e = ca_error_of(&missing);
        assert!(e.contains("map-router-no-such-ca.pem"), "{e}");
        assert!(e.contains("cannot read it"), "{e}");

        let not_pem = temp_file("not-pem.pem", b"this is not a certificate\n");
        let e = ca_error_of(&not_pem);
        assert!(e.contains("not-pem.pem"), "{e}");
        assert!(e.contains("no certificate in it"), "{e}");

        let broken = temp_file(
            "broken.pem",
            b"-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
        );
        let e = ca_error_of(&broken);
        assert!(e.contains("broken.pem"), "{e}");
        assert!(e.contains("not valid PEM"), "{e}");
        for path in [not_pem, broken] {
            let _ = std::fs::remove_dir_all(path.parent().unwrap());
        }
    }

    #[test]
    fn without_a_ca_file_the_system_roots_are_trusted() {
        let t = trust(None).expect("no CA file is not an error");
        assert_eq!(t.trusts_nothing, system_roots().is_empty());
    }

    #[test]
    fn a_rustls_certificate_error_is_classified_as_untrusted() {
        let io = |e: rustls::Error| {
            tungstenite::Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        };
        let untrusted = io(rustls::Error::InvalidCertificate(
            rustls::CertificateError::UnknownIssuer,
        ));
        assert_eq!(
            classify(&untrusted),
            Some(TlsFailure::Untrusted(
                "invalid peer certificate: UnknownIssuer".into()
            ))
        );
        let plain = io(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        ));
        assert!(matches!(classify(&plain), Some(TlsFailure::NotTls(_))));
        let refused = tungstenite::Error::Io(std::io::ErrorKind::ConnectionRefused.into());
        assert_eq!(classify(&refused), None);
    }
}
