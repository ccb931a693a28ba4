//! Archives against held partitions and lost deadlocks.

use super::*;

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
    let mut workers: Vec<_> = (0..2).map(|_| two_loop_worker(&env, "2026-11-26", "25")).collect();
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
