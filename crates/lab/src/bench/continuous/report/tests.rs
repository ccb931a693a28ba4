//! The medians, the targets and the markdown rows.

use super::targets::{latency_target, throughput_target};
use super::*;

fn case(system: &str, producer: Producer, jobs: f64, p99: f64, handled: f64) -> ContinuousCase {
    ContinuousCase {
        seconds: 10.0,
        enqueued: 1000,
        completed: 1000,
        jobs_per_second: Some(jobs),
        pickup_p50_ms: Some(p99 / 2.0),
        pickup_p99_ms: Some(p99),
        peak_dead_tuples: Some(0),
        peak_table_bytes: Some(0),
        duplicates: Some(0),
        handled_share: Some(handled),
        ..ContinuousCase::blank(system.into(), producer, 16, 1, None)
    }
}

#[test]
fn a_peer_that_left_jobs_unstarted_never_has_the_lowest_p99() {
    let cases = vec![
        case("settled-tx", Producer::Fixed, 500.0, 9.0, 1.0),
        case("quick-but-stuck", Producer::Fixed, 10.0, 2.0, 0.03),
        case("slower", Producer::Fixed, 500.0, 12.0, 1.0),
    ];
    let line = latency_target(&medians(&cases), 16).unwrap();
    assert!(line.contains("lowest peer's 12.0 ms (slower)"), "{line}");
    assert!(line.contains("quick-but-stuck left jobs unstarted"), "{line}");
    assert!(line.ends_with("met (target: lower than every peer)"), "{line}");
    let md = markdown_rows(&cases);
    assert!(md.contains("| quick-but-stuck | 16 | 10 | 1.0 | (2.0) |"), "{md}");
}

#[test]
fn throughput_is_judged_against_the_fastest_peer_on_medians() {
    let cases = vec![
        case("settled-tx", Producer::Saturation, 5000.0, 1.0, 0.9),
        case("settled-tx", Producer::Saturation, 7000.0, 1.0, 0.9),
        case("settled-tx", Producer::Saturation, 6000.0, 1.0, 0.9),
        case("peer", Producer::Saturation, 4000.0, 1.0, 0.9),
    ];
    let line = throughput_target(&medians(&cases), 16).unwrap();
    assert_eq!(
        line,
        "W=16, saturation: settled-tx 6000 jobs/s is 1.50x the fastest peer (peer, 4000): met (target 1.5x)"
    );
}

fn markdown_rows(cases: &[ContinuousCase]) -> String {
    let opts = ContinuousOptions {
        settled_modes: Vec::new(),
        peers: Vec::new(),
        peers_dir: "bench/peers".into(),
        workers: vec![16],
        producers: vec![Producer::Fixed],
        rate: 500,
        seconds: 10,
        runs: 1,
        batch: 10,
        depth: 2000,
        retention_secs: 60,
        work_ms: 1,
        database_url: None,
        command: String::new(),
    };
    let report = ContinuousReport {
        started_at: String::new(),
        finished_at: String::new(),
        settled_version: String::new(),
        server_version: String::new(),
        cpus: 2,
        load_average_start: String::new(),
        load_average_end: String::new(),
        options: opts,
        cases: cases.to_vec(),
        skipped: Vec::new(),
        targets: Vec::new(),
    };
    markdown(&report)
}
