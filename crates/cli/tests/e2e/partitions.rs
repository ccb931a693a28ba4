//! Periods are partitions: an unpartitioned database migrates to them with
//! its money intact; `settled archive` retires settled periods all or
//! nothing, its files re-check with `verify --archive`, and an archived
//! period can never take items (so never be paid) again.

use crate::common;

use std::path::Path;

use common::{wait_bounded, wait_until, Env, ProviderSim, LEASED_FAST, PERIOD};
use settled_testkit::{CommitFault, FaultPlan, PgProxy};

/// The migrations before the partitioning one, both crates', in version order.
async fn migrate_to_unpartitioned(env: &Env) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for dir in ["engine/migrations", "settled/migrations"] {
        let mut migrator = sqlx::migrate::Migrator::new(root.join(dir)).await.expect("migrations");
        migrator.migrations = migrator
            .migrations
            .iter()
            .filter(|m| m.version < 20261201000105)
            .cloned()
            .collect::<Vec<_>>()
            .into();
        migrator.set_ignore_missing(true);
        migrator.run(&env.pool).await.expect("old migrations");
    }
}

async fn exec(env: &Env, sql: &str) {
    sqlx::raw_sql(sql).execute(&env.pool).await.expect(sql);
}

fn partitions_of(table: &str) -> String {
    format!(
        "SELECT coalesce(string_agg(c.relname, ',' ORDER BY c.relname), '') FROM pg_inherits i
         JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = '{table}'::regclass"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unpartitioned_database_with_settled_periods_moves_to_partitions_and_still_proves_its_money() {
    let env = Env::unmigrated().await;
    migrate_to_unpartitioned(&env).await;
    assert_eq!(
        env.scalar_text("SELECT relkind::text FROM pg_class WHERE oid = 'settlement.token_trade_volume'::regclass")
            .await,
        "r"
    );
    // The old layout holding one settled period (300 creators paid, their
    // balances credited, its run finished) and one loaded but not started.
    exec(
        &env,
        "INSERT INTO settlement.settlement_policy (period, fee_bps) VALUES ('2026-11-27', 250), ('2026-11-28', 300);
         INSERT INTO settled_engine.runs (job, scope, state, finished_at)
             VALUES ('creator-rewards', '2026-11-27', 'finished', now());
         INSERT INTO settlement.token_trade_volume (period, creator, volume, status, attempt)
             SELECT '2026-11-27', '0x' || lpad(to_hex(i), 40, '0'), i::numeric * 10 ^ 18 + 7, 'settled', 1
             FROM generate_series(1, 300) i;
         INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt)
             SELECT period, creator, settlement.reward(volume, 250), (SELECT id FROM settled_engine.runs), 1
             FROM settlement.token_trade_volume WHERE period = '2026-11-27';
         INSERT INTO settlement.creator_balance (creator, balance)
             SELECT creator, amount FROM settlement.reward_ledger;
         INSERT INTO settlement.token_trade_volume (period, creator, volume)
             SELECT '2026-11-28', '0x' || lpad(to_hex(i), 40, '0'), i::numeric * 10 ^ 20 + 3
             FROM generate_series(100, 399) i;",
    )
    .await;
    env.run_ok(&["verify", "--period", "2026-11-27"]);

    env.run_ok(&["migrate"]);
    assert_eq!(
        env.scalar_text("SELECT relkind::text FROM pg_class WHERE oid = 'settlement.token_trade_volume'::regclass")
            .await,
        "p"
    );
    assert_eq!(
        env.scalar_text(&partitions_of("settlement.token_trade_volume")).await,
        "token_trade_volume_p20261127,token_trade_volume_p20261128"
    );
    assert_eq!(
        env.scalar_text(&partitions_of("settlement.reward_ledger")).await,
        "reward_ledger_p20261127,reward_ledger_p20261128"
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger_p20261127")
            .await,
        300
    );
    let verified = env.run_ok(&["verify", "--period", "2026-11-27"]);
    assert!(verified.contains("OK, every check holds"), "{verified}");

    // Every partition keeps the ledger's guarantees: one row per creator,
    // no edit, no truncate, through the parent or the partition itself.
    let creator = "0x0000000000000000000000000000000000000001";
    for table in ["settlement.reward_ledger", "settlement.reward_ledger_p20261127"] {
        let second = sqlx::query(&format!(
            "INSERT INTO {table} (period, creator, amount, run_id, attempt)
             VALUES ('2026-11-27', $1, 1, (SELECT id FROM settled_engine.runs), 2)"
        ))
        .bind(creator)
        .execute(&env.pool)
        .await
        .unwrap_err();
        assert_eq!(second.as_database_error().unwrap().code().unwrap(), "23505", "{second}");
        for edit in [
            format!("UPDATE {table} SET amount = amount + 1 WHERE creator = '{creator}'"),
            format!("DELETE FROM {table} WHERE creator = '{creator}'"),
            format!("TRUNCATE {table}"),
        ] {
            let err = sqlx::query(&edit).execute(&env.pool).await.unwrap_err();
            assert!(err.to_string().contains("append-only"), "{edit}: {err}");
        }
    }
    // A ledger row needs its item and a run of its own period, checked per
    // statement through the parent and through a partition alike; a paid
    // item cannot be deleted.
    for table in ["settlement.reward_ledger", "settlement.reward_ledger_p20261128"] {
        let no_item = sqlx::query(&format!(
            "INSERT INTO {table} (period, creator, amount, run_id, attempt)
             VALUES ('2026-11-28', '0x00000000000000000000000000000000000000ff', 1, (SELECT id FROM settled_engine.runs), 1)"
        ))
        .execute(&env.pool)
        .await
        .unwrap_err();
        assert_eq!(
            no_item.as_database_error().unwrap().constraint(),
            Some("reward_ledger_rows_have_items"),
            "{no_item}"
        );
        // The item exists, but the run is 2026-11-27's.
        let wrong_run = sqlx::query(&format!(
            "INSERT INTO {table} (period, creator, amount, run_id, attempt)
             VALUES ('2026-11-28', '0x0000000000000000000000000000000000000100', 1, (SELECT id FROM settled_engine.runs), 1)"
        ))
        .execute(&env.pool)
        .await
        .unwrap_err();
        assert_eq!(
            wrong_run.as_database_error().unwrap().constraint(),
            Some("reward_ledger_rows_have_items"),
            "{wrong_run}"
        );
    }
    let delete = sqlx::query("DELETE FROM settlement.token_trade_volume WHERE period = '2026-11-27' AND creator = $1")
        .bind(creator)
        .execute(&env.pool)
        .await
        .unwrap_err();
    assert_eq!(
        delete.as_database_error().unwrap().constraint(),
        Some("settled_items_stay"),
        "{delete}"
    );

    // A period without partitions takes no rows until it gets them.
    let orphan =
        sqlx::query("INSERT INTO settlement.token_trade_volume (period, creator, volume) VALUES ('2026-12-30', $1, 1)")
            .bind(creator)
            .execute(&env.pool)
            .await
            .unwrap_err();
    assert!(orphan.to_string().contains("no partition"), "{orphan}");

    // The period that was waiting settles on the new layout, and balances
    // (carried across both periods) still prove.
    env.run_ok(&["run", "--period", PERIOD, "--wait"]);
    let verified = env.run_ok(&["verify", "--period", PERIOD]);
    assert!(verified.contains("OK, every check holds"), "{verified}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger_p20261128")
            .await,
        300
    );
}

