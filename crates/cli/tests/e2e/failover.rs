//! A primary and its streaming standby (`pg_basebackup -R`), workers
//! connected by a libpq multi-host URL with `target_session_attrs=read-write`;
//! the primary crashes mid-run (`pg_ctl stop -m immediate`) and the standby is
//! promoted. The workers follow the primary to the standby by themselves and
//! finish the run there, every creator paid once, `settled verify` passes.
//! Once with asynchronous and once with synchronous replication.

use crate::common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, spawn_server, wait_bounded, ProviderSim, Server, LEASED_FAST, PERIOD, SETTLED};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use settled_testkit::{LocalOptions, LocalPostgres};
use sqlx::{Connection, PgConnection};

const CREATORS: i64 = 6000;

/// A primary and a standby that follows it; both stopped and removed on drop.
struct Pair {
    primary: Option<LocalPostgres>,
    standby: Option<LocalPostgres>,
    _dir: tempfile::TempDir,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for server in [self.primary.take(), self.standby.take()].into_iter().flatten() {
            let _ = server.stop();
        }
    }
}

fn options(data_dir: std::path::PathBuf, settings: Vec<String>) -> LocalOptions {
    LocalOptions {
        data_dir,
        // Durable: a crash must lose only what was not in the WAL yet.
        throwaway: false,
        remove_on_stop: true,
        max_connections: 100,
        settings,
    }
}

fn start_pair(synchronous: bool) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let settings = if synchronous {
        vec![
            "synchronous_standby_names='*'".to_string(),
            "synchronous_commit=on".to_string(),
        ]
    } else {
        Vec::new()
    };
    let primary = LocalPostgres::start(&options(dir.path().join("primary"), settings)).expect("start the primary");
    let standby_dir = primary.base_backup(&dir.path().join("standby")).expect("pg_basebackup");
    let standby = LocalPostgres::start(&options(standby_dir, Vec::new())).expect("start the standby");
    Pair {
        primary: Some(primary),
        standby: Some(standby),
        _dir: dir,
    }
}

/// libpq's multi-host form over the two servers' sockets.
fn multi_host_url(pair: &Pair) -> String {
    let (p, s) = (pair.primary.as_ref().unwrap(), pair.standby.as_ref().unwrap());
    format!(
        "postgres://postgres@localhost/settled?host={},{}&port={},{}&target_session_attrs=read-write",
        p.socket_dir().display(),
        s.socket_dir().display(),
        p.port(),
        s.port()
    )
}

fn settled(url: &str, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(SETTLED);
    // The default log filter: what an operator sees.
    cmd.args(args)
        .env("DATABASE_URL", url)
        .env_remove("SETTLED_LOG")
        .stdin(Stdio::null());
    cmd
}

fn run_ok(url: &str, args: &[&str]) -> String {
    common::stdout_of_success(settled(url, args), args)
}

async fn count(url: &str, sql: &str) -> i64 {
    let mut conn = PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
}

/// How the workers pay.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Ledger and item in one transaction.
    InTransaction,
    /// Leases, then the provider simulator, then a fenced completion.
    Leased,
}

