//! The dashboard: every page over HTTP, and a headless Chromium that watches
//! a real run advance and sees a waiting backend in the lock view.

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::{browse, chromium, free_port, Env, Server};
use sqlx::{Connection, PgConnection};

async fn serve(env: &Env) -> Server {
    env.serve("t0ken").await
}

/// GET with the token, as every page needs.
async fn get(url: &str) -> (u16, String) {
    let r = reqwest::Client::new()
        .get(url)
        .bearer_auth("t0ken")
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn every_page_answers_with_its_content() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "30"]);
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let victim = env
        .scalar_text("SELECT creator FROM settlement.token_trade_volume ORDER BY creator LIMIT 1")
        .await;
    sqlx::query(
        "UPDATE settlement.token_trade_volume SET status = 'failed', last_error = 'provider <refused>' WHERE creator = $1",
    )
    .bind(&victim)
    .execute(&env.pool)
    .await
    .unwrap();
    let server = serve(&env).await;
    let (status, runs) = get(&server.base).await;
    assert_eq!(status, 200);
    assert!(
        runs.contains("2026-11-28") && runs.contains("finished") && runs.contains("data-done=\"30\""),
        "{runs}"
    );
    let run_id = env.scalar_i64("SELECT id FROM settled_engine.runs").await;
    let (status, report) = get(&format!("{}/runs/{run_id}", server.base)).await;
    assert_eq!(status, 200);
    assert!(
        report.contains("verification") && report.contains("stored report"),
        "{report}"
    );
    let (status, workers) = get(&format!("{}/workers", server.base)).await;
    assert_eq!(status, 200);
    assert!(workers.contains("stopped"), "{workers}");
    let (status, failed) = get(&format!("{}/items?status=failed", server.base)).await;
    assert_eq!(status, 200);
    assert!(
        failed.contains(&victim) && failed.contains("provider &lt;refused&gt;"),
        "errors are shown, escaped"
    );
    let (status, held) = get(&format!("{}/items?status=held", server.base)).await;
    assert_eq!((status, held.contains("No held items")), (200, true));
    let (status, locks) = get(&format!("{}/locks", server.base)).await;
    assert_eq!(status, 200);
    assert!(locks.contains("data-waiting=\"0\""), "{locks}");
    assert_eq!(get(&format!("{}/runs/999", server.base)).await.0, 404);

    // Retry needs the token, as a browser sends it after the 401's Basic
    // challenge (any user, the token as password); with it, the item is
    // eligible again and the run reopened.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for (token, expected) in [("wrong", 401), ("t0ken", 303)] {
        let form = [("period", "2026-11-28"), ("creator", victim.as_str())];
        let r = client
            .post(format!("{}/dashboard/retry", server.base))
            .basic_auth("operator", Some(token))
            .form(&form)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), expected, "token {token}");
        if expected == 401 {
            let challenge = r.headers()["www-authenticate"].to_str().unwrap();
            assert!(challenge.starts_with("Basic realm="), "{challenge}");
        }
    }
    let status = env
        .scalar_text(&format!(
            "SELECT status FROM settlement.token_trade_volume WHERE creator = '{victim}'"
        ))
        .await;
    assert_eq!(status, "eligible");
    // The reopened run still carries its last stored report: the front page
    // counts a running run live (29 done, one eligible again), never from it.
    let (status, runs) = get(&server.base).await;
    assert_eq!(status, 200);
    assert!(runs.contains("running") && runs.contains("data-done=\"29\""), "{runs}");
}

