//! Who may post to `/mamp/v1/messages` as which `from` (docs/gateways.md, "Who may send as
//! whom"): pure decisions over the settings and the caller, no I/O, no state.
//!
//! A MAMP `from` is proven, not claimed. It must be one of:
//! - a configured remote agent (`[[gateways.mamp.remote]]`) whose `principal` is the caller's;
//! - a URI in the caller's namespace: a prefix `[gateways.mamp] namespaces` assigns to its
//!   principal id, or its default namespace `agent://<principal id>@<any host>/...`.
//!
//! Never one of this router's own URIs (`agent://<our host>/...`: those are MAP agents, which
//! speak over MAP). With authentication off there are no principals: every `from` outside our
//! host is accepted, as any free id may then be taken by any MAP participant.
//!
//! The IM gateway's rule needs its table of who registered which URI, so it lives with it
//! (`im/table.rs`): an IM `from` must be a URI the caller's principal registered.

use crate::gateway::caller::Caller;
use crate::gateway::config::{MampSettings, RemoteMamp};
use crate::gateway::wire::AgentUri;

/// Whom a MAMP `from` stands for, once allowed.
#[derive(Debug, Clone, Copy)]
pub enum MampSender<'a> {
    /// A configured remote agent: the message comes from its MAP agent (the service's session).
    Remote(&'a RemoteMamp),
    /// An outside agent of the caller's: the message comes from a session of the caller's
    /// principal standing for it (`peers.rs`).
    Own,
}

/// Whether the caller may post as `from`; `local`: its host is this router's.
///
/// # Errors
/// Why not, for a 403.
pub fn mamp_sender<'a>(
    settings: &'a MampSettings,
    caller: &Caller,
    from: &AgentUri,
    text: &str,
    local: bool,
) -> Result<MampSender<'a>, String> {
    if local {
        return Err(format!(
            "from `{text}` names this router's own host: its agents speak over MAP, and an \
             outside sender's URI must be its own"
        ));
    }
    if let Some(remote) = settings.remote.iter().find(|r| r.uri == text) {
        return match &caller.principal {
            None => Ok(MampSender::Remote(remote)),
            Some(p) if remote.principal.as_deref() == Some(p.id.as_str()) => {
                Ok(MampSender::Remote(remote))
            }
            Some(p) => Err(format!(
                "from `{text}` is a configured remote agent: only the principal bound to it \
                 (gateways.mamp.remote.principal) may post as it, not {}",
                p.id
            )),
        };
    }
    let Some(p) = &caller.principal else {
        return Ok(MampSender::Own);
    };
    if in_namespace(settings, &p.id, from, text) {
        return Ok(MampSender::Own);
    }
    Err(format!(
        "from `{text}` is not in the namespace of principal {id}: post as \
         agent://{id}@<host>/<name>, or as a URI under a prefix gateways.mamp.namespaces gives \
         {id}",
        id = p.id
    ))
}

/// Whether `from` (`text` parsed) is in the namespace of principal `id`: its default one
/// (`agent://<id>@<host>/...`) or a configured prefix. A configured remote agent's URI is
/// never in anybody's namespace.
pub fn in_namespace(settings: &MampSettings, id: &str, from: &AgentUri, text: &str) -> bool {
    if settings.remote.iter().any(|r| r.uri == text) {
        return false;
    }
    let default = from
        .host
        .rsplit_once('@')
        .is_some_and(|(user, host)| user == id && !host.is_empty());
    default
        || settings
            .namespaces
            .get(id)
            .is_some_and(|prefixes| prefixes.iter().any(|p| text.starts_with(p)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::config::Prefixes;
    use crate::protocol::methods::session::Principal;

    fn caller(id: Option<&str>) -> Caller {
        Caller {
            principal: id.map(|id| Principal {
                id: id.into(),
                issuer: None,
                expires_at: None,
            }),
            ip: None,
            sees_all: id.is_none(),
        }
    }

    fn settings() -> MampSettings {
        let mut s = MampSettings::default();
        s.remote.push(RemoteMamp {
            uri: "agent://other.example/analyst".into(),
            endpoint: "http://127.0.0.1:9".into(),
            token: None,
            name: None,
            principal: Some("partner".into()),
        });
        s.namespaces.insert(
            "alice".into(),
            Prefixes::Many(vec!["agent://alice.example/".into()]),
        );
        // A namespace that tries to cover the remote agent's URI does not.
        s.namespaces.insert(
            "mallory".into(),
            Prefixes::One("agent://other.example/".into()),
        );
        s
    }

    fn decide(who: Option<&str>, from: &str, local: bool) -> Result<bool, String> {
        let s = settings();
        let uri = AgentUri::parse(from).unwrap();
        mamp_sender(&s, &caller(who), &uri, from, local).map(|k| matches!(k, MampSender::Remote(_)))
    }

    #[test]
    fn who_may_post_as_whom() {
        // The remote agent: its principal only (and anybody with authentication off).
        assert_eq!(
            decide(Some("partner"), "agent://other.example/analyst", false),
            Ok(true)
        );
        assert_eq!(
            decide(None, "agent://other.example/analyst", false),
            Ok(true)
        );
        for who in ["alice", "mallory", "viewer"] {
            let e = decide(Some(who), "agent://other.example/analyst", false).unwrap_err();
            assert!(e.contains("configured remote agent"), "{e}");
        }
        // Namespaces: the default one and configured prefixes, by principal id.
        assert_eq!(
            decide(Some("alice"), "agent://alice@remote.example/x", false),
            Ok(false)
        );
        assert_eq!(
            decide(Some("alice"), "agent://alice.example/bot/1", false),
            Ok(false)
        );
        assert_eq!(
            decide(Some("mallory"), "agent://other.example/else", false),
            Ok(false)
        );
        for (who, from) in [
            ("bob", "agent://alice@remote.example/x"),
            ("bob", "agent://alice.example/bot"),
            ("alice", "agent://alice.example.evil/bot"),
            ("alice", "agent://remote.example/alice"),
            ("alice", "agent://@remote.example/x"),
            ("alice", "agent://alice@/x"),
        ] {
            let e = decide(Some(who), from, false).unwrap_err();
            assert!(e.contains("not in the namespace"), "{who} {from}: {e}");
        }
        // Our own host: nobody, not even with authentication off.
        for who in [None, Some("alice")] {
            let e = decide(who, "agent://alice@here/x", true).unwrap_err();
            assert!(e.contains("own host"), "{e}");
        }
        // Authentication off: any outside URI.
        assert_eq!(decide(None, "agent://anything.example/x", false), Ok(false));
    }
}
