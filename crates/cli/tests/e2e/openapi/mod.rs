//! The OpenAPI document against real answers, black-box: `settled serve`
//! (two of them: one with webhooks, one with a 1 s confirmation window),
//! `settled deliver` and the provider simulator, driven through payouts in
//! every state a payout can reach, holds, continuous queues and signed
//! provider events. Every answer's status, media type and body is checked
//! against the document the server itself serves at `/openapi.json`, with
//! a JSON Schema validator (formats asserted); every operation of the
//! document must have been answered at least once.

use crate::common;

use std::collections::BTreeSet;

use common::{wait_until, Env, ProviderSim, Server};
use reqwest::{Method, RequestBuilder};
use serde_json::{json, Value};
use settled_engine::NewJob;

mod contract;
mod patterns;

use contract::{authed, make_queues, Contract};

const TOKEN: &str = "openapi-t0ken";
const SECRET: &str = "whsec-openapi";

#[tokio::test(flavor = "multi_thread")]
async fn every_answer_to_real_payouts_holds_queues_and_webhooks_holds_to_the_openapi_document() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "20"]);
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    make_queues(&env).await;
    let creators: Vec<String> =
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC LIMIT 3")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    let (rich, held, other) = (&creators[0], &creators[1], &creators[2]);
    let server = env.serve_with(TOKEN, &["--provider-webhook-secret", SECRET]).await;
    let brief = env.serve_with(TOKEN, &["--confirm-ttl-secs", "1"]).await;
    // Payments stay pending at the provider: the test says when they end,
    // with signed events.
    let sim = ProviderSim::start(&["--settle-delay-ms", "3600000"]);
    let mut api = Contract::of(&server).await;
    let c = api.client.clone();

    server_routes(&mut api, &c, &server).await;
    creators_and_holds(&mut api, &c, &server, held, other).await;
    let (paid, failed) = payouts(&mut api, &c, &server, &brief, rich).await;

    // Delivery sends the queued payouts; the unconfirmed one on the brief
    // server expires meanwhile.
    let mut deliverer = env.deliver(&sim.url, &["--provider-timeout-ms", "500", "--poll-after-secs", "3600"]);
    for id in [paid, failed] {
        let url = format!("/v1/payouts/{id}");
        wait_until(60, "the payout sent", || {
            let (c, base) = (c.clone(), server.base.clone());
            let url = url.clone();
            async move {
                let body: Value = common::json_of(c.get(format!("{base}{url}"))).await;
                body["status"] == "sent"
            }
        })
        .await;
        let (status, sent) = api
            .send("/v1/payouts/{id}", c.get(format!("{}{url}", server.base)))
            .await;
        assert_eq!((status, sent["status"].as_str()), (200, Some("sent")), "{sent}");
    }
    provider_events(&mut api, &c, &server, &env, paid, failed).await;
    let expired: i64 = sqlx::query_scalar("SELECT id FROM settlement.payouts WHERE idempotency_key = 'oa-expires'")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    wait_until(60, "the unconfirmed payout expired", || async {
        env.scalar_text(&format!("SELECT status FROM settlement.payouts WHERE id = {expired}"))
            .await
            == "expired"
    })
    .await;
    common::stop(&mut deliverer);
    let (status, body) = api
        .send(
            "/v1/payouts/{id}",
            c.get(format!("{}/v1/payouts/{expired}", server.base)),
        )
        .await;
    assert_eq!((status, body["status"].as_str()), (200, Some("expired")), "{body}");

    queues(&mut api, &c, &server).await;
    statements(&mut api, &c, &server, rich).await;

    let every_state: BTreeSet<String> = settled::payouts::PayoutState::ALL
        .iter()
        .map(|s| s.as_str().to_string())
        .collect();
    assert_eq!(api.states, every_state, "every state a payout can reach was answered");
    let unanswered = api.unanswered();
    assert!(unanswered.is_empty(), "operations no answer checked: {unanswered:?}");
}

async fn server_routes(api: &mut Contract, c: &reqwest::Client, server: &Server) {
    let base = &server.base;
    assert_eq!(api.send("/healthz", c.get(format!("{base}/healthz"))).await.0, 200);
    assert_eq!(api.send("/readyz", c.get(format!("{base}/readyz"))).await.0, 200);
    let (status, text) = api.send("/metrics", c.get(format!("{base}/metrics"))).await;
    assert_eq!(status, 200);
    assert!(text.as_str().unwrap().contains("settled_payouts_total"));
    let (status, _) = api
        .send(
            "/openapi.json",
            c.get(format!("{base}/openapi.json")).header("Host", "evil.example"),
        )
        .await;
    assert_eq!(status, 421, "a loopback server answers only loopback names");
}