fn first_done(dom: &str) -> u64 {
    let start = dom.find("data-done=\"").expect("a progress bar") + "data-done=\"".len();
    dom[start..].split('"').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_browser_sees_the_run_advance_and_a_waiting_backend_in_the_lock_view() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var("CI").is_err(),
            "CI must have chromium (.ci/run installs it)"
        );
        eprintln!("skipped: no chromium here (apt-get install chromium)");
        return;
    };
    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "20000"]);
    let server = serve(&env).await;
    let mut worker = lab_worker(&env, "50", "4", &[]);
    common::wait_until(30, "the run to start paying", || async {
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await > 0
    })
    .await;
    let first = first_done(&browse(&browser, profile.path(), &["--dump-dom"], &server.base));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let second = first_done(&browse(&browser, profile.path(), &["--dump-dom"], &server.base));
    assert!(second > first, "the progress bar should advance: {first} then {second}");
    screenshot(&browser, profile.path(), &shots, "dashboard-runs.png", &server.base);
    let _ = worker.kill();
    let _ = worker.wait();
    // The chain page, in the navigation, with nothing paid on a chain yet
    // (crates/cli/tests/e2e/chain_ops.rs loads it with a real transaction).
    let chain = browse(
        &browser,
        profile.path(),
        &["--dump-dom"],
        &format!("{}/chain", server.base),
    );
    assert!(
        chain.contains("<h1>chain transactions</h1>") && chain.contains("No transactions."),
        "{chain}"
    );

    // The three-connection scenario: A and B claim with SKIP LOCKED, C waits with FOR UPDATE.
    let claim = "SELECT creator FROM settlement.token_trade_volume WHERE period = '2026-11-28' AND status = 'eligible'
                 ORDER BY creator LIMIT 10 FOR NO KEY UPDATE SKIP LOCKED";
    let mut a = PgConnection::connect(&env.db.url).await.unwrap();
    let mut b = PgConnection::connect(&env.db.url).await.unwrap();
    for conn in [&mut a, &mut b] {
        sqlx::query("BEGIN").execute(&mut *conn).await.unwrap();
        sqlx::query(claim).fetch_all(&mut *conn).await.unwrap();
    }
    let url = env.db.url.clone();
    let waiter = tokio::spawn(async move {
        let mut c = PgConnection::connect(&url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut c).await.unwrap();
        let _ = sqlx::query(
            "SELECT creator FROM settlement.token_trade_volume WHERE period = '2026-11-28' AND status = 'eligible'
             ORDER BY creator LIMIT 10 FOR UPDATE",
        )
        .fetch_all(&mut c)
        .await;
    });
    common::wait_until(30, "C to wait", || async {
        env.scalar_i64("SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE NOT l.granted AND a.datname = current_database()").await > 0
    })
    .await;
    let dom = browse(
        &browser,
        profile.path(),
        &["--dump-dom"],
        &format!("{}/locks", server.base),
    );
    assert!(
        dom.contains("class=\"waiting\""),
        "the lock view should list a waiting backend:\n{dom}"
    );
    assert!(!dom.contains("data-waiting=\"0\""), "{dom}");
    let shot = shots.join("dashboard-locks.png");
    browse(
        &browser,
        profile.path(),
        &[&format!("--screenshot={}", shot.display())],
        &format!("{}/locks", server.base),
    );
    sqlx::query("COMMIT").execute(&mut a).await.unwrap();
    sqlx::query("COMMIT").execute(&mut b).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .unwrap()
        .unwrap();
    audit_and_job_pages(&browser, profile.path(), &shots, &env, &server).await;
}

