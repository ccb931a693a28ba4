//! The engine's face: the names its root exports (`src/lib.rs`: its `pub
//! use` items and `pub mod` modules) are the reviewed list in
//! `tests/face.txt`, so the face grows or shrinks only by a diff of that
//! list. After a deliberate change, write the list again with
//! `SETTLED_WRITE_FACE=1 cargo test -p settled-engine --test face`.

use std::collections::BTreeSet;

const LIB: &str = include_str!("../src/lib.rs");
const LIST: &str = "tests/face.txt";

/// The root's names: every item of a `pub use` (a path's last segment, or
/// each name in its braces) and every `pub mod`, sorted.
fn root_names(lib: &str) -> BTreeSet<String> {
    let code: String = lib
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = BTreeSet::new();
    for statement in code.split(';') {
        let statement = statement.trim();
        if let Some(module) = statement.strip_prefix("pub mod ") {
            names.insert(format!("mod {}", module.trim()));
        } else if let Some(path) = statement.strip_prefix("pub use ") {
            let items = match path.split_once('{') {
                Some((_, inner)) => inner.trim_end_matches('}').to_string(),
                None => path.rsplit("::").next().unwrap_or(path).to_string(),
            };
            names.extend(
                items
                    .split(',')
                    .map(str::trim)
                    .filter(|name| !name.is_empty())
                    .map(String::from),
            );
        }
    }
    names
}

#[test]
fn the_engine_roots_names_are_the_reviewed_list() {
    let names = root_names(LIB);
    let written: String = names.iter().map(|name| format!("{name}\n")).collect();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(LIST);
    if std::env::var_os("SETTLED_WRITE_FACE").is_some() {
        std::fs::write(&path, &written).unwrap();
    }
    let reviewed = std::fs::read_to_string(&path).unwrap_or_default();
    let reviewed: BTreeSet<String> = reviewed.lines().map(String::from).collect();
    let added: Vec<_> = names.difference(&reviewed).collect();
    let removed: Vec<_> = reviewed.difference(&names).collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "the engine's root changed: added {added:?}, removed {removed:?}; review it, then write {LIST} again \
         (SETTLED_WRITE_FACE=1)"
    );
}

#[test]
fn the_list_is_read_from_every_form_of_pub_use() {
    let lib =
        "pub mod raw;\n// pub use commented::Out;\npub use a::b::One;\npub use c::{\n    Two, three,\n};\nmod private;";
    let names: Vec<String> = root_names(lib).into_iter().collect();
    assert_eq!(names, ["One", "Two", "mod raw", "three"]);
}
