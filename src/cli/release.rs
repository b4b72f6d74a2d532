//! `release-id`: an operator frees a participant id or an agent id (`map/identities/release`),
//! so that a principal other than its owner may take it. Connects as a `system` participant,
//! which with authentication on needs a principal in `auth.system_principals`.

use std::process::ExitCode;

use clap::Args;

use crate::cli::common::{connect, fail, leave, one_shot, pretty, print_line, Failure, UrlArgs};
use crate::client::ClientOptions;
use crate::protocol::capabilities::ParticipantType;
use crate::protocol::methods::identities::{IdentityRelease, IdentityReleaseParams};

/// `map-router release-id`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// The participant id to free.
    #[arg(
        long,
        value_name = "ID",
        required_unless_present = "agent",
        conflicts_with = "agent"
    )]
    participant: Option<String>,
    /// The agent id to free.
    #[arg(long, value_name = "ID")]
    agent: Option<String>,
}

pub(super) async fn run(args: ReleaseArgs) -> Result<ExitCode, Failure> {
    let client = connect(
        &args.url,
        one_shot(ClientOptions::new().participant_type(ParticipantType::System)),
    )
    .await?;
    let result = client
        .call::<IdentityRelease>(IdentityReleaseParams {
            participant_id: args.participant,
            agent_id: args.agent,
        })
        .await
        .map_err(fail("map/identities/release"));
    leave(&client).await;
    print_line(&pretty(&result?));
    Ok(ExitCode::SUCCESS)
}
