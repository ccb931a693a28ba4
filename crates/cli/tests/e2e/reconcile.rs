//! Reconciliation and `verify --payouts`, with real processes: payouts
//! delivered through the provider simulator by `settled deliver`, webhooks
//! into `settled serve`, then `settled reconcile` and `settled verify
//! --payouts` run as a user runs them; the simulator's records made wrong
//! on purpose (`DELETE`/`PATCH /v1/payments/{id}`, a payment made behind
//! settled's back), and a balance and a history changed in SQL.

use crate::common;

use std::collections::HashSet;
use std::process::{Child, Output};

use common::{free_port, wait_until, Env, ProviderSim, Server, PERIOD};
use serde_json::{json, Value};

const TOKEN: &str = "test-token";
const SECRET: &str = "whsec-test";

/// A settled period for `creators`, a server taking webhooks (with `serve`
/// flags), and a simulator posting them to it.
async fn setup(creators: &str, sim_flags: &[&str], serve: &[&str]) -> (Env, Server, ProviderSim) {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", creators]);
    env.run_ok(&["worker", "--period", PERIOD]);
    let mut flags = vec!["--provider-webhook-secret", SECRET];
    flags.extend_from_slice(serve);
    let server = env.serve_with(TOKEN, &flags).await;
    let sim = ProviderSim::start(sim_flags);
    point_webhooks(&sim, &server).await;
    (env, server, sim)
}

async fn point_webhooks(sim: &ProviderSim, server: &Server) {
    sim.post_webhooks_to(server, SECRET).await;
}

/// `settled deliver`, looking up payouts sent a second ago.
fn deliver(env: &Env, sim: &ProviderSim) -> Child {
    env.deliver(
        &sim.url,
        &[
            "--provider-timeout-ms",
            "500",
            "--poll-after-secs",
            "1",
            "--batch",
            "10",
        ],
    )
}

fn stop(mut child: Child) {
    common::stop(&mut child);
}

