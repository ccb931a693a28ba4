//! A worker killed with SIGKILL in the middle of a chunk leaves nothing half
//! written, and the rest still settles exactly once.

mod common;

use std::time::Duration;

use common::Env;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_mid_chunk_rolls_back_and_the_rest_settles_once() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "3000"]);

    // Slow chunks: 10 creators x 30 ms of work after the writes, before commit.
    let mut victim = env
        .cmd(&[
            "lab-worker",
            "--period",
            "2026-11-28",
            "--concurrency",
            "2",
            "--chunk",
            "10",
            "--work-ms",
            "30",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();

    // Wait until some chunks committed and one sits written but uncommitted.
    let mut caught_mid_chunk = false;
    for _ in 0..400 {
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
    let mut rest: Vec<_> = (0..3)
        .map(|_| {
            env.cmd(&["worker", "--period", "2026-11-28", "--chunk", "50"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in &mut rest {
        assert!(common::wait_bounded(child, 180).success());
    }
    env.run_ok(&["verify", "--period", "2026-11-28"]);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        3000
    );
}
