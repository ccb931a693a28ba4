//! `settled bench --payouts --chain` end to end, tiny: a real anvil, real
//! deliverers and a real server; the report's shape and its figures'
//! consistency with each other. No figure is asserted as a speed.

use crate::common;

use common::{Env, ONE_BENCH_AT_A_TIME};
use serde_json::Value;

const BACKLOG: u64 = 12;
const BATCH_MAX: u64 = 5;
const SAMPLES: u64 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_bench_reports_throughput_gas_block_fill_and_broadcast_latency() {
    let _turn = ONE_BENCH_AT_A_TIME.lock().await;
    let env = Env::new().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chain.json");
    let out = env.run(&[
        "bench",
        "--payouts",
        "--chain",
        "--deliverers",
        "2",
        "--backlog",
        &BACKLOG.to_string(),
        "--batch-max",
        &BATCH_MAX.to_string(),
        "--latency-samples",
        &SAMPLES.to_string(),
        "--json",
        file.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // 1: a target missed, which a bench this small may well do.
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("## Payouts on-chain"), "{stdout}");
    assert!(stdout.contains("| batched | 12 |"), "{stdout}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let floor = &report["floor"];
    // A first credit writes a zero slot; a later one does not.
    assert!(floor["transfer_to_fresh"].as_u64().unwrap() > floor["transfer_to_funded"].as_u64().unwrap());
    let runs = report["runs"].as_array().unwrap();
    let modes: Vec<&str> = runs.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["unbatched", "batched"]);
    for run in runs {
        check_run(run);
    }
    assert_eq!(
        runs[0]["transactions"].as_u64().unwrap(),
        BACKLOG,
        "one transaction per payout"
    );
    assert!(runs[1]["transactions"].as_u64().unwrap() >= BACKLOG.div_ceil(BATCH_MAX));
    let b = &report["broadcast"];
    assert_eq!(b["samples"].as_u64().unwrap(), SAMPLES);
    let (p50, p99, max) = (f(&b["p50_ms"]), f(&b["p99_ms"]), f(&b["max_ms"]));
    assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "{b}");
    let left = env
        .scalar_i64("SELECT count(*) FROM pg_database WHERE datname LIKE 'settled_bench_%'")
        .await;
    assert_eq!(left, 0, "the bench's database is dropped");
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("a number: {v}"))
}

fn check_run(run: &Value) {
    assert_eq!(run["payouts"].as_u64().unwrap(), BACKLOG, "{run}");
    let gas = run["gas_used"].as_u64().unwrap() as f64;
    assert!((f(&run["gas_per_payout"]) * BACKLOG as f64 - gas).abs() < 1.0, "{run}");
    assert!(
        (f(&run["per_sec"]) * f(&run["seconds"]) - BACKLOG as f64).abs() < 1e-6,
        "{run}"
    );
    assert!(run["blocks"].as_u64().unwrap() >= 1, "{run}");
    assert!(run["block_gas_limit"].as_u64().unwrap() > 0, "{run}");
    let (mean, max) = (f(&run["block_fill_mean"]), f(&run["block_fill_max"]));
    assert!(0.0 < mean && mean <= max && max <= 1.0, "{run}");
    let saturated = f(&run["block_fill_saturated"]);
    assert!((0.0..=max).contains(&saturated), "{run}");
}
