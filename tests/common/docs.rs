//! The fenced code blocks of the README and `docs/`, and the markers that say how each one is
//! checked (`<!-- doc: ... -->` on the line before its fence):
//!
//! - `<!-- doc: test NAME -->`: run by a test, which takes the blocks with [`doc_script`];
//! - `<!-- doc: file PATH -->`: the block is the whole of that file of the repository;
//! - `<!-- doc: config -->`: a configuration the router accepts (every ```toml block is one,
//!   marked or not);
//! - `<!-- doc: ci -->`: a command `.ci/run` runs (the README's test command);
//! - `<!-- doc: illustrative -->`: shows a shape or an abridged program; not run.
//!
//! `tests/docs_examples.rs` checks that every block has one.

use std::path::{Path, PathBuf};

/// One fenced block.
#[derive(Debug, Clone)]
pub struct Block {
    /// The Markdown file, relative to the repository.
    pub file: String,
    /// The line of its opening fence (1-based).
    pub line: usize,
    /// The info string's first word (`sh`, `toml`, ...), possibly empty.
    pub lang: String,
    /// What the `<!-- doc: ... -->` line before the fence says, if there is one.
    pub marker: Option<String>,
    /// The text between the fences.
    pub body: String,
}

/// The repository's root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The README and every `docs/*.md` (not `docs/spec/`, our summary of the specification, which
/// quotes the spec's own shapes).
pub fn documents() -> Vec<String> {
    let mut files = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("readable docs/").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The fenced blocks of `file` (relative to the repository).
pub fn blocks(file: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(root().join(file))
        .unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_start();
        if let Some(info) = line.strip_prefix("```") {
            let indent = lines[i].len() - line.len();
            let marker = (0..i)
                .rev()
                .map(|j| lines[j].trim())
                .find(|l| !l.is_empty())
                .and_then(|l| l.strip_prefix("<!-- doc:"))
                .and_then(|l| l.strip_suffix("-->"))
                .map(|m| m.trim().to_owned());
            let start = i + 1;
            let mut body = String::new();
            i += 1;
            while i < lines.len() && !lines[i].trim_start().starts_with("```") {
                // Blocks inside list items are indented; the indent is not part of the text.
                let l = lines[i];
                let cut = l.len() - l.trim_start().len();
                body.push_str(&l[cut.min(indent)..]);
                body.push('\n');
                i += 1;
            }
            assert!(i < lines.len(), "{file}:{start}: unclosed code block");
            out.push(Block {
                file: file.to_owned(),
                line: start,
                lang: info.split_whitespace().next().unwrap_or("").to_owned(),
                marker,
                body,
            });
        }
        i += 1;
    }
    out
}

/// The blocks of `file` marked `<!-- doc: test NAME -->`, in order, joined into one script.
///
/// # Panics
/// When there is none: the test would check nothing.
pub fn doc_script(file: &str, name: &str) -> String {
    let want = format!("test {name}");
    let parts: Vec<String> = blocks(file)
        .into_iter()
        .filter(|b| b.marker.as_deref() == Some(want.as_str()))
        .map(|b| b.body)
        .collect();
    assert!(
        !parts.is_empty(),
        "{file} has no block marked <!-- doc: test {name} -->"
    );
    parts.join("\n")
}

/// Whether `path` (relative to the repository) exists.
pub fn exists(path: &str) -> bool {
    Path::new(&root()).join(path).exists()
}
