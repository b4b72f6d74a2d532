//! One owner per table inside the router (issue 43): each part's records are written by that
//! part alone, and scope membership is stored once.
//!
//! Reads the router's sources (like `tests/layering.rs`) and checks:
//!
//! 1. **No pub field on the records** ([`RECORDS`]): a field of `AgentRecord`, `ScopeRecord`,
//!    `Session` or `Conn` is private or `pub(in crate::router::<its part>)`, never `pub`,
//!    `pub(crate)`, `pub(super)` or visible to another part. Readers use accessors.
//! 2. **No raw write from outside the part**: the tables' raw writers (`get_mut`, `insert`,
//!    `remove`, `set_owner`, see [`TABLES`]) are private or `pub(in crate::router::<part>)`,
//!    and no file of another part calls them (`self.registry.get_mut(...)` in `sessions/`, say).
//!    Other parts write through the methods that name the intent (`Registry::orphan`,
//!    `Scopes::join`, `Conns::push_message`, ...).
//! 3. **Membership stored once**: only the scopes table holds it. `AgentRecord` has no field
//!    about scopes, and no router file outside `scopes/` pushes to or retains in an agent's
//!    `scopes` (the old second copy kept in step by hand).
//!
//! Each check is also run on a small bad source, so that a checker that finds nothing cannot
//! pass by accident.

use std::path::{Path, PathBuf};

/// The records whose fields are their part's: (file under `src/router/`, struct, part folder).
const RECORDS: &[(&str, &str, &str)] = &[
    ("agents/registry.rs", "AgentRecord", "agents"),
    ("scopes/table.rs", "ScopeRecord", "scopes"),
    ("sessions/table.rs", "Session", "sessions"),
    ("sessions/table.rs", "Conn", "sessions"),
];

/// The tables: (file, type, part folder, the field name other parts reach it by on `Router`).
const TABLES: &[(&str, &str, &str, &str)] = &[
    ("agents/registry.rs", "Registry", "agents", "registry"),
    ("scopes/table.rs", "Scopes", "scopes", "scopes"),
    ("sessions/table.rs", "Sessions", "sessions", "sessions"),
    ("sessions/table.rs", "Conns", "sessions", "conns"),
];

/// The raw writers no other part may call.
const RAW_WRITERS: &[&str] = &["get_mut", "insert", "remove", "set_owner"];

fn router_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/router")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(router_dir().join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// Every `.rs` file under `dir`, as (path relative to `src/router/`, text).
fn sources(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(dir)
                    .expect("under dir")
                    .to_string_lossy()
                    .replace('\\', "/");
                out.push((rel, std::fs::read_to_string(&path).expect("read")));
            }
        }
    }
    out.sort();
    out
}

/// The source without comments (line comments and doc comments), so that prose naming a
/// method does not count.
fn code_only(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The body of `struct NAME { ... }` (between its braces), if declared.
fn struct_body<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!("struct {name} {{"))?;
    let open = start + text[start..].find('{')?;
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[open + 1..open + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The visibility written before an item (`pub`, `pub(crate)`, `pub(in x)`...), `""` when
/// private.
fn visibility(decl: &str) -> &str {
    let d = decl.trim_start();
    if !d.starts_with("pub") {
        return "";
    }
    if d[3..].starts_with('(') {
        let end = d.find(')').map_or(d.len(), |i| i + 1);
        &d[..end]
    } else {
        "pub"
    }
}

fn allowed_visibility(vis: &str, part: &str) -> bool {
    vis.is_empty() || vis == format!("pub(in crate::router::{part})")
}

/// Fields of `record` (in `text`) visible beyond `part`: (field, visibility).
fn open_fields(text: &str, record: &str, part: &str) -> Vec<(String, String)> {
    let body = struct_body(text, record).unwrap_or_else(|| panic!("struct {record} not found"));
    code_only(body)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            // The field's colon: not part of a path (`crate::router`).
            let bytes = l.as_bytes();
            let colon = (0..bytes.len()).find(|&i| {
                bytes[i] == b':'
                    && bytes.get(i + 1) != Some(&b':')
                    && (i == 0 || bytes[i - 1] != b':')
            })?;
            let (decl, _) = l.split_at(colon);
            if decl.contains('<') || decl.is_empty() {
                return None;
            }
            let vis = visibility(decl);
            let name = decl[vis.len()..].trim().to_owned();
            (!allowed_visibility(vis, part)).then(|| (name, vis.to_owned()))
        })
        .collect()
}

/// Raw writers of `table` (in `text`) declared visible beyond `part`: (fn, visibility).
fn open_writers(text: &str, table: &str, part: &str) -> Vec<(String, String)> {
    let code = code_only(text);
    let mut out = Vec::new();
    let mut in_impl = false;
    for line in code.lines() {
        if line.starts_with("impl") {
            in_impl = line.contains(&format!(" {table} ")) || line.ends_with(&format!(" {table}"));
            continue;
        }
        if line.starts_with('}') {
            in_impl = false;
            continue;
        }
        if !in_impl {
            continue;
        }
        let l = line.trim_start();
        let vis = visibility(l);
        let rest = l[vis.len()..].trim_start();
        let Some(sig) = rest.strip_prefix("fn ") else {
            continue;
        };
        let name: String = sig
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if RAW_WRITERS.contains(&name.as_str()) && !allowed_visibility(vis, part) {
            out.push((name, vis.to_owned()));
        }
    }
    out
}

