//! Authentication over real sockets with real credentials: JWTs signed here (HS256 with a
//! secret, RS256 and ES256 with the keys in `tests/fixtures/auth/`, verified through a JWKS file
//! written to a temp dir), API keys from a file and from the environment. Covers the
//! `authRequired` negotiation, `map/authenticate`, `map/auth/refresh`, `map/auth/expiring`, the
//! end of access at expiry, resume rules, and the trusted-transport bypass. Also where
//! authentication meets permissions: capability overrides per principal, and the binary with a
//! config file of JWT and visibility rules.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use map_router::auth::config::{OneOrMany, Secret, TrustedTransport};
use map_router::server::{Config, Server};
use serde_json::{json, Value};

const ISS: &str = "https://issuer.test";
const AUD: &str = "map-router-test";
const SECRET: &str = "a-shared-hs256-secret-of-32-bytes-or-more";
const ALICE_KEY: &str = "ak-alice-0123456789abcdef";
const ENV_KEY: &str = "ak-carol-from-the-environment";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/auth")
        .join(name)
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64
}

/// Standard claims for `sub`, expiring `ttl` seconds from now, plus `extra`.
fn claims(sub: &str, ttl: i64, extra: Value) -> Value {
    let mut c =
        json!({"sub": sub, "iss": ISS, "aud": AUD, "iat": now_secs(), "exp": now_secs() + ttl});
    merge(&mut c, extra);
    c
}

#[derive(Clone, Copy)]
enum Signer {
    Hs256,
    Rs256,
    Es256,
    /// An RSA key that is in no JWKS.
    OtherRsa,
}

fn sign(signer: Signer, kid: Option<&str>, claims: &Value) -> String {
    let (alg, key) = match signer {
        Signer::Hs256 => (
            Algorithm::HS256,
            EncodingKey::from_secret(SECRET.as_bytes()),
        ),
        Signer::Rs256 => (
            Algorithm::RS256,
            EncodingKey::from_rsa_pem(&std::fs::read(fixture("rs256.pem")).unwrap()).unwrap(),
        ),
        Signer::Es256 => (
            Algorithm::ES256,
            EncodingKey::from_ec_pem(&std::fs::read(fixture("es256.pem")).unwrap()).unwrap(),
        ),
        Signer::OtherRsa => (
            Algorithm::RS256,
            EncodingKey::from_rsa_pem(&std::fs::read(fixture("rs256-other.pem")).unwrap()).unwrap(),
        ),
    };
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &key).expect("sign a test token")
}

fn hs256(sub: &str, ttl: i64) -> String {
    sign(Signer::Hs256, None, &claims(sub, ttl, Value::Null))
}

/// A server with JWT (HS256 secret + the fixture JWKS) and API keys (a file), leeway 0.
async fn auth_server(tweak: impl FnOnce(&mut Config)) -> (Server, String, TempDir) {
    let dir = TempDir::new("auth");
    let jwks = dir.path.join("jwks.json");
    std::fs::copy(fixture("jwks.json"), &jwks).unwrap();
    let keys = dir.path.join("api-keys");
    std::fs::write(
        &keys,
        format!("# test keys\n{ALICE_KEY} alice\nak-bob-0123456789abcdef bob\n"),
    )
    .unwrap();
    let (server, url) = start_server(|c| {
        c.auth.jwt.secret = Some(Secret(SECRET.into()));
        c.auth.jwt.jwks_file = Some(jwks);
        c.auth.jwt.issuer = OneOrMany::One(ISS.into());
        c.auth.jwt.audience = OneOrMany::Many(vec!["other".into(), AUD.into()]);
        c.auth.jwt.leeway_secs = 0;
        c.auth.api_keys.file = Some(keys);
        c.auth.realm = Some("test-realm".into());
        tweak(c);
    })
    .await;
    (server, url, dir)
}

/// Opens a WebSocket and sends `map/connect` as `kind` with `auth`; returns the client and the
/// result (which may be `authRequired`).
async fn connect_with(url: &str, kind: &str, auth: Value) -> (WsClient, Value) {
    let mut c = WsClient::connect(url).await;
    let mut params = json!({"protocolVersion": 1, "participantType": kind});
    if !auth.is_null() {
        params["auth"] = auth;
    }
    let r = c.ok("map/connect", params).await;
    c.session = r.clone();
    (c, r)
}

fn bearer(token: &str) -> Value {
    json!({"method": "bearer", "token": token})
}

/// Asserts an `authRequired` answer (no session) with this error code (`None`: no error).
fn assert_auth_required(r: &Value, code: Option<&str>) -> String {
    assert!(r.get("sessionId").is_none(), "no session: {r}");
    assert_eq!(
        r["authRequired"],
        json!({"methods": ["bearer", "api-key"], "required": true, "realm": "test-realm"}),
        "{r}"
    );
    match code {
        None => {
            assert!(r.get("error").is_none(), "{r}");
            String::new()
        }
        Some(code) => {
            assert_eq!(r["error"]["code"], json!(code), "{r}");
            r["error"]["message"].as_str().unwrap().to_owned()
        }
    }
}