fn seed_and_settle(env: &Env, period: &str, creators: &str) {
    env.run_ok(&["seed", "--period", period, "--creators", creators]);
    env.run_ok(&["run", "--period", period, "--wait"]);
}

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
    let workers: Vec<_> = (0..3)
        .map(|_| {
            env.cmd(&[
                "worker",
                "--period",
                "2026-11-26",
                "--chunk",
                "50",
                "--concurrency",
                "2",
            ])
            .spawn()
            .unwrap()
        })
        .collect();
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

/// `settled worker` as a daemon that archives into `dir` the periods older
/// than five days, polling every 200 ms.
fn archive_daemon(env: &Env, dir: &Path) -> std::process::Command {
    env.cmd(&[
        "worker",
        "--archive-after-days",
        "5",
        "--archive-dir",
        dir.to_str().unwrap(),
        "--catch-up-days",
        "0",
        "--max-poll-ms",
        "200",
    ])
}

/// Waits (at most 60 s) until the daemon has archived one period.
async fn wait_for_one_archived(env: &Env) {
    let pool = env.pool.clone();
    wait_until(60, "the daemon to archive the old period", || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM settlement.archived_periods")
                .fetch_one(&pool)
                .await
                .unwrap()
                == 1
        }
    })
    .await;
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

