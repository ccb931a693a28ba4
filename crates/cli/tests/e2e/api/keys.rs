//! Idempotency keys under concurrency, lost commit answers and killed key-lock holders: one payout per key.

use super::*;

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
