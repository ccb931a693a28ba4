//! What a creator's balance is, through real processes: `settled serve`,
//! `settled deliver` and the provider simulator. A creator's posted,
//! pending and available balances follow its payouts, a hold and a
//! return, and its statement, read whole or a line a page, adds up to
//! them exactly; a refused payout says the available balance it was
//! refused against.

use crate::common;

use common::{wait_until, Env, ProviderSim, Server, PERIOD};
use serde_json::{json, Value};

const TOKEN: &str = "test-token";
const SECRET: &str = "whsec-balances";

/// A settled period, a server taking the provider's webhooks, a simulator
/// that pays at once and posts its webhooks to the server.
async fn setup() -> (Env, Server, ProviderSim) {
    let env = Env::new().await;
    env.seed(20);
    env.run_ok(&["worker", "--period", PERIOD]);
    let server = env.serve_with(TOKEN, &["--provider-webhook-secret", SECRET]).await;
    let sim = ProviderSim::start(&[]);
    sim.post_webhooks_to(&server, SECRET).await;
    (env, server, sim)
}

async fn get(server: &Server, path: &str) -> (u16, Value) {
    let r = reqwest::Client::new()
        .get(format!("{}{path}", server.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn post_payout(server: &Server, key: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/payouts", server.base))
        .bearer_auth(TOKEN)
        .header("Idempotency-Key", key)
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// (posted, pending, available, on_hold) of `creator`.
async fn balances(server: &Server, creator: &str) -> (i128, i128, i128, bool) {
    let (status, body) = get(server, &format!("/v1/creators/{creator}")).await;
    assert_eq!(status, 200, "{body}");
    let b = &body["balances"];
    let n = |v: &Value| v.as_str().unwrap().parse::<i128>().unwrap();
    (
        n(&b["posted"]),
        n(&b["pending"]),
        n(&b["available"]),
        b["on_hold"].as_bool().unwrap(),
    )
}

/// The whole statement of `creator`, `limit` lines a page: its lines, and
/// each page's (opening, closing) balances.
async fn statement(server: &Server, creator: &str, limit: u32) -> (Vec<Value>, Vec<(String, String)>) {
    let mut lines = Vec::new();
    let mut pages = Vec::new();
    let mut after = String::new();
    loop {
        let (status, page) = get(
            server,
            &format!("/v1/creators/{creator}/statement?limit={limit}{after}"),
        )
        .await;
        assert_eq!(status, 200, "{page}");
        lines.extend(page["lines"].as_array().unwrap().iter().cloned());
        pages.push((
            page["opening_balance"].as_str().unwrap().to_string(),
            page["closing_balance"].as_str().unwrap().to_string(),
        ));
        match page["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => return (lines, pages),
        }
    }
}

fn amount(line: &Value) -> i128 {
    line["amount"]
        .as_str()
        .unwrap()
        .trim_start_matches('+')
        .parse()
        .unwrap()
}

/// The lines' kinds with their amounts, and each running balance checked
/// against the sum of the lines before it and the line itself.
fn kinds_adding_up(lines: &[Value]) -> Vec<(String, i128)> {
    let mut running = 0i128;
    lines
        .iter()
        .map(|l| {
            running += amount(l);
            assert_eq!(l["balance"].as_str().unwrap(), running.to_string(), "{l}");
            (l["kind"].as_str().unwrap().to_string(), amount(l))
        })
        .collect()
}

async fn status_of(env: &Env, id: i64) -> String {
    env.scalar_text(&format!("SELECT status FROM settlement.payouts WHERE id = {id}"))
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_creators_statement_adds_up_to_its_balances_through_payouts_a_hold_and_a_return() {
    let (env, server, sim) = setup().await;
    let creator = env
        .scalar_text("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC, creator LIMIT 1")
        .await;
    let credit: i128 = env
        .scalar_text(&format!(
            "SELECT balance::text FROM settlement.creator_balance WHERE creator = '{creator}'"
        ))
        .await
        .parse()
        .unwrap();
    assert!(credit > 2_000, "the richest creator has {credit}");
    assert_eq!(balances(&server, &creator).await, (credit, 0, credit, false));

    // One payout delivered and paid, one waiting for its confirmation.
    let (status, paid) = post_payout(&server, "b-1", json!({ "creator": creator, "amount": "1000" })).await;
    assert_eq!(status, 201, "{paid}");
    let paid_id = paid["id"].as_i64().unwrap();
    let (status, waiting) = post_payout(
        &server,
        "b-2",
        json!({ "creator": creator, "amount": "500", "confirm": true }),
    )
    .await;
    assert_eq!(status, 201, "{waiting}");
    assert_eq!(
        balances(&server, &creator).await,
        (credit, 1_500, credit - 1_500, false)
    );
    let mut deliverer = env.deliver(&sim.url, &["--provider-timeout-ms", "500", "--poll-after-secs", "1"]);
    wait_until(30, "the first payout paid", || async {
        status_of(&env, paid_id).await == "paid"
    })
    .await;
    common::stop(&mut deliverer);
    assert_eq!(
        balances(&server, &creator).await,
        (credit - 1_000, 500, credit - 1_500, false),
        "paid: posted fell, pending is the payout awaiting confirmation"
    );

    // A hold: nothing available, and a payout refused says so.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/holds", server.base))
        .bearer_auth(TOKEN)
        .json(&json!({ "creator": creator, "reason": "KYC review" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let hold: Value = r.json().await.unwrap();
    assert_eq!(balances(&server, &creator).await, (credit - 1_000, 500, 0, true));
    let (status, refused) = post_payout(&server, "b-3", json!({ "creator": creator, "amount": "1" })).await;
    assert_eq!((status, refused["available"].as_str()), (409, Some("0")), "{refused}");
    let r = reqwest::Client::new()
        .post(format!("{}/v1/holds/{}/release", server.base, hold["id"]))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let available = credit - 1_500;
    assert_eq!(
        balances(&server, &creator).await,
        (credit - 1_000, 500, available, false)
    );
    let (status, refused) = post_payout(
        &server,
        "b-4",
        json!({ "creator": creator, "amount": (available + 1).to_string() }),
    )
    .await;
    assert_eq!(
        (status, refused["type"].as_str(), refused["available"].as_str()),
        (
            409,
            Some("/problems/insufficient-funds"),
            Some(available.to_string().as_str())
        ),
        "{refused}"
    );

    let (before, _) = statement(&server, &creator, 100).await;
    assert_eq!(
        kinds_adding_up(&before),
        [
            ("credit".to_string(), credit),
            ("payout".into(), -1_000),
            ("payout".into(), -500),
            ("hold_placed".into(), 0),
            ("hold_released".into(), 0),
        ]
    );
    assert_eq!(before[1]["payout_status"], "paid");

    // The bank sends the paid payout back: it is returned, once.
    let payment = env
        .scalar_text(&format!(
            "SELECT provider_id FROM settlement.payouts WHERE id = {paid_id}"
        ))
        .await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/payments/{payment}/return", sim.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    wait_until(30, "the payout returned", || async {
        status_of(&env, paid_id).await == "returned"
    })
    .await;
    assert_eq!(balances(&server, &creator).await, (credit, 500, credit - 500, false));
    let (after, pages) = statement(&server, &creator, 100).await;
    assert_eq!(pages.len(), 1);
    let kinds = kinds_adding_up(&after);
    assert_eq!(kinds.last(), Some(&("return".to_string(), 1_000)), "{after:#?}");
    assert_eq!(after[1]["payout_status"], "returned");
    assert_eq!(
        pages[0].1,
        (credit - 500).to_string(),
        "the closing balance is posted less pending"
    );

    // A line a page: the same lines, each page opening where the last closed.
    let (one_by_one, pages) = statement(&server, &creator, 1).await;
    assert_eq!(one_by_one, after);
    assert_eq!(pages.len(), after.len());
    for pair in pages.windows(2) {
        assert_eq!(pair[0].1, pair[1].0, "a page opens where the one before closed");
    }

    // A window: the lines before the second payout, and none from tomorrow.
    let second_at = after[2]["at"].as_str().unwrap();
    let (status, early) = get(
        &server,
        &format!("/v1/creators/{creator}/statement?to={}", second_at.replace('+', "%2B")),
    )
    .await;
    assert_eq!(status, 200, "{early}");
    assert_eq!(early["lines"].as_array().unwrap().len(), 2, "{early}");
    assert_eq!(early["closing_balance"], (credit - 1_000).to_string());
    let tomorrow = (chrono::Utc::now() + chrono::Duration::days(1)).format("%Y-%m-%d");
    let (_, late) = get(&server, &format!("/v1/creators/{creator}/statement?from={tomorrow}")).await;
    assert_eq!(late["lines"].as_array().unwrap().len(), 0, "{late}");
    assert_eq!(late["opening_balance"], (credit - 500).to_string());
    assert_eq!(late["closing_balance"], (credit - 500).to_string());

    // The dashboard's creator page shows the same figures.
    let html = common::get_text(
        &common::client_with(TOKEN),
        &format!("{}/creators/{creator}", server.base),
    )
    .await;
    for figure in [
        format!("data-posted=\"{credit}\""),
        "data-pending=\"500\"".to_string(),
        format!("data-available=\"{}\"", credit - 500),
        format!("data-closing=\"{}\"", credit - 500),
        "KYC review".to_string(),
    ] {
        assert!(html.contains(&figure), "no {figure} on the creator page:\n{html}");
    }
    let out = env.run_ok(&["verify", "--payouts"]);
    assert!(out.contains("OK, every check holds"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_statement_query_that_cannot_be_read_is_refused_naming_its_field() {
    let env = Env::new().await;
    env.seed(3);
    env.run_ok(&["worker", "--period", PERIOD]);
    let server = env.serve(TOKEN).await;
    let creator = env
        .scalar_text("SELECT creator FROM settlement.creator_balance ORDER BY creator LIMIT 1")
        .await;
    for (query, field, kind) in [
        ("after=yesterday", "after", "invalid-field"),
        ("after=1.9.1", "after", "invalid-field"),
        ("from=2026-13-01", "from", "invalid-field"),
        ("to=soon", "to", "invalid-field"),
        ("limit=0", "limit", "invalid-limit"),
        ("limit=1001", "limit", "invalid-limit"),
    ] {
        let (status, body) = get(&server, &format!("/v1/creators/{creator}/statement?{query}")).await;
        assert_eq!(
            (status, body["field"].as_str(), body["type"].as_str()),
            (400, Some(field), Some(format!("/problems/{kind}").as_str())),
            "{query}: {body}"
        );
    }
    let (status, body) = get(
        &server,
        "/v1/creators/0x00000000000000000000000000000000000000ff/statement",
    )
    .await;
    assert_eq!(
        (status, body["type"].as_str()),
        (404, Some("/problems/unknown-creator")),
        "{body}"
    );
    let (status, body) = get(&server, "/v1/creators/0xnope/statement").await;
    assert_eq!((status, body["field"].as_str()), (400, Some("address")), "{body}");
    // A date is its midnight UTC: the credit of today's run is after it.
    let (status, body) = get(
        &server,
        &format!("/v1/creators/{creator}/statement?from=2026-01-01&to=2026-01-02"),
    )
    .await;
    assert_eq!(
        (status, body["lines"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{body}"
    );
}
