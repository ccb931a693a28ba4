//! Crash safety with real processes and real timing (short leases): killed
//! workers, zombies, provider timeouts, poison items, SIGTERM.

use crate::common;

use std::process::Stdio;

use common::{wait_until, Env, ProviderSim, LEASED_FAST, PERIOD};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn worker(env: &Env, extra: &[&str]) -> std::process::Child {
    let mut args = vec!["lab-worker", "--period", PERIOD];
    args.extend_from_slice(extra);
    env.cmd(&args).stdout(Stdio::null()).spawn().expect("spawn worker")
}

fn signal(child: &std::process::Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
}

async fn processing_of(env: &Env) -> i64 {
    env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'processing'")
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sigkilled_workers_leases_are_rescued_and_settled_by_others() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "300"]);
    let mut args = LEASED_FAST.to_vec();
    args.extend(["--chunk", "20", "--concurrency", "1", "--work-ms", "50"]);
    let mut victim = worker(&env, &args);
    wait_until(30, "the victim to hold leases", || async {
        processing_of(&env).await > 0
    })
    .await;
    signal(&victim, Signal::SIGKILL);
    common::wait_bounded(&mut victim, 180);
    let orphaned: Vec<String> =
        sqlx::query_scalar("SELECT creator FROM settlement.token_trade_volume WHERE status = 'processing'")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    assert!(!orphaned.is_empty());

    let mut args = LEASED_FAST.to_vec();
    args.extend(["--chunk", "50"]);
    let mut rescuer = worker(&env, &args);
    assert!(common::wait_bounded(&mut rescuer, 180).success());
    // The orphans went through the rescuer (lease expired) and were paid once.
    let rescued: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM settlement.token_trade_volume
         WHERE creator = ANY($1) AND status = 'settled' AND attempt >= 2",
    )
    .bind(&orphaned)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(rescued, orphaned.len() as i64);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        300
    );
    env.run_ok(&["verify", "--period", PERIOD]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zombies_completion_is_refused_by_the_fence_and_nothing_is_paid_twice() {
    let env = Env::new().await;
    let sim = ProviderSim::start(&[]);
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "200"]);
    let mut args = LEASED_FAST.to_vec();
    args.extend([
        "--chunk",
        "10",
        "--concurrency",
        "1",
        "--work-ms",
        "100",
        // One call at a time: the pause lands while it works (paid some of
        // its chunk, not all), not inside its completion's transaction.
        "--provider-concurrency",
        "1",
        "--provider-url",
        &sim.url,
    ]);
    let mut zombie = worker(&env, &args);
    // Pause it once it has paid part of a chunk through the provider.
    wait_until(30, "the zombie to pay a first item", || async {
        sim.counters().await["applied"].as_u64().unwrap_or(0) >= 3
    })
    .await;
    signal(&zombie, Signal::SIGSTOP);

    // Others rescue its leases and settle everything while it sleeps.
    let mut args = LEASED_FAST.to_vec();
    args.extend(["--chunk", "50", "--provider-url", &sim.url]);
    let mut other = worker(&env, &args);
    assert!(common::wait_bounded(&mut other, 180).success());
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'settled'")
            .await,
        200
    );

    // It wakes up, tries to complete what it paid, and is refused.
    signal(&zombie, Signal::SIGCONT);
    assert!(common::wait_bounded(&mut zombie, 180).success());
    let rejected = env
        .scalar_i64("SELECT max(fence_rejections) FROM settled_engine.workers")
        .await;
    assert!(rejected > 0, "the zombie's completion should have been refused");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        200
    );
    let counters = sim.counters().await;
    assert_eq!(counters["applied"], 200, "{counters}");
    env.run_ok(&["verify", "--period", PERIOD, "--provider-url", &sim.url]);
}

#[tokio::test(flavor = "multi_thread")]
async fn applied_then_timed_out_never_pays_twice() {
    let env = Env::new().await;
    let sim = ProviderSim::start(&[
        "--applied-timeout-rate",
        "0.5",
        "--applied-timeout-ms",
        "800",
        "--seed",
        "3",
    ]);
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "150"]);
    let mut args = LEASED_FAST.to_vec();
    args.extend(["--chunk", "10", "--concurrency", "4", "--provider-url", &sim.url]);
    let mut children: Vec<_> = (0..2).map(|_| worker(&env, &args)).collect();
    for child in &mut children {
        assert!(common::wait_bounded(child, 180).success());
    }
    let counters = sim.counters().await;
    assert!(counters["applied_then_timed_out"].as_u64().unwrap() > 10, "{counters}");
    assert!(counters["replayed"].as_u64().unwrap() > 0, "{counters}");
    assert_eq!(counters["applied"], 150, "one payment per creator: {counters}");
    env.run_ok(&["verify", "--period", PERIOD, "--provider-url", &sim.url]);
}

