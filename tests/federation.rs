//! Federation, server side (issue 47 item 1, inbound): a peer system's gateway connects with
//! `map/federation/connect` and routes envelopes with `map/federation/route`
//! (`../shared/spec/federation.md`). Real router, real WebSockets, API keys of several
//! principals: the system id a link speaks for is proven by its principal, never claimed; a
//! routed message reaches the local agent under the federated `from` with the payload byte for
//! byte; hostile envelopes get the spec's errors and the router keeps serving.

mod common;

use common::raw::Raw;
use common::*;
use map_router::server::config::FederationPeer;
use map_router::server::Server;
use serde_json::{json, Value};

const ALPHA_KEY: &str = "ak-alpha-gateway-0123456789";
const MALLORY_KEY: &str = "ak-mallory-0123456789abcdef";
const BOB_KEY: &str = "ak-bob-agent-0123456789abc";
const CAROL_KEY: &str = "ak-carol-client-0123456789";

/// A router that calls itself `beta`, with `alpha` a peer whose links authenticate as
/// `alpha-gw`, and `tweak` applied last.
async fn beta(tweak: impl FnOnce(&mut map_router::server::Config)) -> (Server, String, TempDir) {
    let dir = TempDir::new("federation");
    let keys = dir.path.join("api-keys");
    std::fs::write(
        &keys,
        format!("{ALPHA_KEY} alpha-gw\n{MALLORY_KEY} mallory\n{BOB_KEY} bob\n{CAROL_KEY} carol\n"),
    )
    .unwrap();
    let (server, url) = start_server(|c| {
        c.auth.api_keys.file = Some(keys);
        c.federation.system_id = Some("beta".into());
        c.federation.peer = vec![FederationPeer {
            system_id: "alpha".into(),
            principal: "alpha-gw".into(),
            ..Default::default()
        }];
        tweak(c);
    })
    .await;
    (server, url, dir)
}

/// `alpha`'s gateway, connected and linked as `alpha`.
async fn alpha_link(url: &str) -> WsClient {
    let (mut g, _) = connect_with_key(url, ALPHA_KEY, "gateway", json!({})).await;
    let r = g
        .ok(
            "map/federation/connect",
            json!({"systemId": "alpha", "endpoint": "wss://alpha.example/map"}),
        )
        .await;
    assert_eq!(r["connected"], json!(true), "{r}");
    assert!(
        r["systemInfo"]["name"].is_string(),
        "systemInfo always: {r}"
    );
    assert!(r["systemInfo"]["version"].is_string(), "{r}");
    assert!(r["sessionId"].is_string(), "{r}");
    assert!(r.get("authRequired").is_none(), "{r}");
    g
}

/// An envelope from `source` to `target` with `path`, carrying a message to `to`.
fn envelope(source: &str, target: &str, hops: u64, path: Value, to: Value) -> Value {
    let mut f = json!({"sourceSystem": source, "targetSystem": target, "hopCount": hops,
        "originTimestamp": 1_706_000_000_000u64});
    if !path.is_null() {
        f["path"] = path;
    }
    json!({"payload": {"id": "m-remote-1", "from": "alice", "to": to, "timestamp": 1,
        "payload": {"n": 1}}, "federation": f})
}

