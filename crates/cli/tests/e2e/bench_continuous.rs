//! `settled bench --continuous` end to end, tiny: settled in both modes,
//! both producers, W 1 and 4, on real worker processes; the JSON checked
//! case by case. No figure is asserted as a speed.

use crate::common;

use common::Env;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_continuous_measures_settled_in_both_modes_and_writes_its_json() {
    let _turn = common::ONE_BENCH_AT_A_TIME.lock().await;
    let env = Env::unmigrated().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("continuous.json");
    // The test database's server hosts the bench's own databases (one per case).
    let stdout = env.run_ok(&[
        "bench",
        "--continuous",
        "--peers",
        "none",
        "--workers",
        "1,4",
        "--seconds",
        "2",
        "--rate",
        "100",
        "--json",
        file.to_str().unwrap(),
    ]);
    assert!(stdout.contains("| settled-tx | 4 |"), "{stdout}");
    assert!(stdout.contains("### Targets"), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let cases = report["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 8, "2 modes x 2 producers x W 1,4");
    for case in cases {
        assert!(case["error"].is_null(), "{case}");
        let completed = case["completed"].as_u64().unwrap();
        assert!(completed > 0, "{case}");
        assert!(case["enqueued"].as_u64().unwrap() >= completed, "{case}");
        assert!(case["jobs_per_second"].as_f64().unwrap() > 0.0, "{case}");
        let (p50, p99) = (
            case["pickup_p50_ms"].as_f64().unwrap(),
            case["pickup_p99_ms"].as_f64().unwrap(),
        );
        assert!(p50 >= 0.0 && p99 >= p50, "{case}");
        // The workers settled at least what the effects saw complete, and
        // no job's effect is there twice, in either mode.
        assert!(
            case["extra"]["settled_by_workers"].as_u64().unwrap() >= completed,
            "{case}"
        );
        assert_eq!(case["duplicates"], 0, "{case}");
        assert!(case["peak_dead_tuples"].as_i64().is_some(), "{case}");
        assert!(case["peak_table_bytes"].as_i64().unwrap() > 0, "{case}");
        assert!(!case["series"].as_array().unwrap().is_empty(), "{case}");
        // Claims and completions are transactions of the case's database.
        assert!(case["transactions_per_job"].as_f64().unwrap() > 0.0, "{case}");
        assert!(case["row_writes_per_job"].as_f64().unwrap() >= 2.0, "{case}");
        let handled = case["handled_share"].as_f64().unwrap();
        assert!(handled > 0.0 && handled <= 1.0, "{case}");
        match case["system"].as_str().unwrap() {
            "settled-tx" => assert!(case["absorbed_repeats"].is_null(), "{case}"),
            "settled-leased" => assert_eq!(case["absorbed_repeats"], 0, "{case}"),
            other => panic!("unexpected system {other}"),
        }
        if case["producer"] == "fixed" {
            // 100 jobs/s for 2 s, credited on elapsed time.
            assert_eq!(case["offered_rate"], 100, "{case}");
            let enqueued = case["enqueued"].as_u64().unwrap();
            assert!((150..=250).contains(&enqueued), "{case}");
        } else {
            assert!(case["offered_rate"].is_null(), "{case}");
        }
    }
    let targets: Vec<&str> = report["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(
        targets
            .iter()
            .any(|t| t.starts_with("settled-tx duplicates over every case: 0: met")),
        "{targets:?}"
    );
    assert!(report["load_average_start"].as_str().is_some());
}
