//! The one parser of an `Authorization` value for the whole crate: `Bearer <credential>`
//! (the gateways' HTTP routes, `GET /metrics`, AIP's gRPC metadata).
//!
//! Owns nothing, and knows no HTTP types: it reads the header's text, so `auth` stays below
//! `transport`, `gateway` and `server`, which hand it the value they read. Whether the
//! credential is good is [`Authenticator::verify_bearer`](crate::auth::Authenticator::verify_bearer)'s
//! question, asked once per request by the gateway layer's admission (`gateway::caller`).

/// The credential of an `Authorization` value: what follows `Bearer ` (or `bearer `), trimmed;
/// with `bare`, a value without that prefix is taken whole (AIP's metadata accepts the bare
/// credential). `None` when nothing is left.
pub fn credential(value: &str, bare: bool) -> Option<&str> {
    let token = match value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
    {
        Some(token) => token,
        None if bare => value,
        None => return None,
    };
    Some(token.trim()).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::credential;

    #[test]
    fn bearer_values() {
        assert_eq!(credential("Bearer abc", false), Some("abc"));
        assert_eq!(credential("bearer  abc ", false), Some("abc"));
        assert_eq!(credential("Bearer ", false), None);
        assert_eq!(credential("Basic abc", false), None);
        assert_eq!(credential("abc", false), None);
        assert_eq!(credential("abc", true), Some("abc"));
        assert_eq!(credential("Bearer abc", true), Some("abc"));
        assert_eq!(credential("Bearer   ", true), None);
        assert_eq!(credential("  ", true), None);
    }
}
