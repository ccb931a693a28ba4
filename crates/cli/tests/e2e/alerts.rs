//! The alerting rules and the dashboard against a real Prometheus (Debian's
//! `prometheus` package): `promtool test rules` unit-tests every rule, and a
//! Prometheus started here scrapes a running `settled serve` and worker
//! daemon, fires the alerts of a late run, a dead worker and a failing
//! verification, and answers every query of the Grafana dashboard.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Duration as Days, Timelike, Utc};
use common::{free_port, Env};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// The rules every deployment loads, and their unit tests beside them.
const RULES: &str = "deploy/prometheus/settled.rules.yml";
const RULES_DIR: &str = "deploy/prometheus";
const DASHBOARD: &str = "deploy/grafana/settled.json";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether CI is set (`CI=true`, as CI runs `.ci/run`).
fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false"))
}

/// The installed tool, or None (the test then says so and passes) only
/// outside CI: under CI a missing tool fails the test.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            !under_ci(),
            "{name} is not installed: CI installs Debian's prometheus package (.ci/run)"
        );
        eprintln!("SKIPPED: {name} is not installed (apt-get install prometheus); with CI set this fails");
    }
    found
}

/// Names following `- alert:` or `- record:` in a rules file.
fn rule_names(rules: &str, kind: &str) -> Vec<String> {
    let key = format!("- {kind}: ");
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix(&key).map(str::to_string))
        .collect()
}

#[test]
fn promtool_unit_tests_pass_and_cover_every_rule_firing_and_not() {
    let Some(promtool) = tool("promtool") else { return };
    let dir = repo().join(RULES_DIR);
    let mut tests: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".test.yml"))
        .collect();
    tests.sort();
    assert!(!tests.is_empty(), "no *.test.yml in {}", dir.display());
    let check = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(repo().join(RULES))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "promtool check rules: {}",
        String::from_utf8_lossy(&check.stdout)
    );
    let out = Command::new(&promtool)
        .args(["test", "rules"])
        .args(&tests)
        .current_dir(&dir)
        .output()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool test rules failed:\n{report}");
    eprintln!("{report}");

    // Every alert has a case where it fires and one where it does not; every
    // recording rule's value is checked.
    let rules = std::fs::read_to_string(repo().join(RULES)).unwrap();
    let cases: String = tests.iter().map(|t| std::fs::read_to_string(t).unwrap()).collect();
    let lines: Vec<&str> = cases.lines().map(str::trim).collect();
    for alert in rule_names(&rules, "alert") {
        let outcomes: Vec<&str> = lines
            .windows(2)
            .filter(|w| w[0] == format!("alertname: {alert}"))
            .map(|w| w[1])
            .collect();
        assert!(
            outcomes.contains(&"exp_alerts: []"),
            "{alert}: no case where it does not fire"
        );
        assert!(outcomes.contains(&"exp_alerts:"), "{alert}: no case where it fires");
    }
    for record in rule_names(&rules, "record") {
        assert!(
            lines.iter().any(|l| l.starts_with("- expr:") && l.contains(&record)),
            "recording rule {record} has no promql_expr_test"
        );
    }
}

/// The production rules with every `for:` set to 0s: the same expressions,
/// firing at the first evaluation that finds them true.
fn rules_without_waiting() -> String {
    let rules = std::fs::read_to_string(repo().join(RULES)).unwrap();
    let mut replaced = 0;
    let text: String = rules
        .lines()
        .map(|line| match line.trim_start().strip_prefix("for: ") {
            Some(_) => {
                replaced += 1;
                format!("{}for: 0s\n", &line[..line.len() - line.trim_start().len()])
            }
            None => format!("{line}\n"),
        })
        .collect();
    assert_eq!(replaced, rule_names(&rules, "alert").len(), "every alert has a `for:`");
    text
}