/// What an archive holds on a period's partitions while it exports them.
async fn hold_like_an_archive_export(env: &Env, period: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let suffix = period.replace('-', "");
    let mut holder = env.pool.begin().await.unwrap();
    sqlx::query(&format!(
        "LOCK TABLE settlement.token_trade_volume_p{suffix}, settlement.reward_ledger_p{suffix}
         IN SHARE ROW EXCLUSIVE MODE"
    ))
    .execute(&mut *holder)
    .await
    .unwrap();
    holder
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_settle_a_period_while_an_older_periods_partitions_are_held() {
    // An archive exporting an old period keeps writers off its partitions.
    // Workers settling another period must not need them: each statement
    // is planned for its own period, in either mode, however many times a
    // worker runs it (a prepared statement's generic plan would lock every
    // partition, wait here, and deadlock with the archive's detach).
    let env = Env::new().await;
    seed_and_settle(&env, "2026-11-24", "200");
    env.run_ok(&["seed", "--period", "2026-11-26", "--creators", "4000"]);
    env.run_ok(&["seed", "--period", "2026-11-27", "--creators", "1500"]);
    let holder = hold_like_an_archive_export(&env, "2026-11-24").await;

    env.run_ok(&["run", "--period", "2026-11-26"]);
    let mut workers: Vec<_> = (0..2)
        .map(|_| {
            env.cmd(&[
                "worker",
                "--period",
                "2026-11-26",
                "--chunk",
                "25",
                "--concurrency",
                "2",
            ])
            .spawn()
            .unwrap()
        })
        .collect();
    for w in &mut workers {
        assert!(wait_bounded(w, 120).success(), "an in-transaction worker failed");
    }

    // Leased: claims, renewals (every third of a 1 s lease), completions.
    let sim = ProviderSim::start(&["--latency-ms", "30"]);
    env.run_ok(&["run", "--period", "2026-11-27"]);
    let mut args = vec![
        "worker",
        "--period",
        "2026-11-27",
        "--chunk",
        "20",
        "--concurrency",
        "2",
    ];
    args.extend_from_slice(LEASED_FAST);
    args.extend(["--provider-url", sim.url.as_str()]);
    let mut leased = env.cmd(&args).spawn().unwrap();
    assert!(wait_bounded(&mut leased, 120).success(), "the leased worker failed");

    // The holder was never in anyone's way, and is still there.
    holder.rollback().await.unwrap();
    for period in ["2026-11-26", "2026-11-27"] {
        let verified = env.run_ok(&["verify", "--period", period]);
        assert!(verified.contains("OK, every check holds"), "{verified}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_archive_that_loses_a_deadlock_starts_over_and_archives_once() {
    // Another session holds the work table's parent, the archive holds the
    // old partition and waits for the parent to detach, then that session
    // asks for the old partition: a cycle. The archive's deadlock timer
    // fires first (it waited first, and the other session's is long), so
    // PostgreSQL ends the archive's transaction; it must start over.
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    seed_and_settle(&env, "2026-11-24", "300");
    let db = env.scalar_text("SELECT current_database()::text").await;
    // PostgreSQL looks for a cycle once, when the timer fires: 10 s leaves a
    // loaded machine time to make the cycle first (the other session's 60 s
    // stays far behind).
    exec(&env, &format!("ALTER DATABASE \"{db}\" SET deadlock_timeout = '10s'")).await;

    let mut other = env.pool.begin().await.unwrap();
    sqlx::raw_sql(
        "SET LOCAL deadlock_timeout = '60s';
         LOCK TABLE ONLY settlement.token_trade_volume IN ROW EXCLUSIVE MODE",
    )
    .execute(&mut *other)
    .await
    .unwrap();
    let archive = env
        .cmd(&[
            "archive",
            "--before",
            "2026-11-25",
            "--dir",
            dir.path().to_str().unwrap(),
        ])
        .env("SETTLED_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pool = env.pool.clone();
    wait_until(60, "the archive to wait for the parent", || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND mode = 'AccessExclusiveLock'
                                AND relation = 'settlement.token_trade_volume'::regclass)",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    })
    .await;
    // Waits for the archive's partition lock until the archive gives up.
    sqlx::query("LOCK TABLE settlement.token_trade_volume_p20261124 IN ROW EXCLUSIVE MODE")
        .execute(&mut *other)
        .await
        .expect("the other session gets the partition once the archive rolls back");
    other.commit().await.unwrap();

    let out = archive.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "the archive failed: {stdout}\n{stderr}");
    assert!(stderr.contains("lost a deadlock"), "{stderr}");
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("archived 2026-11-24")).count(),
        1,
        "{stdout}"
    );
    let file = dir.path().join("ledger-2026-11-24.csv");
    let checked = env.run_ok(&["verify", "--archive", file.to_str().unwrap()]);
    assert!(checked.contains("OK, every check holds"), "{checked}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.archived_periods").await,
        1
    );
}

