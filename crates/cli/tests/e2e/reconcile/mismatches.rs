//! `settled reconcile` after real delivery: clean, then each kind of mismatch named by payout and key.

use super::*;

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
