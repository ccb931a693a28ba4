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

mod api;
mod cli;
mod dashboard;
mod tables;

const TOKEN: &str = "queue-t0ken";

/// A database with queue `mail` on `jobs.mail` (made by the engine,
/// granted as an application grants its table) holding: ready r1 (its
/// `not_before` 90 s ago), r2, r3; scheduled s1, s2 (in an hour);
/// processing p1 (leased for an hour); dead letters d1 (failed 2 h ago,
/// an error with markup) and d2 (10 minutes ago, a timeout); settled done1.
async fn queue_env() -> Env {
    let env = Env::new().await;
    let mut conn = env.pool.acquire().await.unwrap();
    let queue = common::mail_queue(&mut conn).await;
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
         UPDATE jobs.mail SET status = 'settled', attempt = 1 WHERE key = 'done1';",
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
