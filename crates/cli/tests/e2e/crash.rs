//! A worker killed with SIGKILL in the middle of a chunk leaves nothing half
//! written, and the rest still settles exactly once.

use crate::common;

use std::time::Duration;

use common::{Env, PERIOD};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// `n` workers started with `args` finish the period (within 180 s each),
/// `verify` holds, and the ledger has one row for each of the 3000 creators.
async fn survivors_settle_once(env: &Env, n: usize, args: &[&str]) {
    let mut rest: Vec<_> = (0..n)
        .map(|_| env.cmd(args).stdout(std::process::Stdio::null()).spawn().unwrap())
        .collect();
    for child in &mut rest {
        assert!(common::wait_bounded(child, 180).success());
    }
    env.run_ok(&["verify", "--period", PERIOD]);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        3000
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_chunk_rolls_back_and_the_rest_settles_once() {
    let env = Env::new().await;
    env.seed(3000);

    // Slow chunks: 10 creators x 30 ms of work after the writes, before commit.
    let mut victim = env
        .cmd(&common::lab_worker_args("2", "10", "30"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();

    // Wait until some chunks committed and one sits written but uncommitted.
    let mut caught_mid_chunk = false;
    // A minute or more: a loaded machine may be slow to start the worker.
    for _ in 0..6000 {
        let committed = env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await;
        let open_with_writes = env
            .scalar_i64(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND state = 'idle in transaction'
                   AND query LIKE '%INSERT INTO settlement.reward_ledger%'",
            )
            .await;
        if committed >= 20 && open_with_writes > 0 {
            caught_mid_chunk = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        caught_mid_chunk,
        "never saw the worker between its writes and its commit"
    );
    kill(Pid::from_raw(victim.id() as i32), Signal::SIGKILL).unwrap();
    common::wait_bounded(&mut victim, 180);

    // Its backends notice the dead client and roll back; wait for them to go.
    for _ in 0..200 {
        let open = env
            .scalar_i64(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
            )
            .await;
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // Nothing half written: every ledger row has its settled item and balance, and vice versa.
    let ledger = env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await;
    let settled = env
        .scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'settled'")
        .await;
    let balances = env.scalar_i64("SELECT count(*) FROM settlement.creator_balance").await;
    assert_eq!(ledger, settled);
    assert_eq!(ledger, balances);
    assert!(
        settled > 0 && settled < 3000,
        "the kill should land mid-run, settled {settled}"
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'processing'")
            .await,
        0
    );

    // Survivors finish the period; verify proves each creator paid once.
    survivors_settle_once(&env, 3, &["worker", "--period", PERIOD, "--chunk", "50"]).await;
}

/// The production path: `settled worker` (one chunk statement per chunk,
/// no simulated work) SIGKILLed while its chunk statement is inside the
/// database, stalled on a balance row this test holds locked. The
/// statement's claim, marks, ledger rows and credits all belong to one
/// transaction that never commits, so none of it survives; the period
/// still settles exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn sigkill_of_the_production_worker_inside_its_chunk_statement_leaves_nothing_and_the_period_settles_once() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "3000"]);
    // A creator in the middle of the keys, with a balance row the chunk's
    // credit must update, held by this test.
    let stalled = env
        .scalar_text(
            "SELECT creator FROM settlement.token_trade_volume WHERE period = '2026-11-28'
             ORDER BY creator OFFSET 1500 LIMIT 1",
        )
        .await;
    sqlx::query("INSERT INTO settlement.creator_balance (creator, balance) VALUES ($1, 0)")
        .bind(&stalled)
        .execute(&env.pool)
        .await
        .unwrap();
    let mut holder = env.pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM settlement.creator_balance WHERE creator = $1 FOR UPDATE")
        .bind(&stalled)
        .execute(&mut *holder)
        .await
        .unwrap();

    let mut victim = env
        .cmd(&["worker", "--period", PERIOD, "--concurrency", "1", "--chunk", "100"])
        .env("SETTLED_LOG", "error")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the worker's chunk statement waits for the lock.
    let mut waiting = false;
    for _ in 0..2_400 {
        let blocked = env
            .scalar_i64(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND state = 'active' AND wait_event_type = 'Lock'
                   AND application_name = 'settled-worker' AND query LIKE '%SKIP LOCKED%'",
            )
            .await;
        if blocked > 0 {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        waiting,
        "the worker's chunk statement never waited on the held balance row"
    );
    kill(Pid::from_raw(victim.id() as i32), Signal::SIGKILL).unwrap();
    common::wait_bounded(&mut victim, 60);
    // The statement runs to its end once the lock goes, finds its client
    // gone, and its transaction rolls back with the backend.
    holder.rollback().await.unwrap();
    for _ in 0..400 {
        let others = env
            .scalar_i64(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND application_name LIKE 'settled%'",
            )
            .await;
        if others == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // Nothing of the killed chunk: the stalled creator unpaid and eligible;
    // everything else consistent.
    let stalled_ledger =
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM settlement.reward_ledger WHERE creator = $1")
            .bind(&stalled)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(stalled_ledger, 0, "a row of the killed chunk statement committed");
    let stalled_status: String = sqlx::query_scalar(
        "SELECT status FROM settlement.token_trade_volume WHERE period = '2026-11-28' AND creator = $1",
    )
    .bind(&stalled)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(stalled_status, "eligible");
    let ledger = env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await;
    let settled = env
        .scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'settled'")
        .await;
    assert_eq!(ledger, settled);
    assert!(settled < 3000, "the kill should leave work, settled {settled}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'processing'")
            .await,
        0
    );

    // Two workers finish; the period verifies and the stalled creator holds
    // its reward once.
    survivors_settle_once(&env, 2, &["worker", "--period", PERIOD]).await;
    let (balance_once, ledger_rows): (bool, i64) = sqlx::query_as(
        "SELECT b.balance = l.amount, (SELECT count(*) FROM settlement.reward_ledger WHERE creator = $1)
         FROM settlement.creator_balance b
         JOIN settlement.reward_ledger l ON l.creator = b.creator
         WHERE b.creator = $1",
    )
    .bind(&stalled)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(ledger_rows, 1);
    assert!(balance_once, "the stalled creator's balance is not its one reward");
}
