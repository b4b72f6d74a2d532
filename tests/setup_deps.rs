//! The programs the test suites start and the list `scripts/setup.sh` installs
//! (`scripts/test-deps.txt`) are the same: a test that starts a program nobody installs fails
//! here, not minutes into a run on a fresh machine, and a line that no test needs any more is
//! named too.
//!
//! What counts as starting a program, by file kind:
//! - Rust (`tests/**/*.rs`): `Command::new("X")`, a spawn's `"program": "X"`, a CLI agent's
//!   `"--", "X"`, and a `("name", "X", "examples/...")` row of the stdio-children table;
//! - JavaScript (`tests/**/*.mjs`): `spawn('X'`, a TOML `program = "X"`, a `/usr/bin/X` path;
//! - Python (`tests/**/*.py`): `Popen(["X"`;
//! - shell (`scripts/test.sh`, `scripts/setup.sh`, `scripts/a2a_py.sh`, `scripts/aip_py.sh`,
//!   `scripts/lib.sh` (which they source: its functions are not programs), `tests/**/*.sh`,
//!   and the
//!   README's and docs' blocks that tests run, `doc: test` and `doc: ci`): the first word of every
//!   simple command, builtins and keywords aside.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Program name → the first place that starts it.
type Found = BTreeMap<String, String>;

use common::docs::{blocks, documents, root};

/// Shell builtins and keywords: never a program to install.
const SHELL_WORDS: &[&str] = &[
    "!", ".", ":", "[", "[[", "]]", "{", "}", "break", "case", "cd", "command", "continue", "do",
    "done", "echo", "elif", "else", "esac", "eval", "exec", "exit", "export", "false", "fi", "for",
    "function", "if", "in", "local", "printf", "read", "return", "set", "shift", "source", "test",
    "then", "time", "trap", "true", "until", "wait", "while",
];

/// Words that start a command but run another: the program is the word after them (and after
/// their own arguments: `timeout 60 X`).
const PREFIXES: &[&str] = &["timeout", "exec", "nohup", "sudo", "env"];

/// The manifest: name → kind (`program`, `python`, `essential`).
fn manifest() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root().join("scripts/test-deps.txt")).expect("manifest");
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut words = line.split_whitespace();
        let kind = words.next().unwrap().to_owned();
        let names = words.next().unwrap_or_else(|| panic!("no name: {line}"));
        assert!(words.next().is_some(), "no package column: {line}");
        for name in names.split(',') {
            out.insert(name.to_owned(), kind.clone());
        }
    }
    out
}

/// Every file under `dir` (recursively) whose name ends with `ext`, skipping installed
/// packages and virtual environments.
fn files(dir: &Path, ext: &str, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("readable").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "node_modules" && !name.starts_with('.') && name != "target" {
                files(&path, ext, out);
            }
        } else if name.ends_with(ext) {
            out.push(path);
        }
    }
}

/// The quoted word right after each occurrence of `prefix` (`Command::new("X"`, ...): `X` when
/// it is a bare program name (not a path or a variable).
fn after(text: &str, prefix: &str, place: &str, found: &mut Found) {
    for (at, _) in text.match_indices(prefix) {
        let rest = text[at + prefix.len()..].trim_start();
        let Some(quote) = rest.chars().next().filter(|c| *c == '"' || *c == '\'') else {
            continue;
        };
        let word: String = rest[1..].chars().take_while(|c| *c != quote).collect();
        if is_program_name(&word) {
            found.entry(word).or_insert_with(|| place.to_owned());
        }
    }
}

fn is_program_name(word: &str) -> bool {
    !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && word.chars().next().unwrap().is_ascii_alphabetic()
}

/// The programs a shell text runs: the first word of each simple command. A small tokenizer:
/// quotes, `$( )`, pipes, lists, subshells, line continuations and here-documents.
/// `library` names the functions of the shell files the scripts source (`scripts/lib.sh`):
/// not programs either.
fn shell_programs(text: &str, place: &str, library: &[String], found: &mut Found) {
    let text = text.replace("\\\n", " ");
    // Functions the text defines (`say() {`) are not programs.
    let mut functions = shell_functions(&text);
    functions.extend_from_slice(library);
    let mut heredoc: Option<String> = None;
    for line in text.lines() {
        if let Some(end) = &heredoc {
            if line.trim() == end {
                heredoc = None;
            }
            continue;
        }
        if let Some(at) = line.find("<<") {
            let tag: String = line[at + 2..]
                .trim_start_matches(['-', '~'])
                .trim()
                .trim_matches(['\'', '"'])
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !tag.is_empty() {
                heredoc = Some(tag);
            }
        }
        for segment in segments(line) {
            if let Some(program) = first_program(&segment).filter(|p| !functions.contains(p)) {
                found.entry(program).or_insert_with(|| place.to_owned());
            }
        }
    }
}

