//! The commands README.md and docs/*.md show are run as written, or say
//! that they are only illustrative: a doc's commands drift within a week of
//! parallel work otherwise (README's first command failed for weeks).
//!
//! The convention (docs/architecture.md, "Commands in the docs"): a fenced
//! block that shows commands carries, on the line right before its fence,
//! `<!-- tested: PATH::TEST -->` (the test that reads the block from the doc
//! and runs it), `<!-- tested: PATH -->` (a script that runs it, such as
//! `.ci/run`), or `<!-- illustrative: why -->`. A block shows commands when
//! its fence says a shell (`sh`, `bash`, `shell`, `console`, `zsh`), or when
//! its fence says nothing and a line of it is a prompt (`$ `) or starts with
//! `settled`, `curl` or `cargo`. Output, diagrams and data are fenced with
//! their language (`text`, `json`, `sql`, `toml`...), so they are never
//! taken for commands.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Fence languages whose blocks are commands.
const SHELL_LANGUAGES: &[&str] = &["sh", "bash", "shell", "console", "zsh"];
/// First words that make an unlabelled block a block of commands.
const COMMAND_WORDS: &[&str] = &["settled", "curl", "cargo"];
/// This file, as `tested:` markers name it.
const THIS_TEST: &str = "crates/cli/tests/e2e/docs.rs";

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// README.md and every docs/*.md, as paths from the root.
fn doc_files() -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// What the line before a fence says about its block.
#[derive(Debug, Clone, PartialEq)]
enum Marker {
    Illustrative,
    Tested(String),
}

/// A fenced block of a doc.
struct Block {
    file: String,
    /// The fence's line, counted from 1.
    line: usize,
    info: String,
    marker: Option<Marker>,
    body: Vec<String>,
}

/// The marker an HTML comment line holds, if it is one.
fn marker(line: &str) -> Option<Marker> {
    let inner = line.trim().strip_prefix("<!--")?.strip_suffix("-->")?.trim();
    if inner == "illustrative" || inner.starts_with("illustrative:") {
        return Some(Marker::Illustrative);
    }
    let target = inner.strip_prefix("tested:")?.trim();
    Some(Marker::Tested(target.to_string()))
}

/// The fenced blocks of `text` (fences of three or more backticks, indented
/// or not), and the lines of markers that stand before no fence.
fn blocks(file: &str, text: &str) -> (Vec<Block>, Vec<usize>) {
    let lines: Vec<&str> = text.lines().collect();
    let (mut found, mut dangling) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < lines.len() {
        let fence = lines[i].trim_start();
        if marker(lines[i]).is_some() && !lines.get(i + 1).is_some_and(|l| l.trim_start().starts_with("```")) {
            dangling.push(i + 1);
        }
        if !fence.starts_with("```") {
            i += 1;
            continue;
        }
        let ticks = fence.len() - fence.trim_start_matches('`').len();
        let close = (i + 1..lines.len())
            .find(|&j| {
                let l = lines[j].trim();
                l.len() >= ticks && l.chars().all(|c| c == '`')
            })
            .unwrap_or(lines.len());
        found.push(Block {
            file: file.to_string(),
            line: i + 1,
            info: fence[ticks..].trim().to_string(),
            marker: i.checked_sub(1).and_then(|p| marker(lines[p])),
            body: lines[i + 1..close].iter().map(|l| l.to_string()).collect(),
        });
        i = close + 1;
    }
    (found, dangling)
}

/// Every block of README.md and docs/*.md, and every dangling marker.
fn all_blocks() -> (Vec<Block>, Vec<String>) {
    let (mut all, mut dangling) = (Vec::new(), Vec::new());
    for file in doc_files() {
        let text = std::fs::read_to_string(root().join(&file)).unwrap();
        let (found, lines) = blocks(&file, &text);
        all.extend(found);
        dangling.extend(lines.into_iter().map(|line| format!("{file}:{line}")));
    }
    (all, dangling)
}

