//! `[auth]` of the configuration file (flags and environment variables are applied on top by
//! `main.rs`), its validation, and the one place key material is read:
//! [`AuthSettings::build`], at start-up.
//!
//! Every default is a named constant with its reason. The format of each source is documented
//! in docs/security.md.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::auth::api_keys::ApiKeys;
pub use crate::auth::api_keys::MIN_API_KEY_LEN;
use crate::auth::authenticator::Authenticator;
use crate::auth::authenticator::AuthenticatorParts;
pub use crate::auth::authenticator::TrustedTransport;
use crate::auth::jwt::JwtVerifier;
pub use crate::auth::jwt::MIN_JWT_SECRET_LEN;

/// Default lead time of `map/auth/expiring`: five minutes (the SDK's MAPServer default) gives a
/// client time to fetch a new token; short tokens get half their remaining life instead.
pub const DEFAULT_EXPIRY_NOTICE_SECS: u64 = 300;
/// Default clock leeway for `exp` and `nbf`: enough for ordinary clock skew between the issuer
/// and the router, short enough that an expired token stops working within half a minute.
pub const DEFAULT_LEEWAY_SECS: u64 = 30;

/// A secret given inline (a flag or its environment variable). Never printed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// An authentication method as named in the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthMethodName {
    /// No authentication (cannot be combined with the others).
    None,
    /// API keys (`auth.method: "api-key"` on the wire).
    ApiKey,
    /// JSON Web Tokens (`auth.method: "bearer"` on the wire).
    #[serde(alias = "bearer")]
    Jwt,
}

impl std::str::FromStr for AuthMethodName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "none" => Ok(Self::None),
            "api-key" => Ok(Self::ApiKey),
            "jwt" | "bearer" => Ok(Self::Jwt),
            other => Err(format!(
                "unknown auth method `{other}` (expected none, api-key or jwt)"
            )),
        }
    }
}

/// One string or a list of strings (`issuer = "a"` or `issuer = ["a", "b"]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    /// Not set.
    #[default]
    #[serde(skip)]
    Unset,
    /// One value.
    One(String),
    /// Several values.
    Many(Vec<String>),
}

impl OneOrMany {
    /// The values (empty when unset).
    pub fn values(&self) -> Vec<String> {
        match self {
            Self::Unset => Vec::new(),
            Self::One(v) => vec![v.clone()],
            Self::Many(v) => v.clone(),
        }
        .into_iter()
        .filter(|v| !v.trim().is_empty())
        .collect()
    }
}

/// `[auth]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// Enabled methods. Absent: every method whose keys are configured below (none: no
    /// authentication). `["none"]` turns authentication off explicitly.
    pub methods: Option<Vec<AuthMethodName>>,
    /// Reported in `authRequired.realm` (default: the router name).
    pub realm: Option<String>,
    /// Transports admitted without credentials (default: `["supervised"]`).
    pub trusted_transports: Vec<TrustedTransport>,
    /// Principal ids that may connect as `participantType: "system"`, which passes every
    /// permission rule (default: none). Connections over a trusted transport always may.
    pub system_principals: Vec<String>,
    /// How long before a credential expires `map/auth/expiring` is sent, in seconds (capped at
    /// half the credential's remaining life).
    pub expiry_notice_secs: u64,
    /// `[auth.api_keys]`.
    pub api_keys: ApiKeySettings,
    /// `[auth.jwt]`.
    pub jwt: JwtSettings,
}

impl Default for AuthSettings {
    fn default() -> Self {
        Self {
            methods: None,
            realm: None,
            trusted_transports: vec![TrustedTransport::Supervised],
            system_principals: Vec::new(),
            expiry_notice_secs: DEFAULT_EXPIRY_NOTICE_SECS,
            api_keys: ApiKeySettings::default(),
            jwt: JwtSettings::default(),
        }
    }
}

/// `[auth.api_keys]`: where API keys come from (all sources are merged).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiKeySettings {
    /// A file with one `KEY [PRINCIPAL]` per line (`#` comments).
    pub file: Option<PathBuf>,
    /// The name of an environment variable holding `KEY [PRINCIPAL]` entries separated by
    /// commas or newlines.
    pub keys_env: Option<String>,
    /// Entries given inline (`--api-keys` / `MAP_ROUTER_API_KEYS`; not a file setting).
    #[serde(skip)]
    pub inline: Option<Secret>,
}