/// A Prometheus of this test's own: private directory, a free port on
/// 127.0.0.1, one-second scrapes and evaluations. Stopped by its pid.
struct Prometheus {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(binary: &Path, serve_port: u16, worker_port: u16) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("settled.rules.yml");
        std::fs::write(&rules, rules_without_waiting()).unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n\
             \x20 - job_name: settled-serve\n    static_configs:\n      - targets: ['127.0.0.1:{serve_port}']\n\
             \x20 - job_name: settled-worker\n    static_configs:\n      - targets: ['127.0.0.1:{worker_port}']\n",
            rules = rules.display()
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let prometheus = Prometheus {
            child,
            base: format!("http://127.0.0.1:{port}"),
            dir,
        };
        prometheus
            .wait_for("Prometheus to be ready", 60, |p| async move {
                reqwest::get(format!("{}/-/ready", p.base))
                    .await
                    .is_ok_and(|r| r.status() == 200)
            })
            .await;
        prometheus
    }

    fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// `/api/v1/query`: the whole answer, whatever its status.
    async fn query(&self, expr: &str) -> Value {
        reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.base))
            .query(&[("query", expr)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The single value of an instant query, if it has one.
    async fn value(&self, expr: &str) -> Option<f64> {
        let answer = self.query(expr).await;
        let result = answer["data"]["result"].as_array()?;
        match result.as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// Names of the alerts firing now (`/api/v1/alerts`).
    async fn firing(&self) -> Vec<String> {
        let answer: Value = reqwest::get(format!("{}/api/v1/alerts", self.base))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["status"], "success", "{answer}");
        let mut names: Vec<String> = answer["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["state"] == "firing")
            .map(|a| a["labels"]["alertname"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    async fn wait_for<'a, F, Fut>(&'a self, what: &str, secs: u64, check: F)
    where
        F: Fn(&'a Prometheus) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if check(self).await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        panic!("timed out waiting for {what}; prometheus log:\n{}", self.log());
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        settled_testkit::terminate(&mut self.child, Duration::from_secs(20));
    }
}

async fn db_now(env: &Env) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()").fetch_one(&env.pool).await.unwrap()
}

/// Alerts that must not fire while the run is settled and the worker alive.
const HEALTHY_SILENT: &[&str] = &[
    "SettledDatabaseUnreachable",
    "SettledNoLiveWorker",
    "SettledRunLate",
    "SettledTargetDown",
    "SettledVerificationFailing",
];

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_fires_a_late_run_a_dead_worker_and_a_failed_verification_and_answers_the_dashboard() {
    let Some(prometheus_bin) = tool("prometheus") else {
        return;
    };
    let env = Env::new().await;
    // A daily schedule whose last due time was about twelve hours ago, so
    // none falls within the test: the period it made due is the day before.
    let now = db_now(&env).await;
    let fire_hour = (now + Days::hours(12)).hour();
    let mut last_due = now.date_naive().and_hms_opt(fire_hour, 0, 0).unwrap().and_utc();
    if last_due > now {
        last_due -= Days::days(1);
    }
    let due_period = (last_due.date_naive() - Days::days(1)).to_string();
    let old_period = "2020-01-01";
    env.run_ok(&["seed", "--period", &due_period, "--creators", "200"]);
    env.run_ok(&["seed", "--period", old_period, "--creators", "50"]);
    let schedule = format!("0 {fire_hour} * * *");
    let when = ["--schedule", &schedule, "--timezone", "UTC", "--catch-up-days", "1"];

    let serve = env
        .serve_with(
            "alerts-token",
            &[
                when.as_slice(),
                &["--run-deadline-secs", "2", "--verify-every-secs", "1"],
            ]
            .concat(),
        )
        .await;
    let serve_port: u16 = serve.base.rsplit(':').next().unwrap().parse().unwrap();
    let worker_port = free_port();
    let worker_bind = format!("127.0.0.1:{worker_port}");
    let mut worker = env
        .cmd(
            &[
                [
                    "worker",
                    "--concurrency",
                    "1",
                    "--max-poll-ms",
                    "500",
                    "--metrics-bind",
                    &worker_bind,
                ]
                .as_slice(),
                &when,
            ]
            .concat(),
        )
        .stdout(Stdio::null())
        .spawn()
        .expect("start the worker daemon");
    let prometheus = Prometheus::start(&prometheus_bin, serve_port, worker_port).await;

    // Healthy: the daemon settled the due period, is alive and scraped, the
    // verification holds; none of the alerts fires.
    let verified = format!("settled_verification_ok{{period=\"{due_period}\"}}");
    prometheus
        .wait_for("the due period settled, verified, and a live worker", 120, |p| {
            let verified = verified.clone();
            async move {
                p.value("settled_runs{state=\"finished\"}").await == Some(1.0)
                    && p.value("settled_workers_alive").await == Some(1.0)
                    && p.value(&verified).await == Some(1.0)
                    && p.value("settled_run_due_seconds").await == Some(0.0)
                    && p.value("up{job=\"settled-worker\"}").await == Some(1.0)
                    && p.value("min(settled_database_up)").await == Some(1.0)
            }
        })
        .await;
    prometheus
        .wait_for("the healthy alerts to be silent", 30, |p| async move {
            let firing = p.firing().await;
            HEALTHY_SILENT.iter().all(|a| !firing.iter().any(|f| f == a))
        })
        .await;
    let healthy = prometheus.firing().await;
    eprintln!("firing while healthy: {healthy:?}");

    // The worker dies; an operator starts an old period's run that nobody
    // works; a balance is altered behind the ledger's back.
    kill(Pid::from_raw(worker.id() as i32), Signal::SIGKILL).unwrap();
    let _ = worker.wait();
    env.run_ok(&["run", "--period", old_period]);
    sqlx::query(
        "UPDATE settlement.creator_balance SET balance = balance + 1
         WHERE creator = (SELECT creator FROM settlement.reward_ledger ORDER BY creator LIMIT 1)",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let expected = [
        "SettledNoLiveWorker",
        "SettledRunLate",
        "SettledTargetDown",
        "SettledVerificationFailing",
    ];
    // A killed worker counts as alive until its heartbeat is 60 s old.
    prometheus
        .wait_for(
            "the late run, dead worker and verification alerts",
            180,
            |p| async move {
                let firing = p.firing().await;
                expected.iter().all(|a| firing.iter().any(|f| f == a))
            },
        )
        .await;
    let firing = prometheus.firing().await;
    eprintln!("firing after the worker died: {firing:?}");
    assert!(
        !firing.iter().any(|a| a == "SettledDatabaseUnreachable"),
        "the database is up: {firing:?}"
    );
    assert_eq!(
        prometheus.value("sum(settled_runs_due{state=\"running\"})").await,
        Some(1.0)
    );

    // Every dashboard query evaluates without error against this Prometheus.
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(repo().join(DASHBOARD)).unwrap()).unwrap();
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 20, "the dashboard has {} queries", exprs.len());
    let mut with_data = 0;
    for expr in &exprs {
        let answer = prometheus.query(expr).await;
        assert_eq!(answer["status"], "success", "dashboard query {expr}: {answer}");
        with_data += usize::from(answer["data"]["result"].as_array().is_some_and(|r| !r.is_empty()));
    }
    eprintln!("{} dashboard queries evaluated, {with_data} with data", exprs.len());
    drop(prometheus);
    drop(serve);
}

/// Every `expr` string anywhere in the dashboard (panel targets).
fn collect_exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", Value::String(expr)) => out.push(expr.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}
