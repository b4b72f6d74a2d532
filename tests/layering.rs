//! The crate's layers point one way, and no file imports in a circle.
//!
//! Reads every `src/**/*.rs`, collects the paths it names (`use` trees, and `crate::…`,
//! `super::…`, `self::…` paths in code), resolves each to the file that defines it, and checks:
//!
//! 1. each top-level folder imports only the folders its layer may (the table [`ALLOWED`];
//!    `docs/architecture.md` draws it): `protocol` nothing of ours; `store` only `protocol`;
//!    `router` only `protocol`, `store` and `auth`; `transport` never `server`; `client` never
//!    `server`; ...
//! 2. there is no import cycle between files (which also rules out one between folders).
//!
//! A path in a comment or a string does not count; a path in a `#[cfg(test)]` module does
//! (tests are code too). When this test fails it prints the offending `use` with file and line.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// Which top-level folders (or root files) each one may import. `lib.rs` and `main.rs` tie
/// everything together; `fuzzing.rs` reaches the internals the fuzzers drive.
const ALLOWED: &[(&str, &[&str])] = &[
    ("protocol", &[]),
    ("metrics", &[]),
    ("auth", &["protocol"]),
    ("store", &["protocol", "metrics"]),
    ("router", &["protocol", "store", "auth", "metrics"]),
    (
        "transport",
        &["protocol", "store", "auth", "router", "metrics"],
    ),
    ("process", &["protocol", "router", "transport"]),
    ("client", &["protocol", "transport"]),
    ("gateway", &["protocol", "auth", "client", "transport"]),
    (
        "server",
        &[
            "protocol",
            "auth",
            "store",
            "router",
            "transport",
            "process",
            "metrics",
            "gateway",
        ],
    ),
    (
        "cli",
        &[
            "protocol",
            "auth",
            "store",
            "router",
            "transport",
            "process",
            "client",
            "server",
            "metrics",
            "gateway",
        ],
    ),
];

/// Root files that may import anything.
const ROOTS: &[&str] = &["lib.rs", "main.rs", "fuzzing.rs"];

