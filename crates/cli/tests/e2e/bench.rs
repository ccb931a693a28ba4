//! `settled bench` end to end, small: every strategy, both work settings, the
//! floors and the memory case on real worker processes; every case verified;
//! JSON, markdown and plots written. No figure is asserted as a speed.

use crate::common;

use common::{Env, ONE_BENCH_AT_A_TIME};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_measures_every_strategy_and_verifies_each_case() {
    let _turn = ONE_BENCH_AT_A_TIME.lock().await;
    let env = Env::new().await;
    let out = tempfile::tempdir().unwrap();
    let out_dir = out.path().to_str().unwrap();
    // The test database's server hosts the bench's own databases (created
    // and dropped per case).
    let stdout = env.run_ok(&[
        "bench",
        "--quick",
        "--workers",
        "1,2",
        "--creators",
        "1200",
        "--work-creators",
        "60",
        "--chunk",
        "200",
        "--work-chunk",
        "5",
        "--memory-concurrency",
        "4",
        "--out",
        out_dir,
    ]);
    assert!(stdout.contains("### Targets"), "{stdout}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("results.json")).unwrap()).unwrap();
    let cases = report["cases"].as_array().unwrap();
    let skipped: Vec<&str> = report["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let strategies = [
        "redis-lock",
        "advisory-lock",
        "for-update",
        "offset",
        "skip-locked-item",
        "skip-locked-chunk",
        "skip-locked-leased",
    ];
    for strategy in strategies {
        let ran: Vec<&serde_json::Value> = cases
            .iter()
            .filter(|c| c["kind"] == "strategy" && c["name"] == strategy)
            .collect();
        if ran.is_empty() {
            // Only Redis may be missing, and then the report says why.
            assert_eq!(strategy, "redis-lock");
            assert!(
                skipped.iter().any(|s| s.starts_with("redis-lock skipped")),
                "{skipped:?}"
            );
            continue;
        }
        assert_eq!(ran.len(), 4, "{strategy}: W 1,2 x work 0,5");
        for case in ran {
            assert_eq!(case["verified"], true, "{case}");
            assert!(case["error"].is_null(), "{case}");
            assert!(case["creators_per_second"].as_f64().unwrap() > 0.0, "{case}");
            assert!(case["efficiency"].as_f64().is_some(), "{case}");
            assert!(case["claim_p99_ms"].as_f64().unwrap() >= case["claim_p50_ms"].as_f64().unwrap());
            assert!(case["transactions_per_item"].as_f64().unwrap() > 0.0, "{case}");
            // Every creator was settled by the workers, each exactly once.
            let creators = case["creators"].as_u64().unwrap();
            assert_eq!(
                case["extra"]["settled_by_workers"].as_u64().unwrap(),
                creators,
                "{case}"
            );
            if strategy == "skip-locked-item" {
                // One item per claim, plus the empty claims at the end.
                assert!(case["claims"].as_u64().unwrap() >= creators, "{case}");
                assert!(case["transactions_per_item"].as_f64().unwrap() >= 1.0, "{case}");
            }
            if strategy == "offset" {
                // FOR UPDATE locks the rows OFFSET walks over, not only those returned.
                assert!(case["extra"]["rows_locked"].as_u64().unwrap() >= creators, "{case}");
            }
        }
    }
    for floor in ["pgbench", "set-based"] {
        if floor == "pgbench" && skipped.iter().any(|s| s.starts_with("pgbench floor skipped")) {
            continue;
        }
        let case = cases
            .iter()
            .find(|c| c["kind"] == floor)
            .unwrap_or_else(|| panic!("no {floor} case"));
        assert_eq!(case["verified"], true, "{case}");
    }
    let memory = cases.iter().find(|c| c["kind"] == "memory").expect("memory case");
    assert_eq!(memory["concurrency"], 4);
    assert!(memory["peak_rss_mib"].as_f64().unwrap() > 1.0, "{memory}");
    assert_eq!(report["targets"].as_array().unwrap().len(), 7);
    for plot in ["throughput", "efficiency", "latency"] {
        for ext in ["svg", "png"] {
            let path = out.path().join(format!("{plot}.{ext}"));
            assert!(
                std::fs::metadata(&path).map(|m| m.len() > 1000).unwrap_or(false),
                "{}",
                path.display()
            );
        }
    }
    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    assert!(md.contains("| skip-locked-chunk | 2 |"), "{md}");
    // The plots and the markdown can be redrawn from the JSON alone.
    let again = tempfile::tempdir().unwrap();
    let results = out.path().join("results.json");
    env.run_ok(&[
        "bench",
        "--replot",
        results.to_str().unwrap(),
        "--out",
        again.path().to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read_to_string(again.path().join("results.md")).unwrap(), md);
    assert!(again.path().join("throughput.png").exists());
    // Nothing of the bench's own databases is left on the server.
    let left = env
        .scalar_i64("SELECT count(*) FROM pg_database WHERE datname LIKE 'settled_bench_%'")
        .await;
    assert_eq!(left, 0);
}

#[test]
fn bench_refuses_bad_worker_counts_by_name() {
    for (workers, expected) in [("0", "--workers"), ("65", "--workers"), ("x", "--workers")] {
        let out = std::process::Command::new(common::SETTLED)
            .args(["bench", "--quick", "--workers", workers])
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{workers}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_pairs_alternate_the_product_and_the_set_based_floor_and_give_the_median_and_spread() {
    let _turn = ONE_BENCH_AT_A_TIME.lock().await;
    let env = Env::new().await;
    let out = tempfile::tempdir().unwrap();
    let stdout = env.run_ok(&[
        "bench",
        "--pairs",
        "2",
        "--creators",
        "1500",
        "--workers",
        "2",
        "--concurrency",
        "2",
        "--chunk",
        "100",
        "--json",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["workers"], 2, "{stdout}");
    assert_eq!(report["concurrency"], 2, "{stdout}");
    let rounds = report["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2, "{stdout}");
    assert_eq!(rounds[0]["first"], "skip-locked-chunk");
    assert_eq!(rounds[1]["first"], "set-based");
    let mut ratios = Vec::new();
    for r in rounds {
        let (p, s, ratio) = (
            r["product_per_second"].as_f64().unwrap(),
            r["set_based_per_second"].as_f64().unwrap(),
            r["ratio"].as_f64().unwrap(),
        );
        assert!(p > 0.0 && s > 0.0 && (ratio - p / s).abs() < 1e-9, "{r}");
        ratios.push(ratio);
        // The key-range ceiling runs where pgbench is installed.
        if let Some(ranges) = r["ranges_per_second"].as_f64() {
            assert!((r["ranges_ratio"].as_f64().unwrap() - ranges / s).abs() < 1e-9, "{r}");
        }
    }
    // Two rounds: the median is their mean, the spread their bounds.
    let spread = &report["ratio"];
    let (lo, hi) = (ratios[0].min(ratios[1]), ratios[0].max(ratios[1]));
    assert!(
        (spread["median"].as_f64().unwrap() - (lo + hi) / 2.0).abs() < 1e-9,
        "{spread}"
    );
    assert_eq!(spread["min"].as_f64().unwrap(), lo, "{spread}");
    assert_eq!(spread["max"].as_f64().unwrap(), hi, "{spread}");
    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    assert!(md.contains("Median ratio: "), "{md}");
    assert!(md.contains("2 processes x 2 loops"), "{md}");
    assert_eq!(
        md.matches("| skip-locked-chunk |").count() + md.matches("| set-based |").count(),
        2,
        "{md}"
    );
    // Nothing of the bench's own databases (cases and templates) is left.
    let left = env
        .scalar_i64("SELECT count(*) FROM pg_database WHERE datname LIKE 'settled_bench_%'")
        .await;
    assert_eq!(left, 0);
}