#[tokio::test]
async fn jwts_of_each_algorithm_connect_with_their_principal() {
    let (_server, url, _dir) = auth_server(|_| {}).await;
    let cases = [
        (Signer::Hs256, None, "hs-user"),
        (Signer::Rs256, Some("rsa-1"), "rs-user"),
        (Signer::Es256, Some("ec-1"), "es-user"),
    ];
    for (signer, kid, sub) in cases {
        let c = claims(sub, 600, Value::Null);
        let exp = c["exp"].as_i64().unwrap() as u64;
        let token = sign(signer, kid, &c);
        let (mut client, r) = connect_with(&url, "client", bearer(&token)).await;
        assert!(r["sessionId"].is_string(), "{r}");
        assert_eq!(
            r["principal"],
            json!({"id": sub, "issuer": ISS, "expiresAt": exp * 1000}),
            "{sub}"
        );
        client.ok("map/agents/list", Value::Null).await;
    }
}

#[tokio::test]
async fn both_credential_spellings_are_accepted() {
    let (_server, url, _dir) = auth_server(|_| {}).await;
    let token = hs256("spelling", 600);
    for auth in [
        json!({"method": "bearer", "credential": token}),
        json!({"method": "bearer", "token": token}),
        json!({"method": "api-key", "credential": ALICE_KEY}),
        json!({"method": "api-key", "token": ALICE_KEY}),
    ] {
        let (_c, r) = connect_with(&url, "client", auth.clone()).await;
        assert!(r["sessionId"].is_string(), "{auth}: {r}");
    }
    // Both spellings with different values are refused rather than guessed.
    let (_c, r) = connect_with(
        &url,
        "client",
        json!({"method": "api-key", "credential": ALICE_KEY, "token": "ak-bob-0123456789abcdef"}),
    )
    .await;
    assert!(assert_auth_required(&r, Some("invalid_credentials")).contains("differ"));
}

#[tokio::test]
async fn api_keys_from_a_file_and_from_the_environment() {
    let var = format!("MAP_ROUTER_TEST_KEYS_{}", std::process::id());
    std::env::set_var(&var, format!("{ENV_KEY} carol, ak-no-principal-0123456789"));
    let (_server, url, _dir) = auth_server(|c| c.auth.api_keys.keys_env = Some(var)).await;
    let (_a, r) = connect_with(
        &url,
        "agent",
        json!({"method": "api-key", "token": ALICE_KEY}),
    )
    .await;
    assert_eq!(r["principal"], json!({"id": "alice"}));
    let (_c, r) = connect_with(
        &url,
        "client",
        json!({"method": "api-key", "credential": ENV_KEY}),
    )
    .await;
    assert_eq!(r["principal"], json!({"id": "carol"}));
    // A key without a principal gets a stable, non-reversible one.
    let (_n, r) = connect_with(
        &url,
        "client",
        json!({"method": "api-key", "credential": "ak-no-principal-0123456789"}),
    )
    .await;
    let id = r["principal"]["id"].as_str().unwrap();
    assert!(
        id.starts_with("api-key:") && !id.contains("0123456789"),
        "{id}"
    );
    // API keys sent as bearer tokens work too.
    let (_b, r) = connect_with(&url, "client", bearer(ALICE_KEY)).await;
    assert_eq!(r["principal"]["id"], json!("alice"));
    let (_x, r) = connect_with(
        &url,
        "client",
        json!({"method": "api-key", "credential": "ak-alice-0123456789abcdeX"}),
    )
    .await;
    assert_eq!(
        assert_auth_required(&r, Some("invalid_credentials")),
        "unknown API key"
    );
}

#[tokio::test]
async fn refused_tokens_say_why() {
    let (_server, url, _dir) = auth_server(|_| {}).await;
    let cases: Vec<(String, &str, &str)> = vec![
        (
            sign(
                Signer::Hs256,
                None,
                &claims("u", 600, json!({"iss": "https://evil.test"})),
            ),
            "invalid_credentials",
            "issuer",
        ),
        (
            sign(
                Signer::Rs256,
                Some("rsa-1"),
                &claims("u", 600, json!({"aud": "someone-else"})),
            ),
            "invalid_credentials",
            "audience",
        ),
        (
            sign(Signer::Es256, Some("ec-1"), &claims("u", -120, Value::Null)),
            "expired",
            "expired",
        ),
        (
            sign(
                Signer::Hs256,
                None,
                &claims("u", 7200, json!({"nbf": now_secs() + 3600})),
            ),
            "invalid_credentials",
            "not valid yet",
        ),
        (
            sign(
                Signer::OtherRsa,
                Some("rsa-1"),
                &claims("u", 600, Value::Null),
            ),
            "invalid_credentials",
            "signature",
        ),
        (
            sign(Signer::Rs256, Some("rsa-9"), &claims("u", 600, Value::Null)),
            "invalid_credentials",
            "unknown key id",
        ),
        (
            sign(
                Signer::Hs256,
                None,
                &json!({"sub": "u", "aud": AUD, "exp": now_secs() + 600}),
            ),
            "invalid_credentials",
            "no `iss` claim",
        ),
        ("not.a.jwt".into(), "invalid_credentials", "not a valid JWT"),
    ];
    for (token, code, says) in cases {
        let (mut c, r) = connect_with(&url, "client", bearer(&token)).await;
        let message = assert_auth_required(&r, Some(code));
        assert!(message.contains(says), "{says}: {message}");
        // Nothing but connect/authenticate works afterwards.
        let e = c.err("map/agents/list", Value::Null).await;
        assert_eq!(e["code"], json!(1000), "{e}");
    }
    let (_c, r) = connect_with(&url, "client", json!({"method": "mtls", "credential": "x"})).await;
    assert!(assert_auth_required(&r, Some("method_not_supported"))
        .starts_with("Authentication method not supported: mtls"));
    let (_c, r) = connect_with(&url, "client", Value::Null).await;
    assert_auth_required(&r, None);
}

