//! Periods are partitions: an unpartitioned database migrates to them with
//! its money intact; `settled archive` retires settled periods all or
//! nothing, its files re-check with `verify --archive`, and an archived
//! period can never take items (so never be paid) again.

use crate::common;

use std::path::Path;

use common::{wait_bounded, wait_until, Env, ProviderSim, LEASED_FAST, PERIOD};
use settled_testkit::{CommitFault, FaultPlan, PgProxy};

mod archive;
mod commit;
mod locks;
mod migrate;

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

/// `settled worker` on `period`, two claim loops of `chunk` items each,
/// started.
fn two_loop_worker(env: &Env, period: &str, chunk: &str) -> std::process::Child {
    env.cmd(&["worker", "--period", period, "--chunk", chunk, "--concurrency", "2"])
        .spawn()
        .unwrap()
}

fn seed_and_settle(env: &Env, period: &str, creators: &str) {
    env.run_ok(&["seed", "--period", period, "--creators", creators]);
    env.run_ok(&["run", "--period", period, "--wait"]);
}