impl ApiKeySettings {
    fn configured(&self) -> bool {
        self.file.is_some() || self.keys_env.is_some() || self.inline.is_some()
    }
}

/// `[auth.jwt]`: how bearer tokens are verified.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JwtSettings {
    /// Accepted `iss` values (required).
    pub issuer: OneOrMany,
    /// Accepted `aud` values: the token's `aud` must contain one (required).
    pub audience: OneOrMany,
    /// HS256: a file holding the shared secret (surrounding whitespace is ignored).
    pub secret_file: Option<PathBuf>,
    /// HS256: the name of an environment variable holding the shared secret.
    pub secret_env: Option<String>,
    /// HS256 secret given inline (`--jwt-secret` / `MAP_ROUTER_JWT_SECRET`; not a file setting).
    #[serde(skip)]
    pub secret: Option<Secret>,
    /// RS256 / ES256 (and RS384/RS512/ES384/PS*/EdDSA): a JWKS file; tokens pick a key by `kid`.
    pub jwks_file: Option<PathBuf>,
    /// Clock leeway for `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
}

impl Default for JwtSettings {
    fn default() -> Self {
        Self {
            issuer: OneOrMany::Unset,
            audience: OneOrMany::Unset,
            secret_file: None,
            secret_env: None,
            secret: None,
            jwks_file: None,
            leeway_secs: DEFAULT_LEEWAY_SECS,
        }
    }
}

impl JwtSettings {
    fn configured(&self) -> bool {
        self.secret_file.is_some()
            || self.secret_env.is_some()
            || self.secret.is_some()
            || self.jwks_file.is_some()
    }
}

impl AuthSettings {
    /// The enabled methods (explicit, or inferred from what is configured), without `none`.
    pub fn enabled(&self) -> Vec<AuthMethodName> {
        match &self.methods {
            Some(list) => list
                .iter()
                .copied()
                .filter(|m| *m != AuthMethodName::None)
                .collect(),
            None => {
                let mut out = Vec::new();
                if self.jwt.configured() {
                    out.push(AuthMethodName::Jwt);
                }
                if self.api_keys.configured() {
                    out.push(AuthMethodName::ApiKey);
                }
                out
            }
        }
    }