/// A proxy that faults the archive's COMMIT (its connection is the one
/// that takes the archive's lock).
async fn archive_commit_proxy(env: &Env, fault: CommitFault, then_refuse: bool) -> PgProxy {
    let plan = FaultPlan {
        armed_by: "hashtext('settled archive')".into(),
        fault,
        then_refuse,
    };
    PgProxy::start(&env.db.url, plan).await
}

/// Runs `settled ARGS` through `url` without blocking the proxy's runtime.
async fn run_through(env: &Env, url: &str, args: &[&str]) -> std::process::Output {
    let mut cmd = env.cmd(args);
    cmd.env("DATABASE_URL", url);
    tokio::task::spawn_blocking(move || cmd.output().expect("run settled"))
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every archive file of `period` is in `dir`, verifies OK against the
/// database, and the database names it.
async fn assert_archived_and_verified(env: &Env, dir: &Path, period: &str, rows: i64) {
    let file = dir.join(format!("ledger-{period}.csv"));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(format!("ledger-{period}.manifest.json"))).unwrap()).unwrap();
    assert_eq!(manifest["rows"], rows, "{manifest}");
    let checked = env.run_ok(&["verify", "--archive", file.to_str().unwrap()]);
    assert!(checked.contains("OK, every check holds"), "{checked}");
    let recorded = env
        .scalar_text(&format!(
            "SELECT file || ' ' || ledger_rows || ' ' || sha256 FROM settlement.archived_periods WHERE period = '{period}'"
        ))
        .await;
    assert_eq!(
        recorded,
        format!("{} {rows} {}", file.display(), manifest["sha256"].as_str().unwrap())
    );
}