#[tokio::test]
async fn an_unauthenticated_connection_can_only_connect_or_authenticate() {
    let (_server, url, _dir) = auth_server(|_| {}).await;
    let mut c = WsClient::connect(&url).await;
    let e = c.err("map/agents/list", Value::Null).await;
    assert_eq!(
        e,
        map_error(1000, "Not connected: call map/connect first", "auth")
    );
    let r = c
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "agent"}),
        )
        .await;
    assert_auth_required(&r, None);
    let refused = map_error(
        1000,
        "Authentication required: call map/authenticate (or map/connect with auth) first",
        "auth",
    );
    for (method, params) in [
        ("map/agents/list", Value::Null),
        ("map/agents/register", json!({"name": "sneaky"})),
        ("map/subscribe", json!({})),
        ("map/send", json!({"to": {"broadcast": true}, "payload": 1})),
        ("map/replay", json!({"limit": 10})),
        (
            "map/auth/refresh",
            json!({"method": "bearer", "credential": hs256("x", 60)}),
        ),
        ("map/disconnect", Value::Null),
    ] {
        assert_eq!(c.err(method, params).await, refused, "{method}");
    }
    assert_eq!(c.err("map/nope", json!({})).await["code"], json!(-32601));
    // A notification is ignored, never answered.
    c.send_json(&json!({"jsonrpc": "2.0", "method": "map/subscribe.ack", "params": {"subscriptionId": "s", "upToSequence": 1}}))
        .await;
    let bad = c
        .ok(
            "map/authenticate",
            json!({"method": "api-key", "credential": "ak-wrong-0123456789abcdef"}),
        )
        .await;
    assert_eq!(
        bad,
        json!({"success": false, "error": {"code": "invalid_credentials", "message": "unknown API key"}})
    );
    assert_eq!(c.err("map/agents/list", Value::Null).await, refused);
    let ok = c
        .ok(
            "map/authenticate",
            json!({"method": "api-key", "credential": ALICE_KEY}),
        )
        .await;
    assert_eq!(ok["success"], json!(true));
    assert_eq!(ok["principal"], json!({"id": "alice"}));
    assert_eq!(
        ok["participantType"],
        json!("agent"),
        "the pending connect's params"
    );
    assert!(ok["sessionId"].is_string() && ok["resumeToken"].is_string());
    let agent = c.register_agent(json!({"name": "now-allowed"})).await;
    assert_eq!(agent["ownerId"], ok["participantId"]);
}

#[tokio::test]
async fn auth_required_then_authenticate_with_either_spelling() {
    let (_server, url, _dir) = auth_server(|_| {}).await;
    let token = hs256("late", 600);
    for params in [
        json!({"method": "bearer", "credential": token}),
        json!({"method": "bearer", "token": token}),
    ] {
        let (mut c, r) = connect_with(&url, "client", Value::Null).await;
        assert_auth_required(&r, None);
        let ok = c.ok("map/authenticate", params).await;
        assert_eq!(ok["success"], json!(true), "{ok}");
        assert_eq!(ok["principal"]["id"], json!("late"));
        c.ok("map/agents/list", Value::Null).await;
        // Authenticating again on the session: same principal only.
        let again = c.ok("map/authenticate", bearer(&hs256("late", 900))).await;
        assert_eq!(again["sessionId"], ok["sessionId"]);
        let other = c
            .ok("map/authenticate", bearer(&hs256("mallory", 900)))
            .await;
        assert_eq!(other["success"], json!(false));
        assert_eq!(other["error"]["code"], json!("invalid_credentials"));
    }
    // map/authenticate without a map/connect first.
    let mut c = WsClient::connect(&url).await;
    let r = c.ok("map/authenticate", bearer(&token)).await;
    assert_eq!(r["success"], json!(false));
    assert_eq!(r["error"]["code"], json!("auth_required"));
}

