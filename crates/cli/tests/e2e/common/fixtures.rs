//! Requests, processes and tables several test modules make the same way.

use super::*;

/// `body` signed with `secret` as the provider signs it and posted to the
/// webhook route of the server at `base`: its status and answer.
pub(crate) async fn post_signed_event(base: &str, secret: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let r = send_signed_event(base, secret, body).await;
    (r.status().as_u16(), r.json().await.unwrap())
}

/// `body` signed with `secret` as the provider signs it and posted to the
/// webhook route of the server at `base`: the answer, unread.
pub(crate) async fn send_signed_event(base: &str, secret: &str, body: &serde_json::Value) -> reqwest::Response {
    let raw = serde_json::to_vec(body).unwrap();
    let header = settled::provider::signature::sign(secret.as_bytes(), chrono::Utc::now().timestamp(), &raw);
    reqwest::Client::new()
        .post(format!("{base}/v1/provider-events"))
        .header("Provider-Signature", header)
        .header("Content-Type", "application/json")
        .body(raw)
        .send()
        .await
        .unwrap()
}

/// A payout of `amount` to `creator` made through `server` under the request
/// key `key`; it must answer 201. Its id.
pub(crate) async fn create_payout(server: &Server, token: &str, key: &str, creator: &str, amount: &str) -> i64 {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/payouts", server.base))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&serde_json::json!({ "creator": creator, "amount": amount }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    r.json::<serde_json::Value>().await.unwrap()["id"].as_i64().unwrap()
}

/// The provider key of payout `id`.
pub(crate) async fn provider_key_of(env: &Env, id: i64) -> String {
    env.scalar_text(&format!("SELECT provider_key FROM settlement.payouts WHERE id = {id}"))
        .await
}

/// The body of a GET of `url` by `client`, whatever its status.
pub(crate) async fn get_text(client: &reqwest::Client, url: &str) -> String {
    client.get(url).send().await.unwrap().text().await.unwrap()
}

/// `settled chaos` with `args` on the server the tests use (TEST_DATABASE_URL,
/// or its own): the process's output and its JSON report.
pub(crate) fn chaos_report(args: &[&str]) -> (Output, serde_json::Value) {
    let mut cmd = Command::new(SETTLED);
    cmd.arg("chaos")
        .args(args)
        .env("SETTLED_LOG", "error")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null());
    if let Ok(url) = std::env::var("TEST_DATABASE_URL") {
        cmd.env("DATABASE_URL", url);
    }
    let out = cmd.output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, report)
}

/// A primary and a standby that follows it; both stopped and removed on drop.
pub(crate) struct Pair {
    pub(crate) primary: Option<settled_testkit::LocalPostgres>,
    pub(crate) standby: Option<settled_testkit::LocalPostgres>,
    pub(crate) _dir: tempfile::TempDir,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for server in [self.primary.take(), self.standby.take()].into_iter().flatten() {
            let _ = server.stop();
        }
    }
}

/// `settled deliver` flags that look up payouts sent a second ago, with a
/// short provider timeout and small batches.
pub(crate) const QUICK_LOOKUPS: &[&str] = &[
    "--provider-timeout-ms",
    "500",
    "--poll-after-secs",
    "1",
    "--batch",
    "10",
];

/// Schema `jobs` and in it the engine's table of queue `mail` (`jobs.mail`),
/// granted as an application grants its queue table.
pub(crate) async fn mail_queue(conn: &mut sqlx::PgConnection) -> settled_engine::Queue {
    sqlx::query("CREATE SCHEMA jobs").execute(&mut *conn).await.unwrap();
    let queue = settled_engine::Queue::new("mail", "jobs.mail").unwrap();
    queue.create_table(&mut *conn).await.unwrap();
    sqlx::raw_sql(
        "GRANT USAGE ON SCHEMA jobs TO settled_api, settled_readonly;
         GRANT SELECT ON jobs.mail TO settled_readonly;
         GRANT SELECT, UPDATE ON jobs.mail TO settled_api;",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    queue
}