    /// Checks what can be checked without reading files.
    ///
    /// # Errors
    /// A message naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(list) = &self.methods {
            if list.contains(&AuthMethodName::None) && list.len() > 1 {
                return Err("auth.methods: `none` cannot be combined with other methods".into());
            }
        }
        let enabled = self.enabled();
        if enabled.contains(&AuthMethodName::ApiKey) && !self.api_keys.configured() {
            return Err("auth method api-key needs keys: set auth.api_keys.file or auth.api_keys.keys_env (or --api-keys-file, MAP_ROUTER_API_KEYS)".into());
        }
        if enabled.contains(&AuthMethodName::Jwt) {
            let j = &self.jwt;
            if !j.configured() {
                return Err("auth method jwt needs a key: set auth.jwt.secret_file, auth.jwt.secret_env or auth.jwt.jwks_file (or --jwt-secret-file, --jwks-file, MAP_ROUTER_JWT_SECRET)".into());
            }
            if j.issuer.values().is_empty() {
                return Err(
                    "auth.jwt.issuer is required: the `iss` the router accepts (or --jwt-issuer)"
                        .into(),
                );
            }
            if j.audience.values().is_empty() {
                return Err("auth.jwt.audience is required: an `aud` value naming this router (or --jwt-audience)".into());
            }
        }
        if !enabled.is_empty() && self.expiry_notice_secs == 0 {
            return Err("auth.expiry_notice_secs must be at least 1".into());
        }
        Ok(())
    }

    /// Reads the key material and builds the authenticator; `None` when authentication is off.
    /// `default_realm` is used when `realm` is not set.
    ///
    /// # Errors
    /// An unreadable or malformed key file, a missing environment variable, a weak key: a
    /// message that names the source and never contains key material.
    pub fn build(&self, default_realm: &str) -> Result<Option<Arc<Authenticator>>, String> {
        self.validate()?;
        let enabled = self.enabled();
        if enabled.is_empty() {
            return Ok(None);
        }
        let api_keys = if enabled.contains(&AuthMethodName::ApiKey) {
            let mut keys = ApiKeys::default();
            let s = &self.api_keys;
            if let Some(path) = &s.file {
                keys.add(&read_secret_file(path)?, &path.display().to_string(), false)?;
            }
            if let Some(var) = &s.keys_env {
                keys.add(&read_env(var)?, &format!("${var}"), true)?;
            }
            if let Some(inline) = &s.inline {
                keys.add(&inline.0, "MAP_ROUTER_API_KEYS", true)?;
            }
            if keys.is_empty() {
                return Err("auth method api-key is enabled but no API key was found".into());
            }
            Some(keys)
        } else {
            None
        };
        let jwt = if enabled.contains(&AuthMethodName::Jwt) {
            let j = &self.jwt;
            let secret = match (&j.secret_file, &j.secret_env, &j.secret) {
                (Some(path), _, _) => Some((read_secret_file(path)?, path.display().to_string())),
                (None, Some(var), _) => Some((read_env(var)?, format!("${var}"))),
                (None, None, Some(s)) => Some((s.0.clone(), "MAP_ROUTER_JWT_SECRET".into())),
                (None, None, None) => None,
            };
            let jwks = match &j.jwks_file {
                Some(path) => Some((read_secret_file(path)?, path.display().to_string())),
                None => None,
            };
            Some(JwtVerifier::new(
                secret.as_ref().map(|(s, src)| (s.trim(), src.as_str())),
                jwks.as_ref().map(|(s, src)| (s.as_str(), src.as_str())),
                j.issuer.values(),
                j.audience.values(),
                j.leeway_secs,
            )?)
        } else {
            None
        };
        Ok(Some(Arc::new(Authenticator::new(AuthenticatorParts {
            api_keys,
            jwt,
            realm: self
                .realm
                .clone()
                .unwrap_or_else(|| default_realm.to_owned()),
            trusted: self.trusted_transports.clone(),
            system_principals: self.system_principals.clone(),
            expiry_notice: Duration::from_secs(self.expiry_notice_secs),
            leeway: Duration::from_secs(if enabled.contains(&AuthMethodName::Jwt) {
                self.jwt.leeway_secs
            } else {
                0
            }),
        }))))
    }
}

/// Reads a key file, warning when other users may read it.
fn read_secret_file(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(meta) = std::fs::metadata(path) {
            if meta.permissions().mode() & 0o004 != 0 {
                tracing::warn!(
                    file = %path.display(),
                    "a file with authentication keys is readable by every user; chmod o-r it"
                );
            }
        }
    }
    Ok(text)
}

