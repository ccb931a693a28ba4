//! `settled import`: every kind of bad input is named by line and field, an
//! all-or-nothing import leaves the database exactly as before, and importing
//! the same file twice changes nothing.

use crate::common;

use std::path::PathBuf;

use common::Env;

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/import")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// A fingerprint of everything import may touch.
async fn snapshot(env: &Env) -> String {
    env.scalar_text(
        "SELECT count(*)::text || ':' || coalesce(md5(string_agg(period || creator || volume, ',' ORDER BY period, creator)), '')
         FROM settlement.token_trade_volume",
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn every_bad_file_is_refused_with_its_line_field_and_reason() {
    let env = Env::new().await;
    env.run_ok(&["import", &fixture("good.csv")]);
    let before = snapshot(&env).await;
    let cases: &[(&str, &[&str])] = &[
        (
            "bad_creator.csv",
            &["line 2: creator: must have 40 hex digits after 0x"],
        ),
        (
            "bad_checksum.csv",
            &["line 2: creator: mixed-case address fails its EIP-55 checksum"],
        ),
        (
            "bad_volume_sign.csv",
            &[
                "line 2: volume: must be a whole number",
                "line 3: volume: must be a whole number",
            ],
        ),
        (
            "bad_volume_decimal.csv",
            &["line 2: volume: must be a whole number of base units written with the digits 0-9 only (found '.')"],
        ),
        ("bad_volume_exponent.csv", &["line 2: volume:", "found 'e'"]),
        (
            "volume_too_large.csv",
            &["line 2: volume: exceeds the largest token amount, 2^256 - 1"],
        ),
        (
            "bad_period.csv",
            &["line 2: period: period must be a date written YYYY-MM-DD"],
        ),
        ("future_period.csv", &["line 2: period: 2099-01-01 is in the future"]),
        ("duplicate.csv", &["line 4: creator: duplicate of line 2"]),
        ("not_utf8.csv", &["line 3: line: is not valid UTF-8"]),
        ("long_line.csv", &["line 3: line: is longer than 4096 bytes"]),
        ("truncated_last_line.csv", &["line 3: line: has 2 fields, expected 3"]),
        (
            "bad.jsonl",
            &[
                "line 1: volume: as a JSON number must be a whole number from 0 to 2^53",
                "line 2: line: has an unknown field \"extra\"",
                "line 3: line: is not valid JSON",
            ],
        ),
        // A field given twice is refused, not the last one taken.
        ("duplicate_field.jsonl", &["line 2: volume: is given more than once"]),
        ("empty.csv", &["the file is empty"]),
        ("header_only.csv", &["no data rows"]),
    ];
    for (file, expected) in cases {
        let out = env.run(&["import", &fixture(file)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{file}: {stderr}");
        for want in *expected {
            assert!(stderr.contains(want), "{file}: expected {want:?} in:\n{stderr}");
        }
        assert_eq!(snapshot(&env).await, before, "{file} changed the database");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ten_megabyte_line_is_refused_without_reading_it_into_memory() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.csv");
    let mut data = b"period,creator,volume\n2026-11-20,0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed,".to_vec();
    data.extend(std::iter::repeat_n(b'9', 10 * 1024 * 1024));
    std::fs::write(&path, data).unwrap();
    let out = env.run(&["import", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2: line: is longer than 4096 bytes"));
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume")
            .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn valid_files_import_and_importing_them_again_changes_nothing() {
    let env = Env::new().await;
    let out = env.run_ok(&["import", &fixture("good.csv")]);
    assert!(out.contains("4 rows read, 4 imported"), "{out}");
    // Mixed case passed its checksum and is stored lower case.
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE creator = '0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed'").await,
        1
    );
    let max = env
        .scalar_text("SELECT max(volume)::text FROM settlement.token_trade_volume")
        .await;
    assert_eq!(
        max,
        "115792089237316195423570985008687907853269984665640564039457584007913129639935"
    );
    let before = snapshot(&env).await;
    let out = env.run_ok(&["import", &fixture("good.csv")]);
    assert!(out.contains("0 imported, 4 already present"), "{out}");
    assert_eq!(snapshot(&env).await, before);

    let out = env.run_ok(&["import", &fixture("bom_crlf.csv")]);
    assert!(out.contains("2 imported"), "{out}");
    // From standard input, with the format given.
    let mut child = env
        .cmd(&["import", "-", "--format", "jsonl"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        child.stdin.as_mut().unwrap(),
        &std::fs::read(fixture("good.jsonl")).unwrap(),
    )
    .unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 imported"));

    // A different volume for an imported row is a conflict, not an overwrite.
    let dir = tempfile::tempdir().unwrap();
    let changed = dir.path().join("changed.csv");
    std::fs::write(
        &changed,
        "period,creator,volume\n2026-11-20,0xfb6916095ca1df60bb79ce92ce3ea74c37c5d359,5\n",
    )
    .unwrap();
    let out = env.run(&["import", changed.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("was already imported with volume 0, not 5"));
}

#[tokio::test(flavor = "multi_thread")]
async fn skip_invalid_imports_the_rest_and_writes_the_rejects() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let rejects = dir.path().join("rejects.csv");
    let errors = dir.path().join("errors.txt");
    let out = env.run_ok(&[
        "import",
        &fixture("duplicate.csv"),
        "--skip-invalid",
        rejects.to_str().unwrap(),
        "--errors",
        errors.to_str().unwrap(),
    ]);
    assert!(
        out.contains("3 rows read, 2 imported, 0 already present, 1 rejected"),
        "{out}"
    );
    let rejected = std::fs::read_to_string(&rejects).unwrap();
    assert!(
        rejected.starts_with("line,field,reason,content\n4,creator,\"duplicate of line 2"),
        "{rejected}"
    );
    assert!(std::fs::read_to_string(&errors)
        .unwrap()
        .contains("line 4: creator: duplicate of line 2"));
}

#[tokio::test(flavor = "multi_thread")]
async fn periods_with_a_run_are_refused_and_other_imports_need_append() {
    let env = Env::new().await;
    env.run_ok(&["import", &fixture("good.csv")]);
    let dir = tempfile::tempdir().unwrap();
    let more = dir.path().join("more.csv");
    std::fs::write(&more, "creator,volume\n0x0000000000000000000000000000000000000001,9\n").unwrap();
    let out = env.run(&["import", more.to_str().unwrap(), "--period", "2026-11-20"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("use --append"));
    env.run_ok(&["import", more.to_str().unwrap(), "--period", "2026-11-20", "--append"]);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume")
            .await,
        5
    );

    env.run_ok(&["policy", "--period", "2026-11-20", "--fee-bps", "100"]);
    env.run_ok(&["worker", "--period", "2026-11-20"]);
    let late = dir.path().join("late.csv");
    std::fs::write(&late, "creator,volume\n0x0000000000000000000000000000000000000002,9\n").unwrap();
    let out = env.run(&["import", late.to_str().unwrap(), "--period", "2026-11-20", "--append"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already has run"));
    env.run_ok(&["verify", "--period", "2026-11-20"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_output_that_is_the_input_is_refused_before_anything_is_written() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("volumes.csv");
    let original = "period,creator,volume\n\
                    2026-11-20,0x00000000000000000000000000000000000000a1,100\n\
                    2026-11-20,not-an-address,5\n";
    std::fs::write(&input, original).unwrap();
    let link = dir.path().join("link.csv");
    std::os::unix::fs::symlink(&input, &link).unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let roundabout = dir.path().join("sub/../volumes.csv");
    let input_arg = input.to_str().unwrap();
    let cases: [(&str, &std::path::Path); 4] = [
        ("--errors", &input),
        ("--skip-invalid", &input),
        ("--errors", &link),
        ("--skip-invalid", &roundabout),
    ];
    for (flag, output) in cases {
        let out = env.run(&["import", input_arg, flag, output.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag} {}: {stderr}", output.display());
        assert_eq!(
            stderr.trim_end(),
            format!(
                "error: {flag} {} is the input file itself: writing it would destroy the input; choose another path",
                output.display()
            )
        );
        assert_eq!(
            std::fs::read_to_string(&input).unwrap(),
            original,
            "the input was touched"
        );
    }
    // Read through the link, written to the file it names: the same file.
    let out = env.run(&["import", link.to_str().unwrap(), "--skip-invalid", input_arg]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read_to_string(&input).unwrap(), original);
    // From standard input, when standard input is that file.
    let out = env
        .cmd(&["import", "-", "--errors", input_arg])
        .stdin(std::fs::File::open(&input).unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is the input file itself"));
    assert_eq!(std::fs::read_to_string(&input).unwrap(), original);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume")
            .await,
        0
    );

    // Another file is fine: the valid row imported, the rejected one written.
    let rejects = dir.path().join("rejects.csv");
    let out = env.run_ok(&["import", input_arg, "--skip-invalid", rejects.to_str().unwrap()]);
    assert!(out.contains("2 rows read, 1 imported"), "{out}");
    assert!(std::fs::read_to_string(&rejects).unwrap().contains("not-an-address"));
    assert_eq!(std::fs::read_to_string(&input).unwrap(), original);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_import_whose_commit_answer_is_lost_says_its_outcome_is_unknown_and_a_second_import_is_safe() {
    use settled_testkit::{CommitFault, FaultPlan, PgProxy};
    let env = Env::new().await;
    let plan = FaultPlan {
        armed_by: "import_staging".into(),
        fault: CommitFault::LoseAnswer,
        then_refuse: false,
    };
    let proxy = PgProxy::start(&env.db.url, plan).await;
    let mut cmd = env.cmd(&["import", &fixture("good.csv")]);
    cmd.env("DATABASE_URL", proxy.url());
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert_eq!(proxy.faults(), 1);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("its outcome is unknown if the connection was lost: importing the same file again is safe"),
        "{stderr}"
    );
    // It had committed; the same file again adds nothing and says so.
    let rows = env
        .scalar_i64("SELECT count(*) FROM settlement.token_trade_volume")
        .await;
    assert!(rows > 0);
    let again = env.run_ok(&["import", &fixture("good.csv")]);
    assert!(
        again.contains(&format!("0 imported, {rows} already present")),
        "{again}"
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume")
            .await,
        rows
    );
}
