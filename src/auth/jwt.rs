//! JWT bearer tokens: HS256 with a shared secret, or asymmetric keys from a JWKS (RS256, ES256
//! and the other RSA/EC/EdDSA algorithms their key type implies), chosen by the token's `kid`.
//!
//! A token is accepted when its signature verifies with the key its header names, the header's
//! `alg` is one that key may be used with (an RSA key never verifies an `HS256` token: no
//! algorithm confusion), `iss` is one of the configured issuers, `aud` contains a configured
//! audience, `exp` has not passed and `nbf` (when present) has, both with the configured leeway.
//! `sub`, `iss`, `aud` and `exp` are required. The principal is `{id: sub, issuer: iss,
//! expiresAt: exp}`.
//!
//! Verification is done by `jsonwebtoken` on its pure-Rust backend; this module only chooses the
//! key and the rules, and turns failures into messages a client can act on.

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::protocol::methods::auth::{AuthError, AuthErrorCode};
use crate::protocol::methods::session::Principal;

/// Shortest HS256 secret accepted (RFC 7518 §3.2: at least the hash size, 256 bits).
pub const MIN_JWT_SECRET_LEN: usize = 32;

struct Key {
    kid: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("algorithms", &self.algorithms)
            .finish()
    }
}

/// Verifies bearer tokens.
pub struct JwtVerifier {
    secret: Option<DecodingKey>,
    keys: Vec<Key>,
    issuers: Vec<String>,
    audiences: Vec<String>,
    leeway_secs: u64,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("hs256", &self.secret.is_some())
            .field(
                "kids",
                &self.keys.iter().map(|k| k.kid.clone()).collect::<Vec<_>>(),
            )
            .field("issuers", &self.issuers)
            .field("audiences", &self.audiences)
            .field("leeway_secs", &self.leeway_secs)
            .finish()
    }
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    iss: Option<String>,
    exp: u64,
}

fn invalid(message: impl Into<String>) -> AuthError {
    AuthError::new(AuthErrorCode::InvalidCredentials, message)
}

impl JwtVerifier {
    /// A verifier with an HS256 secret and/or a JWKS document (each with the name of its
    /// source, for errors).
    ///
    /// # Errors
    /// A secret shorter than [`MIN_JWT_SECRET_LEN`] bytes, a JWKS that is not valid JSON or has
    /// no usable signing key.
    pub fn new(
        secret: Option<(&str, &str)>,
        jwks: Option<(&str, &str)>,
        issuers: Vec<String>,
        audiences: Vec<String>,
        leeway_secs: u64,
    ) -> Result<Self, String> {
        let secret = match secret {
            Some((s, source)) if s.len() < MIN_JWT_SECRET_LEN => {
                return Err(format!(
                    "{source}: the HS256 secret is shorter than {MIN_JWT_SECRET_LEN} bytes"
                ));
            }
            Some((s, _)) => Some(DecodingKey::from_secret(s.as_bytes())),
            None => None,
        };
        let keys = match jwks {
            Some((text, source)) => parse_jwks(text, source)?,
            None => Vec::new(),
        };
        Ok(Self {
            secret,
            keys,
            issuers,
            audiences,
            leeway_secs,
        })
    }

    /// Checks a token; returns its principal.
    ///
    /// # Errors
    /// `expired` for a token past its `exp` (plus leeway), `invalid_credentials` for anything
    /// else, with a message saying what was wrong.
    pub fn verify(&self, token: &str) -> Result<Principal, AuthError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| invalid(format!("not a valid JWT: {e}")))?;
        let alg = header.alg;
        let key = match alg {
            Algorithm::HS256 => self.secret.as_ref().ok_or_else(|| {
                invalid("HS256 tokens are not accepted here (no shared secret is configured)")
            })?,
            Algorithm::HS384 | Algorithm::HS512 => {
                return Err(invalid(format!(
                    "{alg:?} tokens are not accepted here (only HS256 with a shared secret)"
                )))
            }
            _ => {
                let key = match header.kid.as_deref() {
                    Some(kid) => self
                        .keys
                        .iter()
                        .find(|k| k.kid.as_deref() == Some(kid))
                        .ok_or_else(|| invalid(format!("unknown key id (kid) `{kid}`")))?,
                    None if self.keys.len() == 1 => &self.keys[0],
                    None if self.keys.is_empty() => {
                        return Err(invalid(format!(
                            "{alg:?} tokens are not accepted here (no JWKS is configured)"
                        )))
                    }
                    None => {
                        return Err(invalid(
                            "the token names no key (kid) and the JWKS has several",
                        ))
                    }
                };
                if !key.algorithms.contains(&alg) {
                    return Err(invalid(format!(
                        "algorithm {alg:?} does not match the key {}",
                        key.kid.as_deref().unwrap_or("(without kid)")
                    )));
                }
                &key.key
            }
        };
        let mut v = Validation::new(alg);
        v.leeway = self.leeway_secs;
        v.validate_nbf = true;
        v.validate_exp = true;
        v.set_issuer(&self.issuers);
        v.set_audience(&self.audiences);
        v.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
        let data = jsonwebtoken::decode::<Claims>(token, key, &v).map_err(|e| match e.kind() {
            ErrorKind::ExpiredSignature => {
                AuthError::new(AuthErrorCode::Expired, "the token has expired (exp)")
            }
            ErrorKind::ImmatureSignature => invalid("the token is not valid yet (nbf)"),
            ErrorKind::InvalidIssuer => invalid("the token's issuer (iss) is not accepted"),
            ErrorKind::InvalidAudience => {
                invalid("the token's audience (aud) does not name this router")
            }
            ErrorKind::InvalidSignature => invalid("the token's signature does not verify"),
            ErrorKind::MissingRequiredClaim(c) => invalid(format!("the token has no `{c}` claim")),
            ErrorKind::InvalidClaimFormat(c) => {
                invalid(format!("the token's `{c}` claim is malformed"))
            }
            _ => invalid(format!("not a valid JWT: {e}")),
        })?;
        let claims = data.claims;
        if claims.sub.trim().is_empty() {
            return Err(invalid("the token's subject (sub) is empty"));
        }
        // NB: a token whose issuer is the router's own (`LOCAL_ISSUER`) is refused by the
        // authenticator, which owns that name (authenticator.rs, `not_local`).
        Ok(Principal {
            id: claims.sub,
            issuer: claims.iss,
            expires_at: Some(claims.exp.saturating_mul(1000)),
        })
    }
}