/// The audit log after a refused request and an operator's command, and a
/// dead letter's page with its attempts, as a browser shows them.
async fn audit_and_job_pages(
    browser: &PathBuf,
    profile: &std::path::Path,
    shots: &std::path::Path,
    env: &Env,
    server: &Server,
) {
    let refused = reqwest::Client::new()
        .post(format!("{}/v1/holds", server.base))
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    env.run_ok(&["retry", "--period", "2026-11-28"]);
    // The server writes the refusals it counted once a second.
    common::wait_until(30, "the refusal to be written", || async {
        env.scalar_i64("SELECT count(*) FROM settlement.audit_log WHERE action = 'POST /v1/holds'")
            .await
            == 1
    })
    .await;
    let wanted = [
        "anonymous",
        "POST /v1/holds",
        "refused 401",
        "cli:",
        "ok 0 item(s) retried",
        "data-audit=",
    ];
    let url = format!("{}/audit", server.base);
    page_shows(browser, profile, shots, &url, &wanted, "/audit", "dashboard-audit.png");

    let mut conn = env.pool.acquire().await.unwrap();
    let queue = common::mail_queue(&mut conn).await;
    queue
        .enqueue_many(&mut conn, &[settled_engine::NewJob::new("welcome-7")])
        .await
        .unwrap();
    sqlx::raw_sql(
        "UPDATE jobs.mail SET status = 'failed', attempt = 2, last_error = 'smtp 550 <no such user>',
                errors = '[{\"attempt\": 1, \"at\": \"2026-12-06T05:00:00Z\", \"error\": \"timeout\"},
                           {\"attempt\": 2, \"at\": \"2026-12-06T05:00:30Z\", \"error\": \"smtp 550 <no such user>\"}]';",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let dom = browse(
        browser,
        profile,
        &["--dump-dom"],
        &format!("{}/queues/mail", server.base),
    );
    assert!(
        dom.contains("href=\"/queues/mail/jobs/welcome-7\""),
        "the dead letter listed:\n{dom}"
    );
    let job = format!("{}/queues/mail/jobs/welcome-7", server.base);
    let wanted = [
        "id=\"job-state\">failed",
        "timeout",
        "smtp 550 &lt;no such user&gt;",
        "id=\"lease-holder\">none",
    ];
    page_shows(
        browser,
        profile,
        shots,
        &job,
        &wanted,
        "the job's page",
        "dashboard-queue-job.png",
    );
}

/// The page at `url`, as the browser shows it, holds each of `wanted`
/// (`page` names it in a failure); its screenshot `name` is written in
/// `shots`.
fn page_shows(
    browser: &PathBuf,
    profile: &std::path::Path,
    shots: &std::path::Path,
    url: &str,
    wanted: &[&str],
    page: &str,
    name: &str,
) {
    let dom = browse(browser, profile, &["--dump-dom"], url);
    for wanted in wanted {
        assert!(dom.contains(wanted), "{wanted} on {page}:\n{dom}");
    }
    screenshot(browser, profile, shots, name, url);
}

/// A screenshot of `url` in `shots`, named `name`; it must be written.
fn screenshot(browser: &PathBuf, profile: &std::path::Path, shots: &std::path::Path, name: &str, url: &str) {
    let shot = shots.join(name);
    browse(browser, profile, &[&format!("--screenshot={}", shot.display())], url);
    assert!(shot.exists());
}

/// `settled lab-worker` on 2026-11-28 ([`common::PERIOD`]), one claim loop of `chunk` items
/// each taking `work_ms`, then `extra` flags.
fn lab_worker(env: &Env, chunk: &str, work_ms: &str, extra: &[&str]) -> std::process::Child {
    let mut args = common::lab_worker_args("1", chunk, work_ms);
    args.extend_from_slice(extra);
    env.cmd(&args).stdout(Stdio::null()).spawn().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_serves_its_claim_latency_histogram_and_counters() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "3000"]);
    let port = free_port();
    let mut worker = lab_worker(&env, "20", "5", &["--metrics-bind", &format!("127.0.0.1:{port}")]);
    common::wait_until(30, "the worker to settle a few chunks", || async {
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await >= 100
    })
    .await;
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let _ = worker.kill();
    let _ = worker.wait();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text");
    let histogram = scrape
        .samples
        .iter()
        .find(|s| s.metric == "work_queue_claim_duration_seconds")
        .unwrap_or_else(|| panic!("no claim latency histogram in:\n{text}"));
    match &histogram.value {
        prometheus_parse::Value::Histogram(buckets) => assert!(buckets.iter().any(|b| b.count > 0.0), "{text}"),
        other => panic!("expected a histogram, got {other:?}"),
    }
    assert!(text.contains("work_queue_handler_duration_seconds_bucket"), "{text}");
    let settled = scrape
        .samples
        .iter()
        .find(|s| s.metric == "settled_worker_items_settled_total")
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .unwrap_or(0.0);
    assert!(settled >= 20.0, "{text}");
}

/// A webhook event signed with `secret`, posted to `base`; its status.
async fn post_event(base: &str, secret: &str, event: serde_json::Value) -> u16 {
    common::send_signed_event(base, secret, &event).await.status().as_u16()
}

/// The row of `state` in the payouts page's table.
fn state_row<'a>(page: &'a str, state: &str) -> &'a str {
    let start = page
        .find(&format!("id=\"state-{state}\""))
        .unwrap_or_else(|| panic!("no row for {state}: {page}"));
    let end = start + page[start..].find("</tr>").unwrap();
    &page[start..end]
}