/// Root files every layer may import, which import nothing of ours (not in [`ALLOWED`]).
const BASE: &[&str] = &["sync.rs"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`, relative to `src/`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(src()).unwrap().to_path_buf());
        }
    }
}

/// The module path of a file: `router/events/log.rs` → `[router, events, log]`,
/// `router/mod.rs` → `[router]`, `lib.rs` → `[]`.
fn module_of(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> = file
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" && stem != "main" {
        parts.push(stem.to_owned());
    }
    parts
}

/// Source text with comments, string and char literals blanked out (same length, so byte
/// offsets still give line numbers).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = text[i..].find('\n').map_or(b.len(), |n| i + n);
                blank(&mut out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = text[i + 2..].find("*/").map_or(b.len(), |n| i + 2 + n + 2);
                blank(&mut out, i, end);
                i = end;
            }
            b'r' if (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')) =>
            {
                // Raw string r"…" or r#"…"#.
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    i += 1;
                    continue;
                }
                let close = format!("\"{}", "#".repeat(hashes));
                let end = text[j + 1..]
                    .find(&close)
                    .map_or(b.len(), |n| j + 1 + n + close.len());
                blank(&mut out, i, end);
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    if b[j] == b'\\' {
                        j += 1;
                    }
                    j += 1;
                }
                blank(&mut out, i, (j + 1).min(b.len()));
                i = j + 1;
            }
            b'\'' => {
                // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): only blank the former.
                let rest = &text[i + 1..];
                let len = if rest.starts_with('\\') {
                    rest.find('\'').map(|n| n + 1)
                } else {
                    rest.chars()
                        .next()
                        .filter(|_| rest.chars().nth(1) == Some('\''))
                        .map(|c| c.len_utf8() + 1)
                };
                match len {
                    Some(n) => {
                        blank(&mut out, i, i + 1 + n);
                        i += 1 + n;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out).unwrap()
}

/// Expands a `use` tree (`a::{b, c::{d, e as f}}`) into full paths (renames dropped).
fn expand(tree: &str) -> Vec<String> {
    // One space between words, none around punctuation: `a::{b, c as d}` → `a::{b,c as d}`.
    let words: Vec<&str> = tree.split_whitespace().collect();
    let mut t = words.join(" ");
    for p in ["::", "{", "}", ","] {
        t = t.replace(&format!(" {p}"), p).replace(&format!("{p} "), p);
    }
    let mut out = Vec::new();
    fn go(prefix: &str, t: &str, out: &mut Vec<String>) {
        if let Some(open) = t.find('{') {
            let head = &t[..open];
            let body = &t[open + 1..t.rfind('}').unwrap_or(t.len())];
            let mut depth = 0;
            let mut start = 0;
            let mut items = Vec::new();
            for (i, c) in body.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(&body[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            items.push(&body[start..]);
            for item in items.into_iter().filter(|i| !i.is_empty()) {
                go(&format!("{prefix}{head}"), item, out);
            }
        } else {
            let t = t.split(" as ").next().unwrap_or(t);
            out.push(format!("{prefix}{t}"));
        }
    }
    go("", &t, &mut out);
    out
}

/// One path a file names, and where.
struct Named {
    path: Vec<String>,
    /// Inline modules (`mod tests { ... }`) the path sits in, outermost first.
    inline: Vec<String>,
    line: usize,
    text: String,
}

/// The inline modules of a file: `(name, body start, body end)` byte ranges.
fn inline_modules(code: &str) -> Vec<(String, usize, usize)> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(n) = code[at..].find("mod ") {
        let start = at + n;
        at = start + 4;
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        let rest = &code[start + 4..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after = rest[name.len()..].trim_start();
        if name.is_empty() || !after.starts_with('{') {
            continue;
        }
        let open = start + 4 + name.len() + (rest.len() - name.len() - after.len());
        let mut depth = 0;
        let mut close = bytes.len();
        for (i, b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((name, open, close));
    }
    out
}

/// The paths a file names: `use` trees and inline `crate::`/`super::`/`self::` paths, and
/// paths that start with the name of one of the file's own child modules (`children`: in a
/// `mod.rs`, `use driver::Command` names the child `driver`), which are rewritten as
/// `self::…`.
fn named_paths(code: &str, children: &[String]) -> Vec<Named> {
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mods = inline_modules(code);
    let inline_at = |at: usize| -> Vec<String> {
        mods.iter()
            .filter(|(_, open, close)| *open < at && at < *close)
            .map(|(name, _, _)| name.clone())
            .collect()
    };
    let mut out = Vec::new();
    let mut use_spans = Vec::new();
    // `use` trees (possibly `pub use`, `pub(crate) use`), up to the semicolon.
    let mut at = 0;
    while let Some(n) = code[at..].find("use ") {
        let start = at + n;
        at = start + 4;
        let before = code[..start].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(end) = code[start..].find(';') else {
            break;
        };
        use_spans.push((start, start + end));
        let tree = &code[start + 4..start + end];
        at = start + end;
        let first = tree
            .trim_start()
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("");
        if !(first == "crate"
            || first == "super"
            || first == "self"
            || children.iter().any(|c| c == first))
        {
            continue;
        }
        for p in expand(tree) {
            let mut path: Vec<String> = p.split("::").map(str::to_owned).collect();
            if children.iter().any(|c| *c == path[0]) {
                path.insert(0, "self".to_owned());
            }
            out.push(Named {
                path,
                inline: inline_at(start),
                line: line_of(start),
                text: format!("use {};", tree.trim()),
            });
        }
    }
    // Paths in code.
    let bytes = code.as_bytes();
    let child_roots: Vec<String> = children.iter().map(|c| format!("{c}::")).collect();
    let roots: Vec<&str> = ["crate::", "super::", "self::"]
        .into_iter()
        .chain(child_roots.iter().map(String::as_str))
        .collect();
    for root in roots {
        let mut at = 0;
        while let Some(n) = code[at..].find(root) {
            let start = at + n;
            at = start + root.len();
            if start > 0
                && (bytes[start - 1].is_ascii_alphanumeric()
                    || bytes[start - 1] == b'_'
                    || bytes[start - 1] == b':')
            {
                continue;
            }
            if use_spans.iter().any(|(a, b)| *a <= start && start < *b) {
                continue;
            }
            let mut end = start;
            while end < bytes.len()
                && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_' || bytes[end] == b':')
            {
                end += 1;
            }
            let path = code[start..end].trim_end_matches(':');
            let mut segs: Vec<String> = path.split("::").map(str::to_owned).collect();
            if !matches!(segs[0].as_str(), "crate" | "super" | "self") {
                segs.insert(0, "self".to_owned());
            }
            out.push(Named {
                path: segs,
                inline: inline_at(start),
                line: line_of(start),
                text: path.to_owned(),
            });
        }
    }
    out
}

/// The file (relative to `src/`) that defines the item `path` names, seen from `module`.
fn resolve(
    module: &[String],
    path: &[String],
    modules: &HashMap<Vec<String>, PathBuf>,
) -> Option<PathBuf> {
    let mut abs: Vec<String> = Vec::new();
    let mut rest = path;
    match path.first().map(String::as_str) {
        Some("crate") => rest = &path[1..],
        Some("super") | Some("self") => {
            abs = module.to_vec();
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "super" => {
                        abs.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    abs.extend(rest.iter().cloned());
    // The longest prefix that is a module.
    for len in (0..=abs.len()).rev() {
        if let Some(file) = modules.get(&abs[..len]) {
            return Some(file.clone());
        }
    }
    None
}

/// The layer of a file: its top-level folder, or the root file's name (`lib.rs`, ...).
fn layer(file: &Path) -> String {
    file.iter().next().unwrap().to_string_lossy().into_owned()
}

fn may_import(from: &str, to: &str) -> bool {
    if from == to || ROOTS.contains(&from) || BASE.contains(&to) {
        return true;
    }
    ALLOWED
        .iter()
        .find(|(l, _)| *l == from)
        .is_some_and(|(_, ok)| ok.contains(&to))
}

struct Edge {
    from: PathBuf,
    to: PathBuf,
    line: usize,
    text: String,
}

fn edges() -> Vec<Edge> {
    let mut all = Vec::new();
    files(&src(), &mut all);
    let modules: HashMap<Vec<String>, PathBuf> =
        all.iter().map(|f| (module_of(f), f.clone())).collect();
    let mut out = Vec::new();
    for file in &all {
        let text = std::fs::read_to_string(src().join(file)).unwrap();
        let code = code_only(&text);
        let module = module_of(file);
        // Only a `mod.rs` (or a root file) has child modules in files.
        let children: Vec<String> = if file.ends_with("mod.rs") || file.iter().count() == 1 {
            modules
                .keys()
                .filter(|m| m.len() == module.len() + 1 && m.starts_with(&module))
                .map(|m| m[module.len()].clone())
                .collect()
        } else {
            Vec::new()
        };
        for named in named_paths(&code, &children) {
            let mut here = module.clone();
            here.extend(named.inline.iter().cloned());
            let Some(to) = resolve(&here, &named.path, &modules) else {
                continue;
            };
            if &to == file {
                continue;
            }
            // A child module naming its own submodule through `self::` is not a dependency on
            // the parent; a parent declaring children is not an import.
            out.push(Edge {
                from: file.clone(),
                to,
                line: named.line,
                text: named.text,
            });
        }
    }
    out
}

#[test]
fn every_layer_imports_only_the_layers_below_it() {
    let mut bad = Vec::new();
    for e in edges() {
        let (from, to) = (layer(&e.from), layer(&e.to));
        if !may_import(&from, &to) {
            bad.push(format!(
                "src/{}:{}: {from} may not import {to}: {}",
                e.from.display(),
                e.line,
                e.text
            ));
        }
    }
    bad.sort();
    bad.dedup();
    assert!(
        bad.is_empty(),
        "layering broken ({} uses):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn no_file_imports_in_a_circle() {
    let mut graph: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    let mut why: HashMap<(PathBuf, PathBuf), String> = HashMap::new();
    for e in edges() {
        // A parent module that re-exports or names its children does not depend on them in a
        // way that matters for layering, but a child naming its parent does: both count, so
        // parents must not name the children that name them back.
        graph
            .entry(e.from.clone())
            .or_default()
            .insert(e.to.clone());
        why.entry((e.from.clone(), e.to.clone()))
            .or_insert_with(|| format!("src/{}:{}: {}", e.from.display(), e.line, e.text));
    }
    // Tarjan's strongly connected components.
    #[derive(Default)]
    struct Tarjan {
        next: usize,
        index: HashMap<PathBuf, usize>,
        low: HashMap<PathBuf, usize>,
        stack: Vec<PathBuf>,
        on_stack: BTreeSet<PathBuf>,
        cycles: Vec<Vec<PathBuf>>,
    }
    impl Tarjan {
        fn strong(&mut self, v: &PathBuf, graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) {
            self.index.insert(v.clone(), self.next);
            self.low.insert(v.clone(), self.next);
            self.next += 1;
            self.stack.push(v.clone());
            self.on_stack.insert(v.clone());
            for w in graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.strong(w, graph);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on_stack.remove(&w);
                    let done = &w == v;
                    component.push(w);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.cycles.push(component);
                }
            }
        }
    }
    let mut t = Tarjan::default();
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            t.strong(v, &graph);
        }
    }
    let cycles = t.cycles;
    let report: Vec<String> = cycles
        .iter()
        .map(|c| {
            let set: BTreeSet<&PathBuf> = c.iter().collect();
            let mut lines = vec![format!(
                "cycle: {}",
                c.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )];
            for a in c {
                for b in graph.get(a).into_iter().flatten() {
                    if set.contains(b) {
                        lines.push(format!("  {}", why[&(a.clone(), b.clone())]));
                    }
                }
            }
            lines.join("\n")
        })
        .collect();
    assert!(
        report.is_empty(),
        "{} import cycles:\n{}",
        report.len(),
        report.join("\n")
    );
}

#[test]
fn the_checker_reads_use_trees_and_ignores_comments_and_strings() {
    assert_eq!(
        expand("crate::a::{b, c::{d, e as f}, g}"),
        [
            "crate::a::b",
            "crate::a::c::d",
            "crate::a::c::e",
            "crate::a::g"
        ]
    );
    let code = code_only("let s = \"crate::x::y\"; // use crate::z;\nuse super::w; let c = '\"';");
    let paths: Vec<String> = named_paths(&code, &[])
        .into_iter()
        .map(|n| n.path.join("::"))
        .collect();
    assert_eq!(paths, ["super::w"]);
    let mut modules = HashMap::new();
    modules.insert(vec!["router".to_owned()], PathBuf::from("router/mod.rs"));
    modules.insert(
        vec!["router".to_owned(), "registry".to_owned()],
        PathBuf::from("router/registry.rs"),
    );
    let from = vec!["router".to_owned(), "agent_ops".to_owned()];
    let p = |s: &str| s.split("::").map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        resolve(&from, &p("super::registry::Registry"), &modules),
        Some(PathBuf::from("router/registry.rs"))
    );
    assert_eq!(
        resolve(&from, &p("super::Router"), &modules),
        Some(PathBuf::from("router/mod.rs"))
    );
    assert!(may_import("router", "store"));
    assert!(!may_import("router", "process"));
    assert!(!may_import("store", "router"));
    assert!(may_import("main.rs", "cli"));
}