async fn creators_and_holds(api: &mut Contract, c: &reqwest::Client, server: &Server, held: &str, other: &str) {
    let base = &server.base;
    let t = "/v1/creators/{address}";
    assert_eq!(api.send(t, c.get(format!("{base}/v1/creators/{held}"))).await.0, 200);
    let unknown = format!("0x{}", "ab".repeat(20));
    assert_eq!(api.send(t, c.get(format!("{base}/v1/creators/{unknown}"))).await.0, 404);
    assert_eq!(api.send(t, c.get(format!("{base}/v1/creators/0xnope"))).await.0, 400);

    let t = "/v1/holds";
    let hold = |creator: &str, reason: &str| {
        authed(c, Method::POST, server, t).json(&json!({ "creator": creator, "reason": reason }))
    };
    let (status, placed) = api.send(t, hold(held, "review")).await;
    assert_eq!(status, 201, "{placed}");
    let hold_id = placed["id"].as_i64().unwrap();
    let (status, again) = api.send(t, hold(held, "again")).await;
    assert_eq!(
        (status, again["existing_hold_id"].as_i64()),
        (409, Some(hold_id)),
        "{again}"
    );
    assert_eq!(api.send(t, hold(held, "a\nb")).await.0, 422);
    assert_eq!(api.send(t, hold(&unknown, "who")).await.0, 404);
    let (status, _) = api
        .send_without_token(
            t,
            reqwest::Client::new()
                .post(format!("{base}{t}"))
                .json(&json!({ "creator": other, "reason": "no token" })),
        )
        .await;
    assert_eq!(status, 401);
    let (status, _) = api
        .send(
            t,
            authed(c, Method::POST, server, t)
                .header("Content-Type", "text/plain")
                .body("{}"),
        )
        .await;
    assert_eq!(status, 415);
    let (status, _) = api
        .send(
            t,
            authed(c, Method::POST, server, t)
                .header("Content-Type", "application/json")
                .body(r#"{"creator":"x","creator":"y","reason":"r"}"#),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = api
        .send(
            t,
            authed(c, Method::POST, server, t)
                .header("Content-Type", "application/json")
                .body("x".repeat(20_000)),
        )
        .await;
    assert_eq!(status, 413);

    // While on hold: a payout, and the confirmation of one made before it.
    let t = "/v1/payouts";
    let (status, refused) = api
        .send(
            t,
            authed(c, Method::POST, server, t)
                .header("Idempotency-Key", "oa-held")
                .json(&json!({ "creator": held, "amount": "5" })),
        )
        .await;
    assert_eq!((status, refused["hold"].as_i64()), (409, Some(hold_id)), "{refused}");

    let t = "/v1/holds/{id}/release";
    let release = |id: &str| authed(c, Method::POST, server, &format!("/v1/holds/{id}/release"));
    let (status, released) = api.send(t, release(&hold_id.to_string())).await;
    assert_eq!((status, released["released_at"].is_string()), (200, true), "{released}");
    assert_eq!(api.send(t, release(&hold_id.to_string())).await.0, 409);
    assert_eq!(api.send(t, release("999999")).await.0, 404);
    assert_eq!(api.send(t, release("x")).await.0, 400);
}

/// Payouts in every state the API itself moves them to; returns two
/// payouts queued for delivery (to be paid and to fail).
async fn payouts(api: &mut Contract, c: &reqwest::Client, server: &Server, brief: &Server, rich: &str) -> (i64, i64) {
    let t = "/v1/payouts";
    let make = |server: &Server, key: &str, body: Value| {
        authed(c, Method::POST, server, t)
            .header("Idempotency-Key", key)
            .json(&body)
    };
    let (status, first) = api
        .send(t, make(server, "oa-paid", json!({ "creator": rich, "amount": "1000" })))
        .await;
    assert_eq!((status, first["status"].as_str()), (201, Some("queued")), "{first}");
    let (status, again) = api
        .send(t, make(server, "oa-paid", json!({ "creator": rich, "amount": "1000" })))
        .await;
    assert_eq!(
        (status, &again["id"]),
        (201, &first["id"]),
        "a repeat answers the payout"
    );
    let (status, body) = api
        .send(t, make(server, "oa-paid", json!({ "creator": rich, "amount": "7" })))
        .await;
    assert_eq!(
        (status, body["type"].as_str()),
        (422, Some("/problems/idempotency-key-reused"))
    );
    let (status, failing) = api
        .send(
            t,
            make(server, "oa-fails", json!({ "creator": rich, "amount": "2000" })),
        )
        .await;
    assert_eq!(status, 201, "{failing}");
    let (status, body) = api
        .send(
            t,
            make(server, "oa-poor", json!({ "creator": rich, "amount": "9".repeat(60) })),
        )
        .await;
    assert_eq!((status, body["balance"].is_string()), (409, true), "{body}");
    let unknown = format!("0x{}", "cd".repeat(20));
    let (status, _) = api
        .send(t, make(server, "oa-who", json!({ "creator": unknown, "amount": "1" })))
        .await;
    assert_eq!(status, 404);
    let (status, _) = api
        .send(t, make(server, "oa-zero", json!({ "creator": rich, "amount": "0" })))
        .await;
    assert_eq!(status, 422);
    let (status, _) = api
        .send(
            t,
            authed(c, Method::POST, server, t).json(&json!({ "creator": rich, "amount": "1" })),
        )
        .await;
    assert_eq!(status, 400, "no Idempotency-Key");

    // Awaiting confirmation: confirmed once; the token refused; cancelled.
    let (status, created) = api
        .send(
            t,
            make(
                server,
                "oa-confirm",
                json!({ "creator": rich, "amount": "30", "confirm": true }),
            ),
        )
        .await;
    assert_eq!(
        (status, created["status"].as_str()),
        (201, Some("created")),
        "{created}"
    );
    let (id, token) = (created["id"].as_i64().unwrap(), created["confirm_token"].clone());
    let t = "/v1/payouts/{id}/confirm";
    let confirm = |id: i64, token: &Value| {
        authed(c, Method::POST, server, &format!("/v1/payouts/{id}/confirm")).json(&json!({ "token": token }))
    };
    let wrong = json!("00000000-0000-4000-8000-000000000000");
    assert_eq!(api.send(t, confirm(id, &wrong)).await.0, 403);
    let (status, body) = api.send(t, confirm(id, &token)).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("queued")), "{body}");
    let (status, body) = api.send(t, confirm(id, &token)).await;
    assert_eq!(
        (status, body["status"].as_u64(), body["payout_status"].as_str()),
        (409, Some(409), Some("queued")),
        "a problem's status is its HTTP status; the payout's is payout_status: {body}"
    );
    assert_eq!(api.send(t, confirm(999_999, &token)).await.0, 404);
    assert_eq!(api.send(t, confirm(id, &json!("not-a-uuid"))).await.0, 422);

    let t = "/v1/payouts/{id}/cancel";
    let cancel = |id: i64| authed(c, Method::POST, server, &format!("/v1/payouts/{id}/cancel"));
    let (_, to_cancel) = api
        .send(
            "/v1/payouts",
            make(
                server,
                "oa-cancel",
                json!({ "creator": rich, "amount": "40", "confirm": true }),
            ),
        )
        .await;
    let cancelled = to_cancel["id"].as_i64().unwrap();
    let (status, body) = api.send(t, cancel(cancelled)).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("cancelled")), "{body}");
    let (status, body) = api.send(t, cancel(cancelled)).await;
    assert_eq!(
        (status, body["status"].as_u64(), body["payout_status"].as_str()),
        (409, Some(409), Some("cancelled")),
        "{body}"
    );
    assert_eq!(api.send(t, cancel(999_999)).await.0, 404);
    let (status, _) = api
        .send(
            t,
            c.post(format!("{}/v1/payouts/x/cancel", server.base))
                .bearer_auth(TOKEN),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = api
        .send_without_token(
            t,
            reqwest::Client::new().post(format!("{}/v1/payouts/{cancelled}/cancel", server.base)),
        )
        .await;
    assert_eq!(status, 401);

    // One that nobody confirms, on the server with a 1 s window.
    let (status, _) = api
        .send(
            "/v1/payouts",
            make(
                brief,
                "oa-expires",
                json!({ "creator": rich, "amount": "50", "confirm": true }),
            ),
        )
        .await;
    assert_eq!(status, 201);

    let t = "/v1/payouts/{id}";
    let (status, shown) = api.send(t, c.get(format!("{}/v1/payouts/{id}", server.base))).await;
    assert_eq!(
        (status, shown["history"].as_array().map(Vec::len)),
        (200, Some(2)),
        "{shown}"
    );
    assert_eq!(
        api.send(t, c.get(format!("{}/v1/payouts/999999", server.base))).await.0,
        404
    );
    assert_eq!(
        api.send(t, c.get(format!("{}/v1/payouts/abc", server.base))).await.0,
        400
    );
    (first["id"].as_i64().unwrap(), failing["id"].as_i64().unwrap())
}