async fn install_poison(env: &Env) -> String {
    let poison = env
        .scalar_text("SELECT creator FROM settlement.token_trade_volume ORDER BY creator OFFSET 37 LIMIT 1")
        .await;
    // A fixture that makes one creator's payment fail, as bad data would.
    sqlx::query(&format!(
        "CREATE FUNCTION settlement.poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.creator = '{poison}' THEN
                 RAISE EXCEPTION 'cannot pay {poison}' USING ERRCODE = 'data_exception';
             END IF;
             RETURN NEW;
         END $$"
    ))
    .execute(&env.pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER poison BEFORE INSERT ON settlement.reward_ledger
         FOR EACH ROW EXECUTE FUNCTION settlement.poison()",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    poison
}

async fn assert_only_poison_failed(env: &Env, poison: &str) {
    let failed: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT creator, last_error FROM settlement.token_trade_volume WHERE status = 'failed'")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, poison);
    assert!(
        failed[0].1.as_deref().unwrap_or("").contains("cannot pay"),
        "{failed:?}"
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        199
    );
    env.run_ok(&["verify", "--period", PERIOD]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_poison_item_fails_alone_in_transaction_mode() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "200"]);
    let poison = install_poison(&env).await;
    env.run_ok(&["worker", "--period", PERIOD, "--chunk", "100"]);
    assert_only_poison_failed(&env, &poison).await;
    assert_eq!(
        env.scalar_text("SELECT state FROM settled_engine.runs").await,
        "finished"
    );

    // Fixed, then retried: paid once, and the run finishes again.
    sqlx::query("DROP TRIGGER poison ON settlement.reward_ledger")
        .execute(&env.pool)
        .await
        .unwrap();
    let out = env.run_ok(&["retry", "--period", PERIOD, "--creator", &poison]);
    assert!(out.contains("1 failed item"), "{out}");
    env.run_ok(&["worker", "--period", PERIOD]);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        200
    );
    env.run_ok(&["verify", "--period", PERIOD]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_poison_item_fails_alone_in_leased_mode() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "200"]);
    let poison = install_poison(&env).await;
    let mut args = vec!["lab-worker", "--period", PERIOD, "--chunk", "100"];
    args.extend_from_slice(LEASED_FAST);
    env.run_ok(&args);
    assert_only_poison_failed(&env, &poison).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_gives_back_held_items_and_exits_zero() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "100"]);
    let mut args = LEASED_FAST.to_vec();
    // One item at a time per loop, so a chunk's later items are held but
    // not started when SIGTERM comes.
    args.extend([
        "--chunk",
        "20",
        "--concurrency",
        "2",
        "--work-ms",
        "400",
        "--provider-concurrency",
        "2",
    ]);
    let mut child = worker(&env, &args);
    wait_until(30, "the worker to hold leases", || async {
        processing_of(&env).await > 0
    })
    .await;
    signal(&child, Signal::SIGTERM);
    let status = common::wait_bounded(&mut child, 180);
    assert!(status.success(), "{status}");
    assert_eq!(processing_of(&env).await, 0, "held items must be released");
    // Released items keep their attempt (the fence only grows).
    let released = env
        .scalar_i64(
            "SELECT count(*) FROM settlement.token_trade_volume
             WHERE status = 'eligible' AND attempt = 1 AND lease_owner IS NULL",
        )
        .await;
    assert!(released > 0);
    env.run_ok(&["worker", "--period", PERIOD]);
    env.run_ok(&["verify", "--period", PERIOD]);
}

async fn deadlocks(env: &Env) -> i64 {
    env.scalar_i64("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_workers_lease_renewals_and_its_completions_never_deadlock() {
    // One process's renewal updates every lease it holds in one statement
    // while its loops complete chunks of the same rows in transactions of
    // their own: unless the two never lock the same rows at once, each can
    // hold a row the other waits for. Renewals every 100 ms (the shortest
    // lease) over four loops' chunks of 100 make that meeting frequent: the
    // build before measured 9 deadlocks in this run.
    let env = Env::new().await;
    let sim = ProviderSim::start(&["--latency-ms", "10"]);
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "20000"]);
    let before = deadlocks(&env).await;
    env.run_leased_worker(
        &sim.url,
        &[
            "--lease-ttl-ms",
            "300",
            // A lease lost on a loaded machine is rescued in seconds, not at
            // the default interval.
            "--rescue-interval-ms",
            "2000",
            "--concurrency",
            "4",
            "--chunk",
            "100",
            "--provider-concurrency",
            "64",
        ],
    );
    // A backend's counters reach the shared statistics when it exits; the
    // worker's have, and this session reads afresh outside a transaction.
    assert_eq!(deadlocks(&env).await - before, 0, "deadlocks while settling");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        20000
    );
    env.run_ok(&["verify", "--period", PERIOD, "--provider-url", &sim.url]);
}