/// Calls of the raw writers of the table reached as `field` (`self.registry.get_mut(`,
/// `router.scopes.insert(`...), with the line number.
fn raw_calls(text: &str, field: &str) -> Vec<(usize, String)> {
    let code = code_only(text);
    // Joined so that a call split over lines (`self\n    .registry\n    .get_mut(`) is seen.
    let flat: String = code
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("\u{1}");
    let mut out = Vec::new();
    let needle = format!(".{field}");
    let mut from = 0;
    while let Some(i) = flat[from..].find(&needle) {
        let at = from + i;
        from = at + needle.len();
        let after = flat[from..].trim_start_matches('\u{1}');
        // The field itself, not a longer name (`.registry_x`).
        if after.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        for w in RAW_WRITERS {
            if after.starts_with(&format!(".{w}(")) {
                let line = flat[..at].matches('\u{1}').count() + 1;
                out.push((line, format!("{needle}.{w}(")));
            }
        }
    }
    out
}

/// Writes to an agent's scope list (the second copy of membership).
fn scope_list_writes(text: &str) -> Vec<(usize, String)> {
    let code = code_only(text);
    code.lines()
        .enumerate()
        .filter_map(|(n, l)| {
            let hit = [".scopes.push(", ".scopes.retain(", ".scopes.insert("]
                .iter()
                .find(|p| l.contains(*p))?;
            Some((n + 1, hit.to_string()))
        })
        .collect()
}

#[test]
fn the_records_fields_are_their_parts_alone() {
    let mut problems = Vec::new();
    for (file, record, part) in RECORDS {
        for (field, vis) in open_fields(&read(file), record, part) {
            problems.push(format!("{file}: {record}.{field} is `{vis}`"));
        }
    }
    assert!(
        problems.is_empty(),
        "fields readable or writable beyond their part (use accessors and intent methods):\n{}",
        problems.join("\n")
    );
}

#[test]
fn no_part_writes_another_parts_table() {
    let mut problems = Vec::new();
    for (file, table, part, _) in TABLES {
        for (name, vis) in open_writers(&read(file), table, part) {
            problems.push(format!("{file}: {table}::{name} is `{vis}`"));
        }
    }
    for (rel, text) in sources(&router_dir()) {
        for (_, _, part, field) in TABLES {
            if rel.starts_with(&format!("{part}/")) {
                continue;
            }
            for (line, call) in raw_calls(&text, field) {
                problems.push(format!(
                    "src/router/{rel}:{line}: {call} (the {part} part's table)"
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "raw writes into a part's table from outside it:\n{}",
        problems.join("\n")
    );
}

#[test]
fn scope_membership_is_stored_once() {
    let registry = read("agents/registry.rs");
    let body = struct_body(&registry, "AgentRecord").expect("AgentRecord");
    let code = code_only(body);
    let scope_fields: Vec<&str> = code
        .lines()
        .filter(|l| l.contains(':') && l.to_lowercase().contains("scope"))
        .collect();
    assert!(
        scope_fields.is_empty(),
        "AgentRecord holds membership: {scope_fields:?}"
    );
    let mut problems = Vec::new();
    for (rel, text) in sources(&router_dir()) {
        if rel.starts_with("scopes/") {
            continue;
        }
        for (line, hit) in scope_list_writes(&text) {
            problems.push(format!("src/router/{rel}:{line}: {hit}"));
        }
    }
    assert!(
        problems.is_empty(),
        "an agent's scope list written beside the scopes table:\n{}",
        problems.join("\n")
    );
}

/// The checkers find what they look for (a checker that finds nothing would pass anything).
#[test]
fn the_checkers_catch_a_bad_source() {
    let bad = r#"
pub struct AgentRecord {
    /// doc
    pub agent: Agent,
    pub(crate) order: u64,
    pub(in crate::router::agents) children: Set,
    hidden: bool,
}
impl Registry {
    pub fn get_mut(&mut self) {}
    pub(in crate::router::agents) fn insert(&mut self) {}
    pub fn orphan(&mut self) {}
}
fn elsewhere(r: &mut Router) {
    r.registry.get_mut(&id);
    r.registry_x.get_mut(&id);
    r.registry.orphan(&id);
    self
        .registry
        .set_owner(&id, None);
    // self.registry.insert(agent) in a comment
    agent.scopes.push(scope);
}
"#;
    let fields = open_fields(bad, "AgentRecord", "agents");
    assert_eq!(
        fields,
        vec![
            ("agent".to_owned(), "pub".to_owned()),
            ("order".to_owned(), "pub(crate)".to_owned())
        ]
    );
    assert_eq!(
        open_writers(bad, "Registry", "agents"),
        vec![("get_mut".to_owned(), "pub".to_owned())]
    );
    let calls: Vec<String> = raw_calls(bad, "registry")
        .into_iter()
        .map(|c| c.1)
        .collect();
    assert_eq!(calls, vec![".registry.get_mut(", ".registry.set_owner("]);
    assert_eq!(scope_list_writes(bad).len(), 1);
}