/// Signed events from the provider: one pays a payout, one fails another,
/// then a repeat, a type settled does not apply, and bad signatures.
async fn provider_events(api: &mut Contract, c: &reqwest::Client, server: &Server, env: &Env, paid: i64, failed: i64) {
    let t = "/v1/provider-events";
    let event = |id: &str, kind: &str, payout: &Value, key: &str| {
        let paid = kind == "payment.paid";
        json!({ "id": id, "type": kind, "created": 1, "data": {
            "id": payout["provider_id"], "idempotency_key": key, "creator": payout["creator"],
            "amount": payout["amount"], "status": kind.trim_start_matches("payment."),
            "failure_reason": if paid { Value::Null } else { json!("account_closed") }, "reference": key } })
    };
    let signed = |body: &Value, secret: &str| {
        let raw = serde_json::to_vec(body).unwrap();
        let header = settled::provider::signature::sign(secret.as_bytes(), chrono::Utc::now().timestamp(), &raw);
        c.post(format!("{}{t}", server.base))
            .header("Provider-Signature", header)
            .header("Content-Type", "application/json")
            .body(raw)
    };
    for (id, kind, outcome) in [(paid, "payment.paid", "paid"), (failed, "payment.failed", "failed")] {
        let payout: Value = common::json_of(c.get(format!("{}/v1/payouts/{id}", server.base))).await;
        let key = common::provider_key_of(env, id).await;
        let ev = event(&format!("evt-{id}"), kind, &payout, &key);
        let (status, body) = api.send(t, signed(&ev, SECRET)).await;
        assert_eq!((status, body["outcome"].as_str()), (200, Some("applied")), "{body}");
        let (status, body) = api.send(t, signed(&ev, SECRET)).await;
        assert_eq!((status, body["outcome"].as_str()), (200, Some("duplicate")), "{body}");
        let (status, body) = api
            .send("/v1/payouts/{id}", c.get(format!("{}/v1/payouts/{id}", server.base)))
            .await;
        assert_eq!((status, body["status"].as_str()), (200, Some(outcome)), "{body}");
    }
    // The bank sends the paid payout back.
    let payout: Value = common::json_of(c.get(format!("{}/v1/payouts/{paid}", server.base))).await;
    let key = common::provider_key_of(env, paid).await;
    let ev = event(&format!("evt-{paid}-returned"), "payment.returned", &payout, &key);
    let (status, body) = api.send(t, signed(&ev, SECRET)).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("applied")), "{body}");
    let (status, body) = api
        .send("/v1/payouts/{id}", c.get(format!("{}/v1/payouts/{paid}", server.base)))
        .await;
    assert_eq!((status, body["status"].as_str()), (200, Some("returned")), "{body}");
    let other = json!({ "id": "evt-refund", "type": "payment.refunded", "created": 1, "data": {} });
    let (status, body) = api.send(t, signed(&other, SECRET)).await;
    assert_eq!((status, body["outcome"].as_str()), (200, Some("ignored")), "{body}");
    let stray = json!({ "id": "evt-stray", "type": "payment.paid", "created": 1, "data": {
        "id": "pay_x", "idempotency_key": "nobody", "creator": "0x", "amount": "1", "status": "paid" } });
    let (status, body) = api.send(t, signed(&stray, SECRET)).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (200, Some("unknown_payout")),
        "{body}"
    );
    assert_eq!(api.send(t, signed(&other, "not-the-secret")).await.0, 400);
    let (status, _) = api.send(t, c.post(format!("{}{t}", server.base)).json(&other)).await;
    assert_eq!(status, 400, "no signature");
    let (status, _) = api
        .send(t, signed(&json!({ "id": "evt-bad", "type": "payment.paid" }), SECRET))
        .await;
    assert_eq!(status, 400, "a signed event without its members");
}

