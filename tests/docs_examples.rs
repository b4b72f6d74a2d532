//! The code blocks of the README and `docs/` are true:
//!
//! - every TOML block is a configuration the router accepts (unknown keys are refused), so the
//!   documentation cannot drift from the config schema;
//! - every other block says how it is checked (`tests/common/docs.rs`): run by a named test
//!   (`<!-- doc: test NAME -->`, and that test exists), the whole of a file of the repository
//!   (`<!-- doc: file PATH -->`, compared byte for byte), run by CI itself (`<!-- doc: ci -->`:
//!   `.ci/run` runs it), or explicitly illustrative.

mod common;

use common::docs::{blocks, documents, root, Block};
use map_router::server::config::Config;

fn where_(b: &Block) -> String {
    format!("{}:{}", b.file, b.line)
}

#[test]
fn every_documented_config_example_is_accepted() {
    let mut checked = 0;
    for file in documents() {
        for b in blocks(&file).into_iter().filter(|b| b.lang == "toml") {
            if b.marker.as_deref() == Some("illustrative") {
                continue;
            }
            let config =
                Config::from_toml(&b.body).unwrap_or_else(|e| panic!("{}: {e}", where_(&b)));
            config
                .validate()
                .unwrap_or_else(|e| panic!("{}: {e}", where_(&b)));
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "only {checked} examples found: did the docs move?"
    );
}

#[test]
fn every_code_block_is_run_compared_or_marked_illustrative() {
    let tests: String = std::fs::read_dir(root().join("tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let mut problems = Vec::new();
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for file in documents() {
        for b in blocks(&file) {
            let marker = b.marker.clone().unwrap_or_default();
            let (kind, arg) = marker.split_once(' ').unwrap_or((marker.as_str(), ""));
            match kind {
                "illustrative" => *counts.entry("illustrative").or_default() += 1,
                "ci" => {
                    // A command CI itself runs (.ci/run, or the README's test command it calls).
                    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
                    if !b.body.lines().all(|l| ci.contains(l.trim())) {
                        problems.push(format!("{}: marked `ci` but .ci/run does not run it", where_(&b)));
                    }
                    *counts.entry("ci").or_default() += 1;
                }
                "config" | "" if b.lang == "toml" => *counts.entry("config").or_default() += 1,
                "test" => {
                    let call = format!("doc_script(\"{}\", \"{arg}\")", b.file);
                    if !tests.contains(&call) {
                        problems.push(format!(
                            "{}: marked `test {arg}` but no test calls {call}",
                            where_(&b)
                        ));
                    }
                    *counts.entry("run").or_default() += 1;
                }
                "file" => {
                    match std::fs::read_to_string(root().join(arg)) {
                        Ok(text) if text == b.body => {}
                        Ok(_) => problems.push(format!(
                            "{}: differs from {arg} (copy the file into the block)",
                            where_(&b)
                        )),
                        Err(e) => problems.push(format!("{}: {arg}: {e}", where_(&b))),
                    }
                    *counts.entry("file").or_default() += 1;
                }
                _ => problems.push(format!(
                    "{}: a ```{} block without <!-- doc: test NAME | file PATH | config | illustrative -->",
                    where_(&b),
                    b.lang
                )),
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} blocks:\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert!(counts.get("run").copied().unwrap_or(0) >= 3, "{counts:?}");
}