#[tokio::test]
async fn refresh_mid_session_extends_the_expiry() {
    let (_server, url, _dir) = auth_server(|_| {}).await;
    let (mut c, r) = connect_with(&url, "client", bearer(&hs256("rita", 3))).await;
    let first = r["principal"]["expiresAt"].as_u64().unwrap();
    // Each shape a client sends.
    let later = claims("rita", 120, Value::Null);
    let later_ms = later["exp"].as_u64().unwrap() * 1000;
    let token = sign(Signer::Es256, Some("ec-1"), &later);
    for params in [
        json!({"method": "bearer", "credential": token}),
        json!({"method": "bearer", "token": token}),
        json!({"refreshToken": token}),
        json!({"credential": token}),
    ] {
        let r = c.ok("map/auth/refresh", params.clone()).await;
        assert_eq!(r["success"], json!(true), "{params}: {r}");
        assert_eq!(
            r["principal"],
            json!({"id": "rita", "issuer": ISS, "expiresAt": later_ms})
        );
        assert_eq!(r["expiresAt"], json!(later_ms));
    }
    assert!(later_ms > first);
    // A different subject, or a bad token, changes nothing.
    let r = c
        .ok(
            "map/auth/refresh",
            json!({"method": "bearer", "credential": hs256("eve", 600)}),
        )
        .await;
    assert_eq!(r["success"], json!(false));
    assert_eq!(r["error"]["code"], json!("invalid_credentials"));
    let r = c
        .ok("map/auth/refresh", json!({"credential": "a.b.c"}))
        .await;
    assert_eq!(r["success"], json!(false));
    // The first token's expiry passes: the session goes on.
    tokio::time::sleep(Duration::from_millis(first.saturating_sub(now_ms()) + 800)).await;
    c.ok("map/agents/list", Value::Null).await;
    c.assert_silent().await;
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::test]
async fn expiring_notice_comes_before_expiry_and_expiry_ends_access() {
    // The watcher is an operator: another principal's session's comings and goings reach only
    // its own principal and system participants (tests/participant_audience.rs).
    let (_server, url, _dir) =
        auth_server(|c| c.auth.system_principals = vec!["watcher".into()]).await;
    let mut watcher = WsClient::connect(&url).await;
    watcher
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "system", "auth": bearer(&hs256("watcher", 600))}),
        )
        .await;
    let sub = watcher
        .subscribe(json!({"eventTypes": ["participant_disconnected"]}))
        .await;

    let c = claims("short", 4, Value::Null);
    let exp_ms = c["exp"].as_u64().unwrap() * 1000;
    let (mut client, r) = connect_with(
        &url,
        "agent",
        bearer(&sign(Signer::Rs256, Some("rsa-1"), &c)),
    )
    .await;
    client
        .register_agent(json!({"agentId": "short-lived"}))
        .await;
    let notice = within(
        Duration::from_secs(6),
        client.notification("map/auth/expiring"),
    )
    .await;
    let arrived = now_ms();
    let p = &notice["params"];
    assert_eq!(p["expiresAt"], json!(exp_ms), "{notice}");
    assert_eq!(p["refreshBefore"], json!(exp_ms), "{notice}");
    let left = p["expiresInMs"].as_u64().unwrap();
    assert!(left > 0 && left <= 4000, "{notice}");
    assert!(arrived < exp_ms, "the notice came before expiry");

    // No refresh: access ends with a close, and the operator sees why.
    let code = within(Duration::from_secs(6), client.expect_close()).await;
    assert_eq!(code, Some(4001));
    assert!(now_ms() + 50 >= exp_ms, "not before exp");
    let ev = within(
        Duration::from_secs(6),
        watcher.event_of_type(&sub, "participant_disconnected"),
    )
    .await;
    assert_eq!(
        ev["event"]["data"]["reason"],
        json!("credential_expired"),
        "{ev}"
    );

    // The session can be resumed, but only with a new credential of the same principal.
    let token = r["resumeToken"].as_str().unwrap();
    let (_x, denied) = connect_with_resume(&url, token, Value::Null).await;
    assert_auth_required(&denied, None);
    let (_y, other) = connect_with_resume(&url, token, bearer(&hs256("someone-else", 600))).await;
    assert_eq!(
        other["reconnected"],
        json!(false),
        "another principal gets a new session"
    );
    let (mut back, resumed) = connect_with_resume(&url, token, bearer(&hs256("short", 600))).await;
    assert_eq!(resumed["reconnected"], json!(true), "{resumed}");
    assert_eq!(resumed["sessionId"], r["sessionId"]);
    assert_eq!(resumed["reclaimedAgents"][0]["id"], json!("short-lived"));
    back.ok("map/agents/list", Value::Null).await;
}

async fn connect_with_resume(url: &str, resume_token: &str, auth: Value) -> (WsClient, Value) {
    let mut c = WsClient::connect(url).await;
    let mut params =
        json!({"protocolVersion": 1, "participantType": "agent", "resumeToken": resume_token});
    if !auth.is_null() {
        params["auth"] = auth;
    }
    let r = c.ok("map/connect", params).await;
    (c, r)
}

#[tokio::test]
async fn a_resume_token_needs_the_sessions_principal() {
    let (_server, url, _dir) = auth_server(|_| {}).await;
    let (mut alice, first) = connect_with(
        &url,
        "agent",
        json!({"method": "api-key", "credential": ALICE_KEY}),
    )
    .await;
    let bye = alice
        .ok(
            "map/disconnect",
            json!({"policy": {"agentBehavior": "orphan"}}),
        )
        .await;
    let token = bye["resumeToken"].as_str().unwrap();
    let (_bob, r) = connect_with_resume(
        &url,
        token,
        json!({"method": "api-key", "credential": "ak-bob-0123456789abcdef"}),
    )
    .await;
    assert_eq!(r["reconnected"], json!(false));
    assert_ne!(r["sessionId"], first["sessionId"]);
    assert_eq!(r["principal"]["id"], json!("bob"));
    let (_a, r) = connect_with_resume(
        &url,
        token,
        json!({"method": "api-key", "credential": ALICE_KEY}),
    )
    .await;
    assert_eq!(r["reconnected"], json!(true));
    assert_eq!(r["sessionId"], first["sessionId"]);
}

