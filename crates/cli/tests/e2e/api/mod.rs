//! Once-only on the request side, with real servers: two `settled serve`
//! processes on one database, hundreds of concurrent requests.

use crate::common;

use std::process::Stdio;

use common::{wait_bounded, Env, Server};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

mod holds;
mod keys;
mod metrics;
mod requests;

const TOKEN: &str = "test-token";

async fn serve(env: &Env) -> Server {
    env.serve(TOKEN).await
}

/// A period settled for `n` creators; returns the creators, richest first.
async fn settled_env(n: &str) -> (Env, Vec<(String, String)>) {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", n]);
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT creator, balance::text FROM settlement.creator_balance WHERE balance > 0 ORDER BY balance DESC",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    (env, rows)
}

async fn post(client: &reqwest::Client, url: &str, key: Option<&str>, body: &Value) -> (u16, Value, bool) {
    let response = common::post_json(client, url, TOKEN, key, body).await;
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
    let body: Value = response.json().await.unwrap();
    if status >= 400 {
        assert_eq!(content_type, "application/problem+json", "{body}");
    }
    (status, body, replayed)
}
