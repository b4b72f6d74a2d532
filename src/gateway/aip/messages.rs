//! AIP agent messages and MAP `meta.aip`, both ways: the session's id and status, the message
//! ids, the sender and receiver as the AIP side named them, and `taskInfo`; the content is the
//! payload (`content.rs`).
//!
//! Owns nothing.

use serde_json::{json, Value};

use super::content;
use super::proto::agent_message::SessionStatus;
use super::proto::task_info::TaskStatus as AipTaskStatus;
use super::proto::{AgentMessage, TaskInfo};

/// `meta.aip` of an agent message.
pub fn message_meta(m: &AgentMessage) -> Value {
    let status = SessionStatus::try_from(m.session_status).unwrap_or(SessionStatus::StartQuest);
    let mut aip = json!({
        "sessionId": m.session_id,
        "sessionStatus": status.as_str_name(),
        "messageId": m.message_id,
        "replyToMessageId": m.reply_to_message_id,
        "senderId": m.sender_id,
        "receiverId": m.receiver_id,
    });
    if let Some(t) = &m.task_info {
        aip["taskInfo"] = json!({
            "taskId": t.task_id,
            "parentTaskIds": t.parent_task_ids,
            "taskStatus": AipTaskStatus::try_from(t.task_status).unwrap_or(AipTaskStatus::Create).as_str_name(),
        });
    }
    aip
}

/// The agent message `meta.aip` describes (content from `payload`).
pub fn message_of(aip: &Value, payload: Option<&Value>) -> AgentMessage {
    let s = |k: &str| aip.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let status = aip
        .get("sessionStatus")
        .and_then(Value::as_str)
        .and_then(SessionStatus::from_str_name)
        .unwrap_or(SessionStatus::StartQuest);
    let task_info = aip.get("taskInfo").map(|t| TaskInfo {
        task_id: t
            .get("taskId")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        parent_task_ids: t
            .get("parentTaskIds")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        task_status: t
            .get("taskStatus")
            .and_then(Value::as_str)
            .and_then(AipTaskStatus::from_str_name)
            .unwrap_or(AipTaskStatus::Create) as i32,
    });
    AgentMessage {
        sender_id: s("senderId"),
        receiver_id: s("receiverId"),
        session_id: s("sessionId"),
        session_status: status as i32,
        task_info,
        message_id: s("messageId"),
        reply_to_message_id: s("replyToMessageId"),
        content: content::items(payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::aip::proto::content_item::Data;
    use crate::gateway::aip::proto::ContentItem;

    #[test]
    fn agent_messages_round_trip_through_meta_and_payload() {
        let m = AgentMessage {
            sender_id: "a".into(),
            receiver_id: "b".into(),
            session_id: "s".into(),
            session_status: SessionStatus::HoldQuest as i32,
            task_info: Some(TaskInfo {
                task_id: "t2".into(),
                parent_task_ids: vec!["t1".into()],
                task_status: AipTaskStatus::Waiting as i32,
            }),
            message_id: "m".into(),
            reply_to_message_id: "r".into(),
            content: vec![ContentItem {
                data: Some(Data::Image(vec![0, 255])),
            }],
        };
        let meta = message_meta(&m);
        assert_eq!(meta["sessionStatus"], "HOLD_QUEST");
        assert_eq!(meta["taskInfo"]["parentTaskIds"], json!(["t1"]));
        let back = message_of(&meta, Some(&content::payload(&m.content)));
        assert_eq!(back, m);
    }
}
