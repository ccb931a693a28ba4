//! A period's input against its run: an import either lands before the run
//! starts (and is settled by it) or is refused, never left eligible under a
//! finished run; a finished run whose period has eligible items can be
//! reopened by hand; and items made eligible again (a retry, a released
//! hold) while the run finishes never stay behind a finished run.

use crate::common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};

use common::{wait_bounded, wait_until, Env};

/// A creator address unique to (`tag`, `i`).
fn creator(tag: u32, i: u32) -> String {
    format!("0x{tag:08x}{i:032x}")
}

/// Writes `rows` rows of `period` for the creators of `tag`.
fn write_csv(dir: &Path, name: &str, period: &str, tag: u32, rows: u32) -> PathBuf {
    let mut csv = String::from("period,creator,volume\n");
    for i in 0..rows {
        writeln!(
            csv,
            "{period},{},{}",
            creator(tag, i),
            1_000_000_000_000u64 + u64::from(i)
        )
        .unwrap();
    }
    let path = dir.join(name);
    std::fs::write(&path, csv).unwrap();
    path
}

/// Rows of `period` whose creators are `tag`'s, with `status` (any: None).
async fn rows_of(env: &Env, period: &str, tag: u32, status: Option<&str>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM settlement.token_trade_volume
         WHERE period = $1::date AND creator LIKE $2 AND ($3::text IS NULL OR status = $3)",
    )
    .bind(period)
    .bind(format!("0x{tag:08x}%"))
    .bind(status)
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

async fn run_state(env: &Env, period: &str) -> String {
    env.scalar_text(&format!(
        "SELECT coalesce((SELECT state FROM settled_engine.runs WHERE scope = '{period}'), 'none')"
    ))
    .await
}

async fn eligible(env: &Env, period: &str) -> i64 {
    env.scalar_i64(&format!(
        "SELECT count(*) FROM settlement.token_trade_volume WHERE period = '{period}' AND status = 'eligible'"
    ))
    .await
}

/// The invariant of this file: a finished run leaves nothing eligible.
async fn assert_nothing_eligible_under_a_finished_run(env: &Env, period: &str) {
    let (state, left) = (run_state(env, period).await, eligible(env, period).await);
    assert!(
        !(state == "finished" && left > 0),
        "{left} item(s) of {period} are eligible under its finished run"
    );
}

/// Backends of this test's database waiting for a lock of `locktype` (any: None).
async fn lock_waiters(env: &Env, locktype: Option<&str>) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE a.datname = current_database() AND NOT l.granted AND ($1::text IS NULL OR l.locktype = $1)",
    )
    .bind(locktype)
    .fetch_one(&env.pool)
    .await
    .unwrap()
}