#[tokio::test]
async fn trusted_transports_are_admitted_with_a_documented_principal() {
    // Default: only supervised children are trusted; in-process needs credentials.
    let (server, _url, _dir) = auth_server(|_| {}).await;
    let mut c = WsClient::open(Transport::InProcess, &server).await;
    let r = c.ok("map/connect", json!({"protocolVersion": 1})).await;
    assert!(r.get("authRequired").is_some(), "{r}");

    let (server, _url, _dir) = auth_server(|c| {
        c.auth.trusted_transports = vec![TrustedTransport::InProcess];
    })
    .await;
    let mut c = WsClient::open(Transport::InProcess, &server).await;
    let r = c.ok("map/connect", json!({"protocolVersion": 1})).await;
    assert_eq!(
        r["principal"],
        json!({"id": "in-process", "issuer": "map-router"})
    );
    // A credential sent anyway is checked and wins.
    let mut c = WsClient::open(Transport::InProcess, &server).await;
    let r = c
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "auth": {"method": "api-key", "credential": ALICE_KEY}}),
        )
        .await;
    assert_eq!(r["principal"], json!({"id": "alice"}));
    // WebSocket is never trusted.
    let (_w, r) = connect_with(
        &format!("ws://{}/", server.local_addrs()[0]),
        "client",
        Value::Null,
    )
    .await;
    assert_auth_required(&r, None);
}

#[tokio::test]
async fn supervised_children_are_trusted_by_default() {
    let (_server, url, dir) = auth_server(|_| {}).await;
    let (mut boss, _) = connect_with(
        &url,
        "agent",
        json!({"method": "api-key", "credential": ALICE_KEY}),
    )
    .await;
    boss.register_agent(json!({"agentId": "boss"})).await;
    let log = dir.path.join("child.log");
    let spawned = boss
        .ok(
            "map/agents/spawn",
            json!({"agentId": "kid", "name": "kid", "command": {"program": child_program("echo_agent.sh"), "env": {"LOG": log.display().to_string()}}}),
        )
        .await;
    assert_eq!(spawned["agent"]["id"], json!("kid"));
    // The child logs what it reads: its connect result names its principal.
    let principal = within(Duration::from_secs(5), async {
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| l.contains("\"principal\"")) {
                let v: Value = serde_json::from_str(line).unwrap();
                return v["result"]["principal"].clone();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        principal,
        json!({"id": "supervised:kid", "issuer": "map-router"})
    );
    boss.ok("map/agents/stop", json!({"agentId": "kid"})).await;
}

#[tokio::test]
async fn untrusted_supervised_children_need_credentials() {
    let (_server, url, _dir) = auth_server(|c| {
        c.auth.trusted_transports = Vec::new();
        c.supervisor.handshake_timeout_ms = 1500;
    })
    .await;
    let (mut boss, _) = connect_with(
        &url,
        "agent",
        json!({"method": "api-key", "credential": ALICE_KEY}),
    )
    .await;
    boss.register_agent(json!({"agentId": "boss"})).await;
    let e = within(
        Duration::from_secs(8),
        boss.err(
            "map/agents/spawn",
            json!({"agentId": "kid", "command": {"program": child_program("echo_agent.sh")}}),
        ),
    )
    .await;
    assert_eq!(e["code"], json!(3004), "{e}");
}

#[tokio::test]
async fn http_clients_authenticate_in_connect_or_in_one_batch() {
    let (server, _url, _dir) = auth_server(|_| {}).await;
    let addr = server.local_addrs()[0];
    // Without credentials: authRequired and no HTTP session token.
    let r = http::post(
        addr,
        None,
        &http::rpc(1, "map/connect", json!({"protocolVersion": 1})),
    )
    .await;
    assert!(r.token().is_none());
    assert!(r.json()["result"]["authRequired"].is_object());
    // connect + authenticate in one batch.
    let batch = format!(
        "[{},{}]",
        http::rpc(1, "map/connect", json!({"protocolVersion": 1})),
        http::rpc(
            2,
            "map/authenticate",
            json!({"method": "api-key", "credential": ALICE_KEY})
        )
    );
    let r = http::post(addr, None, &batch).await;
    let token = r.token().expect("an HTTP session once authenticated");
    assert_eq!(r.json()[1]["result"]["success"], json!(true));
    let r = http::post(
        addr,
        Some(&token),
        &http::rpc(3, "map/agents/list", json!({})),
    )
    .await;
    assert!(r.json()["result"]["agents"].is_array(), "{:?}", r.json());
    // Credentials in map/connect.
    let r = http::post(
        addr,
        None,
        &http::rpc(
            1,
            "map/connect",
            json!({"protocolVersion": 1, "auth": bearer(&hs256("web", 600))}),
        ),
    )
    .await;
    assert!(r.token().is_some());
    assert_eq!(r.json()["result"]["principal"]["id"], json!("web"));
}

#[tokio::test]
async fn without_auth_nobody_has_a_principal() {
    let (_server, url) = default_server().await;
    let (mut c, r) = connect_with(
        &url,
        "client",
        json!({"method": "bearer", "token": "ignored"}),
    )
    .await;
    assert!(r["sessionId"].is_string());
    assert!(r.get("principal").is_none(), "{r}");
    let a = c
        .ok(
            "map/authenticate",
            json!({"method": "bearer", "credential": "x"}),
        )
        .await;
    assert_eq!(a["success"], json!(true));
    assert_eq!(a["sessionId"], r["sessionId"]);
    let f = c.ok("map/auth/refresh", json!({"credential": "x"})).await;
    assert_eq!(f["success"], json!(false));
    assert_eq!(f["error"]["code"], json!("method_not_supported"));
}

#[tokio::test]
async fn the_binary_takes_keys_from_flags_and_the_environment() {
    let dir = TempDir::new("auth-bin");
    let secret = dir.path.join("secret");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    let (_router, url) = start_binary_with_env(
        [
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--ephemeral".as_ref(),
            "--jwt-issuer".as_ref(),
            ISS.as_ref(),
            "--jwt-audience".as_ref(),
            AUD.as_ref(),
            "--jwt-secret-file".as_ref(),
            secret.as_os_str(),
        ],
        [("MAP_ROUTER_API_KEYS", format!("{ENV_KEY} dave"))],
    )
    .await;
    let (_c, r) = connect_with(
        &url,
        "client",
        json!({"method": "api-key", "credential": ENV_KEY}),
    )
    .await;
    assert_eq!(r["principal"]["id"], json!("dave"));
    let (_c, r) = connect_with(&url, "client", bearer(&hs256("erin", 600))).await;
    assert_eq!(r["principal"]["id"], json!("erin"));
    let (_c, r) = connect_with(&url, "client", Value::Null).await;
    assert_eq!(r["authRequired"]["methods"], json!(["bearer", "api-key"]));

    // A bad key file stops the binary with a clear message.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_map-router"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--ephemeral",
            "--api-keys-file",
            "/nonexistent/keys",
        ])
        .env_remove("MAP_ROUTER_CONFIG")
        .env_remove("MAP_ROUTER_API_KEYS")
        .output();
    let out = with_timeout(out).await.unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("auth: cannot read /nonexistent/keys"), "{err}");
}

