//! Human-readable output: event lines and tables.

use crate::client::EventEnvelope;
use crate::protocol::agent::Agent;
use crate::protocol::ids::AgentId;
use crate::protocol::scope::Scope;

/// Longest data shown on an event line before it is cut.
const MAX_DATA_CHARS: usize = 200;

/// `HH:MM:SS.mmm` (UTC) of a Unix-ms timestamp.
pub fn clock(ms: u64) -> String {
    let s = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60,
        ms % 1000
    )
}

/// One line per event: time, type, source, compact data.
pub fn event_line(e: &EventEnvelope) -> String {
    let ts = e.timestamp.unwrap_or(e.event.timestamp);
    let source = e.event.source.as_deref().unwrap_or("-");
    let data = match &e.event.data {
        Some(d) => cut(&d.to_string(), MAX_DATA_CHARS),
        None => String::new(),
    };
    format!("{} {:<26} {:<26} {data}", clock(ts), e.event.kind, source)
        .trim_end()
        .to_owned()
}

fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// Left-aligned columns separated by two spaces.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (cell, w) in cells.zip(&widths) {
            l.push_str(cell);
            l.extend(std::iter::repeat_n(' ', w - cell.chars().count() + 2));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

fn or_dash(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("-").to_owned()
}

/// The `map-router agents` table.
pub fn agents_table(agents: &[Agent]) -> String {
    let rows: Vec<Vec<String>> = agents
        .iter()
        .map(|a| {
            vec![
                a.id.to_string(),
                or_dash(a.name.as_deref()),
                or_dash(a.role.as_deref()),
                a.state.to_string(),
                or_dash(a.parent.as_ref().map(AgentId::as_str)),
                or_dash(a.owner_id.as_ref().map(|o| o.as_str())),
                if a.scopes.is_empty() {
                    "-".to_owned()
                } else {
                    a.scopes
                        .iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                },
            ]
        })
        .collect();
    table(
        &["ID", "NAME", "ROLE", "STATE", "PARENT", "OWNER", "SCOPES"],
        &rows,
    )
}

/// The `map-router scopes` table.
pub fn scopes_table(scopes: &[(Scope, Vec<AgentId>)]) -> String {
    let rows: Vec<Vec<String>> = scopes
        .iter()
        .map(|(s, members)| {
            vec![
                s.id.to_string(),
                or_dash(s.name.as_deref()),
                or_dash(s.parent.as_ref().map(|p| p.as_str())),
                s.visibility
                    .map(|v| format!("{v:?}").to_lowercase())
                    .unwrap_or_else(|| "public".into()),
                members.len().to_string(),
            ]
        })
        .collect();
    table(&["ID", "NAME", "PARENT", "VISIBILITY", "MEMBERS"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_and_tables() {
        assert_eq!(clock(3_723_004), "01:02:03.004");
        assert_eq!(
            table(&["A", "LONGER"], &[vec!["xyz".into(), "1".into()]]),
            "A    LONGER\nxyz  1\n"
        );
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("abc", 3), "abc");
    }

    #[test]
    fn event_lines_are_compact() {
        let e: EventEnvelope = serde_json::from_value(serde_json::json!({
            "subscriptionId": "s", "sequenceNumber": 1, "eventId": "01J", "timestamp": 1000,
            "event": {"id": "01J", "type": "agent_registered", "timestamp": 1000,
                      "source": "a1", "data": {"agentId": "a1"}}
        }))
        .unwrap();
        let line = event_line(&e);
        assert!(line.starts_with("00:00:01.000 agent_registered"), "{line}");
        assert!(line.ends_with(r#"{"agentId":"a1"}"#), "{line}");
    }
}