/// The first word of a command line, past `$ ` and `NAME=value` settings.
fn command_word(line: &str) -> &str {
    let line = line.trim_start();
    let line = line.strip_prefix("$ ").unwrap_or(line);
    line.split_whitespace()
        .find(|word| {
            let setting = word
                .split_once('=')
                .is_some_and(|(name, _)| !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_'));
            !setting
        })
        .unwrap_or("")
}

/// Whether a block shows commands, by the convention above.
fn shows_commands(block: &Block) -> bool {
    let language = block.info.split_whitespace().next().unwrap_or("");
    if !language.is_empty() {
        return SHELL_LANGUAGES.contains(&language);
    }
    block
        .body
        .iter()
        .any(|line| line.trim_start().starts_with("$ ") || COMMAND_WORDS.contains(&command_word(line)))
}

/// Why a `tested:` marker's target does not hold, if it does not: a test
/// must exist in the named file, a script must name the doc.
fn check_target(target: &str, doc: &str) -> Result<(), String> {
    let (path, test) = match target.split_once("::") {
        Some((path, test)) => (path, Some(test)),
        None => (target, None),
    };
    let text = std::fs::read_to_string(root().join(path))
        .map_err(|e| format!("it names {path}, which cannot be read: {e}"))?;
    match test {
        Some(test) if !text.contains(&format!("fn {test}(")) => Err(format!("{path} has no test `{test}`")),
        None if !text.contains(doc) => Err(format!("{path} does not name {doc}, so it does not run this block")),
        _ => Ok(()),
    }
}

/// Why a block fails the convention, if it does.
fn problem(block: &Block) -> Option<String> {
    match &block.marker {
        Some(Marker::Tested(target)) => check_target(target, &block.file)
            .err()
            .map(|why| format!("{}:{}: marked `tested: {target}`, but {why}", block.file, block.line)),
        Some(Marker::Illustrative) => None,
        None if shows_commands(block) => Some(format!(
            "{}:{}: a block of commands is neither run by a test nor marked illustrative: on the line \
             before its fence put `<!-- tested: PATH::TEST -->` (a test that reads and runs the block) or \
             `<!-- illustrative: why -->`; if it is output, fence it as ```text",
            block.file, block.line
        )),
        None => None,
    }
}

#[test]
fn every_command_block_in_the_docs_is_tested_or_marked_illustrative() {
    let (blocks, dangling) = all_blocks();
    assert!(
        blocks.iter().any(|b| b.file == "README.md"),
        "no block found in README.md"
    );
    let mut problems: Vec<String> = blocks.iter().filter_map(problem).collect();
    problems.extend(
        dangling
            .iter()
            .map(|at| format!("{at}: a `tested:` or `illustrative` marker stands before no fence")),
    );
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_convention_tells_commands_from_output_and_names_the_block() {
    let doc = "text\n\n```\n$ settled runs\n```\n\n```text\nsettled demo summary\n```\n\n<!-- illustrative: production hosts -->\n```sh\nsettled worker\n```\n\n<!-- tested: crates/cli/tests/e2e/docs.rs::no_such_test -->\n```sh\ncurl localhost\n```\n\n```\nSETTLED_POOLER=transaction cargo run\n```\n<!-- illustrative -->\n\nprose\n";
    let (found, dangling) = blocks("docs/x.md", doc);
    let problems: Vec<String> = found.iter().filter_map(problem).collect();
    assert_eq!(found.len(), 5);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(
        problems[0].starts_with("docs/x.md:3: a block of commands"),
        "{}",
        problems[0]
    );
    assert!(
        problems[1].starts_with("docs/x.md:17: marked `tested: "),
        "{}",
        problems[1]
    );
    assert!(problems[1].ends_with("has no test `no_such_test`"), "{}", problems[1]);
    assert!(
        problems[2].starts_with("docs/x.md:21: a block of commands"),
        "{}",
        problems[2]
    );
    assert_eq!(dangling, vec![24]);
}

/// The block of `file` whose marker names `test` of this file.
fn tested_block(file: &str, test: &str) -> Block {
    let text = std::fs::read_to_string(root().join(file)).unwrap();
    let wanted = Marker::Tested(format!("{THIS_TEST}::{test}"));
    let mut found: Vec<Block> = blocks(file, &text)
        .0
        .into_iter()
        .filter(|b| b.marker.as_ref() == Some(&wanted))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{file} must have exactly one block marked `tested: {THIS_TEST}::{test}`"
    );
    found.remove(0)
}

/// One command of a shown session and the answer the doc shows for it.
struct Step {
    line: usize,
    command: String,
    shown: Vec<String>,
}

/// The steps of a session block: `$ ` lines, each with the lines under it up
/// to the next command or `# ` comment.
fn session(block: &Block) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut in_step = false;
    for (n, line) in block.body.iter().enumerate() {
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                line: block.line + 1 + n,
                command: command.to_string(),
                shown: Vec::new(),
            });
            in_step = true;
        } else if line.starts_with("# ") {
            in_step = false;
        } else if in_step {
            steps.last_mut().unwrap().shown.push(line.clone());
        }
    }
    for step in &mut steps {
        while step.shown.last().is_some_and(|l| l.trim().is_empty()) {
            step.shown.pop();
        }
    }
    steps
}

