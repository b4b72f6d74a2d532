//! The agents' side: what MAP agents send the gateway agent about A2A tasks (progress, an
//! artifact, a state, the final reply; `record.rs` reads them as an [`AgentReport`]) becomes
//! the task's update.
//!
//! Owns how one report changes a task's record ([`apply`], run by the task writer, which gets
//! the reports from the gateway agent's inbox in arrival order, `Core::take_replies`, and
//! applies those about one task in that order, one at a time). Messages about unknown, foreign
//! or finished tasks are dropped (logged).

use crate::gateway::a2a::error::A2aError;
use crate::gateway::a2a::record::{final_artifact, AgentReport};
use crate::gateway::a2a::wire::{Message, Role, TaskState};

use crate::protocol::trace::TraceContext;

use super::books::Books;
use super::target::Target;

/// Applies `report`, from agent `from`, to task `id` (run by the task writer, so nothing else
/// changes the task meanwhile). A change too large to record fails the task saying so.
///
/// `trace`: the context of the report's delivery, as the writes' `params._meta`.
pub(super) async fn apply(
    books: &Books,
    id: &str,
    from: &str,
    report: AgentReport,
    trace: Option<&TraceContext>,
) {
    let outcome = async {
        let mut record = books.load(&Target::Router, id).await?;
        if record.agent != from {
            return Err(A2aError::invalid_request(format!(
                "{from} is not the agent of task {id}"
            )));
        }
        if record.state.is_terminal() {
            return Err(A2aError::unsupported(format!(
                "task {id} is already {}",
                record.state.v03_name()
            )));
        }
        let text = |t: String| Message::agent_text(t, id, &record.context_id);
        let written = match report {
            AgentReport::Working(m) => {
                let m = m.map(text);
                record.set_state(TaskState::Working, m);
                books.write(id, &record, None, trace).await
            }
            AgentReport::Artifact {
                artifact,
                append,
                last_chunk,
            } => {
                record.add_artifact(artifact, append, last_chunk);
                books.write(id, &record, None, trace).await
            }
            AgentReport::State(state, m) => {
                let m = m.map(text);
                record.set_state(state, m);
                books.write(id, &record, None, trace).await
            }
            AgentReport::Final(payload) => {
                let artifact = final_artifact(payload.as_ref());
                let mut done = Ok(());
                if !artifact.parts.is_empty() {
                    record.add_artifact(artifact, false, true);
                    done = books.write(id, &record, payload.as_ref(), trace).await;
                }
                if done.is_ok() {
                    record.set_state(TaskState::Completed, None);
                    done = books.write(id, &record, None, trace).await;
                }
                done
            }
            AgentReport::Reply { parts, metadata } => {
                let mut m = text(String::new());
                m.parts = parts;
                m.metadata = metadata;
                // A direct answer only to the exchange's first message: after a turn
                // (input-required ...) the caller holds the task, which completes.
                record.message_only = record
                    .history
                    .iter()
                    .filter(|m| m.role == Role::User)
                    .count()
                    == 1;
                record.set_state(TaskState::Completed, Some(m));
                books.write(id, &record, None, trace).await
            }
            AgentReport::Ignored => Ok(()),
        };
        if let Err(e) = &written {
            if e.status == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                // What the agent sent cannot be kept in the task: the task fails saying
                // so, rather than staying `working` with the answer lost.
                fail_too_large(books, id, e, trace).await;
            }
        }
        written
    }
    .await;
    if let Err(e) = outcome {
        tracing::debug!(task = %id, from = %from, error = %e, "a2a gateway: agent message not applied");
    }
}

/// Fails task `id` (its stored state, which the refused change never reached) with a status
/// message saying why the agent's update could not be kept.
async fn fail_too_large(books: &Books, id: &str, why: &A2aError, trace: Option<&TraceContext>) {
    let failed = async {
        let mut record = books.load(&Target::Router, id).await?;
        let text = format!(
            "the agent's update could not be recorded: {}",
            why.message.trim_start_matches("Invalid request: ")
        );
        let message = Message::agent_text(text, id, &record.context_id);
        record.set_state(TaskState::Failed, Some(message));
        books.write(id, &record, None, trace).await
    }
    .await;
    if let Err(e) = failed {
        tracing::warn!(task = %id, error = %e, "a2a gateway: a task whose update was too large could not be failed");
    }
}