fn read_env(var: &str) -> Result<String, String> {
    std::env::var(var).map_err(|_| format!("environment variable {var} is not set (or not UTF-8)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::authenticator::trusted_principal;
    use crate::auth::authenticator::LOCAL_ISSUER;
    use crate::protocol::methods::auth::RefreshParams;
    use crate::protocol::methods::session::{AuthCredentials, AuthErrorCode};

    fn parse(text: &str) -> AuthSettings {
        #[derive(Deserialize)]
        struct Wrap {
            auth: AuthSettings,
        }
        toml::from_str::<Wrap>(text).expect("valid TOML").auth
    }

    #[test]
    fn off_by_default_and_methods_are_inferred() {
        let s = AuthSettings::default();
        assert!(s.enabled().is_empty());
        assert!(s.build("r").unwrap().is_none());
        assert_eq!(s.trusted_transports, vec![TrustedTransport::Supervised]);
        let s = parse("[auth.api_keys]\nkeys_env = \"X\"\n");
        assert_eq!(s.enabled(), vec![AuthMethodName::ApiKey]);
        let s = parse("[auth]\nmethods = [\"none\"]\n[auth.api_keys]\nkeys_env = \"X\"\n");
        assert!(s.enabled().is_empty());
    }

    #[test]
    fn validation_names_what_is_missing() {
        let s = parse("[auth]\nmethods = [\"jwt\"]\n");
        assert!(s.validate().unwrap_err().contains("needs a key"));
        let s = parse("[auth.jwt]\njwks_file = \"/x\"\naudience = \"a\"\n");
        assert!(s.validate().unwrap_err().contains("issuer is required"));
        let s = parse("[auth.jwt]\njwks_file = \"/x\"\nissuer = [\"i\"]\n");
        assert!(s.validate().unwrap_err().contains("audience is required"));
        let s = parse("[auth]\nmethods = [\"api-key\"]\n");
        assert!(s.validate().unwrap_err().contains("needs keys"));
        let s = parse("[auth]\nmethods = [\"none\", \"jwt\"]\n");
        assert!(s.validate().unwrap_err().contains("cannot be combined"));
        let s = parse("[auth]\ntrusted_transports = [\"in-process\", \"stdio\"]\n");
        assert_eq!(
            s.trusted_transports,
            vec![TrustedTransport::InProcess, TrustedTransport::Stdio]
        );
    }

    #[test]
    fn build_reports_missing_sources_without_secrets() {
        let s = parse("[auth.api_keys]\nfile = \"/nonexistent/keys\"\n");
        let err = s.build("r").unwrap_err();
        assert!(err.contains("cannot read /nonexistent/keys"), "{err}");
        let s = parse("[auth.api_keys]\nkeys_env = \"MAP_ROUTER_TEST_UNSET_VARIABLE\"\n");
        let err = s.build("r").unwrap_err();
        assert!(
            err.contains("MAP_ROUTER_TEST_UNSET_VARIABLE is not set"),
            "{err}"
        );
        let mut s = AuthSettings::default();
        s.api_keys.inline = Some(Secret("short".into()));
        let err = s.build("r").unwrap_err();
        assert!(
            err.contains("shorter than 16") && !err.contains("short "),
            "{err}"
        );
        assert_eq!(format!("{:?}", s.api_keys.inline), "Some(Secret(***))");
    }

    // Authenticator checks, built from settings.

    fn keys_only() -> Authenticator {
        let mut s = AuthSettings::default();
        s.api_keys.inline = Some(Secret("k-0123456789abcdef alice".into()));
        clone_of(&s)
    }

    fn clone_of(s: &AuthSettings) -> Authenticator {
        let a = s.build("realm").unwrap().unwrap();
        std::sync::Arc::try_unwrap(a).unwrap()
    }

    fn creds(method: &str, credential: Option<&str>, token: Option<&str>) -> AuthCredentials {
        AuthCredentials {
            method: method.into(),
            credential: credential.map(Into::into),
            token: token.map(Into::into),
            metadata: None,
        }
    }

    #[test]
    fn both_spellings_and_bearer_api_keys() {
        let a = keys_only();
        assert_eq!(a.methods(), vec!["api-key"]);
        for c in [
            creds("api-key", Some("k-0123456789abcdef"), None),
            creds("api-key", None, Some("k-0123456789abcdef")),
            creds("bearer", Some("k-0123456789abcdef"), None),
        ] {
            assert_eq!(a.verify(&c).unwrap().id, "alice");
        }
        let e = a
            .verify(&creds("api-key", Some("k-0123456789abcdeX"), None))
            .unwrap_err();
        assert_eq!(e.code, AuthErrorCode::InvalidCredentials);
        let e = a.verify(&creds("api-key", None, None)).unwrap_err();
        assert_eq!(e.code, AuthErrorCode::AuthRequired);
        let e = a
            .verify(&creds(
                "api-key",
                Some("a-0123456789abcdef"),
                Some("b-0123456789abcdef"),
            ))
            .unwrap_err();
        assert_eq!(e.code, AuthErrorCode::InvalidCredentials);
        let e = a
            .verify(&creds("mtls", Some("k-0123456789abcdef"), None))
            .unwrap_err();
        assert_eq!(e.code, AuthErrorCode::MethodNotSupported);
        assert!(e
            .message
            .starts_with("Authentication method not supported: mtls"));
    }

    #[test]
    fn refresh_takes_any_shape() {
        let a = keys_only();
        let p = RefreshParams {
            refresh_token: Some("k-0123456789abcdef".into()),
            ..RefreshParams::default()
        };
        assert_eq!(a.verify_refresh(&p).unwrap().id, "alice");
        let e = a.verify_refresh(&RefreshParams::default()).unwrap_err();
        assert_eq!(e.code, AuthErrorCode::AuthRequired);
    }

    #[test]
    fn trusted_principals_are_local() {
        let p = trusted_principal(TrustedTransport::Supervised, Some("a1"));
        assert_eq!(p.id, "supervised:a1");
        assert_eq!(p.issuer.as_deref(), Some(LOCAL_ISSUER));
    }
}