/// The functions a shell text defines (`say() {`).
fn shell_functions(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            l.trim()
                .split_once("() {")
                .map(|(name, _)| name.trim().to_owned())
        })
        .collect()
}

/// Splits one line into simple commands (the text of each, quotes kept).
fn segments(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut single = false;
    let mut double = false;
    let mut depth = 0usize;
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let cur = out.last_mut().unwrap();
        if single {
            single = c != '\'';
            cur.push(c);
        } else if c == '\\' {
            cur.push(c);
            if let Some(&n) = chars.get(i + 1) {
                cur.push(n);
                i += 1;
            }
        } else if c == '$' && chars.get(i + 1) == Some(&'(') && chars.get(i + 2) == Some(&'(') {
            // Arithmetic, `$(( ... ))`: no command inside.
            while i + 1 < chars.len() && !(chars[i] == ')' && chars[i + 1] == ')') {
                i += 1;
            }
            i += 1;
        } else if c == '$' && chars.get(i + 1) == Some(&'(') {
            depth += 1;
            out.push(String::new());
            i += 1;
        } else if double {
            double = c != '"';
            cur.push(c);
        } else if c == '\'' {
            single = true;
            cur.push(c);
        } else if c == '"' {
            double = true;
            cur.push(c);
        } else if c == '#' && (cur.is_empty() || cur.ends_with(' ')) {
            break;
        } else if c == ')' && depth == 0 {
            // A `case` pattern (`pattern)`), not a command.
            cur.clear();
        } else if matches!(c, '|' | ';' | '&' | '(' | ')' | '`') {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            out.push(String::new());
        } else {
            cur.push(c);
        }
        i += 1;
    }
    out
}

/// The program a simple command runs, if it names one.
fn first_program(segment: &str) -> Option<String> {
    let mut words = segment.split_whitespace().peekable();
    // Assignments and redirections before the command.
    while let Some(w) = words.peek() {
        let assignment = w.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        if assignment || w.starts_with('>') || w.starts_with('<') || w.starts_with("2>") {
            words.next();
        } else {
            break;
        }
    }
    let mut word = words.next()?;
    // `for x in ...`, `case x in`: no command on this part.
    if matches!(word, "for" | "case") {
        return None;
    }
    while matches!(
        word,
        "then" | "do" | "else" | "elif" | "if" | "while" | "until" | "!" | "time"
    ) {
        word = words.next()?;
    }
    if word == "command" {
        // `command -v X` asks for X: X is needed.
        return words
            .find(|w| !w.starts_with('-'))
            .filter(|w| is_program_name(w))
            .map(str::to_owned);
    }
    if PREFIXES.contains(&word) {
        let prefix = word;
        word = words.find(|w| {
            !(w.starts_with('-') || prefix == "timeout" && w.chars().all(|c| c.is_ascii_digit()))
        })?;
    }
    if word == "python3" && segment.contains("-m venv") {
        return Some("venv".to_owned());
    }
    (is_program_name(word) && !SHELL_WORDS.contains(&word)).then(|| word.to_owned())
}

fn relative(file: &Path) -> String {
    file.strip_prefix(root())
        .unwrap_or(file)
        .display()
        .to_string()
}