#[tokio::test]
async fn the_rust_client_and_the_cli_send_credentials() {
    use map_router::client::{Client, ClientError, ClientOptions, ReconnectPolicy};
    let (_server, url, _dir) = auth_server(|_| {}).await;
    let options = || ClientOptions::new().reconnect(ReconnectPolicy::disabled());
    let client = with_timeout(Client::connect_ws(&url, options().api_key(ALICE_KEY)))
        .await
        .expect("connects with an API key");
    let session = client.session().expect("connected");
    assert_eq!(session.principal.map(|p| p.id).as_deref(), Some("alice"));
    let client = with_timeout(Client::connect_ws(
        &url,
        options().bearer_token(hs256("rusty", 600)),
    ))
    .await
    .expect("connects with a JWT");
    assert!(client.session().is_some());
    let err = with_timeout(Client::connect_ws(&url, options()))
        .await
        .expect_err("refused without credentials");
    assert!(matches!(err, ClientError::Auth(_)), "{err:?}");
    assert!(err.to_string().contains("requires authentication"), "{err}");

    let cli = |env: Option<&str>| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_map-router"));
        cmd.args(["agents", "--json", "--url", &url])
            .env_remove("MAP_ROUTER_TOKEN")
            .env_remove("MAP_ROUTER_API_KEY")
            .kill_on_drop(true);
        if let Some(key) = env {
            cmd.env("MAP_ROUTER_API_KEY", key);
        }
        cmd.output()
    };
    let out = with_timeout(cli(Some(ALICE_KEY))).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = with_timeout(cli(None)).await.unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // The CLI names its own flags (docs/client.md), not the Rust API.
    assert!(
        err.contains("the router requires authentication: pass --api-key KEY or --token JWT"),
        "{err}"
    );
}

/// `[permissions.principals."<id>"]` as a config file would set it.
fn principal_overrides(toml_text: &str) -> map_router::router::permissions::Policy {
    toml::from_str(toml_text).expect("a valid [permissions] table")
}