/// The signing keys of a JWKS document, each with the algorithms it may verify.
fn parse_jwks(text: &str, source: &str) -> Result<Vec<Key>, String> {
    let set: JwkSet =
        serde_json::from_str(text).map_err(|e| format!("{source}: not a JWKS document: {e}"))?;
    let mut keys = Vec::new();
    for (i, jwk) in set.keys.iter().enumerate() {
        let label = jwk.common.key_id.clone().unwrap_or_else(|| format!("#{i}"));
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let implied: Vec<Algorithm> = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => vec![
                Algorithm::RS256,
                Algorithm::RS384,
                Algorithm::RS512,
                Algorithm::PS256,
                Algorithm::PS384,
                Algorithm::PS512,
            ],
            AlgorithmParameters::EllipticCurve(p) => match p.curve {
                EllipticCurve::P256 => vec![Algorithm::ES256],
                EllipticCurve::P384 => vec![Algorithm::ES384],
                _ => Vec::new(),
            },
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                vec![Algorithm::EdDSA]
            }
            _ => Vec::new(),
        };
        let algorithms: Vec<Algorithm> = match jwk.common.key_algorithm {
            Some(named) => {
                let named: Option<Algorithm> = format!("{named:?}").parse().ok();
                implied.into_iter().filter(|a| Some(*a) == named).collect()
            }
            None => implied,
        };
        if algorithms.is_empty() {
            tracing::warn!(source, key = %label, "skipping a JWKS key that cannot verify signatures here (symmetric, unsupported curve, or `alg` not matching its type)");
            continue;
        }
        let key = DecodingKey::from_jwk(jwk)
            .map_err(|e| format!("{source}: key {label} is malformed: {e}"))?;
        keys.push(Key {
            kid: jwk.common.key_id.clone(),
            key,
            algorithms,
        });
    }
    if keys.is_empty() {
        return Err(format!("{source}: the JWKS has no usable signing key"));
    }
    let mut kids: Vec<&str> = keys.iter().filter_map(|k| k.kid.as_deref()).collect();
    kids.sort_unstable();
    if kids.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("{source}: two keys share a kid"));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwks_errors_are_clear() {
        assert!(parse_jwks("nope", "/j")
            .unwrap_err()
            .starts_with("/j: not a JWKS"));
        assert_eq!(
            parse_jwks(r#"{"keys":[]}"#, "/j").unwrap_err(),
            "/j: the JWKS has no usable signing key"
        );
        let oct = r#"{"keys":[{"kty":"oct","k":"c2VjcmV0","kid":"s"}]}"#;
        assert!(
            parse_jwks(oct, "/j").is_err(),
            "symmetric keys are not read from a JWKS"
        );
    }

    #[test]
    fn short_secrets_are_refused() {
        let e = JwtVerifier::new(Some(("short", "$S")), None, vec![], vec![], 0).unwrap_err();
        assert_eq!(e, "$S: the HS256 secret is shorter than 32 bytes");
    }

    #[test]
    fn garbage_is_invalid_not_a_panic() {
        let v = JwtVerifier::new(
            Some(("0123456789abcdef0123456789abcdef", "s")),
            None,
            vec!["i".into()],
            vec!["a".into()],
            0,
        )
        .unwrap();
        for t in ["", "a.b.c", "...", "eyJhbGciOiJub25lIn0.e30."] {
            let e = v.verify(t).unwrap_err();
            assert_eq!(e.code, AuthErrorCode::InvalidCredentials, "{t}: {e}");
        }
    }
}
