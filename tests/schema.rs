//! Fails when `schema/` is stale: every generated file must exist with identical content, and
//! no file may linger that the generator no longer produces.
//!
//! Regenerate with `cargo run -- schema --out schema`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn committed_files(root: &Path) -> BTreeSet<String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("schema/ is readable") {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, root, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root");
                out.insert(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

#[test]
fn schema_directory_matches_the_protocol_types() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schema");
    let generated = map_router::protocol::schema::generate_all();
    let mut problems = Vec::new();
    for (name, text) in &generated {
        match std::fs::read_to_string(root.join(name)) {
            Ok(on_disk) if &on_disk == text => {}
            Ok(_) => problems.push(format!("{name} differs")),
            Err(_) => problems.push(format!("{name} is missing")),
        }
    }
    let expected: BTreeSet<String> = generated.keys().cloned().collect();
    for extra in committed_files(&root).difference(&expected) {
        problems.push(format!("{extra} is not generated any more"));
    }
    assert!(
        problems.is_empty(),
        "schema/ is stale: {}\nregenerate with `cargo run -- schema --out schema`",
        problems.join("; ")
    );
}

#[test]
fn generated_schemas_are_json_objects_with_a_title() {
    for (name, text) in map_router::protocol::schema::generate_all() {
        let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert!(
            v.get("title").and_then(|t| t.as_str()).is_some(),
            "{name} has no title"
        );
    }
}
