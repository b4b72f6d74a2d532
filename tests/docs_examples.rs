//! Every TOML example in the README and `docs/` is a configuration the router accepts, so
//! the documentation cannot drift from the config schema (unknown keys are refused).

use std::path::Path;

use map_router::server::config::Config;

/// The fenced ```toml blocks of a Markdown file, with the line each starts on.
fn toml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (n, line) in text.lines().enumerate() {
        match current.as_mut() {
            None if line.trim_start().starts_with("```toml") => {
                current = Some((n + 1, String::new()))
            }
            None => {}
            Some(_) if line.trim_start().starts_with("```") => blocks.extend(current.take()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    assert!(current.is_none(), "an unclosed ```toml block");
    blocks
}

#[test]
fn every_documented_config_example_is_accepted() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (line, body) in toml_blocks(&text) {
            let config = Config::from_toml(&body)
                .unwrap_or_else(|e| panic!("{}:{line}: {e}", file.display()));
            config
                .validate()
                .unwrap_or_else(|e| panic!("{}:{line}: {e}", file.display()));
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "only {checked} examples found: did the docs move?"
    );
}