/// Agent `agent` of principal `key`, over a WebSocket that reads exact text (the router's frames
/// are never parsed before the payload is compared).
async fn raw_agent(url: &str, key: &str, agent: &str) -> Raw {
    let mut a = Raw::connect(
        url,
        &format!(
            r#"{{"protocolVersion":1,"participantType":"agent","auth":{{"method":"api-key","credential":"{key}"}}}}"#
        ),
    )
    .await;
    let answer = a
        .call(
            "map/agents/register",
            &format!(r#"{{"agentId":"{agent}","role":"worker"}}"#),
        )
        .await;
    assert!(answer.contains("\"agent\""), "{answer}");
    a
}

#[tokio::test]
async fn a_peer_routes_a_message_to_a_local_agent_under_its_federated_from() {
    let (_server, url, _dir) = beta(|_| {}).await;
    let mut bob = raw_agent(&url, BOB_KEY, "bob").await;
    let (mut watcher, _) = connect_with_key(&url, CAROL_KEY, "client", json!({})).await;
    let sub = watcher
        .subscribe(json!({"eventTypes": ["message_sent"]}))
        .await;
    let mut g = alpha_link(&url).await;

    // The envelope as the SDK's GatewayConnection puts it on the wire, with an odd payload
    // (unsorted keys, 1.50, escaped Unicode, inner whitespace) that must arrive as written.
    let odd = r#"{"z":1.50,  "a":["\u00e9", 1e2],"k":{"y":null}}"#;
    let meta = r#"{"priority":"high","correlationId":"c-9"}"#;
    let request = format!(
        r#"{{"jsonrpc":"2.0","id":77,"method":"map/federation/route","params":{{"systemId":"beta","envelope":{{"payload":{{"id":"m-remote-1","from":"alice","to":{{"agent":"bob"}},"timestamp":1,"payload":{odd},"meta":{meta}}},"federation":{{"sourceSystem":"alpha","targetSystem":"beta","hopCount":0,"path":["alpha"],"originTimestamp":1706000000000}}}}}}}}"#
    );
    g.send_raw(&request).await;
    let r = g.next_non_notification().await;
    assert_eq!(r["result"]["routed"], json!(true), "{r}");
    let message_id = r["result"]["messageId"]
        .as_str()
        .expect("messageId")
        .to_owned();

    let frame = bob.next_text().await;
    assert!(frame.contains("\"method\":\"map/message\""), "{frame}");
    assert!(
        frame.contains(&format!("\"payload\":{odd}")),
        "payload byte for byte: {frame}"
    );
    assert!(
        frame.contains(&format!("\"meta\":{meta}")),
        "meta byte for byte: {frame}"
    );
    let v: Value = serde_json::from_str(&frame).unwrap();
    let m = &v["params"]["message"];
    assert_eq!(
        m["from"],
        json!("alpha:agent:alice"),
        "never a local id: {m}"
    );
    assert_eq!(m["id"], json!(message_id));
    assert_eq!(m["to"], json!({"agent": "bob"}));

    let sent = watcher.event_of_type(&sub, "message_sent").await;
    assert_eq!(
        sent["event"]["data"]["from"],
        json!("alpha:agent:alice"),
        "{sent}"
    );

    // The legacy dialect ({systemId, message}) is wrapped as from the link's system.
    let r = g
        .ok(
            "map/federation/route",
            json!({"systemId": "beta", "message": {"id": "m-2", "from": "carl",
                "to": {"agent": "bob"}, "timestamp": 2, "payload": {"legacy": true}}}),
        )
        .await;
    assert_eq!(r["routed"], json!(true), "{r}");
    let frame = bob.next_text().await;
    let v: Value = serde_json::from_str(&frame).unwrap();
    assert_eq!(v["params"]["message"]["from"], json!("alpha:agent:carl"));
    assert_eq!(v["params"]["message"]["payload"], json!({"legacy": true}));

    // A peer reaches what its session's grant allows: a role address is a multicast, which a
    // gateway may not send by default (`messaging.canBroadcast`, overridable per principal).
    let e = g
        .err(
            "map/federation/route",
            json!({"systemId": "beta", "message": {"id": "m-3", "from": "carl",
                "to": {"role": "worker"}, "timestamp": 3}}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    bob.assert_no_message().await;
}

#[tokio::test]
async fn a_system_id_is_proven_by_the_principal_never_claimed() {
    let (_server, url, _dir) = beta(|_| {}).await;
    let mut bob = raw_agent(&url, BOB_KEY, "bob").await;
    let (mut m, _) = connect_with_key(&url, MALLORY_KEY, "gateway", json!({})).await;
    for system in ["alpha", "zeta"] {
        let r = m
            .ok(
                "map/federation/connect",
                json!({"systemId": system, "endpoint": "wss://evil.example/map",
                    "auth": {"method": "bearer", "credentials": "anything"}}),
            )
            .await;
        assert_eq!(r["connected"], json!(false), "{r}");
        assert_eq!(
            r["authRequired"]["methods"],
            json!(["bearer", "api-key"]),
            "{r}"
        );
        assert_eq!(r["authRequired"]["required"], json!(true), "{r}");
        let challenge = r["authRequired"]["challenge"].as_str().unwrap();
        assert!(
            challenge.starts_with("map_chal_") && challenge.len() == 9 + 26,
            "{r}"
        );
        assert!(
            r["systemInfo"]["name"].is_string(),
            "systemInfo always: {r}"
        );
    }
    let e = m
        .err(
            "map/federation/route",
            json!({"systemId": "beta", "envelope":
                envelope("alpha", "beta", 0, json!(["alpha"]), json!({"agent": "bob"}))}),
        )
        .await;
    assert_eq!(e["code"], json!(5000), "{e}");
    // The real alpha link is taken, and mallory cannot take it over while it lives.
    let mut g = alpha_link(&url).await;
    let r = m
        .ok(
            "map/federation/connect",
            json!({"systemId": "alpha", "endpoint": "wss://evil.example/map"}),
        )
        .await;
    assert_eq!(r["connected"], json!(false), "{r}");
    assert_eq!(
        m.err(
            "map/federation/route",
            json!({"systemId": "beta", "envelope":
                envelope("alpha", "beta", 0, json!(["alpha"]), json!({"agent": "bob"}))}),
        )
        .await["code"],
        json!(5000)
    );
    bob.assert_no_message().await;
    // The same principal's newer session takes the link over; the older one may no longer
    // route, the newer one may.
    let mut g2 = alpha_link(&url).await;
    let route = json!({"systemId": "beta", "envelope":
        envelope("alpha", "beta", 0, json!(["alpha"]), json!({"agent": "bob"}))});
    assert_eq!(
        g.err("map/federation/route", route.clone()).await["code"],
        json!(5000)
    );
    assert_eq!(
        g2.ok("map/federation/route", route.clone()).await["routed"],
        json!(true)
    );
    assert!(bob.next_text().await.contains("alpha:agent:alice"));
    // Its session detached, the link is gone: another link of the principal takes the id.
    g2.ok("map/disconnect", json!({})).await;
    alpha_link(&url).await;
}

#[tokio::test]
async fn only_gateway_and_system_participants_may_federate() {
    let (_server, url, _dir) = beta(|_| {}).await;
    let (mut c, _) = connect_with_key(&url, CAROL_KEY, "client", json!({})).await;
    let e = c
        .err(
            "map/federation/connect",
            json!({"systemId": "alpha", "endpoint": "wss://alpha.example/map"}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    let e = c
        .err(
            "map/federation/route",
            json!({"systemId": "beta", "envelope":
                envelope("alpha", "beta", 0, json!(["alpha"]), json!({"agent": "bob"}))}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
    let (mut a, _) = connect_with_key(&url, BOB_KEY, "agent", json!({})).await;
    let e = a
        .err(
            "map/federation/connect",
            json!({"systemId": "alpha", "endpoint": "wss://alpha.example/map"}),
        )
        .await;
    assert_eq!(e["code"], json!(1003), "{e}");
}

#[tokio::test]
async fn hostile_envelopes_get_the_specs_errors_and_the_router_keeps_serving() {
    let (_server, url, _dir) = beta(|c| {
        c.federation.allowed_sources = Some(vec!["alpha".into(), "gamma".into()]);
        c.federation.allowed_targets = Some(vec!["beta".into(), "omega".into()]);
        c.limits.max_payload_bytes = 4096;
        c.limits.max_frame_bytes = 16 * 1024;
    })
    .await;
    let mut bob = raw_agent(&url, BOB_KEY, "bob").await;
    let mut g = alpha_link(&url).await;
    let to = || json!({"agent": "bob"});
    let cases = [
        // The hop limit first (SDK default 10), then loops, then sources and targets.
        (envelope("alpha", "beta", 10, json!(["alpha"]), to()), 5011,
            "Message exceeded maximum hop count of 10"),
        (envelope("alpha", "beta", 2, json!(["alpha", "beta", "alpha"]), to()), 5010,
            "Loop detected: message already visited beta"),
        (envelope("delta", "beta", 1, json!(["delta", "alpha"]), to()), 5003,
            "Source system delta not in allowed sources"),
        (envelope("alpha", "gamma", 0, json!(["alpha"]), to()), 5003,
            "Target system gamma not in allowed targets"),
        // Forged: a source the path does not start with, a path that does not end at the link.
        (envelope("gamma", "beta", 0, json!(["alpha"]), to()), 5003,
            "Forged route: sourceSystem gamma is not the first system of the path"),
        (envelope("alpha", "beta", 1, json!(["alpha", "gamma"]), to()), 5003,
            "Forged route: the path must end with alpha, the system this link speaks for"),
        (envelope("gamma", "beta", 0, Value::Null, to()), 5003,
            "Forged route: sourceSystem gamma is not alpha, the system this link speaks for, and no path shows the relay"),
        // A system this router does not reach (no peer it dials, no route).
        (envelope("alpha", "omega", 0, json!(["alpha"]), to()), 5001, "System not found: omega"),
    ];
    for (env, code, message) in cases {
        let e = g
            .err(
                "map/federation/route",
                json!({"systemId": "beta", "envelope": env}),
            )
            .await;
        assert_eq!(e["code"], json!(code), "{e}");
        assert_eq!(e["message"], json!(message), "{e}");
        assert_eq!(e["data"]["category"], json!("federation"), "{e}");
    }
    // Malformed: -32602, and the connection stays.
    for bad in [
        json!({"systemId": "beta", "envelope": {"payload": {}}}),
        json!({"systemId": "beta", "envelope": "nope"}),
        json!({"systemId": "beta"}),
        json!({"systemId": "beta", "envelope":
            envelope("alpha", "beta", 0, json!(vec!["alpha"; 100]), to())}),
        json!({"systemId": "beta", "envelope":
            envelope(&"a".repeat(200), "beta", 0, json!(["alpha"]), to())}),
        json!({"systemId": "beta", "envelope": {"payload": {"to": {"agent": "bob"}},
            "federation": {"sourceSystem": "alpha", "targetSystem": "beta",
                "hopCount": -1, "originTimestamp": 1}}}),
        // An absurd hop count, and a message id too long to become a local id.
        json!({"systemId": "beta", "envelope": {"payload": {"from": "a", "to": {"agent": "bob"}},
            "federation": {"sourceSystem": "alpha", "targetSystem": "beta",
                "hopCount": 1e300, "originTimestamp": 1}}}),
        json!({"systemId": "beta", "envelope": {"payload": {"id": "m".repeat(300), "from": "a",
            "to": {"agent": "bob"}}, "federation": {"sourceSystem": "alpha",
            "targetSystem": "beta", "hopCount": 0, "originTimestamp": 1}}}),
    ] {
        let e = g.err("map/federation/route", bad.clone()).await;
        assert_eq!(e["code"], json!(-32602), "{bad} -> {e}");
    }
    // Huge: over the payload limit, refused like any send's.
    let mut huge = envelope("alpha", "beta", 0, json!(["alpha"]), to());
    huge["payload"]["payload"] = json!("x".repeat(5000));
    let e = g
        .err(
            "map/federation/route",
            json!({"systemId": "beta", "envelope": huge}),
        )
        .await;
    assert_eq!(e["code"], json!(4002), "{e}");
    // Huger: over the frame limit, refused before it is parsed (-32600).
    let mut huger = envelope("alpha", "beta", 0, json!(["alpha"]), to());
    huger["payload"]["payload"] = json!("x".repeat(20 * 1024));
    let frame = json!({"jsonrpc": "2.0", "id": 999, "method": "map/federation/route",
        "params": {"systemId": "beta", "envelope": huger}});
    g.send_raw(&frame.to_string()).await;
    let r = g.next_non_notification().await;
    assert_eq!(r["error"]["code"], json!(-32600), "{r}");
    bob.assert_no_message().await;
    // Still serving, on the same connection.
    let r = g
        .ok(
            "map/federation/route",
            json!({"systemId": "beta", "envelope":
                envelope("alpha", "beta", 0, json!(["alpha"]), to())}),
        )
        .await;
    assert_eq!(r["routed"], json!(true), "{r}");
    let frame = bob.next_text().await;
    assert!(frame.contains("alpha:agent:alice"), "{frame}");
}

#[tokio::test]
async fn with_authentication_off_a_gateway_is_taken_at_its_word() {
    let (_server, url) = start_server(|c| c.federation.system_id = Some("beta".into())).await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    let mut g = WsClient::connect_as(&url, "gateway", json!({})).await;
    let r = g
        .ok(
            "map/federation/connect",
            json!({"systemId": "alpha", "endpoint": "wss://alpha.example/map"}),
        )
        .await;
    assert_eq!(r["connected"], json!(true), "{r}");
    let r = g
        .ok(
            "map/federation/route",
            json!({"systemId": "beta", "envelope":
                envelope("alpha", "beta", 0, Value::Null, json!({"agent": "bob"}))}),
        )
        .await;
    assert_eq!(r["routed"], json!(true), "{r}");
    assert_eq!(bob.next_message().await["from"], json!("alpha:agent:alice"));
}

/// The SDK's own `GatewayConnection` (tests/interop/federation_gateway.mjs) links as `alpha`,
/// records the link (it does only with `connected && systemInfo`), and its `routeToSystem`
/// (the SDK's envelope, path tracked) reaches the local agent.
#[tokio::test]
async fn the_sdks_gateway_connection_connects_and_routes() {
    let (_server, url, _dir) = beta(|_| {}).await;
    let mut bob = raw_agent(&url, BOB_KEY, "bob").await;
    let got = node_json(
        "federation_gateway.mjs",
        &[url.as_str(), ALPHA_KEY, "alpha", "beta", "bob"],
        std::time::Duration::from_secs(20),
    )
    .await;
    assert_eq!(got["connect"]["connected"], json!(true), "{got}");
    assert_eq!(got["connect"]["systemInfo"]["name"], json!("beta"), "{got}");
    assert_eq!(
        got["recorded"],
        json!(true),
        "the SDK recorded the peer: {got}"
    );
    assert_eq!(got["route"]["routed"], json!(true), "{got}");
    let frame = bob.next_text().await;
    let v: Value = serde_json::from_str(&frame).unwrap();
    let m = &v["params"]["message"];
    assert_eq!(m["from"], json!("alpha:agent:alice"), "{m}");
    assert_eq!(m["payload"], json!({"hello": "from the SDK"}));
    assert_eq!(m["id"], got["route"]["messageId"]);
}

/// `map-router serve --system-id gamma`: the id a peer sees in `systemInfo` and the one routed
/// envelopes must target.
#[tokio::test]
async fn the_serve_flag_names_the_system() {
    let (_router, url) = start_binary([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--ephemeral",
        "--system-id",
        "gamma",
    ])
    .await;
    let mut bob = WsClient::agent(&url, "bob", json!({})).await;
    let mut g = WsClient::connect_as(&url, "gateway", json!({})).await;
    let r = g
        .ok(
            "map/federation/connect",
            json!({"systemId": "alpha", "endpoint": "wss://alpha.example/map"}),
        )
        .await;
    assert_eq!(r["systemInfo"]["name"], json!("gamma"), "{r}");
    let to = json!({"agent": "bob"});
    let e = g
        .err(
            "map/federation/route",
            json!({"systemId": "beta", "envelope":
                envelope("alpha", "beta", 0, json!(["alpha"]), to.clone())}),
        )
        .await;
    assert_eq!(e["message"], json!("System not found: beta"), "{e}");
    bob.assert_no_message().await;
    let r = g
        .ok(
            "map/federation/route",
            json!({"systemId": "gamma", "envelope":
                envelope("alpha", "gamma", 0, json!(["alpha"]), to)}),
        )
        .await;
    assert_eq!(r["routed"], json!(true), "{r}");
    assert_eq!(bob.next_message().await["from"], json!("alpha:agent:alice"));
}

/// A link reaches what its principal's grant allows: `messaging.canSend` to route at all,
/// `messaging.canBroadcast` for a role or scope address (`[permissions.principals]`).
#[tokio::test]
async fn a_links_reach_follows_its_principals_grant() {
    let (_server, url, _dir) = beta(|c| {
        c.permissions = map_router::server::Config::from_toml(
            "[permissions.principals.\"alpha-gw\".messaging]\ncanBroadcast = true\n\
             [permissions.principals.mallory.messaging]\ncanSend = false\n",
        )
        .unwrap()
        .permissions;
        c.federation.peer.push(FederationPeer {
            system_id: "gamma".into(),
            principal: "mallory".into(),
            ..Default::default()
        });
    })
    .await;
    let mut bob = raw_agent(&url, BOB_KEY, "bob").await;
    let mut g = alpha_link(&url).await;
    let r = g
        .ok(
            "map/federation/route",
            json!({"systemId": "beta", "envelope":
                envelope("alpha", "beta", 0, json!(["alpha"]), json!({"role": "worker"}))}),
        )
        .await;
    assert_eq!(r["routed"], json!(true), "{r}");
    let v: Value = serde_json::from_str(&bob.next_text().await).unwrap();
    assert_eq!(v["params"]["message"]["from"], json!("alpha:agent:alice"));

    let (mut m, _) = connect_with_key(&url, MALLORY_KEY, "gateway", json!({})).await;
    let r = m
        .ok(
            "map/federation/connect",
            json!({"systemId": "gamma", "endpoint": "wss://gamma.example/map"}),
        )
        .await;
    assert_eq!(r["connected"], json!(true), "{r}");
    let e = m
        .err(
            "map/federation/route",
            json!({"systemId": "beta", "envelope":
                envelope("gamma", "beta", 0, json!(["gamma"]), json!({"agent": "bob"}))}),
        )
        .await;
    assert_eq!(
        e,
        map_error(1003, "Permission denied: messaging.canSend", "auth")
    );
    bob.assert_no_message().await;
}

/// A peer flooding routes meets its principal's request rate (4001), and the router keeps
/// serving: the agent gets exactly the routes that were answered `routed`.
#[tokio::test]
async fn a_peer_flooding_routes_is_rate_limited_per_principal() {
    let (_server, url, _dir) = beta(|c| {
        c.limits.exempt_loopback = false;
        c.limits.rate_per_principal = 2;
        c.limits.burst_per_principal = 10;
        c.limits.rate_per_connection = 0;
    })
    .await;
    let mut bob = raw_agent(&url, BOB_KEY, "bob").await;
    let mut g = alpha_link(&url).await;
    let route = json!({"systemId": "beta", "envelope":
        envelope("alpha", "beta", 0, json!(["alpha"]), json!({"agent": "bob"}))});
    let (mut routed, mut limited) = (0, 0);
    for i in 0..40 {
        // Each its own message (one id sent again is one message, routed once).
        let mut route = route.clone();
        route["envelope"]["payload"]["id"] = json!(format!("flood-{i}"));
        match g.call("map/federation/route", route).await {
            Ok(r) => {
                assert_eq!(r["routed"], json!(true), "{r}");
                routed += 1;
            }
            Err(e) => {
                assert_eq!(e["code"], json!(4001), "{e}");
                limited += 1;
            }
        }
    }
    assert!(
        limited > 0 && routed > 0,
        "routed {routed}, limited {limited}"
    );
    for _ in 0..routed {
        assert!(bob.next_text().await.contains("alpha:agent:alice"));
    }
    bob.assert_no_message().await;
}

/// What waits for a peer is the router's own links' to take and settle: a linked peer, another
/// principal's gateway and a client all get 1003 from `map/federation/outbound/*`, and the
/// message stays waiting, neither delivered nor failed.
#[tokio::test]
async fn only_the_routers_own_links_take_or_settle_what_waits_for_a_peer() {
    let (_server, url, _dir) = beta(|c| {
        c.federation.peer.push(FederationPeer {
            system_id: "gamma".into(),
            principal: "gamma-gw".into(),
            // Nobody listens there: the message waits.
            endpoint: Some("ws://127.0.0.1:9/".into()),
            ..Default::default()
        });
    })
    .await;
    let (mut bob, _) = connect_with_key(&url, BOB_KEY, "agent", json!({})).await;
    bob.ok("map/agents/register", json!({"agentId": "bob"}))
        .await;
    let sent = bob
        .ok(
            "map/send",
            json!({"to": {"system": "gamma", "agent": "x"}, "payload": {"secret": 1}}),
        )
        .await;
    assert_eq!(sent["queued"], json!(["gamma:agent:x"]), "{sent}");
    let id = sent["messageId"].clone();
    let mut alpha = alpha_link(&url).await;
    let (mut mallory, _) = connect_with_key(&url, MALLORY_KEY, "gateway", json!({})).await;
    let (mut carol, _) = connect_with_key(&url, CAROL_KEY, "client", json!({})).await;
    for who in [&mut alpha, &mut mallory, &mut carol, &mut bob] {
        let e = who
            .err(
                "map/federation/outbound/next",
                json!({"systemId": "gamma", "restart": true, "waitMs": 100}),
            )
            .await;
        assert_eq!(e["code"], json!(1003), "{e}");
        assert!(!e.to_string().contains("secret"), "{e}");
        let e = who
            .err(
                "map/federation/outbound/ack",
                json!({"systemId": "gamma", "acks": [{"messageId": id}]}),
            )
            .await;
        assert_eq!(e["code"], json!(1003), "{e}");
    }
    let log = bob
        .ok(
            "map/replay",
            json!({"filter": {"eventTypes": ["message_delivered", "message_failed", "message.queued"]}}),
        )
        .await;
    let kinds: Vec<&str> = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["data"]["messageId"] == id)
        .map(|e| e["event"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["message.queued"], "still waiting: {log}");
    // A routed message for this system may not name another system in its `to`: that would
    // start a new route from here, past the envelope's checks.
    for to in [
        json!({"system": "gamma", "agent": "x"}),
        json!({"agent": "gamma:agent:x"}),
        json!("gamma:agent:x"),
    ] {
        let e = alpha
            .err(
                "map/federation/route",
                json!({"systemId": "beta", "envelope":
                    envelope("alpha", "beta", 0, json!(["alpha"]), to.clone())}),
            )
            .await;
        assert_eq!(e["code"], json!(5003), "{to} -> {e}");
    }
}