fn spawn(env: &Env, args: &[&str]) -> Child {
    env.cmd(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` (bounded) and returns its output.
async fn finish(mut child: Child) -> Output {
    tokio::task::spawn_blocking(move || {
        wait_bounded(&mut child, 300);
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn verify_ok(env: &Env, period: &str) {
    let verified = env.run_ok(&["verify", "--period", period]);
    assert!(verified.contains("OK, every check holds"), "{verified}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_start_waits_for_an_import_in_progress_and_settles_its_rows() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let period = "2026-11-20";
    env.run_ok(&["policy", "--period", period, "--fee-bps", "250"]);
    env.run_ok(&[
        "import",
        write_csv(dir.path(), "base.csv", period, 1, 50).to_str().unwrap(),
    ]);
    let late = write_csv(dir.path(), "late.csv", period, 2, 2000);

    // Another session is writing one of the late file's rows: the import's
    // insert waits for it, after the import has checked for a run.
    let mut other = env.pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO settlement.token_trade_volume (period, creator, volume) VALUES ($1::date, $2, 1000000000000)",
    )
    .bind(period)
    .bind(creator(2, 0))
    .execute(&mut *other)
    .await
    .unwrap();
    let import = spawn(&env, &["import", late.to_str().unwrap(), "--append"]);
    wait_until(60, "the import to wait for the other session's row", || async {
        lock_waiters(&env, Some("transactionid")).await > 0
    })
    .await;
    // The run start must wait for the import; without that it started,
    // settled the first 50 rows and finished while the import waited.
    let run = spawn(&env, &["run", "--period", period, "--wait"]);
    wait_until(60, "the run start to wait, or the run to finish", || async {
        lock_waiters(&env, Some("advisory")).await > 0 || run_state(&env, period).await == "finished"
    })
    .await;
    other.rollback().await.unwrap();

    let imported = finish(import).await;
    assert!(imported.status.success(), "{}", text(&imported.stderr));
    assert!(
        text(&imported.stdout).contains("2000 imported"),
        "{}",
        text(&imported.stdout)
    );
    let ran = finish(run).await;
    assert!(ran.status.success(), "{}{}", text(&ran.stdout), text(&ran.stderr));
    assert_nothing_eligible_under_a_finished_run(&env, period).await;
    assert_eq!(rows_of(&env, period, 2, Some("settled")).await, 2000);
    assert_eq!(rows_of(&env, period, 1, Some("settled")).await, 50);
    verify_ok(&env, period).await;

    // Once the run exists, an import into its period is refused whole.
    let after = write_csv(dir.path(), "after.csv", period, 3, 10);
    let refused = env.run(&["import", after.to_str().unwrap(), "--append"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr)
            .contains("already has run 1 (finished): its input can no longer change; nothing was imported"),
        "{}",
        text(&refused.stderr)
    );
    assert_eq!(rows_of(&env, period, 3, None).await, 0);
}

/// The sizes of the files each round of the race below appends.
const RACE_FILE_ROWS: [u32; 3] = [2_000, 10_000, 40_000];
/// When each round starts its run, after its appends: spread over the time
/// an append takes, so that over the rounds run starts land before, inside
/// and after each append's window between its check for a run and its
/// commit. An interleaving, not a measurement.
const RACE_START_AFTER_MS: [u64; 7] = [0, 250, 500, 750, 1_000, 1_250, 1_500];

#[tokio::test(flavor = "multi_thread")]
async fn appends_racing_run_starts_are_refused_or_settled_never_left_under_a_finished_run() {
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut accepted, mut refused) = (0, 0);
    for (round, start_after_ms) in (0..).zip(RACE_START_AFTER_MS) {
        let period = format!("2026-11-{:02}", round + 1);
        let tag = |k: u32| round * 10 + k;
        env.run_ok(&["policy", "--period", &period, "--fee-bps", "250"]);
        let base = write_csv(dir.path(), &format!("base-{round}.csv"), &period, tag(0), 100);
        env.run_ok(&["import", base.to_str().unwrap()]);
        let files: Vec<PathBuf> = (1..)
            .zip(RACE_FILE_ROWS)
            .map(|(k, rows)| write_csv(dir.path(), &format!("append-{round}-{k}.csv"), &period, tag(k), rows))
            .collect();
        // Three appends, then a run start with --wait and a worker.
        let imports: Vec<Child> = files
            .iter()
            .map(|f| spawn(&env, &["import", f.to_str().unwrap(), "--append"]))
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(start_after_ms)).await;
        let starters = [
            spawn(&env, &["run", "--period", &period, "--wait"]),
            spawn(&env, &["worker", "--period", &period]),
        ];
        let mut outputs = Vec::new();
        for import in imports {
            outputs.push(finish(import).await);
        }
        for starter in starters {
            let out = finish(starter).await;
            assert!(out.status.success(), "{}{}", text(&out.stdout), text(&out.stderr));
        }
        // Everyone is done: each file was refused whole, or its run settled it.
        for ((k, rows), out) in (1..).zip(RACE_FILE_ROWS).zip(outputs) {
            let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
            if out.status.success() {
                accepted += 1;
                assert!(stdout.contains(&format!("{rows} imported")), "{stdout}");
                assert_eq!(
                    rows_of(&env, &period, tag(k), Some("settled")).await,
                    i64::from(rows),
                    "round {round}: an accepted import's rows are all settled"
                );
            } else {
                refused += 1;
                assert_eq!(out.status.code(), Some(1), "{stderr}");
                assert!(
                    stderr.contains("its input can no longer change; nothing was imported"),
                    "{stderr}"
                );
                assert_eq!(rows_of(&env, &period, tag(k), None).await, 0);
            }
        }
        assert_eq!(run_state(&env, &period).await, "finished");
        assert_eq!(
            eligible(&env, &period).await,
            0,
            "round {round}: eligible under a finished run"
        );
        verify_ok(&env, &period).await;
    }
    println!("appends accepted {accepted}, refused {refused}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_run_with_eligible_items_is_reopened_by_hand_and_settles_them_once() {
    let env = Env::new().await;
    let period = "2026-11-21";
    env.run_ok(&["seed", "--period", period, "--creators", "300"]);
    env.run_ok(&["run", "--period", period, "--wait"]);
    // Rows that reached the period after its run finished (as a late import
    // once could): eligible, and nobody's work.
    sqlx::query(
        "INSERT INTO settlement.token_trade_volume (period, creator, volume)
         SELECT $1::date, '0x' || lpad(to_hex(i), 40, 'e'), i * 1000000000000 FROM generate_series(1, 25) i",
    )
    .bind(period)
    .execute(&env.pool)
    .await
    .unwrap();
    let told = env.run_ok(&["run", "--period", period]);
    assert!(
        told.contains("is finished; nothing changed")
            && told.contains(&format!(
                "25 item(s) of {period} are eligible but its run is finished: `settled run --period {period} --reopen` settles them"
            )),
        "{told}"
    );
    let idle = env.run_ok(&["worker", "--period", period]);
    assert!(idle.contains("is finished; nothing to do"), "{idle}");
    assert_eq!(eligible(&env, period).await, 25);

    let reopened = env.run_ok(&["run", "--period", period, "--reopen"]);
    assert!(
        reopened.contains(&format!("run 1 of {period} reopened: 25 eligible item(s) to settle")),
        "{reopened}"
    );
    assert_eq!(run_state(&env, period).await, "running");
    env.run_ok(&["worker", "--period", period]);
    assert_eq!(run_state(&env, period).await, "finished");
    assert_eq!(eligible(&env, period).await, 0);
    let ledger = format!("SELECT count(*) FROM settlement.reward_ledger WHERE period = '{period}'");
    assert_eq!(env.scalar_i64(&ledger).await, 325);
    verify_ok(&env, period).await;

    // Nothing eligible: left alone, and said so.
    let again = env.run_ok(&["run", "--period", period, "--reopen"]);
    assert!(
        again.contains(&format!(
            "run 1 of {period} is finished and no item of it is eligible; nothing changed"
        )),
        "{again}"
    );
    assert_eq!(run_state(&env, period).await, "finished");

    // With --wait it settles them here.
    sqlx::query(
        "INSERT INTO settlement.token_trade_volume (period, creator, volume)
         SELECT $1::date, '0x' || lpad(to_hex(i), 40, 'd'), i FROM generate_series(1, 5) i",
    )
    .bind(period)
    .execute(&env.pool)
    .await
    .unwrap();
    let waited = env.run_ok(&["run", "--period", period, "--reopen", "--wait"]);
    assert!(waited.contains(&format!("run 1 of {period} finished")), "{waited}");
    assert_eq!(env.scalar_i64(&ledger).await, 330);
    assert_eq!(
        env.scalar_i64(&format!(
            "SELECT count(DISTINCT creator) FROM settlement.reward_ledger WHERE period = '{period}'"
        ))
        .await,
        330
    );
    verify_ok(&env, period).await;
}

/// Holds run `period`'s row as a finisher would, so that a worker's finish
/// waits behind it after taking its snapshot.
async fn hold_the_run_row(env: &Env, period: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut holder = env.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM settled_engine.runs WHERE scope = $1 FOR NO KEY UPDATE")
        .bind(period)
        .execute(&mut *holder)
        .await
        .unwrap();
    holder
}

/// The run's row held by a transaction of the test's, and a worker whose
/// finish waits for it.
async fn worker_waiting_to_finish(env: &Env, period: &str) -> (sqlx::Transaction<'static, sqlx::Postgres>, Child) {
    let holder = hold_the_run_row(env, period).await;
    let worker = spawn(env, &["worker", "--period", period]);
    wait_until(60, "the worker's finish to wait for the run's row", || async {
        lock_waiters(env, None).await > 0
    })
    .await;
    (holder, worker)
}

/// `worker` succeeds, nothing eligible is left under the finished run,
/// and a worker run again leaves the run finished.
async fn finished_with_nothing_eligible(env: &Env, period: &str, worker: Child) {
    assert!(finish(worker).await.status.success());
    assert_nothing_eligible_under_a_finished_run(env, period).await;
    env.run_ok(&["worker", "--period", period]);
    assert_eq!(run_state(env, period).await, "finished");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retry_while_the_run_finishes_never_leaves_items_eligible_under_a_finished_run() {
    let env = Env::new().await;
    let period = "2026-11-22";
    env.run_ok(&["seed", "--period", period, "--creators", "100"]);
    env.run_ok(&["run", "--period", period]);
    sqlx::query(
        "UPDATE settlement.token_trade_volume SET status = 'failed', attempt = 1, last_error = 'by hand'
         WHERE period = $1::date AND creator IN (SELECT creator FROM settlement.token_trade_volume
                                                 WHERE period = $1::date ORDER BY creator LIMIT 10)",
    )
    .bind(period)
    .execute(&env.pool)
    .await
    .unwrap();
    // The worker settles the other 90, then its finish takes its snapshot
    // (10 failed, nothing left) and waits for the run's row.
    let (holder, worker) = worker_waiting_to_finish(&env, period).await;
    let mut retry = spawn(&env, &["retry", "--period", period]);
    wait_until(60, "the retry to commit, or to wait for the finish", || {
        let exited = retry.try_wait().unwrap().is_some();
        let env = &env;
        async move { exited || lock_waiters(env, None).await > 1 }
    })
    .await;
    holder.rollback().await.unwrap();
    let retried = finish(retry).await;
    assert!(retried.status.success(), "{}", text(&retried.stderr));
    finished_with_nothing_eligible(&env, period, worker).await;
    assert_eq!(
        env.scalar_i64(&format!(
            "SELECT count(*) FROM settlement.reward_ledger WHERE period = '{period}'"
        ))
        .await,
        100
    );
    verify_ok(&env, period).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hold_released_while_the_run_finishes_never_leaves_its_items_under_a_finished_run() {
    let env = Env::new().await;
    let period = "2026-11-23";
    env.run_ok(&["seed", "--period", period, "--creators", "100"]);
    let held = env
        .scalar_text(&format!(
            "SELECT creator FROM settlement.token_trade_volume WHERE period = '{period}' ORDER BY creator LIMIT 1"
        ))
        .await;
    let hold_id = env
        .scalar_i64(&format!(
            "INSERT INTO settlement.creator_holds (creator, reason) VALUES ('{held}', 'review') RETURNING id"
        ))
        .await;
    env.run_ok(&["run", "--period", period]);
    let server = env.serve("period-input-token").await;
    // The worker pays 99, holds one, and its finish waits for the run's row.
    let (holder, worker) = worker_waiting_to_finish(&env, period).await;
    let release = tokio::spawn(
        reqwest::Client::new()
            .post(format!("{}/v1/holds/{hold_id}/release", server.base))
            .bearer_auth("period-input-token")
            .json(&serde_json::json!({}))
            .send(),
    );
    wait_until(60, "the release to commit, or to wait for the finish", || async {
        release.is_finished() || lock_waiters(&env, None).await > 1
    })
    .await;
    holder.rollback().await.unwrap();
    let released = release.await.unwrap().unwrap();
    assert_eq!(released.status(), 200, "{:?}", released.text().await);
    finished_with_nothing_eligible(&env, period, worker).await;
    assert_eq!(
        env.scalar_i64(&format!(
            "SELECT count(*) FROM settlement.reward_ledger WHERE period = '{period}' AND creator = '{held}'"
        ))
        .await,
        1
    );
    verify_ok(&env, period).await;
}