/// Nothing of an archive before `before` exists: no file in `dir`, no
/// record, and every settled period still has its partitions.
async fn assert_nothing_archived(env: &Env, dir: &Path, partitions: &str) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.archived_periods").await,
        0
    );
    assert_eq!(
        env.scalar_text(&partitions_of("settlement.reward_ledger")).await,
        partitions
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_archive_whose_commit_answer_is_lost_keeps_its_files_and_learns_that_it_committed() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    seed_and_settle(&env, "2026-11-24", "300");
    seed_and_settle(&env, "2026-11-25", "200");
    // The server commits; the proxy drops its answer and both connections.
    let proxy = archive_commit_proxy(&env, CommitFault::LoseAnswer, false).await;
    let out = run_through(
        &env,
        &proxy.url(),
        &[
            "archive",
            "--before",
            "2026-11-26",
            "--dir",
            dir.path().to_str().unwrap(),
            "--drop-ledger",
        ],
    )
    .await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(proxy.faults(), 1, "the COMMIT's answer was lost: {stdout}\n{stderr}");
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("archived 2026-11-24: 300 ledger rows"), "{stdout}");
    assert!(stdout.contains("archived 2026-11-25: 200 ledger rows"), "{stdout}");
    assert!(
        stderr.contains("the answer to COMMIT was lost; a new connection found the archive committed"),
        "{stderr}"
    );
    // --drop-ledger: the files are now the only copy of these ledger rows.
    assert_eq!(env.scalar_text(&partitions_of("settlement.reward_ledger")).await, "");
    assert_archived_and_verified(&env, dir.path(), "2026-11-24", 300).await;
    assert_archived_and_verified(&env, dir.path(), "2026-11-25", 200).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_archive_that_certainly_did_not_commit_removes_its_files_and_can_run_again() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap().to_string();
    seed_and_settle(&env, "2026-11-24", "300");
    let archive_args = ["archive", "--before", "2026-11-25", "--dir", dir_arg.as_str()];

    // Refused at COMMIT by the server (a deferred constraint): a clear answer.
    exec(
        &env,
        "CREATE FUNCTION public.refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'refused at commit'; END $$;
         CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON settlement.archived_periods
             DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.refuse_at_commit();",
    )
    .await;
    let refused = env.run(&archive_args);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("a new connection found it not committed: its files were removed")
            && stderr.contains("refused at commit"),
        "{stderr}"
    );
    assert_nothing_archived(&env, dir.path(), "reward_ledger_p20261124").await;
    exec(&env, "DROP TRIGGER refuse_at_commit ON settlement.archived_periods").await;

    // COMMIT never reaches the server: a lost connection, and a rollback.
    let proxy = archive_commit_proxy(&env, CommitFault::CutBefore, false).await;
    let cut = run_through(&env, &proxy.url(), &archive_args).await;
    assert_eq!(proxy.faults(), 1);
    assert_eq!(cut.status.code(), Some(1));
    let stderr = text(&cut.stderr);
    assert!(
        stderr.contains("committing the archive failed, and a new connection found it not committed: its files were removed and nothing was archived"),
        "{stderr}"
    );
    assert_nothing_archived(&env, dir.path(), "reward_ledger_p20261124").await;

    // Nothing half done: the same archive then runs to the end.
    let out = env.run_ok(&archive_args);
    assert!(out.contains("archived 2026-11-24: 300 ledger rows"), "{out}");
    assert_archived_and_verified(&env, dir.path(), "2026-11-24", 300).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_archive_whose_outcome_cannot_be_learned_keeps_its_files_and_says_how_to_check() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    seed_and_settle(&env, "2026-11-24", "300");
    // The answer is lost and the database stays unreachable through the proxy.
    let proxy = archive_commit_proxy(&env, CommitFault::LoseAnswer, true).await;
    let out = run_through(
        &env,
        &proxy.url(),
        &[
            "archive",
            "--before",
            "2026-11-25",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(proxy.faults(), 1);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let file = dir.path().join("ledger-2026-11-24.csv");
    assert!(
        stderr.contains("the outcome of the archive is unknown")
            && stderr.contains("The files are kept. Check each with `settled verify --archive FILE`")
            && stderr.contains(file.to_str().unwrap()),
        "{stderr}"
    );
    // The check it names tells the truth: the server had committed.
    assert_archived_and_verified(&env, dir.path(), "2026-11-24", 300).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemons_archive_keeps_its_files_when_the_commit_answer_is_lost() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let old = (chrono::Utc::now().date_naive() - chrono::Duration::days(10)).to_string();
    seed_and_settle(&env, &old, "300");
    let proxy = archive_commit_proxy(&env, CommitFault::LoseAnswer, false).await;
    let mut daemon = archive_daemon(&env, dir.path())
        .env("DATABASE_URL", proxy.url())
        .env("SETTLED_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_one_archived(&env).await;
    // Its COMMIT's answer was lost: it must learn the outcome, not delete.
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let (log, stderr) = (log.clone(), daemon.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
                let line = line.unwrap_or_default();
                log.lock().unwrap().push_str(&(line + "\n"));
            }
        })
    };
    let learned = "the answer to the archive's COMMIT was lost; a new connection found it committed";
    wait_until(60, "the daemon to say what it learned", || {
        let found =
            log.lock().unwrap().contains(learned) || log.lock().unwrap().contains("archiving refused or failed");
        async move { found }
    })
    .await;
    assert_eq!(proxy.faults(), 1);
    kill(Pid::from_raw(daemon.id() as i32), Signal::SIGTERM).unwrap();
    assert!(wait_bounded(&mut daemon, 30).success());
    reader.join().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(log.contains(learned), "{log}");
    assert_archived_and_verified(&env, dir.path(), &old, 300).await;
}
