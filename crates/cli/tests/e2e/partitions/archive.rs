//! `settled archive` and its daemon: round trips through `verify --archive`, concurrent archives, an archived period never paid again.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn archive_round_trips_through_verify_refuses_unfinished_periods_and_an_archived_period_is_never_paid_again() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap();
    seed_and_settle(&env, "2026-11-25", "200");
    seed_and_settle(&env, "2026-11-26", "250");
    env.run_ok(&["seed", "--period", "2026-11-27", "--creators", "150"]);
    // A run in progress (started, nobody working it): refused, with the
    // items that have no run at all, and nothing archived.
    env.run_ok(&["run", "--period", "2026-11-27"]);
    let refused = env.run(&["archive", "--before", PERIOD, "--dir", dir_arg]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("2026-11-27: its run is running"), "{stderr}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no file is left");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.archived_periods").await,
        0
    );
    assert_eq!(
        env.scalar_text(&partitions_of("settlement.reward_ledger")).await,
        "reward_ledger_p20261125,reward_ledger_p20261126,reward_ledger_p20261127"
    );

    let out = env.run_ok(&["archive", "--before", "2026-11-27", "--dir", dir_arg]);
    assert!(out.contains("archived 2026-11-25: 200 ledger rows"), "{out}");
    assert!(out.contains("archived 2026-11-26: 250 ledger rows"), "{out}");
    assert_eq!(
        env.scalar_text(
            "SELECT action || ': ' || target || ': ' || outcome FROM settlement.audit_log WHERE actor LIKE 'cli:%'"
        )
        .await,
        "archive: periods 2026-11-25 2026-11-26: ok",
        "the archive's row in the audit log, the refused archive's none"
    );
    assert_eq!(
        env.scalar_text(&partitions_of("settlement.token_trade_volume")).await,
        "token_trade_volume_p20261127"
    );
    assert_eq!(
        env.scalar_text(&partitions_of("settlement.reward_ledger")).await,
        "reward_ledger_p20261127"
    );
    // Kept outside the ledger, still append-only.
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement_archive.reward_ledger_p20261125")
            .await,
        200
    );
    let err = sqlx::query("DELETE FROM settlement_archive.reward_ledger_p20261125")
        .execute(&env.pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
    // Nothing left to do before that date: a second call archives nothing.
    let again = env.run_ok(&["archive", "--before", "2026-11-27", "--dir", dir_arg]);
    assert!(again.contains("nothing to archive"), "{again}");

    for period in ["2026-11-25", "2026-11-26"] {
        let file = dir.path().join(format!("ledger-{period}.csv"));
        let checked = env.run_ok(&["verify", "--archive", file.to_str().unwrap()]);
        assert!(checked.contains("OK, every check holds"), "{checked}");
        let verified = env.run_ok(&["verify", "--period", period]);
        assert!(
            verified.contains("OK, every check holds") && verified.contains("period_archived"),
            "{verified}"
        );
    }
    // The balances keep proving with the archived totals carried: settle the
    // third period (its creators recur from the first two) and verify.
    env.run_ok(&["worker", "--period", "2026-11-27"]);
    let verified = env.run_ok(&["verify", "--period", "2026-11-27"]);
    assert!(verified.contains("OK, every check holds"), "{verified}");

    // Tampering with a file, one digit of one amount, or one row removed, is caught.
    let file = dir.path().join("ledger-2026-11-25.csv");
    let original = std::fs::read_to_string(&file).unwrap();
    let mut lines: Vec<String> = original.lines().map(str::to_string).collect();
    let mut fields: Vec<String> = lines[7].split(',').map(str::to_string).collect();
    let amount = fields[2].clone();
    let bumped = format!(
        "{}{}",
        &amount[..amount.len() - 1],
        (amount.as_bytes()[amount.len() - 1] - b'0' + 1) % 10
    );
    fields[2] = bumped;
    lines[7] = fields.join(",");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let tampered = env.run(&["verify", "--archive", file.to_str().unwrap()]);
    assert_eq!(tampered.status.code(), Some(1));
    let report = String::from_utf8_lossy(&tampered.stdout);
    assert!(report.contains("[FAIL] file_matches_manifest_sha256"), "{report}");
    assert!(report.contains("[FAIL] total_matches_manifest"), "{report}");
    assert!(report.contains("[FAIL] database_record_matches"), "{report}");
    let mut lines: Vec<&str> = original.lines().collect();
    lines.remove(9);
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let short = env.run(&["verify", "--archive", file.to_str().unwrap()]);
    assert_eq!(short.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&short.stdout).contains("[FAIL] row_count_matches_manifest"));

    // An archived period takes no items again, however they come.
    let reseed = env.run(&["seed", "--period", "2026-11-25", "--creators", "10"]);
    assert_eq!(reseed.status.code(), Some(1));
    let csv = dir.path().join("again.csv");
    std::fs::write(
        &csv,
        "period,creator,volume\n2026-11-25,0x00000000000000000000000000000000000000aa,1000\n",
    )
    .unwrap();
    let import = env.run(&["import", csv.to_str().unwrap()]);
    assert_eq!(
        import.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&import.stderr)
    );
    let direct = sqlx::query("SELECT settlement.ensure_period_partitions('2026-11-25')")
        .execute(&env.pool)
        .await
        .unwrap_err();
    assert!(direct.to_string().contains("is archived"), "{direct}");
    assert_eq!(
        env.scalar_text(&partitions_of("settlement.token_trade_volume")).await,
        "token_trade_volume_p20261127"
    );

    // --drop-ledger: the file is the record, the partition goes.
    let out = env.run_ok(&["archive", "--before", PERIOD, "--dir", dir_arg, "--drop-ledger"]);
    assert!(out.contains("archived 2026-11-27: 150 ledger rows"), "{out}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM pg_class WHERE relname = 'reward_ledger_p20261127'")
            .await,
        0
    );
    let checked = env.run_ok(&[
        "verify",
        "--archive",
        dir.path().join("ledger-2026-11-27.manifest.json").to_str().unwrap(),
    ]);
    assert!(checked.contains("OK, every check holds"), "{checked}");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_archives_at_once_while_workers_settle_the_next_period_archive_once_and_lose_nothing() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap().to_string();
    seed_and_settle(&env, "2026-11-24", "3000");
    seed_and_settle(&env, "2026-11-25", "3000");
    env.run_ok(&["seed", "--period", "2026-11-26", "--creators", "20000"]);
    env.run_ok(&["run", "--period", "2026-11-26"]);
    // Three worker processes settle the next period (small chunks, so they
    // are still at it) while two archive processes retire the first two.
    let workers: Vec<_> = (0..3).map(|_| two_loop_worker(&env, "2026-11-26", "50")).collect();
    let archivers: Vec<_> = (0..2)
        .map(|_| {
            env.cmd(&["archive", "--before", "2026-11-26", "--dir", &dir_arg])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<String> = archivers
        .into_iter()
        .map(|a| {
            let out = a.wait_with_output().unwrap();
            assert!(out.status.success(), "an archive failed");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect();
    let archived_lines = outputs
        .iter()
        .flat_map(|o| o.lines())
        .filter(|l| l.starts_with("archived "))
        .count();
    assert_eq!(archived_lines, 2, "each period archived once: {outputs:?}");
    assert!(outputs.iter().any(|o| o.contains("nothing to archive")), "{outputs:?}");
    for mut w in workers {
        assert!(w.wait().unwrap().success());
    }
    for period in ["2026-11-24", "2026-11-25"] {
        let file = dir.path().join(format!("ledger-{period}.csv"));
        let checked = env.run_ok(&["verify", "--archive", file.to_str().unwrap()]);
        assert!(checked.contains("OK, every check holds"), "{checked}");
    }
    // The period settled meanwhile: once each, balances proving with both
    // archived periods carried.
    let verified = env.run_ok(&["verify", "--period", "2026-11-26"]);
    assert!(verified.contains("OK, every check holds"), "{verified}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger WHERE period = '2026-11-26'")
            .await,
        20_000
    );
    assert_eq!(
        env.scalar_text("SELECT (sum(amount) = (SELECT sum(ledger_total) FROM settlement.archived_periods))::text FROM settlement.ledger_carry")
            .await,
        "true"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_archives_settled_periods_older_than_its_setting() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let today = chrono::Utc::now().date_naive();
    let old = (today - chrono::Duration::days(10)).to_string();
    let recent = (today - chrono::Duration::days(2)).to_string();
    seed_and_settle(&env, &old, "300");
    seed_and_settle(&env, &recent, "300");
    let mut daemon = archive_daemon(&env, dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_one_archived(&env).await;
    kill(Pid::from_raw(daemon.id() as i32), Signal::SIGTERM).unwrap();
    assert!(common::wait_bounded(&mut daemon, 30).success());
    assert_eq!(
        env.scalar_text("SELECT period::text FROM settlement.archived_periods")
            .await,
        old
    );
    assert_eq!(
        env.scalar_text("SELECT actor || ': ' || target FROM settlement.audit_log WHERE action = 'archive'")
            .await,
        format!("worker --archive-after-days: periods {old}"),
        "the daemon's archive in the audit log, by its name"
    );
    let file = dir.path().join(format!("ledger-{old}.csv"));
    let checked = env.run_ok(&["verify", "--archive", file.to_str().unwrap()]);
    assert!(checked.contains("OK, every check holds"), "{checked}");
    // The recent period stays in the hot tables.
    let verified = env.run_ok(&["verify", "--period", &recent]);
    assert!(
        verified.contains("OK, every check holds") && !verified.contains("period_archived"),
        "{verified}"
    );
}
