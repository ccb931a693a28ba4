//! `settled deliver` and `settled reconcile` against a provider that
//! misbehaves: redirects, endless answers, endless pages, answers about
//! another key, terminal escapes in its text. The provider is a real HTTP
//! peer on 127.0.0.1 written here byte by byte, so it can answer what no
//! well-behaved server would; settled is the real binary. None asserts how
//! fast anything is, only what happens.

use crate::common;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{wait_until, Deliverer, Env, Server, PERIOD};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TOKEN: &str = "test-token";
const MIB: u64 = 1024 * 1024;

/// One request the provider received.
#[derive(Debug, Clone)]
struct Request {
    method: String,
    /// Path and query.
    target: String,
    idempotency_key: Option<String>,
    body: Value,
}

/// What the provider answers one request with.
enum Answer {
    /// A status, headers and a body.
    Plain(u16, Vec<(&'static str, String)>, Vec<u8>),
    /// 201, chunked: `head`, then `filler` bytes of `a` written lazily, then `tail`.
    Giant { head: Vec<u8>, filler: u64, tail: Vec<u8> },
}

fn json_answer(status: u16, body: &Value) -> Answer {
    Answer::Plain(
        status,
        vec![("content-type", "application/json".into())],
        body.to_string().into_bytes(),
    )
}

type Answers = Arc<dyn Fn(&Request) -> Answer + Send + Sync>;

/// A provider on 127.0.0.1 answering each request (one per connection)
/// with what `answers` says, and keeping every request it received.
struct Provider {
    url: String,
    received: Arc<Mutex<Vec<Request>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Provider {
    async fn start(answers: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Provider {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let answers: Answers = Arc::new(answers);
        let log = received.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(serve_one(conn, answers.clone(), log.clone()));
            }
        });
        Provider { url, received, task }
    }

    fn received(&self) -> Vec<Request> {
        self.received.lock().unwrap().clone()
    }

    /// POSTs received under idempotency key `key`.
    fn posts(&self, key: &str) -> usize {
        self.received()
            .iter()
            .filter(|r| r.method == "POST" && r.idempotency_key.as_deref() == Some(key))
            .count()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_one(mut conn: TcpStream, answers: Answers, log: Arc<Mutex<Vec<Request>>>) {
    let Some(request) = read_request(&mut conn).await else {
        return;
    };
    let answer = answers(&request);
    log.lock().unwrap().push(request);
    // The client may hang up part way (as settled does past its cap).
    let _ = write_answer(&mut conn, answer).await;
}

async fn read_request(conn: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = conn.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let length: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    while buf.len() < head_end + length {
        let n = conn.read(&mut chunk).await.ok().filter(|n| *n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    let mut first = head.split(' ');
    Some(Request {
        method: first.next()?.to_string(),
        target: first.next()?.to_string(),
        idempotency_key: header("idempotency-key"),
        body: serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or(Value::Null),
    })
}

async fn write_answer(conn: &mut TcpStream, answer: Answer) -> std::io::Result<()> {
    match answer {
        Answer::Plain(status, headers, body) => {
            let mut head = format!(
                "HTTP/1.1 {status} Whatever\r\nconnection: close\r\ncontent-length: {}\r\n",
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            conn.write_all(head.as_bytes()).await?;
            conn.write_all(&body).await?;
        }
        Answer::Giant { head, filler, tail } => {
            conn.write_all(
                b"HTTP/1.1 201 Created\r\nconnection: close\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
            )
            .await?;
            write_chunk(conn, &head).await?;
            let block = vec![b'a'; 64 * 1024];
            let mut left = filler;
            while left > 0 {
                let n = left.min(block.len() as u64) as usize;
                write_chunk(conn, &block[..n]).await?;
                left -= n as u64;
            }
            write_chunk(conn, &tail).await?;
            conn.write_all(b"0\r\n\r\n").await?;
        }
    }
    conn.shutdown().await
}

async fn write_chunk(conn: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    conn.write_all(format!("{:x}\r\n", bytes.len()).as_bytes()).await?;
    conn.write_all(bytes).await?;
    conn.write_all(b"\r\n").await
}

/// The provider's payment for `request` (a POST), under `key`, in `status`.
fn payment_for(request: &Request, id: &str, key: &str, status: &str) -> Value {
    json!({
        "id": id,
        "idempotency_key": key,
        "creator": request.body["creator"],
        "amount": request.body["amount"],
        "status": status,
        "failure_reason": (status == "failed").then_some("account closed"),
        "reference": request.body["reference"],
    })
}

fn amount_of(request: &Request) -> &str {
    request.body["amount"].as_str().unwrap_or("")
}

/// A settled period and a server that takes payout requests.
async fn setup() -> (Env, Server) {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "20"]);
    env.run_ok(&["worker", "--period", PERIOD]);
    let server = env.serve(TOKEN).await;
    (env, server)
}

/// A payout of `amount` for the `n`th creator able to pay it: its id and provider key.
async fn payout(env: &Env, server: &Server, n: i64, amount: &str) -> (i64, String) {
    let creator: String = sqlx::query_scalar(
        "SELECT creator FROM settlement.creator_balance WHERE balance >= $1::numeric ORDER BY creator OFFSET $2 LIMIT 1",
    )
    .bind(amount)
    .bind(n)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let response = reqwest::Client::new()
        .post(format!("{}/v1/payouts", server.base))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", format!("hostile-{n}"))
        .json(&json!({ "creator": creator, "amount": amount }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let id = response.json::<Value>().await.unwrap()["id"].as_i64().unwrap();
    let key: String = sqlx::query_scalar("SELECT provider_key FROM settlement.payouts WHERE id = $1")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap();
    (id, key)
}

async fn status(env: &Env, id: i64) -> String {
    env.scalar_text(&format!("SELECT status FROM settlement.payouts WHERE id = {id}"))
        .await
}

async fn returns(env: &Env, id: i64) -> i64 {
    env.scalar_i64(&format!(
        "SELECT count(*) FROM settlement.payout_returns WHERE payout_id = {id}"
    ))
    .await
}

async fn conflicts(env: &Env, id: i64) -> Vec<String> {
    sqlx::query_scalar("SELECT detail FROM settlement.payout_conflicts WHERE payout_id = $1 ORDER BY id")
        .bind(id)
        .fetch_all(&env.pool)
        .await
        .unwrap()
}

/// `settled deliver` against `provider`, with `timeout_ms` per call.
fn deliver(env: &Env, provider: &Provider, timeout_ms: &str) -> Deliverer {
    Deliverer(env.deliver(
        &provider.url,
        &["--provider-timeout-ms", timeout_ms, "--poll-after-secs", "1"],
    ))
}

/// A line of /proc/PID/status (`VmHWM`, `VmRSS`) in bytes.
fn memory_bytes(pid: u32, field: &str) -> u64 {
    memory_bytes_if_alive(pid, field).unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A line of /proc/PID/status in bytes, or `None` once the process has
/// exited: an exited child not yet reaped (a zombie) still has a status
/// file, without its memory lines.
fn memory_bytes_if_alive(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:")))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Waits until each payout was POSTed at least twice (delivery retried it:
/// its outcome was unknown) or left `queued`.
async fn retried_or_moved(env: &Env, provider: &Provider, payouts: &[(i64, String)]) {
    wait_until(90, "each payout retried or moved", || async {
        for (id, key) in payouts {
            if provider.posts(key) < 2 && status(env, *id).await == "queued" {
                return false;
            }
        }
        true
    })
    .await;
}

/// Each payout still queued, its funds held.
async fn still_queued_and_held(env: &Env, payouts: &[(i64, String)], why: &str) {
    for (id, key) in payouts {
        assert_eq!(status(env, *id).await, "queued", "payout {id} ({key}): {why}");
        assert_eq!(returns(env, *id).await, 0, "payout {id} ({key}): its funds stay held");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redirect_is_never_followed_and_leaves_the_payout_queued_with_its_funds_held() {
    let (env, server) = setup().await;
    // Another host: it answers as a provider would, and no call may reach it.
    let elsewhere = Provider::start(|r| {
        json_answer(
            201,
            &payment_for(r, "pay_x", r.idempotency_key.as_deref().unwrap_or(""), "failed"),
        )
    })
    .await;
    let other = format!("{}/v1/payments", elsewhere.url);
    // The provider records each payment, then answers 303 to a URL that
    // answers 404, 302 to ftp://, or 307 to the other host.
    let provider = Provider::start(move |r| {
        if r.target == "/gone" {
            return Answer::Plain(404, Vec::new(), b"not found".to_vec());
        }
        let (code, location) = match amount_of(r) {
            "101" => (303, "/gone".to_string()),
            "102" => (302, "ftp://127.0.0.1/payments".to_string()),
            _ => (307, other.clone()),
        };
        Answer::Plain(code, vec![("location", location)], Vec::new())
    })
    .await;
    let payouts = [
        payout(&env, &server, 0, "101").await,
        payout(&env, &server, 1, "102").await,
        payout(&env, &server, 2, "103").await,
    ];
    let deliverer = deliver(&env, &provider, "5000");
    retried_or_moved(&env, &provider, &payouts).await;
    deliverer.stop();
    still_queued_and_held(&env, &payouts, "a redirect leaves the outcome unknown, never refused").await;
    assert!(
        elsewhere.received().is_empty(),
        "the other host was called: {:?}",
        elsewhere.received()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_giant_answer_is_cut_at_its_cap_in_bounded_memory_and_leaves_the_payout_queued() {
    let (env, server) = setup().await;
    // A pending payment under the right key, whose reference is 200 MiB long.
    let provider = Provider::start(|r| {
        let mut payment = payment_for(r, "pay_1", r.idempotency_key.as_deref().unwrap_or(""), "pending");
        payment["reference"] = json!("REFERENCE");
        let text = payment.to_string();
        let (head, tail) = text.split_once("REFERENCE").unwrap();
        Answer::Giant {
            head: head.as_bytes().to_vec(),
            filler: 200 * MIB,
            tail: tail.as_bytes().to_vec(),
        }
    })
    .await;
    let payouts = [
        payout(&env, &server, 0, "201").await,
        payout(&env, &server, 1, "202").await,
        payout(&env, &server, 2, "203").await,
    ];
    let deliverer = deliver(&env, &provider, "60000");
    retried_or_moved(&env, &provider, &payouts).await;
    let peak = memory_bytes(deliverer.0.id(), "VmHWM");
    deliverer.stop();
    assert!(
        peak < 200 * MIB,
        "deliver's resident memory peaked at {} MiB reading answers of 200 MiB",
        peak / MIB
    );
    still_queued_and_held(&env, &payouts, "an answer past the cap is an unknown outcome").await;
}

/// Runs `settled ARGS`, killing it and failing the test if its resident
/// memory passes `rss_max` or it runs past `secs`; its exit code, stdout,
/// stderr and the highest resident memory seen.
fn run_bounded(env: &Env, args: &[&str], rss_max: u64, secs: u64) -> (i32, String, String, u64) {
    let mut child = env
        .cmd(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut seen = 0;
    while child.try_wait().unwrap().is_none() {
        let rss = memory_bytes_if_alive(child.id(), "VmRSS").unwrap_or(0);
        seen = seen.max(rss);
        if rss > rss_max || started.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "settled {args:?} still running after {:?} at {} MiB resident",
                started.elapsed(),
                rss / MIB
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        seen,
    )
}

/// The number in a listing's cursor (`after=pay_000000001000`), 0 without one.
fn after_of(target: &str) -> u64 {
    target
        .split_once("after=pay_")
        .and_then(|(_, rest)| rest.split('&').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn reconcile_against_endless_pages_ends_with_an_error_in_bounded_memory() {
    let env = Env::new().await;
    // Every page is full, its ids after the cursor: the listing never ends.
    let provider = Provider::start(|r| {
        let after = after_of(&r.target);
        let page: Vec<Value> = (after + 1..=after + 1_000)
            .map(|n| {
                json!({"id": format!("pay_{n:012}"), "idempotency_key": format!("k-{n}"),
                       "creator": "0x00000000000000000000000000000000000000aa", "amount": "1", "status": "paid"})
            })
            .collect();
        json_answer(200, &Value::Array(page))
    })
    .await;
    let args = ["reconcile", "--provider-url", &provider.url];
    let (code, _, stderr, peak) = run_bounded(&env, &args, 1536 * MIB, 600);
    assert_eq!(code, 2, "the comparison could not be made: {stderr}");
    assert!(
        stderr.contains("pages"),
        "the error says the listing had too many pages: {stderr}"
    );
    println!("reconcile peaked at {} MiB", peak / MIB);
    assert!(peak < 1024 * MIB, "reconcile peaked at {} MiB", peak / MIB);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_or_a_lookup_about_another_key_is_a_conflict_and_changes_nothing() {
    let (env, server) = setup().await;
    // 301: delivery's answer is a failed payment under another key, same
    // creator and amount. 302: delivery's answer is right (pending), and
    // the lookup of the sent payout answers a failed payment under another
    // key, for the creator and amount the payout was sent with.
    let remembered: Arc<Mutex<Option<Request>>> = Arc::default();
    let provider = Provider::start(move |r| {
        if r.method == "GET" {
            return match remembered.lock().unwrap().as_ref() {
                Some(first) => json_answer(200, &payment_for(first, "pay_other_2", "someone-else", "failed")),
                None => Answer::Plain(404, Vec::new(), Vec::new()),
            };
        }
        let key = r.idempotency_key.clone().unwrap_or_default();
        match amount_of(r) {
            "301" => json_answer(201, &payment_for(r, "pay_other_1", "someone-else", "failed")),
            _ => {
                *remembered.lock().unwrap() = Some(r.clone());
                json_answer(201, &payment_for(r, "pay_2", &key, "pending"))
            }
        }
    })
    .await;
    let answered = payout(&env, &server, 0, "301").await;
    let looked_up = payout(&env, &server, 1, "302").await;
    let deliverer = deliver(&env, &provider, "5000");
    wait_until(90, "both answers recorded as conflicts, or applied", || async {
        let mut done = true;
        for id in [answered.0, looked_up.0] {
            let moved = matches!(status(&env, id).await.as_str(), "failed" | "paid");
            done &= moved || !conflicts(&env, id).await.is_empty();
        }
        done
    })
    .await;
    deliverer.stop();
    assert_eq!(
        (status(&env, answered.0).await, status(&env, looked_up.0).await),
        ("queued".to_string(), "sent".to_string()),
        "neither delivery's answer nor the lookup applied anything"
    );
    for (id, key) in [&answered, &looked_up] {
        assert_eq!(returns(&env, *id).await, 0, "payout {id}: its funds stay held");
        let found = conflicts(&env, *id).await;
        assert!(
            found
                .iter()
                .any(|d| d.contains("someone-else") && d.contains(key.as_str())),
            "payout {id}'s conflict names both keys: {found:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reconcile_prints_no_terminal_escape_or_carriage_return_the_provider_sent() {
    let (env, server) = setup().await;
    let hostile = "key taken\u{1b}[2J\u{1b}]0;owned\u{7}\rall fine\u{202e}";
    // Delivery's call answers a key conflict whose text holds escapes (the
    // job becomes a dead letter holding it); the listing holds a payment
    // whose id and creator hold them.
    let provider = Provider::start(move |r| {
        if r.method == "POST" {
            return Answer::Plain(422, Vec::new(), hostile.as_bytes().to_vec());
        }
        let page = json!([{"id": "pay_\u{1b}[31m1", "idempotency_key": "other\r", "creator": "0x\u{1b}[0m\raa",
                           "amount": "5\u{1b}[8m", "status": "paid"}]);
        json_answer(200, &page)
    })
    .await;
    let (id, _) = payout(&env, &server, 0, "401").await;
    let deliverer = deliver(&env, &provider, "5000");
    wait_until(60, "the delivery job to be a dead letter", || async {
        env.scalar_i64(&format!(
            "SELECT count(*) FROM settlement.payout_jobs WHERE payout_id = {id} AND status = 'failed'"
        ))
        .await
            == 1
    })
    .await;
    deliverer.stop();
    let out = env.run(&["reconcile", "--provider-url", &provider.url]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stdout.contains("stranded") && stdout.contains("unknown_to_settled"),
        "{stdout}"
    );
    assert!(
        stdout.contains("key taken"),
        "the dead letter's error is shown: {stdout}"
    );
    for text in [&stdout, &stderr] {
        assert!(!text.contains(['\u{1b}', '\r', '\u{7}', '\u{202e}']), "{text:?}");
    }
    // An error the provider answers is printed clean too.
    let refusing = Provider::start(move |_| Answer::Plain(400, Vec::new(), hostile.as_bytes().to_vec())).await;
    let out = env.run(&["reconcile", "--provider-url", &refusing.url]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("key taken"), "{stderr}");
    assert!(!stderr.contains(['\u{1b}', '\r', '\u{7}', '\u{202e}']), "{stderr:?}");
}