async fn post(url: &str, key: Option<&str>, body: &Value) -> (u16, Value) {
    let response = common::post_json(&reqwest::Client::new(), url, TOKEN, key, body).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// One payout of `amount` for each of `n` creators, keys `{prefix}-{i}`.
async fn make_payouts(env: &Env, server: &Server, prefix: &str, n: i64, amount: &str) -> Vec<i64> {
    let creators = common::creators_with_balance(env, n, amount).await;
    let mut ids = Vec::new();
    for (i, creator) in creators.iter().enumerate() {
        let (status, body) = post(
            &format!("{}/v1/payouts", server.base),
            Some(&format!("{prefix}-{i}")),
            &json!({ "creator": creator, "amount": amount }),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        ids.push(body["id"].as_i64().unwrap());
    }
    ids
}

async fn count(env: &Env, sql: &str) -> i64 {
    env.scalar_i64(sql).await
}

async fn wait_final(env: &Env, what: &str) {
    wait_until(90, what, || async {
        count(
            env,
            "SELECT count(*) FROM settlement.payouts WHERE status IN ('created', 'queued', 'sent')",
        )
        .await
            == 0
    })
    .await;
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn reconcile_json(env: &Env, sim: &ProviderSim) -> (i32, Value) {
    let out = env.run(&["reconcile", "--provider-url", &sim.url, "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    (out.status.code().unwrap(), report)
}

/// The provider's payment under `key`.
async fn payment(sim: &ProviderSim, key: &str) -> Value {
    let r = reqwest::get(format!("{}/v1/payments?idempotency_key={key}", sim.url))
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "a payment under {key}");
    r.json().await.unwrap()
}

async fn tamper(sim: &ProviderSim, method: reqwest::Method, id: &str, body: Option<Value>) {
    let mut request = reqwest::Client::new().request(method, format!("{}/v1/payments/{id}", sim.url));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let r = request.send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

/// A payment made straight at the provider, behind settled's back.
async fn pay_directly(sim: &ProviderSim, key: &str, creator: &str, amount: &str, reference: Option<&str>) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/payments", sim.url))
        .header("Idempotency-Key", key)
        .json(&json!({ "creator": creator, "amount": amount, "reference": reference }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn reconcile_is_clean_after_real_delivery_and_names_a_payment_the_provider_lost() {
    let (env, server, sim) = setup(
        "40",
        &[
            "--settle-delay-ms",
            "100",
            "--failure-rate",
            "0.2",
            "--refusal-rate",
            "0.2",
            "--webhook-duplicate-rate",
            "0.3",
            "--webhook-loss-rate",
            "0.2",
        ],
        &[],
    )
    .await;
    let ids = make_payouts(&env, &server, "p", 24, "1000").await;
    let a = deliver(&env, &sim);
    wait_final(&env, "every payout paid or failed").await;
    stop(a);
    assert!(count(&env, "SELECT count(*) FROM settlement.payouts WHERE status = 'failed'").await > 0);

    // Both read as settled_readonly: its grants suffice.
    let out = env.run(&["--role-per-command", "reconcile", "--provider-url", &sim.url]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        text(&out).contains("OK, settled and the provider agree"),
        "{}",
        text(&out)
    );
    env.run_ok(&["--role-per-command", "verify", "--payouts", "--provider-url", &sim.url]);

    // The provider loses a paid payment.
    let lost: i64 = sqlx::query_scalar("SELECT id FROM settlement.payouts WHERE status = 'paid' ORDER BY id LIMIT 1")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert!(ids.contains(&lost));
    let forgotten = payment(&sim, &key_of(&env, lost).await).await;
    tamper(&sim, reqwest::Method::DELETE, forgotten["id"].as_str().unwrap(), None).await;
    let out = env.run(&["reconcile", "--provider-url", &sim.url]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let lost_key = key_of(&env, lost).await;
    assert!(
        text(&out).contains(&format!(
            "[missing_at_provider] payout {lost} ({lost_key}): settled says paid"
        )),
        "{}",
        text(&out)
    );
    let (code, report) = reconcile_json(&env, &sim);
    assert_eq!(code, 1);
    assert_eq!(report["ok"], false);
    assert_eq!(report["counts"]["missing_at_provider"], 1, "{report}");
    assert_eq!(report["mismatches"].as_array().unwrap().len(), 1, "{report}");
    assert_eq!(report["mismatches"][0]["payout_id"], lost);
    let out = env.run(&["verify", "--payouts", "--provider-url", &sim.url]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("[FAIL] provider_has_every_sent_payout") && text(&out).contains(&format!("payout {lost} ")),
        "{}",
        text(&out)
    );

    // A provider that cannot be reached is an error, not a finding.
    let out = env.run(&[
        "reconcile",
        "--provider-url",
        &format!("http://127.0.0.1:{}", free_port()),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread")]
async fn reconcile_detects_each_kind_of_mismatch_by_payout_and_key() {
    let (env, server, sim) = setup("30", &["--settle-delay-ms", "50"], &[]).await;
    let a = deliver(&env, &sim);
    let paid = make_payouts(&env, &server, "paid", 6, "500").await;
    wait_final(&env, "the first payouts paid").await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/faults", sim.url))
        .json(&json!({ "settle_delay_ms": 50, "failure_rate": 1.0 }))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let failed = make_payouts(&env, &server, "failed", 1, "400").await[0];
    wait_final(&env, "the last payout failed").await;
    stop(a);
    let r = reqwest::Client::new()
        .post(format!("{}/v1/faults", sim.url))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "every fault cleared");
    assert_eq!(
        count(&env, "SELECT count(*) FROM settlement.payouts WHERE status = 'paid'").await,
        6
    );
    let (code, report) = reconcile_json(&env, &sim);
    assert_eq!((code, report["ok"].as_bool()), (0, Some(true)), "{report}");

    let id_of = |v: &Value| v["id"].as_str().unwrap().to_string();
    let [lost, short, elsewhere, unpaid, twice, _] = paid[..] else {
        unreachable!()
    };
    let p = payment(&sim, &key_of(&env, lost).await).await;
    tamper(&sim, reqwest::Method::DELETE, &id_of(&p), None).await;
    let p = payment(&sim, &key_of(&env, short).await).await;
    tamper(
        &sim,
        reqwest::Method::PATCH,
        &id_of(&p),
        Some(json!({ "amount": "499" })),
    )
    .await;
    let p = payment(&sim, &key_of(&env, elsewhere).await).await;
    tamper(
        &sim,
        reqwest::Method::PATCH,
        &id_of(&p),
        Some(json!({ "creator": "0x00000000000000000000000000000000000000ee" })),
    )
    .await;
    let p = payment(&sim, &key_of(&env, unpaid).await).await;
    tamper(
        &sim,
        reqwest::Method::PATCH,
        &id_of(&p),
        // Pending, of a paid payout: a contradiction (a failed one would be
        // a return settled has not heard of: behind, tests/e2e/returns.rs).
        Some(json!({ "status": "pending" })),
    )
    .await;
    let p = payment(&sim, &key_of(&env, failed).await).await;
    assert_eq!(p["status"], "failed");
    tamper(
        &sim,
        reqwest::Method::PATCH,
        &id_of(&p),
        Some(json!({ "status": "paid", "failure_reason": null })),
    )
    .await;
    let p = payment(&sim, &key_of(&env, twice).await).await;
    let creator = p["creator"].as_str().unwrap().to_string();
    pay_directly(&sim, "manual-retry", &creator, "500", Some(&key_of(&env, twice).await)).await;
    pay_directly(&sim, "stray-1", &creator, "77", None).await;

    let (code, report) = reconcile_json(&env, &sim);
    assert_eq!(code, 1, "{report}");
    let found: HashSet<(String, Option<i64>, String)> = report["mismatches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["kind"].as_str().unwrap().to_string(),
                m["payout_id"].as_i64(),
                m["key"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: HashSet<(String, Option<i64>, String)> = [
        ("missing_at_provider", Some(lost), key_of(&env, lost).await),
        ("amount_differs", Some(short), key_of(&env, short).await),
        ("creator_differs", Some(elsewhere), key_of(&env, elsewhere).await),
        ("states_disagree", Some(unpaid), key_of(&env, unpaid).await),
        ("states_disagree", Some(failed), key_of(&env, failed).await),
        ("paid_twice", Some(twice), key_of(&env, twice).await),
        ("unknown_to_settled", None, "manual-retry".to_string()),
        ("unknown_to_settled", None, "stray-1".to_string()),
    ]
    .into_iter()
    .map(|(k, id, key)| (k.to_string(), id, key))
    .collect();
    assert_eq!(found, expected, "{report}");
    for (kind, n) in [
        ("missing_at_provider", 1),
        ("unknown_to_settled", 2),
        ("amount_differs", 1),
        ("creator_differs", 1),
        ("states_disagree", 2),
        ("paid_twice", 1),
    ] {
        assert_eq!(report["counts"][kind], n, "{kind}: {report}");
    }
    let out = env.run(&["reconcile", "--provider-url", &sim.url]);
    let human = text(&out);
    assert_eq!(out.status.code(), Some(1), "{human}");
    let (short_key, failed_key, unpaid_key, twice_key) = (
        key_of(&env, short).await,
        key_of(&env, failed).await,
        key_of(&env, unpaid).await,
        key_of(&env, twice).await,
    );
    for line in [
        format!("[amount_differs] payout {short} ({short_key}): the payout is for 500"),
        format!("[states_disagree] payout {failed} ({failed_key}): settled says failed (its funds were returned)"),
        format!("[states_disagree] payout {unpaid} ({unpaid_key}): settled says paid"),
        format!("[paid_twice] payout {twice} ({twice_key}): 2 payments"),
        "[unknown_to_settled] key stray-1:".to_string(),
    ] {
        assert!(human.contains(&line), "{line}\n{human}");
    }
    // settled's own records hold; against the provider every check fails.
    env.run_ok(&["verify", "--payouts"]);
    let out = env.run(&["verify", "--payouts", "--provider-url", &sim.url, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let verified: Value = serde_json::from_slice(&out.stdout).unwrap();
    let failing = common::failed_checks(&verified);
    assert_eq!(
        failing,
        [
            "provider_has_every_sent_payout",
            "provider_paid_only_known_payouts",
            "provider_amounts_match",
            "provider_creators_match",
            "provider_states_agree",
            "provider_paid_each_payout_once"
        ]
    );
}

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
    let out = env.run(&["verify", "--payouts"]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
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
    let out = env.run(&["verify", "--payouts"]);
    let report = text(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
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

/// The provider key settled sends for payout `id`.
async fn key_of(env: &Env, id: i64) -> String {
    sqlx::query_scalar("SELECT provider_key FROM settlement.payouts WHERE id = $1")
        .bind(id)
        .fetch_one(&env.pool)
        .await
        .unwrap()
}

/// A queued payout's funds are held until its delivery sends it: its
/// delivery job cannot be cancelled, retention cannot delete it as a dead
/// letter, reconcile names it while it is one, and a replay sends it.
#[tokio::test(flavor = "multi_thread")]
async fn a_queued_payouts_delivery_is_never_cancelled_or_pruned_and_a_dead_letter_is_named_until_replayed() {
    let (env, server, sim) = setup("20", &["--settle-delay-ms", "50"], &[]).await;
    let ids = make_payouts(&env, &server, "held", 2, "300").await;
    let (stuck, other) = (ids[0], ids[1]);
    let held = |id: i64| {
        format!(
            "SELECT count(*) FROM settlement.payouts p JOIN settlement.payout_jobs j ON j.payout_id = p.id
             WHERE p.id = {id} AND p.status = 'queued' AND j.status = 'eligible'
               AND NOT EXISTS (SELECT 1 FROM settlement.payout_returns r WHERE r.payout_id = p.id)"
        )
    };

    // A cancel is refused, naming the payout; nothing changes.
    let out = env.run(&["queues", "cancel", "payout_delivery", "--key", &stuck.to_string()]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("payout {stuck} is queued with its funds held")),
        "{}",
        text(&out)
    );
    assert_eq!(
        count(&env, &held(stuck)).await,
        1,
        "the payout and its job are as they were"
    );

    // The provider holds another request under the stuck payout's key:
    // delivery gets 422, a permanent error, and the job becomes a dead
    // letter. That payment's own webhook (paid, 1 unit to someone else)
    // is recorded as a conflict and never makes the payout paid.
    let key = key_of(&env, stuck).await;
    pay_directly(&sim, &key, "0x00000000000000000000000000000000000000ee", "1", None).await;
    let a = deliver(&env, &sim);
    wait_until(
        60,
        "the other payout paid, the stuck one's job dead, its webhook refused",
        || async {
            count(
                &env,
                &format!(
                "SELECT (SELECT count(*) FROM settlement.payouts p JOIN settlement.payout_jobs j ON j.payout_id = p.id
                         WHERE (p.id = {other} AND p.status = 'paid') OR (p.id = {stuck} AND j.status = 'failed'))
                      + (SELECT count(*) FROM settlement.provider_events
                         WHERE payout_id = {stuck} AND outcome = 'conflict')"
            ),
            )
            .await
                == 3
        },
    )
    .await;
    stop(a);

    let states = env
        .scalar_text(
            "SELECT string_agg(p.id || ':' || p.status || '/' || j.status, ' ' ORDER BY p.id)
             FROM settlement.payouts p JOIN settlement.payout_jobs j ON j.payout_id = p.id",
        )
        .await;
    assert_eq!(states, format!("{stuck}:queued/failed {other}:paid/settled"));

    // Retention's delete, as it would run once both are long finished: the
    // paid payout's job goes, the dead letter of the queued one stays.
    sqlx::query("UPDATE settlement.payout_jobs SET updated_at = now() - interval '400 days'")
        .execute(&env.pool)
        .await
        .unwrap();
    let deleted = sqlx::query("DELETE FROM settlement.payout_jobs WHERE status IN ('settled', 'failed', 'cancelled')")
        .execute(&env.pool)
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(deleted, 1, "only the finished payout's job is deleted");
    assert_eq!(
        count(
            &env,
            &format!("SELECT count(*) FROM settlement.payout_jobs WHERE payout_id = {stuck} AND status = 'failed'")
        )
        .await,
        1
    );

    // Reconcile names the stranded payout and how to send it.
    let (code, report) = reconcile_json(&env, &sim);
    assert_eq!(code, 1, "{report}");
    let stranded: Vec<&Value> = report["mismatches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["kind"] == "stranded")
        .collect();
    assert_eq!(stranded.len(), 1, "{report}");
    assert_eq!(stranded[0]["payout_id"], stuck, "{report}");
    let detail = stranded[0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("dead letter") && detail.contains("settled queues replay payout_delivery"),
        "{detail}"
    );

    // The conflicting payment gone at the provider, a replay sends the payout.
    let p = payment(&sim, &key).await;
    tamper(&sim, reqwest::Method::DELETE, p["id"].as_str().unwrap(), None).await;
    env.run_ok(&["queues", "replay", "payout_delivery", "--key", &stuck.to_string()]);
    let a = deliver(&env, &sim);
    wait_final(&env, "the replayed payout paid").await;
    stop(a);
    assert_eq!(
        count(
            &env,
            &format!("SELECT count(*) FROM settlement.payouts WHERE id = {stuck} AND status = 'paid'")
        )
        .await,
        1
    );
    let (code, report) = reconcile_json(&env, &sim);
    assert_eq!((code, report["ok"].as_bool()), (0, Some(true)), "{report}");
    env.run_ok(&["verify", "--period", PERIOD]);
}
