//! Metrics parse as Prometheus text and equal the database counts.

use super::*;

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
    let text = common::get_text(&client, &format!("{}/metrics", server.base)).await;
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
