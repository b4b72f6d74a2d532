//! `map/permissions/update`: a system participant changes another participant's capabilities.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::protocol::capabilities::ParticipantCapabilities;
use crate::protocol::ids::ParticipantId;
use crate::protocol::methods::method::method;

/// `map/permissions/update` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermissionsUpdateParams {
    /// The participant whose capabilities change (`participantId` is accepted too).
    #[serde(alias = "participantId")]
    pub client_id: ParticipantId,
    /// The flags to set, per group; flags left out keep their value.
    pub permissions: ParticipantCapabilities,
}

/// `map/permissions/update` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PermissionsUpdateResult {
    /// Always true (failures are errors).
    pub success: bool,
    /// The capabilities now in force.
    pub effective_permissions: ParticipantCapabilities,
}

method!(
    /// `map/permissions/update` (system participants only).
    PermissionsUpdate,
    "map/permissions/update",
    None,
    PermissionsUpdateParams,
    PermissionsUpdateResult
);
