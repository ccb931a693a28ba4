//! Continuous queues for operators, black-box: `settled queues` and its
//! verbs, the `/v1/queues` endpoints, the dashboard's queue pages and the
//! queue metrics, against a queue table made by the engine's own
//! `Queue::create_table`, with jobs in every state made in SQL. Every
//! command and server runs under `--role-per-command`, with the grants an
//! application gives its queue table, so the roles' grants are shown to
//! be enough.

use crate::common;

use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use common::{Env, Server};
use serde_json::{json, Value};
use settled_engine::{NewJob, Queue};
use sqlx::Connection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "queue-t0ken";

/// A database with queue `mail` on `jobs.mail` (made by the engine,
/// granted as an application grants its table) holding: ready r1 (its
/// `not_before` 90 s ago), r2, r3; scheduled s1, s2 (in an hour);
/// processing p1 (leased for an hour); dead letters d1 (failed 2 h ago,
/// an error with markup) and d2 (10 minutes ago, a timeout); settled done1.
async fn queue_env() -> Env {
    let env = Env::new().await;
    let mut conn = env.pool.acquire().await.unwrap();
    sqlx::query("CREATE SCHEMA jobs").execute(&mut *conn).await.unwrap();
    let queue = Queue::new("mail", "jobs.mail").unwrap();
    queue.create_table(&mut conn).await.unwrap();
    let later = Utc::now() + chrono::Duration::hours(1);
    let jobs: Vec<NewJob> = ["r1", "r2", "r3", "p1", "d1", "d2", "done1"]
        .into_iter()
        .map(NewJob::new)
        .chain(["s1", "s2"].into_iter().map(|k| NewJob::new(k).not_before(later)))
        .collect();
    assert_eq!(queue.enqueue_many(&mut conn, &jobs).await.unwrap(), 9);
    sqlx::raw_sql(
        "UPDATE jobs.mail SET enqueued_at = now() - interval '90 seconds', not_before = now() - interval '90 seconds'
             WHERE key = 'r1';
         UPDATE jobs.mail SET status = 'processing', attempt = 1, lease_owner = gen_random_uuid(),
                lease_until = now() + interval '1 hour' WHERE key = 'p1';
         UPDATE jobs.mail SET status = 'failed', attempt = 3, last_error = 'smtp 550 mailbox <unknown>',
                errors = '[{\"attempt\": 1, \"error\": \"smtp 550 mailbox <unknown>\"}]',
                updated_at = now() - interval '2 hours' WHERE key = 'd1';
         UPDATE jobs.mail SET status = 'failed', attempt = 3, last_error = 'timeout after 30 s',
                updated_at = now() - interval '10 minutes' WHERE key = 'd2';
         UPDATE jobs.mail SET status = 'settled', attempt = 1 WHERE key = 'done1';
         GRANT USAGE ON SCHEMA jobs TO settled_api, settled_readonly;
         GRANT SELECT ON jobs.mail TO settled_readonly;
         GRANT SELECT, UPDATE ON jobs.mail TO settled_api;",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    env
}

/// Registers `ghost` on a table that does not exist.
async fn register_ghost(env: &Env) {
    sqlx::query("INSERT INTO settled_engine.queues (name, table_name) VALUES ('ghost', 'jobs.ghost')")
        .execute(&env.pool)
        .await
        .unwrap();
}

async fn status_of(env: &Env, key: &str) -> String {
    env.scalar_text(&format!("SELECT status FROM jobs.mail WHERE key = '{key}'"))
        .await
}

async fn paused(env: &Env) -> bool {
    sqlx::query_scalar("SELECT paused_at IS NOT NULL FROM settled_engine.queues WHERE name = 'mail'")
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// `settled --role-per-command ARGS`: exit code, stdout, stderr.
fn queues(env: &Env, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["--role-per-command", "queues"];
    all.extend_from_slice(args);
    let out = env.run(&all);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn rfc3339(at: chrono::DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

#[tokio::test(flavor = "multi_thread")]
async fn settled_queues_lists_exact_counts_and_a_queue_it_cannot_read_with_the_error() {
    let env = queue_env().await;
    let (code, out, err) = queues(&env, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("mail "))
        .unwrap_or_else(|| panic!("no row for mail:\n{out}"))
        .split_whitespace()
        .collect();
    assert_eq!(&row[..7], ["mail", "jobs.mail", "serving", "3", "2", "1", "2"], "{out}");
    let oldest: f64 = row[7].trim_end_matches('s').parse().unwrap();
    assert!((90.0..3600.0).contains(&oldest), "oldest ready {oldest}: {out}");

    let (code, out, _) = queues(&env, &["--json"]);
    assert_eq!(code, 0);
    let all: Value = serde_json::from_str(&out).unwrap();
    let stats = &all[0]["stats"];
    assert_eq!(all[0]["name"], "mail");
    assert_eq!(all[0]["paused"], false);
    assert_eq!(
        [
            &stats["ready"],
            &stats["scheduled"],
            &stats["processing"],
            &stats["failed"]
        ],
        [&json!(3), &json!(2), &json!(1), &json!(2)],
        "{out}"
    );
    assert!(stats["oldest_ready_secs"].as_f64().unwrap() >= 90.0, "{out}");

    // A queue whose table is missing, and one whose table the readonly role
    // was never granted: each listed with its error, exit 1, no crash.
    register_ghost(&env).await;
    let mut conn = env.pool.acquire().await.unwrap();
    sqlx::query("CREATE SCHEMA vault").execute(&mut *conn).await.unwrap();
    Queue::new("secret", "vault.secret")
        .unwrap()
        .create_table(&mut conn)
        .await
        .unwrap();
    let (code, out, _) = queues(&env, &[]);
    assert_eq!(code, 1, "{out}");
    let line = |name: &str| out.lines().find(|l| l.starts_with(name)).unwrap().to_string();
    assert!(
        line("ghost ").contains("error: ") && line("ghost ").contains("no such table"),
        "{out}"
    );
    assert!(
        line("secret ").contains("error: ") && line("secret ").contains("permission denied"),
        "{out}"
    );
    assert!(
        line("mail ").contains("serving"),
        "the readable queue is still listed: {out}"
    );
    let (code, out, _) = queues(&env, &["--json"]);
    assert_eq!(code, 1);
    let all: Value = serde_json::from_str(&out).unwrap();
    let ghost = all.as_array().unwrap().iter().find(|q| q["name"] == "ghost").unwrap();
    assert_eq!(ghost["stats"], Value::Null);
    assert!(ghost["error"].as_str().unwrap().contains("jobs.ghost"), "{ghost}");
    // The owner (no --role-per-command) reads the ungranted table.
    let owner = env.run(&["queues"]);
    let text = String::from_utf8_lossy(&owner.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("secret ") && !l.contains("error")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn each_verb_says_what_it_changed_and_refuses_what_it_cannot_do() {
    let env = queue_env().await;
    let (code, out, _) = queues(&env, &["pause", "mail"]);
    assert_eq!(
        (code, out.trim()),
        (
            0,
            "queue mail paused: its workers claim nothing until `settled queues resume mail`"
        )
    );
    assert!(paused(&env).await);
    let (code, out, _) = queues(&env, &["pause", "mail"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("queue mail was already paused since ") && out.trim().ends_with("nothing changed"),
        "{out}"
    );
    assert!(queues(&env, &[])
        .1
        .lines()
        .any(|l| l.starts_with("mail ") && l.contains(" paused ")));
    let (code, out, _) = queues(&env, &["resume", "mail"]);
    assert_eq!((code, out.trim()), (0, "queue mail resumed: its workers were woken"));
    assert!(!paused(&env).await);
    assert_eq!(
        queues(&env, &["resume", "mail"]).1.trim(),
        "queue mail was not paused; nothing changed"
    );
    let (code, _, err) = queues(&env, &["pause", "nope"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no queue named \"nope\" is registered (registered: mail, payout_delivery)"),
        "{err}"
    );

    // Cancel: a job nobody holds, then the refusals.
    let (code, out, _) = queues(&env, &["cancel", "mail", "--key", "r2"]);
    assert_eq!(
        (code, out.trim()),
        (0, "job \"r2\" of queue mail cancelled: it will not run")
    );
    assert_eq!(status_of(&env, "r2").await, "cancelled");
    for (key, why) in [
        ("p1", "it has started: it is processing under a lease"),
        ("d1", "it has ended: its status is failed"),
        ("r2", "it has ended: its status is cancelled"),
    ] {
        let (code, _, err) = queues(&env, &["cancel", "mail", "--key", key]);
        assert_eq!(code, 1, "{key}");
        assert!(
            err.contains(&format!("job \"{key}\" of queue mail was not cancelled: {why}")),
            "{err}"
        );
    }
    let (code, _, err) = queues(&env, &["cancel", "mail", "--key", "zzz"]);
    assert_eq!(code, 1);
    assert!(err.contains("queue mail has no job \"zzz\""), "{err}");
    // A job a worker's transaction holds (as an in-transaction claim does)
    // has started: refused, and still eligible once the worker lets go.
    let mut worker = sqlx::PgConnection::connect(&env.db.url).await.unwrap();
    let mut tx = worker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs.mail WHERE key = 'r3' FOR NO KEY UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let (code, _, err) = queues(&env, &["cancel", "mail", "--key", "r3"]);
    assert_eq!(code, 1);
    assert!(err.contains("it is being handled in a worker's transaction"), "{err}");
    tx.rollback().await.unwrap();
    assert_eq!(status_of(&env, "r3").await, "eligible");
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_are_listed_and_replayed_by_key_or_filter_and_bad_flags_are_named() {
    let env = queue_env().await;
    let (code, out, _) = queues(&env, &["dead", "mail"]);
    assert_eq!(code, 0);
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows[0].starts_with("d2 ") && rows[0].contains("timeout after 30 s"),
        "newest first: {out}"
    );
    assert!(
        rows[1].starts_with("d1 ") && rows[1].contains("smtp 550 mailbox <unknown>"),
        "{out}"
    );
    assert_eq!(rows[1].split_whitespace().nth(1), Some("3"), "attempts: {out}");
    let (_, out, _) = queues(&env, &["dead", "mail", "--json", "--limit", "1"]);
    let dead: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(dead.as_array().unwrap().len(), 1);
    assert_eq!((&dead[0]["key"], &dead[0]["attempts"]), (&json!("d2"), &json!(3)));

    // Usage errors name the flag and exit 2; nothing changes.
    for (args, flag) in [
        (vec!["--failed-since", "yesterday"], "--failed-since"),
        (vec!["--limit", "0"], "--limit"),
        (
            vec![
                "--failed-since",
                "2026-12-03T10:00:00Z",
                "--failed-before",
                "2026-12-03T09:00:00Z",
            ],
            "--failed-before",
        ),
    ] {
        let mut all = vec!["replay", "mail"];
        all.extend(args);
        let (code, _, err) = queues(&env, &all);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(flag), "{flag}: {err}");
    }
    let (code, _, err) = queues(&env, &["replay", "mail", "--error-contains", "refused"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no dead letter of queue mail matches (last error containing \"refused\"); nothing changed"),
        "{err}"
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM jobs.mail WHERE status = 'failed'")
            .await,
        2
    );

    // By time: only d1 failed over an hour ago.
    let hour_ago = rfc3339(Utc::now() - chrono::Duration::hours(1));
    let (code, out, _) = queues(&env, &["replay", "mail", "--failed-before", &hour_ago]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("1 dead letter(s) of queue mail replayed (failed before "),
        "{out}"
    );
    assert_eq!(status_of(&env, "d1").await, "eligible");
    assert_eq!(status_of(&env, "d2").await, "failed");
    // A replayed job starts a fresh count of attempts; its fence keeps rising.
    assert_eq!(
        env.scalar_i64("SELECT (attempt - attempt_base)::bigint FROM jobs.mail WHERE key = 'd1'")
            .await,
        0
    );
    let (code, out, _) = queues(&env, &["replay", "mail", "--key", "d2", "--error-contains", "timeout"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("1 dead letter(s) of queue mail replayed (key \"d2\", last error containing \"timeout\")"),
        "{out}"
    );
    let (code, _, err) = queues(&env, &["replay", "mail"]);
    assert_eq!(code, 1, "nothing left to replay");
    assert!(err.contains("(any dead letter)"), "{err}");
    assert_eq!(
        queues(&env, &["dead", "mail"]).1.trim(),
        "queue mail has no dead letters"
    );
    let (code, _, err) = queues(&env, &["dead", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no queue named \"nope\""), "{err}");
}

async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let r = client.get(url).bearer_auth(TOKEN).send().await.unwrap();
    let status = r.status().as_u16();
    if status >= 400 {
        assert_eq!(r.headers()["content-type"], "application/problem+json");
    }
    (status, r.json().await.unwrap())
}

async fn post(client: &reqwest::Client, url: &str, token: Option<&str>, body: Option<&str>) -> (u16, Value) {
    let mut request = client.post(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request
            .header("Content-Type", "application/json")
            .body(body.to_string());
    }
    let r = request.send().await.unwrap();
    let status = r.status().as_u16();
    if status >= 400 {
        assert_eq!(r.headers()["content-type"], "application/problem+json");
    }
    if status == 401 {
        assert_eq!(r.headers()["www-authenticate"], "Bearer realm=\"settled\"");
    }
    (status, r.json().await.unwrap())
}

/// Sends a request head that announces a body and never sends it; the answer.
async fn head_only(server: &Server, path: &str) -> String {
    let target = server.base.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&target).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut answer))
        .await
        .expect("an answer")
        .unwrap();
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_queue_endpoints_read_with_any_role_and_act_only_with_an_operators_token() {
    let env = queue_env().await;
    let server = env.serve(TOKEN).await;
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", server.base);

    let (status, all) = get(&client, &url("/v1/queues")).await;
    assert_eq!(status, 200);
    assert_eq!(all["queues"][0]["name"], "mail");
    assert_eq!(all["queues"][0]["stats"]["ready"], 3);
    let (status, one) = get(&client, &url("/v1/queues/mail")).await;
    assert_eq!(status, 200);
    assert_eq!(
        (&one["stats"]["scheduled"], &one["stats"]["failed"]),
        (&json!(2), &json!(2))
    );
    let (status, problem) = get(&client, &url("/v1/queues/nope")).await;
    assert_eq!((status, &problem["type"]), (404, &json!("/problems/unknown-queue")));
    let (status, dead) = get(&client, &url("/v1/queues/mail/dead")).await;
    assert_eq!(status, 200);
    let keys: Vec<&str> = dead["dead_letters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["d2", "d1"]);
    assert_eq!(dead["dead_letters"][1]["last_error"], "smtp 550 mailbox <unknown>");
    assert_eq!(dead["dead_letters"][1]["history"][0]["attempt"], 1);
    let (status, problem) = get(&client, &url("/v1/queues/mail/dead?limit=0")).await;
    assert_eq!((status, &problem["field"]), (400, &json!("limit")));

    // Without the token (or with a wrong one) nothing changes; the token is
    // checked before the body is read.
    for token in [None, Some("wrong")] {
        for path in ["pause", "resume"] {
            assert_eq!(
                post(&client, &url(&format!("/v1/queues/mail/{path}")), token, None)
                    .await
                    .0,
                401
            );
        }
        let (status, _) = post(&client, &url("/v1/queues/mail/replay"), token, Some("{}")).await;
        assert_eq!(status, 401);
        let (status, _) = post(&client, &url("/v1/queues/mail/cancel"), token, Some(r#"{"key":"r2"}"#)).await;
        assert_eq!(status, 401);
    }
    for path in [
        "/v1/queues/mail/replay",
        "/v1/queues/mail/cancel",
        "/dashboard/queues/mail/replay",
    ] {
        let answer = head_only(&server, path).await;
        assert!(answer.starts_with("HTTP/1.1 401"), "{path}: {answer}");
    }
    assert!(!paused(&env).await);
    assert_eq!(status_of(&env, "r2").await, "eligible");
    assert_eq!(status_of(&env, "d1").await, "failed");

    let token = Some(TOKEN);
    let (status, body) = post(&client, &url("/v1/queues/mail/pause"), token, None).await;
    assert_eq!(
        (status, body),
        (200, json!({"queue": "mail", "paused": true, "changed": true}))
    );
    assert!(paused(&env).await);
    let (_, body) = post(&client, &url("/v1/queues/mail/pause"), token, None).await;
    assert_eq!(body["changed"], false);
    assert_eq!(
        env.scalar_text(
            "SELECT string_agg(outcome, ', ' ORDER BY id) FROM settlement.audit_log
             WHERE action = 'POST /v1/queues/{name}/pause'"
        )
        .await,
        "ok, no change: already paused",
        "the audit log says which pause changed nothing"
    );
    let (status, body) = post(&client, &url("/v1/queues/mail/resume"), token, None).await;
    assert_eq!((status, &body["changed"]), (200, &json!(true)));
    assert!(!paused(&env).await);
    let (status, problem) = post(&client, &url("/v1/queues/nope/pause"), token, None).await;
    assert_eq!((status, &problem["type"]), (404, &json!("/problems/unknown-queue")));

    // Replay: bodies refused with the field named, a filter that matches
    // nothing, one by key, then the rest.
    let replay = url("/v1/queues/mail/replay");
    for (body, status, kind, field) in [
        (r#"{"key":"d1","key":"d2"}"#, 400, "duplicate-field", "key"),
        (r#"{"nope":1}"#, 400, "malformed-json", "nope"),
        (r#"{"failed_since":"yesterday"}"#, 422, "invalid-field", "failed_since"),
        (r#"{"limit":0}"#, 422, "invalid-field", "limit"),
    ] {
        let (got, problem) = post(&client, &replay, token, Some(body)).await;
        assert_eq!(
            (got, &problem["type"]),
            (status, &json!(format!("/problems/{kind}"))),
            "{body}: {problem}"
        );
        assert_eq!(problem["field"], field, "{problem}");
    }
    let (status, problem) = post(&client, &replay, token, Some(r#"{"error_contains":"refused"}"#)).await;
    assert_eq!(
        (status, &problem["type"]),
        (404, &json!("/problems/no-dead-letter-matched"))
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM jobs.mail WHERE status = 'failed'")
            .await,
        2
    );
    let (status, body) = post(&client, &replay, token, Some(r#"{"key":"d1"}"#)).await;
    assert_eq!(
        (status, body),
        (200, json!({"queue": "mail", "replayed": 1, "limit_reached": false}))
    );
    assert_eq!(status_of(&env, "d1").await, "eligible");
    let (status, body) = post(&client, &replay, token, Some(r#"{"limit":1}"#)).await;
    assert_eq!(
        (status, body),
        (200, json!({"queue": "mail", "replayed": 1, "limit_reached": true}))
    );
    assert_eq!(status_of(&env, "d2").await, "eligible");

    // Cancel.
    let cancel = url("/v1/queues/mail/cancel");
    let (status, body) = post(&client, &cancel, token, Some(r#"{"key":"r2"}"#)).await;
    assert_eq!(
        (status, body),
        (200, json!({"queue": "mail", "key": "r2", "cancelled": true}))
    );
    assert_eq!(status_of(&env, "r2").await, "cancelled");
    let (status, problem) = post(&client, &cancel, token, Some(r#"{"key":"p1"}"#)).await;
    assert_eq!(
        (status, &problem["type"]),
        (409, &json!("/problems/job-started")),
        "{problem}"
    );
    let (status, problem) = post(&client, &cancel, token, Some(r#"{"key":"zzz"}"#)).await;
    assert_eq!((status, &problem["type"]), (404, &json!("/problems/unknown-job")));
    let (status, problem) = post(&client, &cancel, token, Some(r#"{}"#)).await;
    assert_eq!((status, &problem["field"]), (400, &json!("key")), "{problem}");

    // A queue whose table is missing: listed with its error, its verbs 409.
    register_ghost(&env).await;
    let (_, all) = get(&client, &url("/v1/queues")).await;
    assert!(
        all["queues"][0]["error"].as_str().unwrap().contains("jobs.ghost"),
        "{all}"
    );
    let (status, problem) = post(&client, &url("/v1/queues/ghost/replay"), token, Some("{}")).await;
    assert_eq!((status, &problem["type"]), (409, &json!("/problems/queue-unusable")));

    let (_, doc) = get(&client, &url("/openapi.json")).await;
    for path in [
        "/v1/queues",
        "/v1/queues/{name}/dead",
        "/v1/queues/{name}/replay",
        "/v1/queues/{name}/cancel",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} is documented");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dashboard_shows_each_queue_and_its_forms_act_only_with_the_token() {
    let env = queue_env().await;
    register_ghost(&env).await;
    let server = env.serve(TOKEN).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let page = |path: &'static str| {
        let (client, url) = (client.clone(), format!("{}{path}", server.base));
        async move {
            let r = client.get(url).bearer_auth(TOKEN).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (status, list) = page("/queues").await;
    assert_eq!(status, 200);
    for wanted in [
        "href=\"/queues\"",
        "href=\"/queues/mail\"",
        "data-ready=\"3\"",
        "data-scheduled=\"2\"",
        "data-processing=\"1\"",
        "data-failed=\"2\"",
        "cannot read its table: ",
    ] {
        assert!(list.contains(wanted), "{wanted}: {list}");
    }
    let (status, mail) = page("/queues/mail").await;
    assert_eq!(status, 200);
    for wanted in [
        "<b id=\"state\">serving</b>",
        "data-ready=\"3\"",
        "smtp 550 mailbox &lt;unknown&gt;",
        "timeout after 30 s",
        "action=\"/dashboard/queues/mail/replay\"",
        "<input type=\"hidden\" name=\"key\" value=\"d1\">",
        "action=\"/dashboard/queues/mail/pause\"",
        "Not known here",
    ] {
        assert!(mail.contains(wanted), "{wanted}: {mail}");
    }
    let oldest = mail
        .split("data-oldest-ready=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert!(oldest.parse::<f64>().unwrap() >= 90.0, "{oldest}");
    assert_eq!(page("/queues/nope").await.0, 404);

    // The forms: 401 with a Basic challenge without the token, 403 from
    // another origin even with it, 303 back to the page with it.
    let form = |path: &str, token: &str, origin: Option<&str>| {
        let mut request = client
            .post(format!("{}{path}", server.base))
            .basic_auth("operator", Some(token))
            .form(&[("key", "d1")]);
        if let Some(origin) = origin {
            request = request.header("Origin", origin);
        }
        request.send()
    };
    let r = form("/dashboard/queues/mail/pause", "wrong", None).await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Basic realm="));
    let r = form("/dashboard/queues/mail/replay", TOKEN, Some("http://evil.example"))
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(!paused(&env).await);
    assert_eq!(status_of(&env, "d1").await, "failed");
    let r = form("/dashboard/queues/mail/pause", TOKEN, None).await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/queues/mail");
    assert!(paused(&env).await);
    let (_, mail) = page("/queues/mail").await;
    assert!(
        mail.contains("<b id=\"state\">paused</b>") && mail.contains("/dashboard/queues/mail/resume"),
        "{mail}"
    );
    let r = form("/dashboard/queues/mail/replay", TOKEN, None).await.unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.headers()["location"], "/queues/mail?replayed=1");
    assert_eq!(status_of(&env, "d1").await, "eligible");
    assert_eq!(status_of(&env, "d2").await, "failed", "only the key posted");
    let (_, mail) = page("/queues/mail?replayed=1").await;
    assert!(mail.contains("1 dead letter(s) replayed."), "{mail}");
    let r = form("/dashboard/queues/mail/resume", TOKEN, None).await.unwrap();
    assert_eq!(r.status(), 303);
    assert!(!paused(&env).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_give_each_queues_depth_oldest_ready_age_and_pause_at_scrape_time() {
    let env = queue_env().await;
    register_ghost(&env).await;
    let server = env.serve(TOKEN).await;
    let scrape = || async {
        let text = reqwest::get(format!("{}/metrics", server.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let parsed = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text");
        (text, parsed)
    };
    let value = |scrape: &(String, prometheus_parse::Scrape), name: &str, labels: &[(&str, &str)]| -> Option<f64> {
        scrape
            .1
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
    };
    let depth = |s: &(String, prometheus_parse::Scrape), state: &str| {
        value(s, "work_queue_depth", &[("queue", "mail"), ("state", state)]).unwrap_or_else(|| panic!("{}", s.0))
    };
    let first = scrape().await;
    assert_eq!(
        ["ready", "scheduled", "processing", "failed"].map(|st| depth(&first, st)),
        [3.0, 2.0, 1.0, 2.0]
    );
    assert!(value(&first, "work_queue_oldest_ready_seconds", &[("queue", "mail")]).unwrap() >= 90.0);
    assert_eq!(value(&first, "work_queue_paused", &[("queue", "mail")]), Some(0.0));
    // The queue without a table: its pause, and no depth at all.
    assert_eq!(value(&first, "work_queue_paused", &[("queue", "ghost")]), Some(0.0));
    assert_eq!(
        value(&first, "work_queue_depth", &[("queue", "ghost")]),
        None,
        "{}",
        first.0
    );

    // s1's time has come (made so in SQL), the queue is paused, and a
    // ready job is cancelled: the next scrape says so.
    sqlx::query("UPDATE jobs.mail SET not_before = now() - interval '1 second' WHERE key = 's1'")
        .execute(&env.pool)
        .await
        .unwrap();
    assert_eq!(queues(&env, &["pause", "mail"]).0, 0);
    assert_eq!(queues(&env, &["cancel", "mail", "--key", "r2"]).0, 0);
    let second = scrape().await;
    assert_eq!(
        ["ready", "scheduled", "processing", "failed"].map(|st| depth(&second, st)),
        [3.0, 1.0, 1.0, 2.0]
    );
    assert_eq!(value(&second, "work_queue_paused", &[("queue", "mail")]), Some(1.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queue_keyed_by_a_bigint_is_operated_by_its_own_key_column_and_a_key_of_another_type_is_named() {
    let env = Env::new().await;
    let mut conn = env.pool.acquire().await.unwrap();
    sqlx::query("CREATE SCHEMA jobs").execute(&mut *conn).await.unwrap();
    let queue = Queue::with_key("numbers", "jobs.numbers", "id", "bigint").unwrap();
    queue.create_table(&mut conn).await.unwrap();
    let jobs: Vec<NewJob> = ["7", "8", "9"].into_iter().map(NewJob::new).collect();
    queue.enqueue_many(&mut conn, &jobs).await.unwrap();
    sqlx::raw_sql(
        "UPDATE jobs.numbers SET status = 'failed', attempt = 2, last_error = 'no such account' WHERE id = 9;
         GRANT USAGE ON SCHEMA jobs TO settled_api, settled_readonly;
         GRANT SELECT ON jobs.numbers TO settled_readonly;
         GRANT SELECT, UPDATE ON jobs.numbers TO settled_api;",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let (code, out, _) = queues(&env, &["--json"]);
    assert_eq!(code, 0, "{out}");
    let all: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&all[0]["stats"]["ready"], &all[0]["stats"]["failed"]),
        (&json!(2), &json!(1))
    );
    let (code, out, _) = queues(&env, &["dead", "numbers"]);
    assert_eq!(code, 0);
    assert!(out.lines().nth(1).unwrap().starts_with("9 "), "{out}");
    let (code, out, err) = queues(&env, &["cancel", "numbers", "--key", "8"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("job \"8\" of queue numbers cancelled"), "{out}");
    let (code, _, err) = queues(&env, &["cancel", "numbers", "--key", "eight"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("key \"eight\" is not a bigint, the type of queue \"numbers\"'s key"),
        "{err}"
    );
    let (code, out, _) = queues(&env, &["replay", "numbers", "--key", "9"]);
    assert_eq!(code, 0, "{out}");
    let status: String = sqlx::query_scalar("SELECT status FROM jobs.numbers WHERE id = 9")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(status, "eligible");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payout_deliverys_dead_letter_is_replayed_under_the_least_role_by_the_cli_and_the_api() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "10"]);
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let creator = env
        .scalar_text("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1")
        .await;
    let mut ids = Vec::new();
    for key in ["dead-1", "dead-2"] {
        let id: i64 =
            sqlx::query_scalar("SELECT payout_id FROM settlement.debit_for_payout($1, 100, $2, 'h', NULL, NULL, NULL)")
                .bind(&creator)
                .bind(key)
                .fetch_one(&env.pool)
                .await
                .unwrap();
        ids.push(id.to_string());
    }
    // Both deliveries ran out of attempts: dead letters, their payouts queued.
    sqlx::query(
        "UPDATE settlement.payout_jobs SET status = 'failed', attempt = 5, last_error = 'the provider is unavailable'",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let job = |id: &str| format!("SELECT status FROM settlement.payout_jobs WHERE payout_id = {id}");
    let (code, out, err) = queues(&env, &["replay", "payout_delivery", "--key", &ids[0]]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(env.scalar_text(&job(&ids[0])).await, "eligible");
    // A cancel is refused by the payout's guard, not by a missing grant.
    let (code, out, err) = queues(&env, &["cancel", "payout_delivery", "--key", &ids[0]]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("is queued with its funds held"), "{err}");
    let server = env.serve(TOKEN).await;
    let client = reqwest::Client::new();
    let (status, body) = post(
        &client,
        &format!("{}/v1/queues/payout_delivery/replay", server.base),
        Some(TOKEN),
        Some(&json!({ "key": ids[1] }).to_string()),
    )
    .await;
    assert_eq!((status, body["replayed"].as_i64()), (200, Some(1)), "{body}");
    assert_eq!(env.scalar_text(&job(&ids[1])).await, "eligible");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payouts WHERE status = 'queued'")
            .await,
        2
    );
    // The deliverer, under its own least role, sends both.
    let sim = common::ProviderSim::start(&["--settle-delay-ms", "100000"]);
    let mut deliverer = env
        .cmd(&[
            "--role-per-command",
            "deliver",
            "--provider-url",
            &sim.url,
            "--lease-ttl-ms",
            "1000",
            "--shutdown-grace-ms",
            "300",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::wait_until(60, "both replayed payouts sent", || async {
        env.scalar_i64("SELECT count(*) FROM settlement.payouts WHERE status = 'sent'")
            .await
            == 2
    })
    .await;
    common::stop(&mut deliverer);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payout_jobs WHERE status = 'settled'")
            .await,
        2
    );
}

/// The keys of the jobs listed in the table of `state` on a queue's page.
fn listed_jobs(page: &str, state: &str) -> Vec<String> {
    let Some(start) = page.find(&format!("<table data-state=\"{state}\">")) else {
        return Vec::new();
    };
    let table = &page[start..start + page[start..].find("</table>").unwrap()];
    table
        .split("data-job=\"")
        .skip(1)
        .map(|rest| rest[..rest.find('"').unwrap()].to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queues_page_lists_each_states_jobs_by_keyset_and_a_jobs_page_shows_its_attempts_and_lease() {
    let env = queue_env().await;
    let server = env.serve(TOKEN).await;
    let client = reqwest::Client::new();
    let page = |path: String| {
        let (client, url) = (client.clone(), format!("{}{path}", server.base));
        async move {
            let r = client.get(url).bearer_auth(TOKEN).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    // Two a page: ready in claim order (r1 is due first), walked by its
    // "more" link to the end; the other states on their first page.
    let (status, mail) = page("/queues/mail?limit=2".into()).await;
    assert_eq!(status, 200);
    assert_eq!(listed_jobs(&mail, "ready"), ["r1", "r2"]);
    assert_eq!(listed_jobs(&mail, "scheduled"), ["s1", "s2"]);
    assert_eq!(listed_jobs(&mail, "processing"), ["p1"]);
    assert_eq!(listed_jobs(&mail, "failed"), ["d2", "d1"], "newest failure first");
    let next = mail
        .split("<a rel=\"next\" href=\"")
        .map(|rest| rest[..rest.find('"').unwrap()].replace("&amp;", "&"))
        .find(|href| href.contains("state=ready"))
        .expect("a link to the next ready jobs");
    assert_eq!(next, "/queues/mail?state=ready&after=r2&limit=2#ready");
    let (status, later) = page(next.replace("#ready", "")).await;
    assert_eq!(status, 200);
    assert_eq!(listed_jobs(&later, "ready"), ["r3"]);
    assert_eq!(listed_jobs(&later, "failed"), ["d2", "d1"], "other states start over");
    assert!(
        !later.contains("state=ready&amp;after=r3"),
        "the last page links no further"
    );
    let (status, _) = page("/queues/mail?state=stuck".into()).await;
    assert_eq!(status, 422);

    // A dead letter's page: its attempts with their errors, escaped; a
    // processing job's: its lease holder.
    assert!(mail.contains("href=\"/queues/mail/jobs/d1\""), "{mail}");
    let (status, d1) = page("/queues/mail/jobs/d1".into()).await;
    assert_eq!(status, 200);
    for wanted in [
        "<b id=\"job-state\">failed</b>",
        "smtp 550 mailbox &lt;unknown&gt;",
        "<td>1</td>",
        "none",
    ] {
        assert!(d1.contains(wanted), "{wanted}: {d1}");
    }
    let owner = env
        .scalar_text("SELECT lease_owner::text FROM jobs.mail WHERE key = 'p1'")
        .await;
    let (_, p1) = page("/queues/mail/jobs/p1".into()).await;
    assert!(
        p1.contains(&owner) && p1.contains("<b id=\"job-state\">processing</b>"),
        "{p1}"
    );
    let (status, _) = page("/queues/mail/jobs/nope".into()).await;
    assert_eq!(status, 404);
    assert!(!d1.contains("<script") && !mail.contains("<script"), "no script");
}

/// What the catalog says of a queue table, with its own name taken out so
/// two tables can be compared: each column (name, type, null, default,
/// identity), each index, check and trigger, and the storage options.
async fn table_shape(env: &Env, table: &str) -> Vec<String> {
    let base = table.rsplit('.').next().unwrap();
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT 'column ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
                || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
         FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
         UNION ALL
         SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = $1::regclass
         UNION ALL
         SELECT 'constraint ' || pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::regclass AND contype <> 't'
         UNION ALL
         SELECT 'trigger ' || pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal
         UNION ALL
         SELECT 'options ' || array_to_string(reloptions, ',') FROM pg_class WHERE oid = $1::regclass",
    )
    .bind(table)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let mut shape: Vec<String> = rows
        .into_iter()
        .map(|row| row.replace(table, "TABLE").replace(base, "BASE"))
        .collect();
    shape.sort();
    shape
}

/// The one continuous queue whose table an earlier migration wrote by hand
/// (settled's `settlement.payout_jobs`, before the engine had
/// `settled_engine.create_queue`) is the table that function creates: the
/// same columns, defaults, indexes, checks, trigger and storage options.
#[tokio::test]
async fn the_payout_delivery_table_is_the_table_the_engines_create_queue_makes() {
    let env = Env::new().await;
    sqlx::query(
        "SELECT settled_engine.create_queue('payout_delivery_twin', 'public.payout_jobs', 'payout_id', 'bigint')",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let made = table_shape(&env, "public.payout_jobs").await;
    let written = table_shape(&env, "settlement.payout_jobs").await;
    let made_wake = "trigger CREATE TRIGGER BASE_wake AFTER INSERT ON TABLE FOR EACH STATEMENT EXECUTE FUNCTION \
                     settled_engine.queue_wake('payout_delivery_twin')";
    let written_wake = "trigger CREATE TRIGGER BASE_wake AFTER INSERT ON TABLE FOR EACH STATEMENT EXECUTE FUNCTION \
                        settled_engine.queue_wake('payout_delivery')";
    assert!(made.iter().any(|row| row == made_wake), "{made:#?}");
    let made: Vec<String> = made.into_iter().filter(|row| row != made_wake).collect();
    let only_written: Vec<&String> = written.iter().filter(|row| !made.contains(row)).collect();
    let only_made: Vec<&String> = made.iter().filter(|row| !written.contains(row)).collect();
    assert!(only_made.is_empty(), "the hand-written table lacks: {only_made:#?}");
    // What settled added to its queue table since (its own guard trigger
    // and grants live elsewhere), beside the engine's wake-up.
    let own: Vec<&String> = only_written.into_iter().filter(|row| *row != written_wake).collect();
    assert!(
        own.iter().all(|row| row.starts_with("trigger ")),
        "settled's queue table differs from the engine's: {own:#?}"
    );
    let registered: String =
        sqlx::query_scalar("SELECT table_name FROM settled_engine.queues WHERE name = 'payout_delivery_twin'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(registered, "public.payout_jobs");
}

/// `create_queue` checks its names itself (it can be called from any
/// client): nothing that is not an identifier reaches its DDL.
#[tokio::test]
async fn create_queue_refuses_a_name_that_is_not_an_identifier_and_creates_nothing() {
    let env = Env::new().await;
    for (args, field) in [
        (["bad name", "public.q", "key", "text"], "name"),
        (["q", "public.q; DROP TABLE x", "key", "text"], "table"),
        (["q", "public.q", "k\"ey", "text"], "key"),
        (["q", "public.q", "key", "text) ; --"], "key type"),
    ] {
        let err = sqlx::query("SELECT settled_engine.create_queue($1, $2, $3, $4)")
            .bind(args[0])
            .bind(args[1])
            .bind(args[2])
            .bind(args[3])
            .execute(&env.pool)
            .await
            .unwrap_err();
        let message = err.as_database_error().unwrap().message().to_string();
        assert!(
            message.starts_with(&format!("create_queue: {field} ")),
            "{args:?}: {message}"
        );
    }
    let made: Option<String> = sqlx::query_scalar("SELECT to_regclass('public.q')::text")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(made, None);
}
