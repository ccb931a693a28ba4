//! Once-only on the request side, with real servers: two `settled serve`
//! processes on one database, hundreds of concurrent requests.

use crate::common;

use std::process::Stdio;

use common::{wait_bounded, Env, Server};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

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

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_concurrent_requests_with_one_key_on_two_servers_pay_once() {
    let (env, creators) = settled_env("20").await;
    let (a, b) = (serve(&env).await, serve(&env).await);
    let (creator, balance_before) = creators[0].clone();
    let body = json!({ "creator": creator, "amount": "12345" });
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let url = format!("{}/v1/payouts", if i % 2 == 0 { &a.base } else { &b.base });
        let (client, body) = (client.clone(), body.clone());
        tasks.spawn(async move { post(&client, &url, Some("same-key-1"), &body).await });
    }
    let mut created = Vec::new();
    let mut in_progress = 0;
    while let Some(r) = tasks.join_next().await {
        let (status, body, _) = r.unwrap();
        match status {
            201 => created.push(body),
            409 => {
                assert_eq!(body["type"], "/problems/request-in-progress", "{body}");
                in_progress += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert!(!created.is_empty());
    assert!(
        created.iter().all(|p| p == &created[0]),
        "every 201 must be the stored response"
    );
    assert_eq!(created.len() + in_progress, 200);
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payouts").await, 1);
    let balance_after = env
        .scalar_text(&format!(
            "SELECT balance::text FROM settlement.creator_balance WHERE creator = '{creator}'"
        ))
        .await;
    let expected: u128 = balance_before.parse::<u128>().unwrap() - 12345;
    assert_eq!(balance_after, expected.to_string(), "exactly one debit");

    // The same key with another body is refused, on either server.
    let (status, problem, _) = post(
        &client,
        &format!("{}/v1/payouts", b.base),
        Some("same-key-1"),
        &json!({ "creator": creator, "amount": "1" }),
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["type"], "/problems/idempotency-key-reused");
    // A replay after the fact is the stored response, marked as such.
    let (status, again, replayed) = post(&client, &format!("{}/v1/payouts", a.base), Some("same-key-1"), &body).await;
    assert_eq!((status, &again, replayed), (201, &created[0], true));
    env.run_ok(&["verify", "--period", "2026-11-28"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_payouts_with_different_keys_never_overdraw() {
    let (env, creators) = settled_env("20").await;
    let (a, b) = (serve(&env).await, serve(&env).await);
    // Give one creator an exact balance of 700 for the test: 100 payouts of 7 fit.
    let creator = creators[0].0.clone();
    sqlx::query("UPDATE settlement.creator_balance SET balance = 700 WHERE creator = $1")
        .bind(&creator)
        .execute(&env.pool)
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let url = format!("{}/v1/payouts", if i % 2 == 0 { &a.base } else { &b.base });
        let (client, creator) = (client.clone(), creator.clone());
        tasks.spawn(async move {
            // A 503 database-busy (the row's lock waited longer than the
            // API waits, on a loaded machine) had no effect: a client
            // retries it with the same key, as the answer says.
            loop {
                let answer = post(
                    &client,
                    &url,
                    Some(&format!("key-{i}")),
                    &json!({ "creator": creator, "amount": "7" }),
                )
                .await;
                if answer.0 != 503 || answer.1["type"] != "/problems/database-busy" {
                    return answer;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        });
    }
    let (mut ok, mut refused) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        let (status, body, _) = r.unwrap();
        match status {
            201 => ok += 1,
            409 => {
                assert_eq!(body["type"], "/problems/insufficient-funds", "{body}");
                refused += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!((ok, refused), (100, 100));
    let paid = env
        .scalar_text(&format!(
            "SELECT sum(amount)::text FROM settlement.payouts WHERE creator = '{creator}'"
        ))
        .await;
    assert_eq!(paid, "700", "the sum paid equals the starting balance");
    let balance = env
        .scalar_text(&format!(
            "SELECT balance::text FROM settlement.creator_balance WHERE creator = '{creator}'"
        ))
        .await;
    assert_eq!(balance, "0");
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_concurrent_holds_leave_one_active_hold() {
    let (env, creators) = settled_env("10").await;
    let (a, b) = (serve(&env).await, serve(&env).await);
    let creator = creators[0].0.clone();
    let client = reqwest::Client::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let url = format!("{}/v1/holds", if i % 2 == 0 { &a.base } else { &b.base });
        let (client, creator) = (client.clone(), creator.clone());
        tasks.spawn(async move {
            post(
                &client,
                &url,
                None,
                &json!({ "creator": creator, "reason": format!("admin {i}") }),
            )
            .await
        });
    }
    let mut statuses = Vec::new();
    let mut winner = None;
    while let Some(r) = tasks.join_next().await {
        let (status, body, _) = r.unwrap();
        if status == 201 {
            winner = Some(body["id"].as_i64().unwrap());
        } else {
            assert_eq!(body["type"], "/problems/hold-exists", "{body}");
        }
        statuses.push(status);
    }
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1);
    assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 49);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.creator_holds WHERE released_at IS NULL")
            .await,
        1
    );
    // Released once; a second release is refused.
    let url = format!("{}/v1/holds/{}/release", a.base, winner.unwrap());
    assert_eq!(post(&client, &url, None, &json!({})).await.0, 200);
    let (status, body, _) = post(&client, &url, None, &json!({})).await;
    assert_eq!(
        (status, body["type"].as_str()),
        (409, Some("/problems/hold-already-released"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_creator_is_not_paid_until_released_then_paid_once() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-27", "--creators", "30"]);
    env.run_ok(&["worker", "--period", "2026-11-27"]);
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "30"]);
    let server = serve(&env).await;
    let creator = env
        .scalar_text(
            "SELECT creator FROM settlement.token_trade_volume WHERE period = '2026-11-28' ORDER BY creator LIMIT 1",
        )
        .await;
    let client = reqwest::Client::new();
    let (status, hold, _) = post(
        &client,
        &format!("{}/v1/holds", server.base),
        None,
        &json!({ "creator": creator, "reason": "review" }),
    )
    .await;
    assert_eq!(status, 201, "{hold}");
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let status_sql = format!(
        "SELECT status FROM settlement.token_trade_volume WHERE period = '2026-11-28' AND creator = '{creator}'"
    );
    assert_eq!(env.scalar_text(&status_sql).await, "held");
    assert_eq!(
        env.scalar_text("SELECT state FROM settled_engine.runs WHERE scope = '2026-11-28'")
            .await,
        "finished"
    );
    env.run_ok(&["verify", "--period", "2026-11-28"]);

    let url = format!("{}/v1/holds/{}/release", server.base, hold["id"]);
    assert_eq!(post(&client, &url, None, &json!({})).await.0, 200);
    assert_eq!(
        env.scalar_text("SELECT state FROM settled_engine.runs WHERE scope = '2026-11-28'")
            .await,
        "running"
    );
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    assert_eq!(env.scalar_text(&status_sql).await, "settled");
    let rows = env
        .scalar_i64(&format!(
            "SELECT count(*) FROM settlement.reward_ledger WHERE creator = '{creator}' AND period = '2026-11-28'"
        ))
        .await;
    assert_eq!(rows, 1);
    env.run_ok(&["verify", "--period", "2026-11-28"]);
}

/// A hold that was acknowledged stops every payout of its creator that
/// comes after it, however many race; its release lets them through again.
#[tokio::test(flavor = "multi_thread")]
async fn an_active_hold_refuses_payouts_of_its_creator_until_released() {
    let (env, creators) = settled_env("10").await;
    let (a, b) = (serve(&env).await, serve(&env).await);
    let (creator, balance_before) = creators[0].clone();
    let client = reqwest::Client::new();
    let hold_body = json!({ "creator": creator, "reason": "fraud check" });
    let (status, hold, _) = post(&client, &format!("{}/v1/holds", a.base), None, &hold_body).await;
    assert_eq!(status, 201, "{hold}");
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..40 {
        let url = format!("{}/v1/payouts", if i % 2 == 0 { &a.base } else { &b.base });
        let (client, creator) = (client.clone(), creator.clone());
        tasks.spawn(async move {
            let body = json!({ "creator": creator, "amount": "1" });
            post(&client, &url, Some(&format!("held-{i}")), &body).await
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (status, body, _) = joined.unwrap();
        assert_eq!(status, 409, "{body}");
        assert_eq!(body["type"], "/problems/creator-on-hold", "{body}");
        assert_eq!(body["hold"], hold["id"], "{body}");
    }
    let paid_sql = format!("SELECT count(*) FROM settlement.payouts WHERE creator = '{creator}'");
    assert_eq!(env.scalar_i64(&paid_sql).await, 0);
    let balance_sql = format!("SELECT balance::text FROM settlement.creator_balance WHERE creator = '{creator}'");
    assert_eq!(env.scalar_text(&balance_sql).await, balance_before);

    let release = format!("{}/v1/holds/{}/release", b.base, hold["id"]);
    assert_eq!(post(&client, &release, None, &json!({})).await.0, 200);
    let url = format!("{}/v1/payouts", a.base);
    let body = json!({ "creator": creator, "amount": "1" });
    let (status, payout, _) = post(&client, &url, Some("after-release"), &body).await;
    assert_eq!(status, 201, "{payout}");
    assert_eq!(env.scalar_i64(&paid_sql).await, 1);
}

/// The edge as the standards read: the Bearer scheme in any case, a 401
/// with its challenge, JSON only as `application/json` and only as an
/// object, and Idempotency-Key as the draft's sf-string (the bare form is the
/// same key; two headers are refused).
#[tokio::test(flavor = "multi_thread")]
async fn the_api_edge_reads_auth_media_types_and_keys_as_the_standards_say() {
    let (env, creators) = settled_env("5").await;
    let server = serve(&env).await;
    let creator = creators[0].0.clone();
    let client = reqwest::Client::new();
    let url = format!("{}/v1/payouts", server.base);
    let body = json!({ "creator": creator, "amount": "7" }).to_string();
    let send = |auth: &str, content_type: &str, keys: &[&str], body: String| {
        let mut request = client
            .post(&url)
            .header("Authorization", auth.to_string())
            .header("Content-Type", content_type.to_string());
        for key in keys {
            request = request.header("Idempotency-Key", key.to_string());
        }
        request.body(body).send()
    };
    let lower = format!("bearer {TOKEN}");
    let r = send(&lower, "application/json", &["\"sf-key\""], body.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{:?}", r.text().await);
    // The bare form of the same key is the same request: replayed, not paid again.
    let bearer = format!("Bearer {TOKEN}");
    let r = send(&bearer, "application/json; charset=utf-8", &["sf-key"], body.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert!(r.headers().contains_key("idempotent-replayed"));
    let paid = format!("SELECT count(*) FROM settlement.payouts WHERE creator = '{creator}'");
    assert_eq!(env.scalar_i64(&paid).await, 1);

    let r = send("Bearer wrong", "application/json", &["w"], body.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer realm=\"settled\"");
    let r = send(&bearer, "text/plain", &["t"], body.clone()).await.unwrap();
    assert_eq!(r.status(), 415);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let form = format!("creator={creator}&amount=7");
    let r = send(&bearer, "application/x-www-form-urlencoded", &["f"], form)
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let array = json!([creator, "7"]).to_string();
    let r = send(&bearer, "application/json", &["a"], array).await.unwrap();
    assert_eq!(r.status(), 400);
    let r = send(&bearer, "application/json", &["one", "two"], body.clone())
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let problem: Value = r.json().await.unwrap();
    assert_eq!(problem["field"], "Idempotency-Key", "{problem}");
    let r = send(&bearer, "application/json", &["\"unterminated"], body)
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(env.scalar_i64(&paid).await, 1, "no refused request paid anything");
}

/// Answers 503 `outcome-unknown` (with `Retry-After`), as every write does
/// when the answer to its COMMIT is lost.
async fn assert_outcome_unknown(what: &str, response: reqwest::Response) {
    assert_eq!(response.status(), 503, "{what}");
    assert_eq!(response.headers()["retry-after"], "1", "{what}");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "/problems/outcome-unknown", "{what}: {problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("may or may not have taken effect"),
        "{what}: {problem}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_commit_answer_is_an_unknown_outcome_and_a_retry_with_the_same_key_returns_the_one_payout() {
    let (env, creators) = settled_env("5").await;
    let (creator, before) = creators[0].clone();
    // `settled serve` reaches PostgreSQL through a proxy that can lose the
    // server's answer to a COMMIT.
    let plan = settled_testkit::FaultPlan {
        armed_by: "settlement.debit_for_payout(".into(),
        fault: settled_testkit::CommitFault::LoseAnswer,
        then_refuse: false,
    };
    let proxy = settled_testkit::PgProxy::start(&env.db.url, plan).await;
    let port = common::free_port();
    let mut cmd = env.cmd(&["--role-per-command", "serve", "--bind", &format!("127.0.0.1:{port}")]);
    cmd.env("DATABASE_URL", proxy.url()).env("SETTLED_API_TOKEN", TOKEN);
    let server = common::spawn_server(cmd, port, "/healthz").await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let payout = json!({ "creator": creator, "amount": "1000" });
    let pay = || {
        client
            .post(format!("{}/v1/payouts", server.base))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", "lost-answer")
            .json(&payout)
            .send()
    };
    assert_outcome_unknown("payout", pay().await.unwrap()).await;
    assert_eq!(proxy.faults(), 1);
    let made = env.scalar_i64("SELECT id FROM settlement.payouts").await;
    // The retry with the same key answers the payout that was made.
    let again = pay().await.unwrap();
    assert_eq!(again.status(), 201);
    assert!(again.headers().contains_key("idempotent-replayed"));
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["id"], made);
    common::assert_one_payout_of_1000(&env, &creator, &before).await;

    // Every other write says the same; repeating it shows what happened.
    let hold = || {
        client
            .post(format!("{}/v1/holds", server.base))
            .bearer_auth(TOKEN)
            .json(&json!({ "creator": creator, "reason": "review" }))
            .send()
    };
    proxy.arm("settlement.place_hold(");
    assert_outcome_unknown("hold", hold().await.unwrap()).await;
    let held = env.scalar_i64("SELECT id FROM settlement.creator_holds").await;
    let again: Value = hold().await.unwrap().json().await.unwrap();
    assert_eq!(
        (&again["type"], &again["existing_hold_id"]),
        (&json!("/problems/hold-exists"), &json!(held))
    );
    let release = || {
        client
            .post(format!("{}/v1/holds/{held}/release", server.base))
            .bearer_auth(TOKEN)
            .send()
    };
    proxy.arm("UPDATE settlement.creator_holds SET released_at");
    assert_outcome_unknown("release", release().await.unwrap()).await;
    let again: Value = release().await.unwrap().json().await.unwrap();
    assert_eq!(again["type"], "/problems/hold-already-released");
    let victim = &creators[1].0;
    sqlx::query("UPDATE settlement.token_trade_volume SET status = 'failed' WHERE creator = $1")
        .bind(victim)
        .execute(&env.pool)
        .await
        .unwrap();
    let retry = || {
        client
            .post(format!("{}/dashboard/retry", server.base))
            .basic_auth("operator", Some(TOKEN))
            .form(&[("period", "2026-11-28"), ("creator", victim.as_str())])
            .send()
    };
    proxy.arm("SET status = 'eligible'");
    assert_outcome_unknown("dashboard retry", retry().await.unwrap()).await;
    let status = env
        .scalar_text(&format!(
            "SELECT status FROM settlement.token_trade_volume WHERE creator = '{victim}'"
        ))
        .await;
    assert_eq!(status, "eligible", "the retry committed");
    assert_eq!(retry().await.unwrap().status(), 303);
    assert_eq!(proxy.faults(), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_field_named_twice_is_refused_naming_it_never_the_last_one_taken() {
    let (env, creators) = settled_env("5").await;
    let server = serve(&env).await;
    let creator = &creators[0].0;
    let client = reqwest::Client::new();
    let send = |path: &str, key: &str, body: String| {
        client
            .post(format!("{}{path}", server.base))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let cases = [
        (
            "/v1/payouts",
            format!(r#"{{"creator":"{creator}","amount":"1","amount":"7"}}"#),
            "amount",
        ),
        (
            "/v1/payouts",
            format!(r#"{{"amount":"1","creator":"{creator}","creator":"{creator}"}}"#),
            "creator",
        ),
        (
            "/v1/holds",
            format!(r#"{{"creator":"{creator}","reason":"a","reason":"b"}}"#),
            "reason",
        ),
    ];
    for (i, (path, body, field)) in cases.into_iter().enumerate() {
        let r = send(path, &format!("twice-{i}"), body.clone()).await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let problem: Value = r.json().await.unwrap();
        assert_eq!(problem["type"], "/problems/duplicate-field", "{problem}");
        assert_eq!(problem["field"], field, "{problem}");
    }
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.payouts").await, 0);
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.creator_holds").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_problems_that_name_the_field() {
    let (env, creators) = settled_env("5").await;
    let server = serve(&env).await;
    let creator = creators[0].0.clone();
    let client = reqwest::Client::new();
    let url = format!("{}/v1/payouts", server.base);
    let cases: Vec<(Option<&str>, Value, u16, &str)> = vec![
        (Some("k"), json!({ "creator": creator, "amount": "abc" }), 422, "amount"),
        (Some("k"), json!({ "creator": creator, "amount": "0" }), 422, "amount"),
        (Some("k"), json!({ "creator": creator, "amount": "-5" }), 422, "amount"),
        (
            Some("k"),
            json!({ "creator": creator, "amount": "1".repeat(80) }),
            422,
            "amount",
        ),
        (Some("k"), json!({ "creator": "0x123", "amount": "5" }), 422, "creator"),
        (
            Some("k"),
            json!({ "creator": creator, "amount": "5", "note": "x" }),
            400,
            "note",
        ),
        (Some("k"), json!({ "creator": creator }), 400, "amount"),
        // A value of the wrong type names its field, not itself.
        (Some("k"), json!({ "creator": creator, "amount": 1 }), 400, "amount"),
        (Some("k"), json!({ "creator": 7, "amount": "5" }), 400, "creator"),
        (
            None,
            json!({ "creator": creator, "amount": "5" }),
            400,
            "Idempotency-Key",
        ),
    ];
    for (key, body, status, field) in cases {
        let (got, problem, _) = post(&client, &url, key, &body).await;
        assert_eq!(
            (got, problem["field"].as_str()),
            (status, Some(field)),
            "{body}: {problem}"
        );
    }
    let long_key = "k".repeat(256);
    let (got, problem, _) = post(
        &client,
        &url,
        Some(&long_key),
        &json!({ "creator": creator, "amount": "5" }),
    )
    .await;
    assert_eq!((got, problem["field"].as_str()), (400, Some("Idempotency-Key")));
    // Malformed JSON, no token, unknown creator.
    let r = client
        .post(&url)
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "m")
        .header("Content-Type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = client
        .post(&url)
        .header("Idempotency-Key", "n")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let unknown = "0x00000000000000000000000000000000000000ff";
    let (got, problem, _) = post(&client, &url, Some("u"), &json!({ "creator": unknown, "amount": "5" })).await;
    assert_eq!(
        (got, problem["type"].as_str()),
        (404, Some("/problems/unknown-creator"))
    );
    let r = client
        .get(format!("{}/v1/creators/{unknown}", server.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = client
        .get(format!("{}/v1/creators/nope", server.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = client
        .get(format!("{}/v1/creators/{creator}", server.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let big = "x".repeat(20_000);
    let r = client
        .post(&url)
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", "big")
        .header("Content-Type", "application/json")
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let doc: Value = client
        .get(format!("{}/openapi.json", server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payouts").await,
        0,
        "nothing half written"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_lease_holder_blocks_no_one_past_its_ttl_and_its_late_release_is_refused() {
    let env = Env::new().await;
    let mut holder = env
        .cmd(&[
            "lease",
            "acquire",
            "--name",
            "nightly",
            "--ttl-ms",
            "60000",
            "--hold-ms",
            "600000",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let first: Value = {
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(holder.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        serde_json::from_str(&line).unwrap()
    };
    kill(Pid::from_raw(holder.id() as i32), Signal::SIGKILL).unwrap();
    wait_bounded(&mut holder, 30);

    // While its TTL runs, nobody else gets it.
    let out = env.run(&["lease", "acquire", "--name", "nightly", "--ttl-ms", "5000"]);
    assert_eq!(out.status.code(), Some(1));
    // After the TTL (the database clock passing it is made so in SQL, not
    // slept: a loaded machine may take longer than a short TTL to get here),
    // someone does, with a greater fence.
    sqlx::query("UPDATE settled_engine.leases SET expires_at = now() - interval '1 second' WHERE name = 'nightly'")
        .execute(&env.pool)
        .await
        .unwrap();
    let second: Value =
        serde_json::from_str(&env.run_ok(&["lease", "acquire", "--name", "nightly", "--ttl-ms", "5000"])).unwrap();
    assert!(second["fence"].as_i64() > first["fence"].as_i64());
    // The dead holder's late release carries its old fence and is refused.
    let fence = first["fence"].to_string();
    let out = env.run(&["lease", "release", "--name", "nightly", "--fence", &fence]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused"));
    env.run_ok(&[
        "lease",
        "release",
        "--name",
        "nightly",
        "--fence",
        &second["fence"].to_string(),
    ]);
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_parse_as_prometheus_text_and_equal_the_database_counts() {
    let (env, creators) = settled_env("40").await;
    let server = serve(&env).await;
    let client = reqwest::Client::new();
    let (status, _, _) = post(
        &client,
        &format!("{}/v1/payouts", server.base),
        Some("m-1"),
        &json!({ "creator": creators[0].0, "amount": "1" }),
    )
    .await;
    assert_eq!(status, 201);
    let ready = client.get(format!("{}/readyz", server.base)).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    let text = client
        .get(format!("{}/metrics", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text");
    let value = |name: &str, label: Option<(&str, &str)>| -> f64 {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
            .unwrap_or_else(|| panic!("{name} missing in:\n{text}"))
    };
    let settled = env
        .scalar_i64("SELECT count(*) FROM settlement.token_trade_volume WHERE status = 'settled'")
        .await;
    assert_eq!(value("settled_items_settled_total", None), settled as f64);
    assert_eq!(value("settled_items", Some(("status", "settled"))), settled as f64);
    assert_eq!(value("settled_ledger_entries_total", None), 40.0);
    assert_eq!(value("settled_payouts_total", None), 1.0);
    assert_eq!(value("settled_runs", Some(("state", "finished"))), 1.0);
    assert_eq!(value("settled_fence_rejections_total", None), 0.0);
}
