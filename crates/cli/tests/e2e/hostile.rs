//! `settled serve` against clients that misbehave: slow or silent
//! connections, too many of them, odd requests, requests that wait on locks,
//! keys reused after their retention. Each test drives the real binary over
//! real sockets; none asserts how fast anything is, only what happens.

use crate::common;

use std::time::{Duration, Instant};

use common::{wait_bounded, Env, Server, PERIOD};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "test-token";

fn addr(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_string()
}

/// Waits until the server closes `conn` (EOF or reset); None after `limit`.
async fn closed_within(conn: &mut TcpStream, limit: Duration) -> Option<Instant> {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(Instant::now()),
            Ok(Ok(_)) => continue, // a response (e.g. 408); the close follows
            Err(_) => return None,
        }
    }
}

async fn healthz(client: &reqwest::Client, base: &str) -> u16 {
    client
        .get(format!("{base}/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_and_idle_connections_are_cut_healthz_answers_throughout_and_sigterm_ends_within_its_grace() {
    let env = Env::new().await;
    let mut server = env
        .serve_with(TOKEN, &["--header-timeout-ms", "1500", "--shutdown-grace-ms", "1000"])
        .await;
    let target = addr(&server);
    // 300 connections that send a request head one byte at a time, one byte
    // every 250 ms: they would need far longer than the header timeout.
    let mut slow = Vec::new();
    for _ in 0..300 {
        let target = target.clone();
        slow.push(tokio::spawn(async move {
            let mut conn = TcpStream::connect(&target).await.expect("connect");
            let head =
                b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
            let started = Instant::now();
            for byte in head.iter().take(head.len() - 2) {
                if conn.write_all(&[*byte]).await.is_err() {
                    return (started, true); // cut while writing
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
                let mut probe = [0u8; 1];
                if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(1), conn.read(&mut probe)).await {
                    return (started, true);
                }
            }
            (
                started,
                closed_within(&mut conn, Duration::from_secs(10)).await.is_some(),
            )
        }));
    }
    // Meanwhile /healthz, each time on a fresh connection, keeps answering.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let probing = Instant::now();
    let mut answered = 0;
    while probing.elapsed() < Duration::from_secs(4) {
        assert_eq!(
            healthz(&client, &server.base).await,
            200,
            "/healthz under 300 slow connections"
        );
        answered += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered > 5);
    for task in slow {
        let (_, cut) = task.await.unwrap();
        assert!(cut, "a slow connection was never cut");
    }
    // An idle keep-alive connection is closed too, after one request.
    let mut idle = TcpStream::connect(&target).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = idle.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(
        closed_within(&mut idle, Duration::from_secs(10)).await.is_some(),
        "an idle keep-alive connection stayed open"
    );
    // SIGTERM with a client holding a half-sent request: the server ends
    // after its grace, whatever the client does.
    let mut half = TcpStream::connect(&target).await.unwrap();
    half.write_all(b"POST /v1/payouts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    kill(Pid::from_raw(server.child.id() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::task::block_in_place(|| wait_bounded(&mut server.child, 15));
    assert!(status.success(), "serve exited with {status:?} after SIGTERM");
    drop(half);
}

#[tokio::test(flavor = "multi_thread")]
async fn at_the_cap_a_new_client_evicts_the_oldest_waiting_connection_and_waits_only_behind_busy_ones() {
    let env = Env::new().await;
    let server = env
        .serve_with(
            TOKEN,
            &[
                "--max-connections",
                "4",
                "--header-timeout-ms",
                "60000",
                "--request-timeout-ms",
                "1500",
            ],
        )
        .await;
    let target = addr(&server);
    // Four silent connections fill the cap; none would be cut for a minute.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(&target).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    assert_eq!(
        healthz(&client, &server.base).await,
        200,
        "a client that asks at once is served at the cap"
    );
    assert!(
        closed_within(&mut silent[0], Duration::from_secs(5)).await.is_some(),
        "the oldest silent connection made room"
    );
    drop(silent);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Four connections whose requests are in progress (with the token, a
    // body half sent): nothing can be evicted, so a fifth waits until one
    // ends (here by the request timeout's 503).
    let mut busy = Vec::new();
    for _ in 0..4 {
        let mut conn = TcpStream::connect(&target).await.unwrap();
        conn.write_all(
            format!(
                "POST /v1/holds HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        busy.push(conn);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fifth = tokio::spawn({
        let (client, base) = (client.clone(), server.base.clone());
        async move { (healthz(&client, &base).await, Instant::now()) }
    });
    // Each busy request ends with its 503 and its connection closes (a
    // reset may come instead of the answer: the unread body is dropped).
    let mut ends = tokio::task::JoinSet::new();
    for mut conn in busy {
        ends.spawn(async move { closed_within(&mut conn, Duration::from_secs(10)).await });
    }
    let mut first_answer: Option<Instant> = None;
    while let Some(end) = ends.join_next().await {
        let at = end.unwrap().expect("a busy request never ended");
        first_answer = Some(first_answer.map_or(at, |f| f.min(at)));
    }
    let (status, served_at) = fifth.await.unwrap();
    assert_eq!(status, 200);
    assert!(
        served_at + Duration::from_millis(100) >= first_answer.unwrap(),
        "the fifth connection was served while four requests were in progress"
    );
}

/// Sends `head` (which announces a body of `content_length` bytes), then
/// the body one byte every 200 ms until the server answers or closes.
/// Returns the answer's first bytes and how many body bytes were sent.
async fn trickle_body(target: &str, head: &str, content_length: usize) -> (String, usize) {
    let mut conn = TcpStream::connect(target).await.expect("connect");
    conn.write_all(head.as_bytes()).await.expect("send the head");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let mut sent = 0;
    let give_up = Instant::now() + Duration::from_secs(60);
    while Instant::now() < give_up {
        match tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            Err(_) if sent < content_length => {
                if conn.write_all(b"a").await.is_err() {
                    break;
                }
                sent += 1;
            }
            Err(_) => {}
        }
    }
    (String::from_utf8_lossy(&answer).into_owned(), sent)
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_bodies_get_401_unread_without_the_token_and_408_with_it_while_healthz_answers_at_the_cap() {
    let env = Env::new().await;
    let server = env
        .serve_with(
            TOKEN,
            &[
                "--max-connections",
                "20",
                "--header-timeout-ms",
                "60000",
                "--request-timeout-ms",
                "120000",
            ],
        )
        .await;
    let target = addr(&server);
    // Three times the cap of clients without the token, each sending a
    // complete head and then its body one byte every 200 ms: a request
    // whose body is being read is in progress, and the cap evicts none.
    let form = "application/x-www-form-urlencoded";
    let routes = [
        ("/dashboard/retry", form),
        ("/dashboard/retry", form),
        ("/v1/payouts", "application/json"),
        ("/v1/holds", "application/json"),
    ];
    let mut slow = tokio::task::JoinSet::new();
    for i in 0..60 {
        let (target, (route, media)) = (target.clone(), routes[i % routes.len()]);
        let head = format!(
            "POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: k{i}\r\nContent-Type: {media}\r\nContent-Length: 1000\r\n\r\n"
        );
        slow.spawn(async move { (route, trickle_body(&target, &head, 1000).await) });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    assert_eq!(
        healthz(&client, &server.base).await,
        200,
        "/healthz behind 60 slow bodies at a cap of 20, well before a trickle could end"
    );
    while let Some(done) = slow.join_next().await {
        let (route, (answer, sent)) = done.unwrap();
        assert!(answer.starts_with("HTTP/1.1 401"), "{route}: {answer}");
        assert!(sent < 1000, "{route}: the whole body was read before the 401");
    }
    // With the token, a body that trickles is cut off after the body's
    // time limit: 408, and the connection closes.
    let head = format!(
        "POST /v1/holds HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    let (answer, sent) = trickle_body(&target, &head, 1000).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    assert!(sent < 1000, "the trickle was read to its end");
}

/// Posts `body` to the dashboard's retry form as `content_type`, with
/// `token` as a browser sends it (HTTP Basic).
async fn post_retry(
    c: &reqwest::Client,
    base: &str,
    token: &str,
    content_type: &str,
    body: impl Into<reqwest::Body>,
) -> (u16, reqwest::header::HeaderMap, String) {
    let response = c
        .post(format!("{base}/dashboard/retry"))
        .basic_auth("operator", Some(token))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    text(response).await
}

async fn text(response: reqwest::Response) -> (u16, reqwest::header::HeaderMap, String) {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

fn assert_problem(what: &str, got: &(u16, reqwest::header::HeaderMap, String), status: u16, kind: &str) -> Value {
    assert_eq!(got.0, status, "{what}: {}", got.2);
    assert_eq!(got.1["content-type"], "application/problem+json", "{what}");
    let body: Value = serde_json::from_str(&got.2).unwrap_or_else(|_| panic!("{what}: {}", got.2));
    assert_eq!(body["type"], format!("/problems/{kind}"), "{what}: {body}");
    assert_eq!(body["status"], status, "{what}");
    body
}

#[tokio::test(flavor = "multi_thread")]
async fn every_error_is_problem_json_every_answer_has_security_headers_and_foreign_hosts_are_refused() {
    let env = Env::new().await;
    env.seed(5);
    let server = env.serve(TOKEN).await;
    let b = &server.base;
    let c = common::client_with(TOKEN);
    let got = text(c.get(format!("{b}/no/such/page")).send().await.unwrap()).await;
    assert_problem("404", &got, 404, "no-such-route");
    let got = text(c.get(format!("{b}/v1/payouts")).send().await.unwrap()).await;
    let body = assert_problem("405", &got, 405, "method-not-allowed");
    assert!(got.1.contains_key("allow"), "405 keeps Allow");
    assert!(got.1["allow"].to_str().unwrap().contains("POST"), "{body}");
    let got = text(c.get(format!("{b}/runs/%FF")).send().await.unwrap()).await;
    assert_problem("bad path encoding", &got, 400, "bad-request");
    let got = text(
        c.get(format!("{b}/items?status=failed&status=held"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_problem("repeated query parameter", &got, 400, "bad-request");
    // The retry form: the token first, then the body, bounded, its fields
    // named. A 2 MB body is refused from its Content-Length, before it is sent.
    let mut conn = TcpStream::connect(addr(&server)).await.unwrap();
    conn.write_all(
        b"POST /dashboard/retry HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 2097152\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer).to_string();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    assert!(head.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{answer}"
    );
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("content-type", "application/problem+json".parse().unwrap());
    let got = (413, headers, body.to_string());
    assert_problem("2 MB retry form", &got, 413, "body-too-large");
    let form = "application/x-www-form-urlencoded";
    let got = post_retry(&c, b, TOKEN, form, "period=2026-11-28").await;
    let body = assert_problem("retry form without creator", &got, 400, "malformed-form");
    assert_eq!(body["field"], "creator");
    let got = post_retry(&c, b, TOKEN, "text/plain", "period=2026-11-28").await;
    assert_problem("retry form as text", &got, 415, "unsupported-media-type");
    let fields = format!("period=2026-11-28&creator=0x{}", "1".repeat(40));
    let got = post_retry(&c, b, "wrong", form, fields.clone()).await;
    assert_problem("retry with a wrong token", &got, 401, "unauthorized");
    assert!(got.1["www-authenticate"].to_str().unwrap().starts_with("Basic realm="));
    // Remembered Basic credentials go with a form another site posts here:
    // a request from another origin is refused, whatever it carries.
    for (name, value) in [("origin", "http://evil.example"), ("sec-fetch-site", "cross-site")] {
        let response = c
            .post(format!("{b}/dashboard/retry"))
            .basic_auth("operator", Some(TOKEN))
            .header(name, value)
            .header("content-type", form)
            .body(fields.clone())
            .send()
            .await
            .unwrap();
        assert_problem(name, &text(response).await, 403, "cross-origin-form");
    }
    // Security headers on pages, API answers and problems alike.
    for path in ["/", "/workers", "/locks", "/healthz", "/openapi.json", "/nope"] {
        let response = c.get(format!("{b}{path}")).send().await.unwrap();
        let h = response.headers();
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"),
            "{path}: {csp}"
        );
    }
    // DNS rebinding: a page served under another name is refused; the
    // health probes answer whatever name was dialled.
    for path in ["/", "/locks", "/v1/creators/0x0000000000000000000000000000000000000001"] {
        let got = text(
            c.get(format!("{b}{path}"))
                .header("host", "evil.example")
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_problem(path, &got, 421, "unknown-host");
    }
    for (path, host) in [("/", "localhost:1234"), ("/healthz", "10.1.2.3")] {
        let answer = c.get(format!("{b}{path}")).header("host", host).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{path} for host {host}");
    }
    // Hold reasons are one line of text: control characters and direction
    // overrides are refused, naming the field.
    let creator = env
        .scalar_text("SELECT creator FROM settlement.token_trade_volume LIMIT 1")
        .await;
    for reason in [
        "two\nlines",
        "bell\u{7}",
        "\u{1b}[31mred",
        "tab\there",
        "rtl \u{202e}txt",
    ] {
        let got = text(
            c.post(format!("{b}/v1/holds"))
                .bearer_auth(TOKEN)
                .json(&json!({ "creator": creator, "reason": reason }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let body = assert_problem(reason, &got, 422, "invalid-field");
        assert_eq!(body["field"], "reason");
    }
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.creator_holds").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_lock_view_hides_other_sessions_literals_unless_the_token_is_sent() {
    let env = Env::new().await;
    // As the owner: under its least role, PostgreSQL itself shows other
    // roles' query text as `<insufficient privilege>`.
    let server = env.serve_as_login(TOKEN, &[]).await;
    // Another session, mid-transaction, whose statement holds a secret.
    let mut other = sqlx::PgConnection::connect(&env.db.url).await.unwrap();
    use sqlx::Connection;
    let role = format!("hostile_{}", std::process::id());
    let mut tx = other.begin().await.unwrap();
    sqlx::query(&format!("CREATE ROLE {role} LOGIN PASSWORD 'S3cr3t-pw'"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let (page, admins_page) = lock_pages(&env, &server).await;
    assert!(page.contains(&format!("CREATE ROLE {role} LOGIN PASSWORD ?")), "{page}");
    assert!(!page.contains("S3cr3t"), "the lock view showed a password");
    assert!(
        admins_page.contains("S3cr3t-pw"),
        "with the token the query is shown whole"
    );
    tx.rollback().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_lock_view_hides_setting_values_and_nested_comments_of_other_sessions() {
    let env = Env::new().await;
    let server = env.serve_as_login(TOKEN, &[]).await;
    // Another session, mid-transaction, holding a lock on a settlement
    // table; its last query string sets two values without quotes and
    // ends in a comment nested in a comment (PostgreSQL's comments nest).
    use sqlx::Connection;
    let mut other = sqlx::PgConnection::connect(&env.db.url).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::raw_sql(
        "LOCK TABLE settlement.payouts IN ROW EXCLUSIVE MODE; \
         SET LOCAL my.to_value TO S3cr3tTo; SET LOCAL my.eq_value = S3cr3tEq; \
         SELECT 1 /* a /* b */ S3cr3tComment */",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let (page, admins_page) = lock_pages(&env, &server).await;
    assert!(
        page.contains("SET LOCAL my.to_value TO ?; SET LOCAL my.eq_value = ?;"),
        "{page}"
    );
    assert!(
        !page.to_lowercase().contains("s3cr3t"),
        "the lock view showed a secret: {page}"
    );
    for secret in ["S3cr3tTo", "S3cr3tEq", "S3cr3tComment"] {
        assert!(
            admins_page.contains(secret),
            "with the token the query is shown whole: {admins_page}"
        );
    }
    tx.rollback().await.unwrap();
}

/// The lock view (`/locks`) as a viewer's token sees it, literals hidden,
/// then as the admin's (SETTLED_API_TOKEN) does, queries whole.
async fn lock_pages(env: &Env, server: &Server) -> (String, String) {
    let viewer = env.run_ok(&["tokens", "create", "--name", "viewer", "--role", "viewer"]);
    let locks = |token: &str| {
        let request = reqwest::Client::new()
            .get(format!("{}/locks", server.base))
            .bearer_auth(token);
        async move { request.send().await.unwrap().text().await.unwrap() }
    };
    (locks(viewer.trim()).await, locks(TOKEN).await)
}

async fn metric(base: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn costly_pages_wait_on_their_own_pool_and_share_one_verification_while_payouts_and_healthz_go_on() {
    let env = Env::new().await;
    env.seed(2000);
    env.run_ok(&["worker", "--period", PERIOD]);
    let run_id = env.scalar_i64("SELECT id FROM settled_engine.runs").await;
    let (creator, _) = sqlx::query_as::<_, (String, String)>(
        "SELECT creator, balance::text FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let server = env.serve(TOKEN).await;
    // Every page reads the ledger: with it locked, each page holds its
    // connection until the lock goes, the worst a slow page can do.
    use sqlx::Connection;
    let mut blocker = sqlx::PgConnection::connect(&env.db.url).await.unwrap();
    let mut tx = blocker.begin().await.unwrap();
    sqlx::query("LOCK TABLE settlement.reward_ledger IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let mut readers = tokio::task::JoinSet::new();
    for i in 0..60 {
        let url = if i % 3 == 0 {
            format!("{}/", server.base)
        } else {
            format!("{}/runs/{run_id}", server.base)
        };
        readers.spawn(async move {
            let response = common::client_with(TOKEN).get(url).send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let client = reqwest::Client::new();
    assert_eq!(
        healthz(&client, &server.base).await,
        200,
        "/healthz while 60 pages wait"
    );
    let (status, paid, _) = pay(
        &server.base,
        "during-pages",
        &json!({ "creator": creator, "amount": "3" }),
    )
    .await;
    assert_eq!(status, 201, "a payout while 60 pages wait: {paid}");
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'settled-serve-reads' AND wait_event_type = 'Lock'",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert!(waiting >= 1, "the pages wait on their own pool's connections");
    tx.rollback().await.unwrap();
    while let Some(page) = readers.join_next().await {
        let (status, page) = page.unwrap();
        assert_eq!(status, 200, "{page}");
        assert!(page.contains(PERIOD), "{page}");
        if page.contains("verification") {
            assert!(page.contains("every check holds"), "{page}");
            assert!(page.contains("stored report"), "a finished run shows its stored report");
        }
    }
    assert_eq!(
        metric(&server.base, "settled_dashboard_verifications_total").await,
        1.0,
        "40 readers within the interval share one verification"
    );
}

async fn pay(base: &str, key: &str, body: &Value) -> (u16, Value, bool) {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/payouts"))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    (status, response.json().await.unwrap(), replayed)
}

async fn settled_creator(env: &Env) -> (String, String) {
    env.seed(10);
    env.run_ok(&["worker", "--period", PERIOD]);
    sqlx::query_as("SELECT creator, balance::text FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1")
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idempotency_key_used_after_its_retention_answers_its_own_payout_never_a_second() {
    let env = Env::new().await;
    let (creator, before) = settled_creator(&env).await;
    let server = env.serve(TOKEN).await;
    let body = json!({ "creator": creator, "amount": "1000" });
    let (status, first, _) = pay(&server.base, "old-key", &body).await;
    assert_eq!(status, 201, "{first}");
    // The retention ends and the key's stored response is pruned.
    sqlx::query("DELETE FROM settled_engine.idempotency_keys WHERE key = 'old-key'")
        .execute(&env.pool)
        .await
        .unwrap();
    let (status, again, replayed) = pay(&server.base, "old-key", &body).await;
    assert_eq!(status, 201, "{again}");
    assert!(replayed, "the answer is the earlier payout's");
    assert_eq!(again["id"], first["id"]);
    sqlx::query("DELETE FROM settled_engine.idempotency_keys WHERE key = 'old-key'")
        .execute(&env.pool)
        .await
        .unwrap();
    let other = json!({ "creator": creator, "amount": "7" });
    let (status, refused, _) = pay(&server.base, "old-key", &other).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["type"], "/problems/idempotency-key-reused");
    common::assert_one_payout_of_1000(&env, &creator, &before).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn past_its_retention_a_key_that_paid_stays_its_requests_and_a_late_repeat_of_it_is_never_blamed() {
    let env = Env::new().await;
    let (creator, before) = settled_creator(&env).await;
    let server = env.serve(TOKEN).await;
    let original = json!({ "creator": creator, "amount": "1000" });
    let other = json!({ "creator": creator, "amount": "7" });
    let (status, first, _) = pay(&server.base, "kept", &original).await;
    assert_eq!(status, 201, "{first}");
    let expire =
        "UPDATE settled_engine.idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = 'kept'";
    for pruned in [false, true] {
        // The retention ends (and, the second time, the key is pruned).
        sqlx::query(expire).execute(&env.pool).await.unwrap();
        if pruned {
            settled_engine::once::idempotency::prune(&env.pool).await.unwrap();
        }
        // Another request cannot take the key over, however often it tries...
        for _ in 0..2 {
            let (status, refused, _) = pay(&server.base, "kept", &other).await;
            assert_eq!(status, 422, "pruned {pruned}: {refused}");
            assert_eq!(refused["type"], "/problems/idempotency-key-reused");
        }
        // ...and a late repeat of the original gets its payout, not a 422
        // that blames it for the other request.
        let (status, again, replayed) = pay(&server.base, "kept", &original).await;
        assert_eq!(status, 201, "pruned {pruned}: {again}");
        assert!(replayed);
        assert_eq!(again["id"], first["id"]);
    }
    common::assert_one_payout_of_1000(&env, &creator, &before).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payout_behind_a_locked_balance_gives_up_with_503_and_retry_after_then_pays_once() {
    let env = Env::new().await;
    let (creator, _) = settled_creator(&env).await;
    let server = env.serve(TOKEN).await;
    use sqlx::Connection;
    let mut blocker = sqlx::PgConnection::connect(&env.db.url).await.unwrap();
    let mut tx = blocker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM settlement.creator_balance WHERE creator = $1 FOR UPDATE")
        .bind(&creator)
        .execute(&mut *tx)
        .await
        .unwrap();
    let body = json!({ "creator": creator, "amount": "5" });
    let response = reqwest::Client::new()
        .post(format!("{}/v1/payouts", server.base))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "waits")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "/problems/database-busy", "{problem}");
    tx.rollback().await.unwrap();
    let (status, paid, _) = pay(&server.base, "waits", &body).await;
    assert_eq!(status, 201, "{paid}");
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payouts").await, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_balance_past_78_digits_keeps_growing_and_a_run_without_a_date_scope_leaves_the_front_page_up() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-27", "--creators", "3"]);
    env.run_ok(&["worker", "--period", "2026-11-27"]);
    // A creator nine periods of maximum volume in: its balance is at the
    // old column's limit.
    let creator = env
        .scalar_text("SELECT creator FROM settlement.creator_balance LIMIT 1")
        .await;
    sqlx::query("UPDATE settlement.creator_balance SET balance = repeat('9', 78)::numeric WHERE creator = $1")
        .bind(&creator)
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO settlement.settlement_policy (period, fee_bps) VALUES ('2026-11-28', 100)")
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("SELECT settlement.ensure_period_partitions('2026-11-28')")
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO settlement.token_trade_volume (period, creator, volume)
         VALUES ('2026-11-28', $1, 2::numeric ^ 255)",
    )
    .bind(&creator)
    .execute(&env.pool)
    .await
    .unwrap();
    env.run_ok(&["worker", "--period", PERIOD]);
    let status = env
        .scalar_text("SELECT status FROM settlement.token_trade_volume WHERE period = '2026-11-28'")
        .await;
    assert_eq!(status, "settled", "the item is paid, not failed by a numeric overflow");
    let digits = env
        .scalar_i64(&format!(
            "SELECT length(balance::text)::bigint FROM settlement.creator_balance WHERE creator = '{creator}'"
        ))
        .await;
    assert_eq!(digits, 79);
    // A runs row whose scope is not a date (written by hand) is listed, the
    // page still answers.
    sqlx::query("INSERT INTO settled_engine.runs (job, scope, state, finished_at) VALUES ('creator-rewards', 'not-a-date', 'finished', now())")
        .execute(&env.pool)
        .await
        .unwrap();
    let server = env.serve(TOKEN).await;
    let page = common::client_with(TOKEN)
        .get(format!("{}/", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    assert!(page.contains("not-a-date") && page.contains(PERIOD), "{page}");
    // Amounts for people: whole tokens (18 decimals) next to base units.
    let paid = env
        .scalar_text("SELECT sum(amount)::text FROM settlement.reward_ledger WHERE period = '2026-11-27'")
        .await;
    let tokens = settled::money::tokens(&paid, 18);
    assert!(tokens.contains(',') || paid.len() <= 21, "{paid} -> {tokens}");
    assert!(
        page.contains(&tokens) && page.contains(&paid),
        "{tokens} / {paid} not on the page"
    );
    let status = env.run_ok(&["status", "--period", "2026-11-27", "--token-decimals", "6"]);
    let six = settled::money::tokens(&paid, 6);
    assert!(
        status.contains(&format!("paid {six} of {six} tokens (6 decimals)"))
            && status.contains(&format!("paid {paid} of {paid} (base units)")),
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_loses_its_trailing_newline_and_one_no_request_could_carry_is_refused_at_start() {
    let env = Env::new().await;
    // A token read from a secret file ends with a line ending: it is dropped.
    for written in ["s3cret\n", "s3cret\r\n"] {
        let server = env.serve(written).await;
        let got = text(
            reqwest::Client::new()
                .post(format!("{}/v1/holds", server.base))
                .bearer_auth("s3cret")
                .json(&json!({ "creator": format!("0x{}", "1".repeat(40)), "reason": "r" }))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_problem(&format!("token {written:?}"), &got, 404, "unknown-creator");
    }
    // A token no request could carry stops the server at start, in one
    // line that names the variable and does not repeat the token.
    for (token, why) in [
        ("", "is blank"),
        (" ", "is blank"),
        ("\n", "is blank"),
        ("\t\r\n", "is blank"),
        (" s3cret", "whitespace"),
        ("s3cret\n\n", "whitespace"),
        ("s3\u{1b}cret", "control"),
    ] {
        let port = common::free_port().to_string();
        let mut child = env
            .cmd(&["serve", "--bind", &format!("127.0.0.1:{port}")])
            .env("SETTLED_API_TOKEN", token)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let status = tokio::task::block_in_place(|| wait_bounded(&mut child, 20));
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(2), "token {token:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(
            stderr.contains("SETTLED_API_TOKEN (--api-token)") && stderr.contains(why),
            "token {token:?}: {stderr}"
        );
        assert!(!stderr.contains("s3"), "the error repeats the token: {stderr}");
    }
}

const WEBHOOK_SECRET: &str = "whsec-hostile";

/// Sends `head` (announcing a body it never sends) and reads the answer's
/// head, or what came before the server closed; None after `limit`.
async fn answer_to_head(target: &str, head: &str, limit: Duration) -> Option<String> {
    let mut conn = TcpStream::connect(target).await.expect("connect");
    conn.write_all(head.as_bytes()).await.expect("send the head");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, conn.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                answer.extend_from_slice(&buf[..n]);
                if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    // The problem's body follows in the same write or the next.
                    let _ = tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf))
                        .await
                        .map(|r| r.map(|n| answer.extend_from_slice(&buf[..n])));
                    break;
                }
            }
            Err(_) => return None,
        }
    }
    Some(String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test(flavor = "multi_thread")]
async fn webhooks_with_a_bad_or_stale_signature_header_are_refused_before_their_body_while_healthz_answers() {
    let env = Env::new().await;
    let server = env
        .serve_with(
            TOKEN,
            &[
                "--provider-webhook-secret",
                WEBHOOK_SECRET,
                "--max-connections",
                "64",
                "--header-timeout-ms",
                "60000",
                "--request-timeout-ms",
                "120000",
            ],
        )
        .await;
    let target = addr(&server);
    let now = chrono::Utc::now().timestamp();
    let v1 = "ab".repeat(32);
    let headers = [
        format!("t={},v1={v1}", now - 3_600),
        format!("t={},v1={v1}", now + 3_600),
        format!("t={now},v1=not-hex"),
        format!("t={now}"),
        "v1=abc".to_string(),
    ];
    // More clients than the cap, each sending a head whose signature header
    // can be judged alone, announcing a body it never sends.
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..100 {
        let signature = headers[i % headers.len()].clone();
        let head = format!(
            "POST /v1/provider-events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nProvider-Signature: {signature}\r\nContent-Length: 1000\r\n\r\n"
        );
        let target = target.clone();
        clients.spawn(async move { (signature, answer_to_head(&target, &head, Duration::from_secs(60)).await) });
    }
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    assert_eq!(
        healthz(&client, &server.base).await,
        200,
        "/healthz behind 100 webhooks with bad signature headers at a cap of 64"
    );
    while let Some(done) = clients.join_next().await {
        let (signature, answer) = done.unwrap();
        let answer = answer.unwrap_or_else(|| panic!("{signature}: no answer within 60 s"));
        assert!(
            answer.starts_with("HTTP/1.1 400") && answer.contains("/problems/bad-signature"),
            "{signature}: answered without its body: {answer}"
        );
    }
    let failures = metric(
        &server.base,
        "settled_webhook_signature_failures_total{reason=\"outside_tolerance\"}",
    )
    .await;
    assert_eq!(failures, 40.0, "stale and future timestamps counted");
    // A header that holds until the body is checked: the body has the
    // webhook's own short time limit, then 408 and the connection closes.
    let head = format!(
        "POST /v1/provider-events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nProvider-Signature: t={now},v1={v1}\r\nContent-Length: 1000\r\n\r\n"
    );
    let (answer, sent) = trickle_body(&target, &head, 1000).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    assert!(sent < 1000, "the trickle was read to its end");
    let answer = answer_to_head(&target, &head, Duration::from_secs(60))
        .await
        .expect("an answer");
    let limit = settled::api::provider_events::WEBHOOK_BODY_READ_TIMEOUT;
    assert!(limit < settled::api::BODY_READ_TIMEOUT);
    assert!(
        answer.starts_with("HTTP/1.1 408") && answer.contains(&format!("within {} ms", limit.as_millis())),
        "the webhook's own body limit: {answer}"
    );
}

/// `settled serve` started with `var` set to `value`: its exit status and stderr.
async fn serve_refused(env: &Env, var: &str, value: &std::ffi::OsStr) -> (Option<i32>, String) {
    let port = common::free_port().to_string();
    let mut child = env
        .cmd(&["serve", "--bind", &format!("127.0.0.1:{port}")])
        .env(var, value)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = tokio::task::block_in_place(|| wait_bounded(&mut child, 20));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_serve_cannot_take_stops_it_with_one_line_naming_the_variable_never_the_secret() {
    use std::os::unix::ffi::OsStrExt;
    let env = Env::new().await;
    let secret_var = "SETTLED_PROVIDER_WEBHOOK_SECRET";
    let mut cases: Vec<(&str, &std::ffi::OsStr)> =
        ["s3cretA,s3cretB ", " s3cretA", "s3cretA,", "s3cretA,s3cretB,s3cretC"]
            .into_iter()
            .map(|v| (secret_var, std::ffi::OsStr::new(v)))
            .collect();
    for var in [secret_var, "SETTLED_API_TOKEN", "DATABASE_URL", "SETTLED_DIRECT_URL"] {
        cases.push((
            var,
            std::ffi::OsStr::from_bytes(b"postgres://u:s3cretpw\xff@127.0.0.1/x"),
        ));
    }
    for (var, value) in cases {
        let (code, stderr) = serve_refused(&env, var, value).await;
        assert_eq!(code, Some(2), "{var}={value:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{var}: one line: {stderr}");
        assert!(
            stderr.contains(var),
            "{var}={value:?}: the error names the variable: {stderr}"
        );
        assert!(
            !stderr.contains("s3cret"),
            "{var}: the error repeats the secret: {stderr}"
        );
    }
}

/// Posts `body` to the webhook route signed with the test's secret.
async fn post_event(base: &str, body: &Value) -> (u16, Value) {
    let raw = serde_json::to_vec(body).unwrap();
    let header = settled::provider::signature::sign(WEBHOOK_SECRET.as_bytes(), chrono::Utc::now().timestamp(), &raw);
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/provider-events"))
        .header("Provider-Signature", header)
        .header("Content-Type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn signed_events_settled_cannot_apply_are_stored_ignored_and_answered_200_so_the_provider_stops_sending() {
    let env = Env::new().await;
    let server = env
        .serve_with(TOKEN, &["--provider-webhook-secret", WEBHOOK_SECRET])
        .await;
    let b = &server.base;
    let payment = json!({ "id": "pay_1", "idempotency_key": "payout-999999", "amount": "5",
        "creator": format!("0x{}", "1".repeat(40)), "status": "paid" });
    let stored = |id: String| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_as::<_, (String, String, Option<String>, i64)>(
                "SELECT type, outcome, detail, count(*) OVER () FROM settlement.provider_events WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(&pool)
            .await
            .unwrap()
        }
    };
    let digest = |text: String| {
        let pool = env.pool.clone();
        async move {
            let hex: String = sqlx::query_scalar("SELECT encode(sha256(convert_to($1, 'UTF8')), 'hex')")
                .bind(text)
                .fetch_one(&pool)
                .await
                .unwrap();
            format!("sha256:{hex}")
        }
    };
    // A type settled does not know: kept, ignored, and its repeat a duplicate.
    let refund = json!({ "id": "ev-refund", "type": "payment.refunded", "created": 1, "data": payment });
    let (status, body) = post_event(b, &refund).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("ignored")), "{body}");
    let (kind, outcome, detail, _) = stored("ev-refund".into()).await.expect("stored");
    assert_eq!((kind.as_str(), outcome.as_str()), ("payment.refunded", "ignored"));
    assert!(detail.unwrap_or_default().contains("payment.refunded"));
    let (status, body) = post_event(b, &refund).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("duplicate")), "{body}");
    // A type longer than the column takes is kept by its digest.
    let long_type = "x".repeat(150);
    let odd = json!({ "id": "ev-odd", "type": long_type, "created": 1 });
    let (status, body) = post_event(b, &odd).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("ignored")), "{body}");
    let (kind, _, _, _) = stored("ev-odd".into()).await.expect("stored");
    assert_eq!(kind, digest(long_type).await);
    // An id longer than 255 characters is kept by its digest, applied as
    // any event is, and a repeat of it is a duplicate.
    let long_id = "e".repeat(300);
    let paid = json!({ "id": long_id, "type": "payment.paid", "created": 1, "data": payment });
    let (status, body) = post_event(b, &paid).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("unknown_payout")),
        "{body}"
    );
    let key = digest(long_id.clone()).await;
    assert_eq!(body["id"], key.as_str(), "{body}");
    let (_, outcome, _, rows) = stored(key.clone()).await.expect("stored under its digest");
    assert_eq!((outcome.as_str(), rows), ("unknown_payout", 1));
    let (status, body) = post_event(b, &paid).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("duplicate")), "{body}");
    // An empty id names nothing a repeat could be matched by: ignored, kept
    // under the digest of its body.
    let nameless = json!({ "id": "", "type": "payment.paid", "created": 1, "data": payment });
    let (status, body) = post_event(b, &nameless).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("ignored")), "{body}");
    let key = format!(
        "body-{}",
        digest(String::from_utf8(serde_json::to_vec(&nameless).unwrap()).unwrap()).await
    );
    assert_eq!(body["id"], key.as_str(), "{body}");
    let (_, outcome, detail, _) = stored(key).await.expect("stored under its body's digest");
    assert_eq!(outcome, "ignored");
    assert!(detail.unwrap_or_default().contains("empty"));
    let (status, body) = post_event(b, &nameless).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("duplicate")), "{body}");
    // The signature still comes first.
    let r = reqwest::Client::new()
        .post(format!("{b}/v1/provider-events"))
        .header("Content-Type", "application/json")
        .body(serde_json::to_vec(&refund).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.provider_events").await,
        4,
        "each event stored once"
    );
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payouts").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_head_over_32_kib_is_refused_with_431_and_one_within_it_is_served() {
    let env = Env::new().await;
    let server = env.serve(TOKEN).await;
    let target = addr(&server);
    let head_of = |size: usize| {
        let start = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ";
        let end = "\r\n\r\n";
        format!("{start}{}{end}", "a".repeat(size - start.len() - end.len()))
    };
    let limit = settled::api::server::MAX_HEAD_BYTES;
    assert_eq!(limit, 32 * 1024, "the documented limit");
    for size in [31 * 1024, limit] {
        let head = head_of(size);
        assert_eq!(head.len(), size);
        let answer = answer_to_head(&target, &head, Duration::from_secs(30))
            .await
            .expect("an answer");
        assert!(answer.starts_with("HTTP/1.1 200"), "a head of {size} bytes: {answer}");
    }
    for size in [limit + 1, 33 * 1024, 48 * 1024, 64 * 1024] {
        let answer = answer_to_head(&target, &head_of(size), Duration::from_secs(30))
            .await
            .expect("an answer or a close");
        // The 431 may be lost to a reset when the server closes with the
        // rest of the head unread; never a 200.
        assert!(
            answer.starts_with("HTTP/1.1 431") || answer.is_empty(),
            "a head of {size} bytes: {answer}"
        );
    }
    let client = reqwest::Client::new();
    assert_eq!(healthz(&client, &server.base).await, 200);
}
