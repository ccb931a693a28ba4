//! A queued payout's delivery is never cancelled or pruned; a dead letter is named until replayed.

use super::*;

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
