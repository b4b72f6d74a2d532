//! What every user command shares: where the router is and the credentials it wants
//! ([`UrlArgs`]), connecting as the CLI (a recognisable name and participant id), how a failure
//! is reported ([`Failure`], naming the CLI's flags for authentication), and output helpers.

use std::io::Write as _;
use std::path::PathBuf;

use clap::Args;
use serde_json::Value;

use crate::client::{Client, ClientError, ClientOptions, ReconnectPolicy};
use crate::protocol::message::Address;

/// Default router URL of the user commands.
pub const DEFAULT_URL: &str = "ws://127.0.0.1:4500/";

/// The name every CLI connection gives in `map/connect`.
pub const CLI_NAME: &str = "map-router-cli";
/// How the participant ids of CLI connections, and the ids of the CLI's temporary agents,
/// begin (`watch` hides their connection events unless `--all`).
pub const CLI_ID_PREFIX: &str = "map-router-cli-";

/// What the CLI says when the router wants credentials it was not given.
pub const AUTH_HINT: &str =
    "the router requires authentication: pass --api-key KEY or --token JWT \
     (or set MAP_ROUTER_API_KEY / MAP_ROUTER_TOKEN)";

/// Where the router is, and the credentials it wants (when authentication is on).
#[derive(Debug, Clone, Args)]
pub struct UrlArgs {
    /// The router's URL: ws://HOST:PORT/, or wss://HOST:PORT/ when it serves TLS (http:// and
    /// https:// are taken as ws:// and wss://).
    #[arg(long, env = "MAP_ROUTER_URL", default_value = DEFAULT_URL)]
    pub url: String,
    /// A CA certificate (PEM) to trust for a wss:// router, besides the system's root
    /// certificates: the CA that signed the router's certificate (or that certificate itself
    /// when it is self-signed).
    #[arg(long, env = "MAP_ROUTER_CA_FILE", value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// A JWT to authenticate with (`bearer`). Prefer the environment variable: a flag is
    /// visible to every user in `ps`.
    #[arg(
        long,
        env = "MAP_ROUTER_TOKEN",
        hide_env_values = true,
        conflicts_with = "api_key"
    )]
    pub token: Option<String>,
    /// An API key to authenticate with (`api-key`). Prefer the environment variable.
    #[arg(long, env = "MAP_ROUTER_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

impl UrlArgs {
    /// The `auth` object of `map/connect`, if credentials were given.
    pub fn credentials(&self) -> Option<crate::protocol::methods::session::AuthCredentials> {
        let (method, credential) = match (&self.token, &self.api_key) {
            (Some(t), _) => ("bearer", t),
            (None, Some(k)) => ("api-key", k),
            (None, None) => return None,
        };
        Some(crate::protocol::methods::session::AuthCredentials {
            method: method.into(),
            credential: Some(credential.clone()),
            token: None,
            metadata: None,
        })
    }
}

/// A failed command: what was being done, and why.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) what: String,
    pub(crate) error: String,
}

impl Failure {
    pub(crate) fn new(what: impl Into<String>, error: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            error: error.into(),
        }
    }
}

pub(crate) fn fail(what: impl Into<String>) -> impl FnOnce(ClientError) -> Failure {
    let what = what.into();
    move |e| Failure {
        what,
        error: describe(&e),
    }
}

/// A client error in the CLI's words: authentication problems name the CLI's flags, not the
/// Rust API.
pub(crate) fn describe(e: &ClientError) -> String {
    match e {
        e if e.is_auth_required() => AUTH_HINT.to_owned(),
        ClientError::Auth(_) => {
            format!("{e}; check --api-key / --token (or MAP_ROUTER_API_KEY / MAP_ROUTER_TOKEN)")
        }
        e => e.to_string(),
    }
}

pub(crate) async fn connect(url: &UrlArgs, options: ClientOptions) -> Result<Client, Failure> {
    let options = match url.credentials() {
        Some(c) => options.auth(c),
        None => options,
    };
    let options = match &url.ca_file {
        Some(path) => options.ca_file(path),
        None => options,
    };
    Client::connect_ws(&url.url, cli_identity(options))
        .await
        .map_err(connect_failure)
}

/// A failed connection, with the CLI's remedy when the router's certificate is not trusted.
pub(crate) fn connect_failure(e: ClientError) -> Failure {
    match e {
        ClientError::UntrustedCertificate { url, reason } => Failure {
            what: format!("cannot connect to {url}"),
            error: format!(
                "TLS certificate not trusted ({reason}); pass the router's CA with --ca-file \
                 or MAP_ROUTER_CA_FILE"
            ),
        },
        e => fail("connect")(e),
    }
}

/// Makes a connection recognisably the CLI's: name [`CLI_NAME`], participant id
/// [`CLI_ID_PREFIX`]`<random>`.
pub(crate) fn cli_identity(options: ClientOptions) -> ClientOptions {
    options.name(CLI_NAME).participant_id(cli_id())
}

/// A fresh id that begins with [`CLI_ID_PREFIX`].
pub(crate) fn cli_id() -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{CLI_ID_PREFIX}{}", &random[..16])
}

/// One-shot commands do not reconnect: they fail fast.
pub(crate) fn one_shot(options: ClientOptions) -> ClientOptions {
    options.reconnect(ReconnectPolicy::disabled())
}

/// Whether `to` reaches a group (which needs `messaging.canBroadcast`, i.e. an `agent`
/// participant).
pub(crate) fn address_is_group(to: &Value) -> bool {
    match Address::parse(to) {
        Ok(Address::Text(s)) => s.starts_with("scope:"),
        Ok(a) => a.is_multicast(),
        Err(_) => false,
    }
}

/// Parses JSON, or keeps the text as a JSON string when it is not JSON.
pub(crate) fn json_or_string(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Writes one line to stdout; `false` when stdout is gone (a closed pipe ends the command).
pub(crate) fn print_line(line: &str) -> bool {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

pub(crate) fn pretty(v: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("<unprintable: {e}>"))
}

/// Leaves a one-shot session: `map/disconnect` (the session's own agents go with it), then
/// close.
pub(crate) async fn leave(client: &Client) {
    let _ = client.disconnect().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::methods::auth::{AuthError, AuthErrorCode};

    #[test]
    fn auth_errors_name_the_cli_flags() {
        let missing = ClientError::Auth(AuthError::new(AuthErrorCode::AuthRequired, "rust hint"));
        assert_eq!(describe(&missing), AUTH_HINT);
        let refused = ClientError::Auth(AuthError::new(AuthErrorCode::InvalidCredentials, "bad"));
        let text = describe(&refused);
        assert!(
            text.starts_with("authentication refused (invalid_credentials): bad; check --api-key"),
            "{text}"
        );
        assert_eq!(describe(&ClientError::Closed), "the client is closed");
    }

    #[test]
    fn cli_ids_are_recognisable_and_fresh() {
        let (a, b) = (cli_id(), cli_id());
        assert!(
            a.starts_with(CLI_ID_PREFIX) && a.len() == CLI_ID_PREFIX.len() + 16,
            "{a}"
        );
        assert_ne!(a, b);
    }
}