#[tokio::test]
async fn principal_overrides_follow_the_authenticated_principal() {
    let (_server, url, _dir) = auth_server(|c| {
        c.permissions = principal_overrides(
            r#"
[principals.alice.observation]
canQuery = false
[principals.dash.observation]
canObserve = false
"#,
        );
    })
    .await;
    let alice = json!({"method": "api-key", "credential": ALICE_KEY});

    // API key on map/connect: alice gets her override, bob (no override) the type's grant.
    let (mut a, r) = connect_with(&url, "agent", alice.clone()).await;
    assert_eq!(r["principal"]["id"], json!("alice"));
    assert_eq!(
        r["capabilities"]["observation"]["canQuery"],
        json!(false),
        "{r}"
    );
    assert_eq!(r["capabilities"]["observation"]["canObserve"], json!(true));
    let e = a.err("map/agents/list", Value::Null).await;
    assert_eq!(e["code"], json!(1003), "{e}");
    a.subscribe(Value::Null).await;
    let (mut b, r) = connect_with(
        &url,
        "agent",
        json!({"method": "api-key", "credential": "ak-bob-0123456789abcdef"}),
    )
    .await;
    assert_eq!(r["capabilities"]["observation"]["canQuery"], json!(true));
    b.ok("map/agents/list", Value::Null).await;

    // JWT through authRequired then map/authenticate: the pending connect gets dash's grant.
    let (mut d, r) = connect_with(&url, "client", Value::Null).await;
    assert_auth_required(&r, None);
    let ok = d.ok("map/authenticate", bearer(&hs256("dash", 600))).await;
    assert_eq!(ok["success"], json!(true), "{ok}");
    assert_eq!(
        ok["capabilities"]["observation"]["canObserve"],
        json!(false),
        "{ok}"
    );
    let e = d.err("map/subscribe", json!({})).await;
    assert_eq!(e["code"], json!(1003), "{e}");
    d.ok("map/agents/list", Value::Null).await;

    // The override does not depend on the method: dash by API key would get it too, and a
    // JWT for alice gets alice's.
    let (mut j, r) = connect_with(&url, "client", bearer(&hs256("alice", 600))).await;
    assert_eq!(r["capabilities"]["observation"]["canQuery"], json!(false));
    let e = j.err("map/agents/get", json!({"agentId": "x"})).await;
    assert_eq!(e["code"], json!(1003), "{e}");

    // A resumed session keeps its principal's grant.
    let bye = a
        .ok(
            "map/disconnect",
            json!({"policy": {"agentBehavior": "orphan"}}),
        )
        .await;
    let (mut back, r) =
        connect_with_resume(&url, bye["resumeToken"].as_str().unwrap(), alice).await;
    assert_eq!(r["reconnected"], json!(true), "{r}");
    assert_eq!(r["capabilities"]["observation"]["canQuery"], json!(false));
    let e = back.err("map/agents/list", Value::Null).await;
    assert_eq!(e["code"], json!(1003), "{e}");
}

