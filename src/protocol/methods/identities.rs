//! `map/identities/release` (ours): a system participant frees a participant id or an agent id,
//! so that another principal may take it (docs/security.md, "Identity").

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::methods::method::method;

/// `map/identities/release` params: exactly one of the two ids.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityReleaseParams {
    /// A participant id to free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participant_id: Option<String>,
    /// An agent id to free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
}

/// Who owned a released id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityOwner {
    /// The principal's id.
    pub id: String,
    /// Its issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
}

/// `map/identities/release` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdentityReleaseResult {
    /// Whether the id had an owner (and now has none).
    pub released: bool,
    /// The owner it had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_owner: Option<IdentityOwner>,
}

method!(
    /// `map/identities/release` (system participants only).
    IdentityRelease,
    "map/identities/release",
    None,
    IdentityReleaseParams,
    IdentityReleaseResult
);