/// An HTTP answer as curl prints it: the status line and headers with `-i`,
/// then the body.
struct Answer {
    status: Option<String>,
    headers: BTreeMap<String, String>,
    body: String,
}

fn answer(lines: &[String]) -> Answer {
    let lines: Vec<&str> = lines.iter().map(|l| l.trim_end_matches('\r')).collect();
    if !lines.first().is_some_and(|l| l.starts_with("HTTP/")) {
        return Answer {
            status: None,
            headers: BTreeMap::new(),
            body: lines.join("\n"),
        };
    }
    let end = lines.iter().position(|l| l.is_empty()).unwrap_or(lines.len());
    let headers = lines[1..end]
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    let body = lines.get(end + 1..).unwrap_or_default().join("\n");
    Answer {
        status: Some(lines[0].trim().to_string()),
        headers,
        body,
    }
}

/// Whether `actual` holds every field `shown` shows, with its value; a time
/// (a field named `*_at`) only needs to be a time where the doc shows one.
fn json_shows(shown: &Value, actual: &Value, at: &str) -> Result<(), String> {
    match (shown, actual) {
        (Value::Object(shown), Value::Object(actual)) => shown.iter().try_for_each(|(key, value)| {
            let field = format!("{at}.{key}");
            let got = actual.get(key).ok_or(format!("{field} is missing"))?;
            if key.ends_with("_at") && value.is_string() && got.is_string() {
                return Ok(());
            }
            json_shows(value, got, &field)
        }),
        (Value::Array(shown), Value::Array(actual)) if shown.len() == actual.len() => shown
            .iter()
            .zip(actual)
            .enumerate()
            .try_for_each(|(i, (s, a))| json_shows(s, a, &format!("{at}[{i}]"))),
        _ if shown == actual => Ok(()),
        _ => Err(format!("{at} is {actual}, the doc shows {shown}")),
    }
}

/// Whether the answer curl printed is the one the doc shows: the same
/// status line, the headers shown (but its length, which follows the times),
/// and the body's fields.
fn matches(shown: &Answer, actual: &Answer) -> Result<(), String> {
    if shown.status != actual.status {
        return Err(format!("status {:?}, the doc shows {:?}", actual.status, shown.status));
    }
    for (name, value) in shown.headers.iter().filter(|(name, _)| *name != "content-length") {
        if actual.headers.get(name) != Some(value) {
            return Err(format!(
                "header {name}: {:?}, the doc shows {value:?}",
                actual.headers.get(name)
            ));
        }
    }
    match serde_json::from_str::<Value>(&shown.body) {
        Ok(json) => {
            let got: Value = serde_json::from_str(&actual.body).map_err(|e| format!("the body is not JSON ({e})"))?;
            json_shows(&json, &got, "body")
        }
        Err(_) if shown.body == actual.body => Ok(()),
        Err(_) => Err(format!("body {:?}, the doc shows {:?}", actual.body, shown.body)),
    }
}

/// docs/api.md's session, each `curl` run as the doc writes it (its server's
/// address replaced by the test's), against what the doc says it ran on: one
/// settled period of 100 creators and `settled serve`.
#[tokio::test(flavor = "multi_thread")]
async fn api_curl_session() {
    let block = tested_block("docs/api.md", "api_curl_session");
    let env = common::Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "100"]);
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let server = env.serve("s3cret").await;
    let steps = session(&block);
    assert!(
        steps.len() >= 5,
        "docs/api.md:{}: too few commands in the session",
        block.line
    );
    for step in steps {
        let command = step.command.replace("http://127.0.0.1:8080", &server.base);
        let out = Command::new("sh")
            .args(["-c", &command])
            .env("SETTLED_API_TOKEN", "s3cret")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docs/api.md:{}: `{command}` failed: {out:?}",
            step.line
        );
        let printed: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        if let Err(why) = matches(&answer(&step.shown), &answer(&printed)) {
            panic!(
                "docs/api.md:{}: `{}` answers otherwise: {why}\n{}",
                step.line,
                step.command,
                printed.join("\n")
            );
        }
    }
}