/// The whole path a new user takes: JWT authentication and visibility rules in one config
/// file, the real binary, and a dashboard authenticated as a principal that sees only what it
/// may see (system exposure, scope visibility, its own capability override), in lists, gets,
/// live events and replay.
#[tokio::test]
async fn a_config_file_with_jwt_and_visibility_rules_limits_what_a_principal_sees() {
    let dir = TempDir::new("auth-e2e");
    let secret = dir.path.join("jwt.secret");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    let config = dir.path.join("map-router.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[auth.jwt]
issuer = "{ISS}"
audience = "{AUD}"
secret_file = {secret:?}

[permissions.exposure.agents]
hidden = ["internal-*"]

[permissions.principals."viewer".lifecycle]
canStop = false
canSteer = false
"#,
            secret = secret.display().to_string()
        ),
    )
    .unwrap();
    let (_child, url) = start_binary([
        "--listen".as_ref(),
        "127.0.0.1:0".as_ref(),
        "--ephemeral".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
    ])
    .await;

    // Nobody gets in without a token.
    let (_anon, r) = connect_with(&url, "client", Value::Null).await;
    assert_eq!(r["authRequired"]["methods"], json!(["bearer"]), "{r}");
    assert!(r.get("sessionId").is_none(), "{r}");

    let (mut viewer, r) = connect_with(&url, "client", bearer(&hs256("viewer", 600))).await;
    assert_eq!(r["principal"]["id"], json!("viewer"));
    assert_eq!(
        r["capabilities"]["lifecycle"]["canStop"],
        json!(false),
        "{r}"
    );
    let sub = viewer.subscribe(Value::Null).await;
    // Declaring itself a system participant (which sees everything) does not get it around
    // the rules.
    let mut c = WsClient::connect(&url).await;
    let e = c
        .err(
            "map/connect",
            json!({"protocolVersion": 1, "participantType": "system", "auth": bearer(&hs256("viewer", 600))}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");

    let (mut worker, _) = connect_with(&url, "agent", bearer(&hs256("worker", 600))).await;
    worker
        .ok("map/scopes/create", json!({"scopeId": "s-ops"}))
        .await;
    worker
        .register_agent(json!({"agentId": "internal-db"}))
        .await;
    worker
        .register_agent(json!({"agentId": "ops-bot", "visibility": "scope", "scopes": ["s-ops"]}))
        .await;
    worker.register_agent(json!({"agentId": "pub-1"})).await;
    // A principal owning an agent in s-ops sees ops-bot; the exposure rule hides internal-db
    // from it too.
    let (mut peer, _) = connect_with(&url, "agent", bearer(&hs256("peer", 600))).await;
    peer.register_agent(json!({"agentId": "peer-bot", "scopes": ["s-ops"]}))
        .await;
    let listed = peer.ok("map/agents/list", Value::Null).await;
    let ids = |list: &Value| {
        let mut v: Vec<String> = list["agents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["id"].as_str().unwrap().to_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids(&listed), strings(&["ops-bot", "peer-bot", "pub-1"]));
    worker.register_agent(json!({"agentId": "zz-marker"})).await;

    // The viewer: neither the hidden nor the scope-visible agent, anywhere.
    let mut seen = Vec::new();
    loop {
        let ev = viewer.next_event(&sub).await;
        let done = ev["event"]["type"] == json!("agent_registered")
            && ev["event"]["data"]["agentId"] == json!("zz-marker");
        seen.push(ev);
        if done {
            break;
        }
    }
    let replayed = viewer.ok("map/replay", json!({"limit": 1000})).await;
    for ev in seen.iter().chain(replayed["events"].as_array().unwrap()) {
        let text = ev.to_string();
        assert!(
            !text.contains("internal-db") && !text.contains("ops-bot"),
            "the viewer was shown {ev}"
        );
    }
    assert!(
        seen.iter()
            .any(|e| e["event"]["data"]["agentId"] == json!("pub-1")),
        "the viewer sees the public agent's registration: {seen:?}"
    );
    let listed = viewer.ok("map/agents/list", Value::Null).await;
    assert_eq!(ids(&listed), strings(&["peer-bot", "pub-1", "zz-marker"]));
    for hidden in ["internal-db", "ops-bot"] {
        let e = viewer
            .err("map/agents/get", json!({"agentId": hidden}))
            .await;
        assert_eq!(e["code"], json!(2001), "{hidden}: {e}");
    }
    // Its principal's override: it may look, not stop.
    let e = viewer
        .err("map/agents/stop", json!({"agentId": "pub-1"}))
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
}

#[tokio::test]
async fn only_listed_principals_and_trusted_transports_may_be_system() {
    let (server, url, _dir) = auth_server(|c| {
        c.auth.system_principals = vec!["ops".into()];
        c.auth.trusted_transports = vec![TrustedTransport::InProcess];
    })
    .await;
    let system_connect = |auth: Value| {
        let mut p = json!({"protocolVersion": 1, "participantType": "system"});
        if !auth.is_null() {
            p["auth"] = auth;
        }
        p
    };
    // A valid credential of another principal is not enough.
    let mut c = WsClient::connect(&url).await;
    let e = c
        .err(
            "map/connect",
            system_connect(json!({"method": "api-key", "credential": ALICE_KEY})),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("auth.system_principals"),
        "{e}"
    );
    // The same connection may still connect as what it is allowed to be.
    let r = c
        .ok(
            "map/connect",
            json!({"protocolVersion": 1, "auth": {"method": "api-key", "credential": ALICE_KEY}}),
        )
        .await;
    assert_eq!(r["participantType"], json!("client"));
    // Completing a pending system connect with map/authenticate is checked the same way.
    let mut p = WsClient::connect(&url).await;
    let r = p.ok("map/connect", system_connect(Value::Null)).await;
    assert_auth_required(&r, None);
    let e = p
        .err("map/authenticate", bearer(&hs256("mallory", 600)))
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    let e = p.err("map/agents/list", Value::Null).await;
    assert_eq!(e["code"], json!(1000), "still no session: {e}");
    // A listed principal, by either route.
    let (_o, r) = connect_with(&url, "system", bearer(&hs256("ops", 600))).await;
    assert_eq!(r["participantType"], json!("system"), "{r}");
    let r = p.ok("map/connect", system_connect(Value::Null)).await;
    assert_auth_required(&r, None);
    let ok = p.ok("map/authenticate", bearer(&hs256("ops", 600))).await;
    assert_eq!(ok["participantType"], json!("system"), "{ok}");
    // A trusted transport needs no listing.
    let mut local = WsClient::open(Transport::InProcess, &server).await;
    let r = local.ok("map/connect", system_connect(Value::Null)).await;
    assert_eq!(r["participantType"], json!("system"), "{r}");
}

/// No token can be the router's own principals (issuer `map-router`: trusted transports and the
/// gateways' service principal), even where an operator lists that issuer.
#[tokio::test]
async fn a_token_may_not_claim_the_routers_own_issuer() {
    let (_server, url, _dir) = auth_server(|c| {
        c.auth.jwt.issuer = OneOrMany::Many(vec![ISS.into(), "map-router".into()]);
        c.auth.system_principals = vec!["map-router:service".into()];
    })
    .await;
    let token = sign(
        Signer::Hs256,
        None,
        &claims("map-router:service", 600, json!({"iss": "map-router"})),
    );
    let (_c, r) = connect_with(&url, "system", bearer(&token)).await;
    assert!(r.get("sessionId").is_none(), "{r}");
    assert_eq!(r["error"]["code"], json!("invalid_credentials"), "{r}");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("reserved"),
        "{r}"
    );
    // The same subject from the configured issuer is an ordinary principal.
    let (_c, r) = connect_with(&url, "client", bearer(&hs256("map-router:service", 600))).await;
    assert_eq!(r["principal"]["issuer"], json!(ISS), "{r}");
}