/// A creator's statement (credits, payouts, a return), paged; and what
/// is refused.
async fn statements(api: &mut Contract, c: &reqwest::Client, server: &Server, rich: &str) {
    let base = &server.base;
    let t = "/v1/creators/{address}/statement";
    let (status, page) = api
        .send(t, c.get(format!("{base}/v1/creators/{rich}/statement?limit=2")))
        .await;
    assert_eq!(
        (status, page["lines"].as_array().map(Vec::len)),
        (200, Some(2)),
        "{page}"
    );
    let next = page["next"].as_str().expect("more than two lines").to_string();
    let (status, rest) = api
        .send(
            t,
            c.get(format!(
                "{base}/v1/creators/{rich}/statement?after={next}&from=2026-01-01"
            )),
        )
        .await;
    assert_eq!(status, 200, "{rest}");
    let kinds: Vec<&str> = rest["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|l| l["kind"].as_str())
        .collect();
    assert!(kinds.contains(&"return"), "{rest}");
    assert_eq!(
        api.send(t, c.get(format!("{base}/v1/creators/{rich}/statement?after=x")))
            .await
            .0,
        400
    );
    assert_eq!(
        api.send(t, c.get(format!("{base}/v1/creators/{rich}/statement?limit=0")))
            .await
            .0,
        400
    );
    let unknown = format!("0x{}", "cd".repeat(20));
    assert_eq!(
        api.send(t, c.get(format!("{base}/v1/creators/{unknown}/statement")))
            .await
            .0,
        404
    );
}

async fn queues(api: &mut Contract, c: &reqwest::Client, server: &Server) {
    let base = &server.base;
    let (status, all) = api.send("/v1/queues", c.get(format!("{base}/v1/queues"))).await;
    assert_eq!(
        (status, all["queues"].as_array().map(Vec::len)),
        (200, Some(3)),
        "{all}"
    );
    let t = "/v1/queues/{name}";
    assert_eq!(api.send(t, c.get(format!("{base}/v1/queues/mail"))).await.0, 200);
    assert_eq!(api.send(t, c.get(format!("{base}/v1/queues/nope"))).await.0, 404);

    let t = "/v1/queues/{name}/dead";
    let (status, dead) = api.send(t, c.get(format!("{base}/v1/queues/mail/dead"))).await;
    assert_eq!(
        (status, dead["dead_letters"].as_array().map(Vec::len)),
        (200, Some(2)),
        "{dead}"
    );
    assert_eq!(
        api.send(t, c.get(format!("{base}/v1/queues/mail/dead?limit=0")))
            .await
            .0,
        400
    );
    assert_eq!(api.send(t, c.get(format!("{base}/v1/queues/ghost/dead"))).await.0, 409);
    assert_eq!(api.send(t, c.get(format!("{base}/v1/queues/nope/dead"))).await.0, 404);

    for (verb, paused) in [("pause", true), ("pause", false), ("resume", true), ("resume", false)] {
        let t = format!("/v1/queues/{{name}}/{verb}");
        let (status, body) = api
            .send(&t, authed(c, Method::POST, server, &format!("/v1/queues/mail/{verb}")))
            .await;
        assert_eq!((status, body["changed"].as_bool()), (200, Some(paused)), "{body}");
        let (status, _) = api
            .send(&t, authed(c, Method::POST, server, &format!("/v1/queues/nope/{verb}")))
            .await;
        assert_eq!(status, 404);
    }

    let t = "/v1/queues/{name}/replay";
    let replay =
        |name: &str, body: Value| authed(c, Method::POST, server, &format!("/v1/queues/{name}/replay")).json(&body);
    let (status, body) = api.send(t, replay("mail", json!({ "key": "d1" }))).await;
    assert_eq!((status, body["replayed"].as_u64()), (200, Some(1)), "{body}");
    // A count written with a zero fraction is the same count (JSON Schema
    // counts 3546.0 as an integer).
    let (status, body) = api.send(t, replay("mail", json!({ "limit": 3546.0 }))).await;
    assert_eq!((status, body["replayed"].as_u64()), (200, Some(1)), "{body}");
    let (status, body) = api.send(t, replay("mail", json!({ "limit": 2.5 }))).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(api.send(t, replay("mail", json!({ "key": "zzz" }))).await.0, 404);
    assert_eq!(api.send(t, replay("mail", json!({ "limit": 0 }))).await.0, 422);
    assert_eq!(api.send(t, replay("ghost", json!({}))).await.0, 409);
    for nul in [json!({ "key": "a\u{0}b" }), json!({ "error_contains": "\u{0}" })] {
        let (status, body) = api.send(t, replay("mail", nul.clone())).await;
        assert_eq!(status, 422, "a NUL, which no text column holds: {nul} {body}");
    }

    let t = "/v1/queues/{name}/cancel";
    let cancel = |name: &str, key: &str| {
        authed(c, Method::POST, server, &format!("/v1/queues/{name}/cancel")).json(&json!({ "key": key }))
    };
    let (status, body) = api.send(t, cancel("mail", "r2")).await;
    assert_eq!((status, body["cancelled"].as_bool()), (200, Some(true)), "{body}");
    assert_eq!(api.send(t, cancel("mail", "p1")).await.0, 409);
    assert_eq!(api.send(t, cancel("mail", "zzz")).await.0, 404);
    let (status, body) = api.send(t, cancel("mail", "r\u{0}3")).await;
    assert_eq!(status, 422, "{body}");
}