async fn crash_mid_run_and_promote(synchronous: bool, mode: Mode) {
    let mut pair = start_pair(synchronous);
    create_database(&pair).await;
    let url = multi_host_url(&pair);
    run_ok(&url, &["seed", "--period", PERIOD, "--creators", &CREATORS.to_string()]);
    let sim = (mode == Mode::Leased).then(|| ProviderSim::start(&[]));
    let mut args = vec![
        "lab-worker",
        "--period",
        PERIOD,
        "--concurrency",
        "2",
        "--chunk",
        "50",
        "--work-ms",
        "4",
    ];
    if let Some(sim) = &sim {
        args.extend_from_slice(LEASED_FAST);
        args.extend(["--provider-url", sim.url.as_str()]);
    }
    let logs = tempfile::tempdir().unwrap();
    let mut workers: Vec<Child> = (0..3)
        .map(|i| {
            let log = std::fs::File::create(logs.path().join(format!("worker-{i}.log"))).unwrap();
            settled(&url, &args).stdout(Stdio::null()).stderr(log).spawn().unwrap()
        })
        .collect();
    // An API server on the same URL: it answers 503 during the failover and
    // recovers by itself.
    let port = free_port();
    let mut serve = settled(&url, &["serve", "--bind", &format!("127.0.0.1:{port}")])
        .env("SETTLED_API_TOKEN", "t")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let api = format!("http://127.0.0.1:{port}");
    // Mid-run: a sixth of the creators paid.
    let on_primary = pair.primary.as_ref().unwrap().url("settled");
    let deadline = Instant::now() + Duration::from_secs(120);
    while count(&on_primary, "SELECT count(*) FROM settlement.reward_ledger").await < CREATORS / 6 {
        assert!(Instant::now() < deadline, "the run did not get going");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let primary = pair.primary.take().unwrap();
    primary.crash().expect("crash the primary");
    tokio::time::sleep(Duration::from_millis(500)).await;
    pair.standby.as_ref().unwrap().promote().expect("promote the standby");
    for (i, worker) in workers.iter_mut().enumerate() {
        let status = tokio::task::block_in_place(|| wait_bounded(worker, 180));
        let log = std::fs::read_to_string(logs.path().join(format!("worker-{i}.log"))).unwrap();
        assert!(status.success(), "worker {i} exited {status:?}:\n{log}");
        assert_eq!(
            log.matches("following the primary to another host").count(),
            1,
            "worker {i} says once that it follows the primary:\n{log}"
        );
        // Bounded logs: at most one line per claim loop for the outage.
        assert!(
            log.matches("chunk rolled back").count() <= 2,
            "worker {i} logged the outage once per attempt:\n{log}"
        );
    }
    if std::env::var_os("SETTLED_SHOW_FAILOVER_LOGS").is_some() {
        for i in 0..3 {
            eprintln!(
                "{}",
                std::fs::read_to_string(logs.path().join(format!("worker-{i}.log"))).unwrap()
            );
        }
    }
    let _ = primary.stop();
    // The API server is on the new primary too.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = reqwest::get(format!("{api}/readyz"))
            .await
            .map(|r| r.status().as_u16())
            .ok();
        if ready == Some(200) {
            break;
        }
        assert!(Instant::now() < deadline, "serve did not recover: {ready:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let creator: String = {
        let mut conn = PgConnection::connect(&pair.standby.as_ref().unwrap().url("settled"))
            .await
            .unwrap();
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1")
            .fetch_one(&mut conn)
            .await
            .unwrap()
    };
    let paid = reqwest::Client::new()
        .post(format!("{api}/v1/payouts"))
        .bearer_auth("t")
        .header("Idempotency-Key", "after-failover")
        .json(&serde_json::json!({ "creator": creator, "amount": "1" }))
        .send()
        .await
        .unwrap();
    // Leased settlement paid the rewards out through the provider, so the
    // balances are empty there: the answer is still a decision written on
    // the new primary (its idempotency key stored), not an error.
    let want = if mode == Mode::Leased { 409 } else { 201 };
    assert_eq!(paid.status(), want, "a payout after the failover");
    let _ = serve.kill();
    let _ = serve.wait();
    // On the new primary: the run finished, every creator paid once.
    let on_new = pair.standby.as_ref().unwrap().url("settled");
    assert_eq!(
        count(&on_new, "SELECT count(*) FROM settlement.reward_ledger").await,
        CREATORS
    );
    assert_eq!(
        count(&on_new, "SELECT count(DISTINCT creator) FROM settlement.reward_ledger").await,
        CREATORS
    );
    assert_eq!(
        count(
            &on_new,
            "SELECT count(*) FROM settled_engine.runs WHERE state = 'finished'"
        )
        .await,
        1
    );
    let verified = run_ok(&url, &["verify", "--period", PERIOD]);
    assert!(verified.contains("OK"), "{verified}");
    if let Some(sim) = &sim {
        // Outside the database, one payment per creator: what the old
        // primary lost was paid again under the same idempotency key.
        let counters = sim.counters().await;
        assert_eq!(counters["applied"], CREATORS, "{counters}");
        assert_eq!(counters["conflicts"], 0, "{counters}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_follow_a_failover_to_the_promoted_standby_and_pay_once_with_asynchronous_replication() {
    crash_mid_run_and_promote(false, Mode::InTransaction).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_follow_a_failover_to_the_promoted_standby_and_pay_once_with_synchronous_replication() {
    crash_mid_run_and_promote(true, Mode::InTransaction).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leased_workers_follow_a_failover_and_the_provider_is_paid_once_per_creator_with_asynchronous_replication() {
    crash_mid_run_and_promote(false, Mode::Leased).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn leased_workers_follow_a_failover_and_the_provider_is_paid_once_per_creator_with_synchronous_replication() {
    crash_mid_run_and_promote(true, Mode::Leased).await;
}

async fn wait_for(url: &str, sql: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut conn = PgConnection::connect(url).await.unwrap();
        if sqlx::query_scalar::<_, bool>(sql).fetch_one(&mut conn).await.unwrap() {
            return;
        }
        assert!(Instant::now() < deadline, "waited too long for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The fence question. With asynchronous replication a failover loses the
/// commits the standby had not received; a leased claim among them comes
/// back on the new primary as a claim with the same attempt number. The
/// fence carries the primary's timeline too, so the zombie holding the lost
/// claim is refused, where the attempt alone would have let it complete in
/// the new claim's name. (Past the fence, the ledger's key and the
/// provider's idempotency key stop a second payment anyway: see the leased
/// failover tests.)
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_lost_in_a_failover_gets_its_attempt_number_again_and_the_timeline_in_the_fence_refuses_its_zombie() {
    let mut pair = start_pair(false);
    create_database(&pair).await;
    run_ok(
        &multi_host_url(&pair),
        &["seed", "--period", PERIOD, "--creators", "20"],
    );
    let (old_url, new_url) = (
        pair.primary.as_ref().unwrap().url("settled"),
        pair.standby.as_ref().unwrap().url("settled"),
    );
    let job = settled::settlement::job();
    let old = sqlx::PgPool::connect(&old_url).await.unwrap();
    let run = job.start_or_join(&old, PERIOD, None).await.unwrap().run;
    // The standby has all of that; then it stops receiving.
    cut_replication(&pair).await;
    // The zombie's claim commits on the primary only.
    let ttl = Duration::from_secs(600);
    let mut conn = old.acquire().await.unwrap();
    let zombie = job
        .queue()
        .claim_leased(&mut conn, PERIOD, 5, run.id, uuid::Uuid::new_v4(), ttl)
        .await
        .unwrap();
    assert_eq!(zombie.len(), 5);
    drop(conn);
    old.close().await;
    pair.primary.take().unwrap().crash().unwrap();
    pair.standby.as_ref().unwrap().promote().unwrap();
    // The new primary never saw that claim: it hands out the same attempt
    // numbers again, on a new timeline.
    let new = sqlx::PgPool::connect(&new_url).await.unwrap();
    let mut conn = new.acquire().await.unwrap();
    let live = job
        .queue()
        .claim_leased(&mut conn, PERIOD, 20, run.id, uuid::Uuid::new_v4(), ttl)
        .await
        .unwrap();
    assert_eq!(live.len(), 20);
    for z in &zombie {
        let l = live
            .iter()
            .find(|l| l.key == z.key)
            .expect("the zombie's item is claimed again");
        assert_eq!(
            l.fence.get(),
            z.fence.get(),
            "the same attempt number, handed out twice"
        );
        assert!(l.fence.epoch() > z.fence.epoch(), "{} vs {}", l.fence, z.fence);
    }
    // By attempt alone the zombie would complete in the live claim's name...
    let keys: Vec<String> = zombie.iter().map(|z| z.key.clone()).collect();
    let attempts: Vec<i32> = zombie.iter().map(|z| z.fence.get()).collect();
    let by_attempt: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM settlement.token_trade_volume t
         JOIN unnest($1::text[], $2::int[]) AS z(creator, attempt) USING (creator)
         WHERE t.period = $3::date AND t.attempt = z.attempt AND t.status = 'processing'",
    )
    .bind(&keys)
    .bind(&attempts)
    .bind(PERIOD)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert_eq!(by_attempt, 5);
    drop(conn);
    // ...the fence refuses it, and accepts the live claim.
    let mut tx = new.begin().await.unwrap();
    let accepted = job.queue().complete_fenced(&mut tx, PERIOD, &zombie).await.unwrap();
    assert!(accepted.is_empty(), "the zombie completed: {accepted:?}");
    let accepted = job.queue().complete_fenced(&mut tx, PERIOD, &live).await.unwrap();
    assert_eq!(accepted.len(), 20);
    tx.commit().await.unwrap();
}

/// Creates the `settled` database on the primary (the standby follows).
async fn create_database(pair: &Pair) {
    let mut admin = PgConnection::connect(&pair.primary.as_ref().unwrap().url("postgres"))
        .await
        .unwrap();
    sqlx::query("CREATE DATABASE settled")
        .execute(&mut admin)
        .await
        .unwrap();
}

/// Waits until the standby has replayed all the primary has, then stops its
/// replication: what the primary commits from now on, the standby never gets.
async fn cut_replication(pair: &Pair) {
    let (old_url, new_url) = (
        pair.primary.as_ref().unwrap().url("settled"),
        pair.standby.as_ref().unwrap().url("settled"),
    );
    let mut old = PgConnection::connect(&old_url).await.unwrap();
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&mut old)
        .await
        .unwrap();
    wait_for(
        &new_url,
        &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
        "the standby to replay what the primary has",
    )
    .await;
    let mut standby = PgConnection::connect(&new_url).await.unwrap();
    for sql in ["ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"] {
        sqlx::query(sql).execute(&mut standby).await.unwrap();
    }
    wait_for(
        &old_url,
        "SELECT count(*) = 0 FROM pg_stat_replication",
        "replication to stop",
    )
    .await;
}

/// Settles 10 creators through `url`, waits until the standby has replayed
/// it all, then stops the standby's replication: what the primary commits
/// from now on, the standby never gets.
async fn settle_then_cut_replication(pair: &Pair, url: &str) -> String {
    create_database(pair).await;
    run_ok(url, &["seed", "--period", PERIOD, "--creators", "10"]);
    run_ok(url, &["worker", "--period", PERIOD]);
    let mut old = PgConnection::connect(&pair.primary.as_ref().unwrap().url("settled"))
        .await
        .unwrap();
    let creator: String =
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1")
            .fetch_one(&mut old)
            .await
            .unwrap();
    drop(old);
    cut_replication(pair).await;
    creator
}

/// `settled serve` on `url` with `extra` flags, once it is ready.
async fn api(url: &str, extra: &[&str]) -> Server {
    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    let mut args = vec!["serve", "--bind", bind.as_str()];
    args.extend_from_slice(extra);
    let mut cmd = settled(url, &args);
    cmd.env("SETTLED_API_TOKEN", "t");
    spawn_server(cmd, port, "/readyz").await
}

async fn pay(base: &str, key: &str, creator: &str) -> (u16, serde_json::Value) {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/payouts"))
        .bearer_auth("t")
        .header("Idempotency-Key", key)
        .json(&serde_json::json!({ "creator": creator, "amount": "1000" }))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

/// Crashes the primary, promotes the standby, and waits until `api` takes
/// writes again.
async fn fail_over(pair: &mut Pair, api: &Server) {
    pair.primary.take().unwrap().crash().unwrap();
    pair.standby.as_ref().unwrap().promote().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while reqwest::get(format!("{}/readyz", api.base))
        .await
        .map(|r| r.status().as_u16())
        .ok()
        != Some(200)
    {
        assert!(Instant::now() < deadline, "serve did not follow the failover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_acknowledged_payout_can_vanish_in_an_asynchronous_failover_and_its_retry_pays_once() {
    let mut pair = start_pair(false);
    let url = multi_host_url(&pair);
    let creator = settle_then_cut_replication(&pair, &url).await;
    let server = api(&url, &[]).await;
    let (status, first) = pay(&server.base, "ack-1", &creator).await;
    assert_eq!(status, 201, "{first}");
    fail_over(&mut pair, &server).await;
    let new_url = pair.standby.as_ref().unwrap().url("settled");
    assert_eq!(
        count(&new_url, "SELECT count(*) FROM settlement.payouts").await,
        0,
        "the 201 was acknowledged by a primary whose commit the standby never got"
    );
    // The client retries with its key: one payout, on the new primary.
    let (status, again) = pay(&server.base, "ack-1", &creator).await;
    assert_eq!(status, 201, "{again}");
    let (status, replayed) = pay(&server.base, "ack-1", &creator).await;
    assert_eq!((status, &replayed["id"]), (201, &again["id"]));
    assert_eq!(count(&new_url, "SELECT count(*) FROM settlement.payouts").await, 1);
    let verified = run_ok(&url, &["verify", "--period", PERIOD]);
    assert!(verified.contains("OK"), "{verified}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_remote_apply_no_payout_is_acknowledged_before_the_standby_has_it() {
    let mut pair = start_pair(true);
    let url = multi_host_url(&pair);
    let creator = settle_then_cut_replication(&pair, &url).await;
    // The standby gets nothing now: a payout must not be answered 201, even
    // after the API's 5 s statement timeout (PostgreSQL would turn a
    // cancelled wait for the standby into a successful commit).
    let server = api(
        &url,
        &["--synchronous-commit", "remote-apply", "--request-timeout-ms", "7000"],
    )
    .await;
    let (status, answer) = pay(&server.base, "ack-2", &creator).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["type"], "/problems/request-timeout", "{answer}");
    fail_over(&mut pair, &server).await;
    let new_url = pair.standby.as_ref().unwrap().url("settled");
    assert_eq!(count(&new_url, "SELECT count(*) FROM settlement.payouts").await, 0);
    let (status, paid) = pay(&server.base, "ack-2", &creator).await;
    assert_eq!(status, 201, "{paid}");
    assert_eq!(count(&new_url, "SELECT count(*) FROM settlement.payouts").await, 1);
    let verified = run_ok(&url, &["verify", "--period", PERIOD]);
    assert!(verified.contains("OK"), "{verified}");
}

/// A client making payouts one after another through `settled serve`,
/// retrying under the same key until each gets an answer; the keys of the
/// payouts answered 201.
async fn payout_stream(base: String, creators: Vec<String>, stream: usize, n: usize) -> Vec<(String, i64)> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut made = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    for i in 0..n {
        let key = format!("failover-payout-{stream}-{i}");
        loop {
            assert!(Instant::now() < deadline, "payout {key} got no answer");
            let sent = http
                .post(format!("{base}/v1/payouts"))
                .bearer_auth("t")
                .header("Idempotency-Key", &key)
                .json(&serde_json::json!({ "creator": creators[(i + stream) % creators.len()], "amount": "1000" }))
                .send()
                .await;
            match sent {
                Ok(r) if r.status() == 201 => {
                    let body: serde_json::Value = r.json().await.unwrap();
                    made.push((key, body["id"].as_i64().unwrap()));
                    break;
                }
                Ok(r) if r.status().is_client_error() && r.status() != 409 => {
                    panic!("payout {key}: {} {}", r.status(), r.text().await.unwrap_or_default())
                }
                // 5xx while the database is away, 409 while a try is in progress.
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    made
}

/// Payouts made and delivered while the primary crashes and the standby is
/// promoted (asynchronous replication): the API server and two `settled
/// deliver` processes follow the primary by themselves; the provider's
/// webhooks (some lost, some sent twice) and look-ups finish the payouts.
/// On the new primary every payout ends paid (one payment at the provider
/// under its key, of its amount) or failed and returned once, none stuck,
/// and verify holds. An acknowledged payout whose commit the standby never
/// got is gone with its debit; if it had reached the provider, its payment
/// is there under a key the new primary does not know (counted, for
/// reconciliation).
#[tokio::test(flavor = "multi_thread")]
async fn payouts_delivered_through_an_asynchronous_failover_end_paid_once_or_returned() {
    const SECRET: &str = "whsec-failover";
    const STREAMS: usize = 2;
    const PAYOUTS: usize = 400;
    let mut pair = start_pair(false);
    create_database(&pair).await;
    let url = multi_host_url(&pair);
    run_ok(&url, &["seed", "--period", PERIOD, "--creators", "100"]);
    run_ok(&url, &["worker", "--period", PERIOD]);
    let sim = ProviderSim::start(&[
        "--settle-delay-ms",
        "300",
        "--failure-rate",
        "0.1",
        "--webhook-loss-rate",
        "0.2",
        "--webhook-duplicate-rate",
        "0.2",
    ]);
    let server = api(&url, &["--provider-webhook-secret", SECRET]).await;
    let endpoint = serde_json::json!({ "url": format!("{}/v1/provider-events", server.base), "secret": SECRET });
    let r = reqwest::Client::new()
        .post(format!("{}/v1/webhook-endpoint", sim.url))
        .json(&endpoint)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let logs = tempfile::tempdir().unwrap();
    let mut deliverers: Vec<Child> = (0..2)
        .map(|i| {
            let log = std::fs::File::create(logs.path().join(format!("deliver-{i}.log"))).unwrap();
            settled(
                &url,
                &[
                    "deliver",
                    "--provider-url",
                    &sim.url,
                    "--provider-timeout-ms",
                    "1000",
                    "--lease-ttl-ms",
                    "2000",
                    "--rescue-interval-ms",
                    "500",
                    "--poll-after-secs",
                    "1",
                    "--max-poll-ms",
                    "200",
                    "--batch",
                    "10",
                    "--shutdown-grace-ms",
                    "1000",
                ],
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
        })
        .collect();
    let on_primary = pair.primary.as_ref().unwrap().url("settled");
    let creators: Vec<String> = {
        let mut conn = PgConnection::connect(&on_primary).await.unwrap();
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance WHERE balance >= 1000000 ORDER BY creator")
            .fetch_all(&mut conn)
            .await
            .unwrap()
    };
    assert!(creators.len() >= 10, "creators with balances: {}", creators.len());
    let streams: Vec<_> = (0..STREAMS)
        .map(|s| {
            tokio::spawn(payout_stream(
                server.base.clone(),
                creators.clone(),
                s,
                PAYOUTS / STREAMS,
            ))
        })
        .collect();
    // Mid-stream, with deliveries under way: the primary crashes.
    let deadline = Instant::now() + Duration::from_secs(120);
    while count(
        &on_primary,
        "SELECT count(*) FROM settlement.payouts WHERE status IN ('sent', 'paid', 'failed')",
    )
    .await
        < (PAYOUTS / 4) as i64
    {
        assert!(Instant::now() < deadline, "delivery did not get going");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let primary = pair.primary.take().unwrap();
    primary.crash().expect("crash the primary");
    pair.standby.as_ref().unwrap().promote().expect("promote the standby");
    let mut made = Vec::new();
    for stream in streams {
        made.extend(stream.await.unwrap());
    }
    let on_new = pair.standby.as_ref().unwrap().url("settled");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let open = count(
            &on_new,
            "SELECT count(*) FROM settlement.payouts WHERE status IN ('created', 'queued', 'sent')",
        )
        .await;
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} payouts not final on the new primary; deliverers' logs:\n{}",
            (0..2)
                .map(|i| std::fs::read_to_string(logs.path().join(format!("deliver-{i}.log"))).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (i, deliverer) in deliverers.iter_mut().enumerate() {
        kill(Pid::from_raw(deliverer.id() as i32), Signal::SIGTERM).unwrap();
        let status = tokio::task::block_in_place(|| wait_bounded(deliverer, 60));
        let log = std::fs::read_to_string(logs.path().join(format!("deliver-{i}.log"))).unwrap();
        assert!(status.success(), "deliverer {i} exited {status:?}:\n{log}");
    }
    let _ = primary.stop();

    let mut conn = PgConnection::connect(&on_new).await.unwrap();
    let payouts: Vec<(i64, String, String, String, String)> =
        sqlx::query_as("SELECT id, creator, amount::text, status, provider_key FROM settlement.payouts ORDER BY id")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    let returned: std::collections::HashMap<i64, String> =
        sqlx::query_as::<_, (i64, String)>("SELECT payout_id, amount::text FROM settlement.payout_returns")
            .fetch_all(&mut conn)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let provider = settled::provider::HttpProvider::new(&sim.url, Duration::from_secs(10)).unwrap();
    let payments = provider.list_all().await.unwrap();
    let by_key: std::collections::HashMap<&str, &settled::provider::Payment> =
        payments.iter().map(|p| (p.idempotency_key.as_str(), p)).collect();
    assert_eq!(by_key.len(), payments.len(), "one payment per key at the provider");
    for (id, creator, amount, status, key) in &payouts {
        let payment = by_key.get(key.as_str());
        match status.as_str() {
            "paid" => {
                let p = payment.unwrap_or_else(|| panic!("payout {id} is paid; the provider has no payment"));
                assert_eq!(
                    (p.status.as_str(), p.amount.as_str(), p.creator.as_str()),
                    ("paid", amount.as_str(), creator.as_str()),
                    "payout {id}"
                );
                assert!(!returned.contains_key(id), "paid payout {id} was returned");
            }
            "failed" => {
                assert!(
                    payment.is_none_or(|p| p.status.as_str() == "failed"),
                    "failed payout {id} was paid at the provider"
                );
                assert_eq!(returned.get(id), Some(amount), "failed payout {id} returned once");
            }
            other => panic!("payout {id} ended {other}"),
        }
    }
    let known: std::collections::HashSet<&str> = payouts.iter().map(|p| p.4.as_str()).collect();
    let orphans = payments
        .iter()
        .filter(|p| !known.contains(p.idempotency_key.as_str()))
        .count();
    let stored: std::collections::HashSet<i64> = payouts.iter().map(|p| p.0).collect();
    let vanished = made.iter().filter(|(_, id)| !stored.contains(id)).count();
    let counters = sim.counters().await;
    println!(
        "{} payouts acknowledged, {} on the new primary, {vanished} acknowledged then lost in the failover, \
         {orphans} provider payments without a payout; simulator: {counters}",
        made.len(),
        payouts.len()
    );
    assert_eq!(made.len(), PAYOUTS);
    assert_eq!(
        counters["conflicts"], 0,
        "no key was sent with two different payouts: {counters}"
    );
    assert!(
        orphans <= vanished,
        "a payment without a payout is one lost in the failover"
    );
    assert_eq!(
        count(&on_new, "SELECT count(*) FROM settlement.payout_conflicts").await,
        0
    );
    let verified = run_ok(&url, &["verify", "--period", PERIOD]);
    assert!(verified.contains("OK"), "{verified}");
}

/// The payouts a deliverer paid while the standby got none of them vanish
/// in the failover, ids and all; the new primary hands the same ids out
/// again. Withdrawals' provider keys come from their requests' idempotency
/// keys, not their ids, so the new payouts never meet the lost payments at
/// the provider: every one is paid. A client retrying a vanished request
/// with its key gets a new payout under the same provider key, which the
/// provider answers with the first payment: paid once.
#[tokio::test(flavor = "multi_thread")]
async fn payouts_lost_after_their_delivery_in_an_asynchronous_failover_block_nothing_and_their_retries_pay_once() {
    const SECRET: &str = "whsec-lost";
    let mut pair = start_pair(false);
    let url = multi_host_url(&pair);
    settle_then_cut_replication(&pair, &url).await;
    let sim = ProviderSim::start(&[]);
    let server = api(&url, &["--provider-webhook-secret", SECRET]).await;
    let endpoint = serde_json::json!({ "url": format!("{}/v1/provider-events", server.base), "secret": SECRET });
    let r = reqwest::Client::new()
        .post(format!("{}/v1/webhook-endpoint", sim.url))
        .json(&endpoint)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let mut deliverer = settled(
        &url,
        &[
            "deliver",
            "--provider-url",
            &sim.url,
            "--poll-after-secs",
            "1",
            "--max-poll-ms",
            "200",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let on_primary = pair.primary.as_ref().unwrap().url("settled");
    let creators: Vec<String> = {
        let mut conn = PgConnection::connect(&on_primary).await.unwrap();
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance ORDER BY creator")
            .fetch_all(&mut conn)
            .await
            .unwrap()
    };
    // More than a sequence's 32 cached values: the new primary is sure to
    // hand out some of these ids again.
    for i in 0..40 {
        let (status, body) = pay(&server.base, &format!("lost-{i}"), &creators[i % 2]).await;
        assert_eq!(status, 201, "{body}");
    }
    wait_for(
        &on_primary,
        "SELECT count(*) = 40 FROM settlement.payouts WHERE status = 'paid'",
        "the payouts paid on the old primary",
    )
    .await;
    fail_over(&mut pair, &server).await;
    let on_new = pair.standby.as_ref().unwrap().url("settled");
    assert_eq!(count(&on_new, "SELECT count(*) FROM settlement.payouts").await, 0);
    let mut reused = 0;
    for i in 0..40 {
        let (status, body) = pay(&server.base, &format!("after-{i}"), &creators[2 + i % 2]).await;
        assert_eq!(status, 201, "{body}");
        reused += i64::from(body["id"].as_i64().unwrap() <= 40);
    }
    assert!(reused > 0, "the new primary handed out none of the lost ids again");
    // Ten clients retry their vanished requests.
    for i in 0..10 {
        let (status, body) = pay(&server.base, &format!("lost-{i}"), &creators[i % 2]).await;
        assert_eq!(status, 201, "{body}");
    }
    wait_for(
        &on_new,
        "SELECT count(*) = 50 FROM settlement.payouts WHERE status = 'paid'",
        "every payout on the new primary paid",
    )
    .await;
    kill(Pid::from_raw(deliverer.id() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::task::block_in_place(|| wait_bounded(&mut deliverer, 60));
    assert!(status.success(), "deliver exited {status:?}");
    let counters = sim.counters().await;
    assert_eq!(counters["conflicts"], 0, "{counters}");
    assert_eq!(counters["applied"], 80, "40 lost, 40 after: {counters}");
    assert!(counters["replayed"].as_u64().unwrap() >= 10, "{counters}");
    let provider = settled::provider::HttpProvider::new(&sim.url, Duration::from_secs(10)).unwrap();
    let payments = provider.list_all().await.unwrap();
    let mut conn = PgConnection::connect(&on_new).await.unwrap();
    let keys: Vec<String> = sqlx::query_scalar("SELECT provider_key FROM settlement.payouts")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    let orphans = payments.iter().filter(|p| !keys.contains(&p.idempotency_key)).count();
    assert_eq!(
        orphans, 30,
        "the lost payouts nobody retried are paid at the provider only"
    );
    let verified = run_ok(&url, &["verify", "--period", PERIOD]);
    assert!(verified.contains("OK"), "{verified}");
}