/// Every program the suites start, with the first place that starts it.
fn started() -> Found {
    let root = root();
    let mut found = Found::new();
    let mut rust = Vec::new();
    files(&root.join("tests"), ".rs", &mut rust);
    for file in rust {
        let text = std::fs::read_to_string(&file).unwrap();
        if file.ends_with("setup_deps.rs") {
            continue;
        }
        let place = relative(&file);
        let place = place.as_str();
        after(&text, "Command::new(", place, &mut found);
        after(&text, "\"program\":", place, &mut found);
        for (at, _) in text.match_indices("\"--\",") {
            after(&text[at..], "\"--\",", place, &mut found);
        }
        // The stdio-children table: ("py", "python3", "examples/stdio-agent/agent.py").
        for line in text.lines() {
            let cells: Vec<&str> = line
                .trim()
                .trim_start_matches('(')
                .split("\", \"")
                .collect();
            if cells.len() == 3 && cells[2].starts_with("examples/") {
                found
                    .entry(cells[1].to_owned())
                    .or_insert_with(|| place.to_owned());
            }
        }
    }
    let mut js = Vec::new();
    files(&root.join("tests"), ".mjs", &mut js);
    for file in js {
        let text = std::fs::read_to_string(&file).unwrap();
        let place = relative(&file);
        after(&text, "spawn(", &place, &mut found);
        after(&text, "program =", &place, &mut found);
        for (at, _) in text.match_indices("'/usr/bin/") {
            let name: String = text[at + 10..].chars().take_while(|c| *c != '\'').collect();
            found.entry(name).or_insert_with(|| place.clone());
        }
    }
    let mut py = Vec::new();
    files(&root.join("tests"), ".py", &mut py);
    for file in py {
        let text = std::fs::read_to_string(&file).unwrap();
        let place = relative(&file);
        after(&text, "Popen([", &place, &mut found);
        after(&text, "Popen(\n            [", &place, &mut found);
    }
    // The helpers the scripts source: their programs count, their functions are not programs.
    let lib = root.join("scripts/lib.sh");
    let library = shell_functions(&std::fs::read_to_string(&lib).unwrap());
    let mut sh = vec![
        lib,
        root.join("scripts/test.sh"),
        root.join("scripts/setup.sh"),
        root.join("scripts/a2a_py.sh"),
        root.join("scripts/aip_py.sh"),
    ];
    files(&root.join("tests"), ".sh", &mut sh);
    for file in sh {
        shell_programs(
            &std::fs::read_to_string(&file).unwrap(),
            &relative(&file),
            &library,
            &mut found,
        );
    }
    for doc in documents() {
        for block in blocks(&doc) {
            let run = block
                .marker
                .as_deref()
                .is_some_and(|m| m.starts_with("test ") || m == "ci");
            if run && matches!(block.lang.as_str(), "sh" | "bash" | "") {
                let place = format!("{}:{}", block.file, block.line);
                shell_programs(&block.body, &place, &library, &mut found);
            }
        }
    }
    // The binary under test is built, not installed.
    found.remove("map-router");
    found
}

#[test]
fn every_program_the_tests_start_is_installed_by_setup() {
    let listed = manifest();
    let started = started();
    let unlisted: Vec<String> = started
        .iter()
        .filter(|(p, _)| !listed.contains_key(*p))
        .map(|(p, place)| format!("{p} ({place})"))
        .collect();
    assert!(
        unlisted.is_empty(),
        "the tests start {unlisted:?}, which scripts/test-deps.txt does not list: add a line \
         (kind, name, Debian package, what needs it) so that scripts/setup.sh installs it"
    );
    let unused: Vec<&String> = listed
        .keys()
        .filter(|p| !started.contains_key(*p))
        .collect();
    assert!(
        unused.is_empty(),
        "scripts/test-deps.txt lists {unused:?}, which no test starts any more: remove the line"
    );
}

#[test]
fn the_scanner_finds_programs_in_each_kind_of_file() {
    // The tokenizer itself: pipes, substitutions, prefixes, heredocs, builtins.
    let mut found = Found::new();
    shell_programs(
        "X=$(curl -s \"$U\" | tr -d '\\r')\nif ! command -v jq >/dev/null; then timeout 5 node a.mjs; fi\n\
         cat <<EOF\nnotaprogram here\nEOF\necho done # comment words\n(cd d && npm ci) >&2\n\
         python3 -m venv v\nfor x in a b; do sleep 1; done\nurl=$(router_url \"$log\")\n",
        "test",
        &["router_url".to_owned()],
        &mut found,
    );
    let found: BTreeSet<String> = found.into_keys().collect();
    let want: BTreeSet<String> = ["curl", "tr", "jq", "node", "cat", "npm", "venv", "sleep"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(found, want);
}