#[tokio::test(flavor = "multi_thread")]
async fn the_payouts_page_and_metrics_show_states_amounts_returns_conflicts_and_unknown_events() {
    const SECRET: &str = "whsec-dash";
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "20"]);
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let server = env.serve_with("t0ken", &["--provider-webhook-secret", SECRET]).await;
    let creators: Vec<String> =
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC LIMIT 8")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    let client = reqwest::Client::new();
    let mut made = Vec::new();
    for (i, (amount, confirm)) in [
        (101, false), // stays queued
        (102, false), // sent
        (103, false), // paid, then returned by its bank (a webhook)
        (103, false), // paid
        (104, false), // failed: returned; then a webhook says paid (a conflict)
        (105, true),  // cancelled: returned
        (106, true),  // expired: returned
        (107, true),  // stays created
    ]
    .into_iter()
    .enumerate()
    {
        let body: serde_json::Value = common::json_of(
            client
                .post(format!("{}/v1/payouts", server.base))
                .bearer_auth("t0ken")
                .header("Idempotency-Key", format!("dash-{i}"))
                .json(&serde_json::json!({ "creator": creators[i], "amount": amount.to_string(), "confirm": confirm })),
        )
        .await;
        made.push(body["id"].as_i64().expect("a payout id"));
    }
    for (id, to, provider_id) in [
        (made[1], "sent", Some("pay_sent")),
        (made[2], "paid", Some("pay_paid_1")),
        (made[3], "paid", Some("pay_paid_2")),
        (made[4], "failed", None),
    ] {
        let moved: bool = sqlx::query_scalar("SELECT settlement.move_payout($1, ARRAY['queued'], $2, 'test', $3)")
            .bind(id)
            .bind(to)
            .bind(provider_id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
        assert!(moved, "payout {id} to {to}");
    }
    let r = client
        .post(format!("{}/v1/payouts/{}/cancel", server.base, made[5]))
        .bearer_auth("t0ken")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    sqlx::query("UPDATE settlement.payouts SET expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(made[6])
        .execute(&env.pool)
        .await
        .unwrap();
    assert_eq!(
        env.scalar_i64("SELECT settlement.expire_unconfirmed_payouts(10)").await,
        1
    );
    // The provider returns a paid payout, says a failed one was paid (a
    // conflict), speaks of a payout settled never made, and one event is
    // signed wrong.
    let event = |id: &str, payout: usize, key: String, status: &str, amount: &str| {
        serde_json::json!({ "id": id, "type": format!("payment.{status}"), "created": 1, "data": {
            "id": format!("pay_{payout}"), "idempotency_key": key, "creator": creators[payout], "amount": amount,
            "status": status, "failure_reason": "account_closed" } })
    };
    let key_of = |id: i64| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT provider_key FROM settlement.payouts WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let mut returned = event("evt_0", 2, key_of(made[2]).await, "returned", "103");
    returned["data"]["id"] = "pay_paid_1".into();
    assert_eq!(post_event(&server.base, SECRET, returned).await, 200);
    let contradiction = event("evt_1", 4, key_of(made[4]).await, "paid", "104");
    assert_eq!(post_event(&server.base, SECRET, contradiction).await, 200);
    let stranger = event("evt_2", 2, "payout-999999".into(), "paid", "103");
    assert_eq!(post_event(&server.base, SECRET, stranger.clone()).await, 200);
    assert_eq!(post_event(&server.base, "not-the-secret", stranger).await, 400);

    let (status, page) = get(&format!("{}/payouts", server.base)).await;
    assert_eq!(status, 200);
    for (state, n, amount) in [
        ("created", 1, "107"),
        ("queued", 1, "101"),
        ("sent", 1, "102"),
        ("paid", 1, "103"),
        ("failed", 1, "104"),
        ("returned", 1, "103"),
        ("cancelled", 1, "105"),
        ("expired", 1, "106"),
    ] {
        let row = state_row(&page, state);
        assert!(
            row.contains(&format!("data-count=\"{n}\"")) && row.contains(&format!("data-amount=\"{amount}\"")),
            "{state}: {row}"
        );
        assert!(!row.contains("data-oldest=\"\""), "{state} has an age: {row}");
    }
    assert!(page.contains("data-total=\"8\""), "{page}");
    assert!(page.contains("data-returned=\"418\""), "104 + 103 + 105 + 106: {page}");
    let conflicts = &page[page.find("id=\"conflicts\"").expect("a conflicts table")..];
    assert!(
        conflicts.contains(&format!("data-payout=\"{}\"", made[4])) && conflicts.contains("webhook"),
        "{conflicts}"
    );
    let unknown = &page[page.find("id=\"unknown-events\"").expect("an unknown events table")..];
    assert!(
        unknown.contains("payout-999999") && unknown.contains("evt_2"),
        "{unknown}"
    );
    let (_, front) = get(&server.base).await;
    assert!(front.contains("href=\"/payouts\""), "the nav links the page");

    let (status, metrics) = get(&format!("{}/metrics", server.base)).await;
    assert_eq!(status, 200);
    prometheus_parse::Scrape::parse(metrics.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text");
    for line in [
        "settled_payouts{state=\"paid\"} 1",
        "settled_payouts{state=\"returned\"} 1",
        "settled_payouts{state=\"created\"} 1",
        "settled_payouts{state=\"expired\"} 1",
        "settled_payouts_amount{state=\"paid\"} 103",
        "settled_payouts_amount{state=\"queued\"} 101",
        "settled_payouts_returned_total 418",
        "settled_payouts_returned_count_total 4",
        "settled_payout_conflicts_total 1",
        "settled_provider_events_unknown_total 1",
        "settled_provider_keys_awaiting_operator 0",
        "settled_webhook_signature_failures_total{reason=\"no_match\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
    let oldest_sent: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("settled_payout_oldest_sent_seconds "))
        .expect("the oldest sent payout's age")
        .parse()
        .unwrap();
    assert!(oldest_sent >= 0.0);
}
