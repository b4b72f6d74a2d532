//! [`PeerTable`]: the sessions that stand for outside agents (`peers.rs` opens them), and the
//! MAMP conversation-id mapping (ours ↔ a remote agent's), both in memory: a restart opens the
//! sessions again on first use, and a remote conversation started before it is a new one after.

use std::collections::HashMap;

use crate::client::{AgentHandle, Client};

/// One outside agent's session and MAP agent.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The outside agent's URI, also its MAP agent id.
    pub uri: String,
    /// Its session.
    pub client: Client,
    /// Its MAP agent (kept so that the agent's messages reach the pump).
    pub agent: AgentHandle,
}

/// The peer table and the MAMP conversation mapping.
#[derive(Debug, Default)]
pub struct PeerTable {
    /// NB. A tokio mutex held while a peer opens, so that two first messages from one sender
    /// do not both register its agent (the second would find the id taken).
    pub(crate) table: tokio::sync::Mutex<HashMap<String, Peer>>,
    /// MAMP conversation ids: (remote URI, our conversation) ↔ (remote URI, theirs).
    conversations: std::sync::Mutex<ConversationMap>,
}

#[derive(Debug, Default)]
struct ConversationMap {
    ours_to_theirs: HashMap<(String, String), String>,
    theirs_to_ours: HashMap<(String, String), String>,
}

impl PeerTable {
    /// Removes the peer for `uri` (an IM agent is connecting under that URI: its own session
    /// takes the agent id over).
    pub async fn take(&self, uri: &str) -> Option<Peer> {
        self.table.lock().await.remove(uri)
    }

    /// Our conversation id for the remote's `theirs`, if a message of ours started it.
    pub fn ours(&self, remote: &str, theirs: &str) -> Option<String> {
        let map = self.conversations.lock().ok()?;
        map.theirs_to_ours
            .get(&(remote.to_owned(), theirs.to_owned()))
            .cloned()
    }

    /// The remote's conversation id for `ours`.
    pub fn theirs(&self, remote: &str, ours: &str) -> Option<String> {
        let map = self.conversations.lock().ok()?;
        map.ours_to_theirs
            .get(&(remote.to_owned(), ours.to_owned()))
            .cloned()
    }

    /// Records that `ours` is `theirs` at `remote`.
    pub fn map_conversation(&self, remote: &str, ours: &str, theirs: &str) {
        if let Ok(mut map) = self.conversations.lock() {
            map.ours_to_theirs
                .insert((remote.to_owned(), ours.to_owned()), theirs.to_owned());
            map.theirs_to_ours
                .insert((remote.to_owned(), theirs.to_owned()), ours.to_owned());
        }
    }
}
