//! The contracts' checked-in bytecode (`contracts/build/`) is what their
//! sources (`contracts/*.sol`) compile to: solc from the npm registry
//! (tools/chain, installed by `.ci/run`) compiles them again with the
//! settings of `tools/chain/compile.js`, and every file must match.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn listing(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_checked_in_bytecode_is_what_the_sources_compile_to() {
    let solc = root().join("tools/chain/node_modules/solc");
    assert!(
        solc.is_dir(),
        "solc is not installed: `npm ci --prefix tools/chain` (.ci/run does it) puts it in {}",
        solc.display()
    );
    let out = tempfile::tempdir().unwrap();
    let compiled = Command::new("node")
        .arg(root().join("tools/chain/compile.js"))
        .arg(out.path())
        .output()
        .expect("node runs (apt-get install nodejs; .ci/run installs it)");
    assert!(
        compiled.status.success(),
        "compiling the contracts failed: {}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let fresh = listing(out.path());
    let checked_in = listing(&root().join("contracts/build"));
    let names = |l: &[(String, String)]| l.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&fresh), names(&checked_in), "the same contracts");
    assert_eq!(
        names(&checked_in),
        ["NoReturnToken.bin", "PayMany.bin", "TestToken.bin"],
        "the test tokens and the batch contract"
    );
    for ((name, fresh), (_, kept)) in fresh.iter().zip(&checked_in) {
        assert_eq!(
            fresh, kept,
            "{name} differs from its source: run `node tools/chain/compile.js` and commit contracts/build"
        );
    }
}
