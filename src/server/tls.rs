//! TLS for the listeners: loads a PEM certificate chain and private key and builds a rustls
//! acceptor (ring crypto provider, TLS 1.2 and 1.3, ALPN `http/1.1`).
//!
//! Owns only the loading and the rustls configuration; the accept loop (`server::listener`)
//! runs the handshake. Errors name the file and what was wrong with it, so a bad path or a
//! swapped cert/key is reported at start-up rather than at the first connection.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Certificate and key files (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Builds the TLS acceptor for `files`.
///
/// # Errors
/// A file is unreadable, holds no certificate or key, or the key does not match.
pub fn acceptor(files: &TlsFiles) -> std::io::Result<tokio_rustls::TlsAcceptor> {
    acceptor_alpn(files, vec![b"http/1.1".to_vec()])
}

/// As [`acceptor`], offering the ALPN protocols `alpn` (the AIP gateway's gRPC listener:
/// `h2`, which gRPC clients require).
///
/// # Errors
/// As [`acceptor`].
pub fn acceptor_alpn(
    files: &TlsFiles,
    alpn: Vec<Vec<u8>>,
) -> std::io::Result<tokio_rustls::TlsAcceptor> {
    let certs = load_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| invalid(&files.key, &format!("no usable private key: {e}")))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| invalid(&files.cert, &format!("certificate and key do not fit: {e}")))?;
    config.alpn_protocols = alpn;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

fn load_certs(path: &Path) -> std::io::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| invalid(path, &format!("cannot read certificates: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(path, &format!("bad certificate: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(path, "no certificate in the file"));
    }
    Ok(certs)
}

fn invalid(path: &Path, what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("TLS: {}: {what}", path.display()),
    )
}
