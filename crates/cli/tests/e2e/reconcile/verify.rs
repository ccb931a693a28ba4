//! `verify --payouts` through a storm of requests, and a tampered balance and history named.

use super::*;

/// One client's share of the storm: payouts for its creators, some held
/// for confirmation and then confirmed, cancelled (twice, racing) or left
/// to expire.
async fn storm_client(bases: Vec<String>, creators: Vec<String>, client_no: usize, rounds: usize) -> usize {
    let client = reqwest::Client::new();
    let mut made = 0;
    for round in 0..rounds {
        let base = &bases[(client_no + round) % bases.len()];
        let creator = &creators[(client_no * 7 + round) % creators.len()];
        let confirm = round % 3 != 0;
        let response = client
            .post(format!("{base}/v1/payouts"))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", format!("storm-{client_no}-{round}"))
            .json(&json!({ "creator": creator, "amount": format!("{}", 50 + round * 3), "confirm": confirm }))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        if status != 201 {
            // Other clients emptied the balance first.
            assert_eq!(
                (status, body["type"].as_str()),
                (409, Some("/problems/insufficient-funds")),
                "a payout the storm cannot make is refused, not lost: {body}"
            );
            continue;
        }
        made += 1;
        if !confirm {
            continue;
        }
        let id = body["id"].as_i64().unwrap();
        let token = body["confirm_token"].as_str().unwrap().to_string();
        let verb = match round % 4 {
            0 | 1 => "confirm",
            2 => "cancel",
            _ => continue, // left to expire
        };
        let mut racing = tokio::task::JoinSet::new();
        for other in &bases {
            let request = client
                .post(format!("{other}/v1/payouts/{id}/{verb}"))
                .bearer_auth(TOKEN)
                .json(&json!({ "token": token }));
            racing.spawn(async move { request.send().await.unwrap().status().as_u16() });
        }
        let mut answers = Vec::new();
        while let Some(status) = racing.join_next().await {
            answers.push(status.unwrap());
        }
        let won = answers.iter().filter(|s| **s == 200).count();
        // None wins only when the confirmation window closed first.
        assert!(
            won == 1 || won == 0 && answers.iter().all(|s| [409, 410].contains(s)),
            "one {verb} of payout {id} wins: {answers:?}"
        );
    }
    made
}

/// `settled verify --payouts`, which must fail: its report.
fn verify_payouts_fails(env: &Env) -> String {
    let out = env.run(&["verify", "--payouts"]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    report
}

fn verify_payouts_ok(env: &Env, extra: &[&str]) {
    let mut args = vec!["verify", "--payouts"];
    args.extend_from_slice(extra);
    let out = env.run(&args);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("verify payouts: OK"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_payouts_holds_through_a_storm_and_names_a_tampered_balance_and_history() {
    let (env, first, sim) = setup(
        "24",
        &[
            "--settle-delay-ms",
            "100",
            "--failure-rate",
            "0.25",
            "--refusal-rate",
            "0.15",
            "--error-rate",
            "0.05",
            "--webhook-duplicate-rate",
            "0.3",
            "--webhook-reorder-rate",
            "0.3",
            "--webhook-loss-rate",
            "0.2",
        ],
        &["--confirm-ttl-secs", "2"],
    )
    .await;
    let second = env
        .serve_with(TOKEN, &["--provider-webhook-secret", SECRET, "--confirm-ttl-secs", "2"])
        .await;
    let creators: Vec<String> =
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance WHERE balance > 0 ORDER BY creator")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    let (a, b) = (deliver(&env, &sim), deliver(&env, &sim));
    let bases = vec![first.base.clone(), second.base.clone()];
    let mut storm = tokio::task::JoinSet::new();
    for client_no in 0..16 {
        storm.spawn(storm_client(bases.clone(), creators.clone(), client_no, 12));
    }
    // While it blows: every snapshot proves the balances.
    let mut mid_storm = 0;
    while !storm.is_empty() {
        tokio::select! {
            done = storm.join_next() => { done.unwrap().unwrap(); }
            _ = tokio::time::sleep(std::time::Duration::from_millis(300)) => {
                verify_payouts_ok(&env, &[]);
                mid_storm += 1;
            }
        }
    }
    assert!(mid_storm > 0, "verify ran while payouts were being made");
    wait_final(&env, "every payout paid, failed, cancelled or expired").await;
    stop(a);
    stop(b);
    let by_state: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM settlement.payouts GROUP BY status ORDER BY status")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    println!("storm: payouts by state {by_state:?}, verify --payouts ran {mid_storm} times during it");
    for state in ["paid", "failed", "cancelled", "expired"] {
        assert!(
            count(
                &env,
                &format!("SELECT count(*) FROM settlement.payouts WHERE status = '{state}'")
            )
            .await
                > 0,
            "the storm left payouts {state}"
        );
    }
    verify_payouts_ok(&env, &["--provider-url", &sim.url]);
    let out = env.run(&["reconcile", "--provider-url", &sim.url]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // One balance changed behind settled's back: named.
    let victim = &creators[3];
    sqlx::query("UPDATE settlement.creator_balance SET balance = balance + 1 WHERE creator = $1")
        .bind(victim)
        .execute(&env.pool)
        .await
        .unwrap();
    let report = verify_payouts_fails(&env);
    assert!(report.contains("[FAIL] balances_equal_ledger"), "{report}");
    assert!(report.contains(&format!("- {victim} has balance")), "{report}");
    assert!(report.contains("[FAIL] payout_totals"), "{report}");
    assert!(!report.contains("[FAIL] payout_histories"), "{report}");

    // A history row appended out of turn: the payout is named.
    let paid: i64 = count(
        &env,
        "SELECT id FROM settlement.payouts WHERE status = 'paid' ORDER BY id LIMIT 1",
    )
    .await;
    sqlx::query(
        "INSERT INTO settlement.payout_history (payout_id, from_state, to_state, reason) VALUES ($1, 'paid', 'failed', 'forged')",
    )
    .bind(paid)
    .execute(&env.pool)
    .await
    .unwrap();
    let report = verify_payouts_fails(&env);
    let named = report
        .lines()
        .find(|l| l.contains(&format!("- payout {paid} is paid: step ")))
        .unwrap_or_else(|| panic!("payout {paid} is named: {report}"));
    assert!(
        named.ends_with("goes from paid to failed, which the state machine does not allow"),
        "{named}"
    );
    assert!(
        report.contains("[FAIL] payout_histories_lead_to_their_states"),
        "{report}"
    );
}
