//! `map-router agents` and `map-router scopes`: tables (or JSON) of what the caller can see.

use std::process::ExitCode;

use clap::Args;
use serde_json::Value;

use crate::cli::common::connect;
use crate::cli::common::fail;
use crate::cli::common::leave;
use crate::cli::common::one_shot;
use crate::cli::common::pretty;
use crate::cli::common::print_line;
use crate::cli::common::Failure;
use crate::cli::common::UrlArgs;
use crate::cli::format;
use crate::client::{ClientError, ClientOptions};

/// `map-router agents` and `map-router scopes`.
#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    url: UrlArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub(super) async fn agents(args: ListArgs) -> Result<ExitCode, Failure> {
    let client = connect(&args.url, one_shot(ClientOptions::new())).await?;
    let agents = client
        .list_agents(Default::default())
        .await
        .map_err(fail("map/agents/list"));
    leave(&client).await;
    let agents = agents?;
    if args.json {
        print_line(&pretty(&agents));
    } else if agents.is_empty() {
        print_line("no agents");
    } else {
        print_line(format::agents_table(&agents).trim_end());
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn scopes(args: ListArgs) -> Result<ExitCode, Failure> {
    let client = connect(&args.url, one_shot(ClientOptions::new())).await?;
    let listed = async {
        let scopes = client.scopes().list().await?;
        let mut rows = Vec::with_capacity(scopes.len());
        for scope in scopes {
            let members = client.scopes().members(scope.id.clone()).await?;
            rows.push((scope, members));
        }
        Ok::<_, ClientError>(rows)
    }
    .await
    .map_err(fail("map/scopes/list"));
    leave(&client).await;
    let rows = listed?;
    if args.json {
        let json: Vec<Value> = rows
            .iter()
            .map(|(scope, members)| {
                let mut v = serde_json::to_value(scope).unwrap_or(Value::Null);
                if let Some(o) = v.as_object_mut() {
                    o.insert("members".into(), serde_json::json!(members));
                }
                v
            })
            .collect();
        print_line(&pretty(&json));
    } else if rows.is_empty() {
        print_line("no scopes");
    } else {
        print_line(format::scopes_table(&rows).trim_end());
    }
    Ok(ExitCode::SUCCESS)
}