/// A line of a block, without its `# comment`, in each form it shows: a
/// `[--flag]` is run once without it and once with it.
fn forms(line: &str) -> Vec<String> {
    let command = line.split(" #").next().unwrap().trim();
    match (command.find('['), command.find(']')) {
        (Some(open), Some(close)) if open < close => {
            let (before, option, after) = (&command[..open], &command[open + 1..close], &command[close + 1..]);
            vec![
                format!("{}{}", before.trim_end(), after),
                format!("{before}{option}{after}"),
            ]
        }
        _ => vec![command.to_string()],
    }
}

/// README's "Using it", line by line as written, with the `settled` built
/// for the tests first on the PATH and `volumes.csv` a valid import: each
/// command must succeed; the `&` lines run side by side, and the next line
/// runs when they have ended (a `--period` worker ends when its period is
/// settled); verify's JSON must say the money is conserved.
#[tokio::test(flavor = "multi_thread")]
async fn readme_using_it() {
    let block = tested_block("README.md", "readme_using_it");
    let env = common::Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        root().join("crates/cli/tests/fixtures/import/good.csv"),
        dir.path().join("volumes.csv"),
    )
    .unwrap();
    let bin_dir = Path::new(common::SETTLED).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let sh = |command: &str| {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", command])
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("DATABASE_URL", &env.db.url)
            .env("SETTLED_LOG", "error")
            .stdin(std::process::Stdio::null());
        cmd
    };
    let (mut background, mut last_verify) = (Vec::new(), String::new());
    for (n, line) in block.body.iter().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = format!("README.md:{}", block.line + 1 + n);
        for command in forms(line) {
            if let Some(command) = command.strip_suffix('&') {
                background.push((
                    at.clone(),
                    sh(command).stdout(std::process::Stdio::null()).spawn().unwrap(),
                ));
                continue;
            }
            for (at, mut child) in background.drain(..) {
                assert!(
                    common::wait_bounded(&mut child, 300).success(),
                    "{at}: a background command failed"
                );
            }
            let out = sh(&command).output().unwrap();
            assert!(out.status.success(), "{at}: `{command}` failed: {out:?}");
            if command.starts_with("settled verify") {
                last_verify = String::from_utf8_lossy(&out.stdout).into_owned();
            }
        }
    }
    let report: Value = serde_json::from_str(&last_verify).expect("the block ends with `settled verify ... --json`");
    assert_eq!(report["ok"], true, "{report:#}");
}

/// README's first command, `cargo run --release -- demo`, runs `settled`
/// from the root, however many binaries the workspace has: exactly one
/// member names a `default-run`, `settled-cli`'s `settled`. And README's
/// `cargo test` runs every crate's tests: every member is a default member
/// (docs/architecture.md, "Which binary `cargo run` runs").
#[test]
fn cargo_run_at_the_root_runs_settled_and_cargo_test_tests_every_crate() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    let default_runs: Vec<(&str, &str)> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| Some((p["name"].as_str()?, p["default_run"].as_str()?)))
        .collect();
    assert_eq!(
        default_runs,
        vec![("settled-cli", "settled")],
        "the members' default-run keys"
    );
    assert_eq!(
        metadata["workspace_default_members"], metadata["workspace_members"],
        "a bare `cargo test` must test every member"
    );
}

/// `.ci/run` runs README's first `sh` block: that block must be the one
/// marked as run there (the "Two commands"), so a block put above it cannot
/// take its place unseen, and it must hold `cargo test`, CI's only test run.
#[test]
fn readme_first_sh_block_is_the_one_ci_runs() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let (found, _) = blocks("README.md", &text);
    let first = found
        .iter()
        .find(|b| b.info == "sh")
        .expect("README.md has a ```sh block");
    assert_eq!(
        first.marker,
        Some(Marker::Tested(".ci/run".into())),
        "README.md:{}: the first ```sh block, which .ci/run runs, must be marked `<!-- tested: .ci/run -->`",
        first.line
    );
    assert!(
        first.body.iter().any(|l| l.starts_with("cargo test")),
        "README.md:{}: the block .ci/run runs must hold the test command, or CI runs no test",
        first.line
    );
}
