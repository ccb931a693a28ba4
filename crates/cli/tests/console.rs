//! The operator's console tells the truth (#38): a run in progress is never
//! a failed verification, a run whose workers died is `stalled` (on its
//! pages and in `settled runs`), a dead worker's committed work is shown
//! beside its last heartbeat's counters, every dashboard status is HTML
//! with the navigation, and watching pages refresh with a way to stop.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{Env, Server};

const TOKEN: &str = "t0ken";
const PERIOD: &str = "2026-11-28";

/// GET as a browser asks (Accept: text/html): status, body, content type.
async fn browse(server: &Server, path: &str) -> (u16, String, String) {
    let r = reqwest::Client::new()
        .get(format!("{}{path}", server.base))
        .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
        .basic_auth("operator", Some(TOKEN))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let kind = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = r.text().await.unwrap();
    (status, body, kind)
}

fn runs_json(env: &Env) -> serde_json::Value {
    let out = env.run_ok(&["runs", "--json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The row of `run` on the runs page.
fn run_row(page: &str, run: i64) -> &str {
    let start = page
        .find(&format!("<a href=\"/runs/{run}\">"))
        .unwrap_or_else(|| panic!("run {run} listed:\n{page}"));
    let end = page[start..].find("</tr>").map_or(page.len(), |e| start + e);
    &page[start..end]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_in_progress_is_never_failed_and_once_its_only_worker_is_killed_it_is_stalled_with_its_work_counted() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "20000"]);
    let server = env.serve(TOKEN).await;
    let mut worker = env
        .cmd(&[
            "lab-worker",
            "--period",
            PERIOD,
            "--concurrency",
            "1",
            "--chunk",
            "50",
            "--work-ms",
            "2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    common::wait_until(60, "the run to start paying", || async {
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await > 200
    })
    .await;
    let run = env.scalar_i64("SELECT id FROM settled_engine.runs").await;

    // In progress with a live worker: no FAILED, work not done yet is not
    // an offence, and the run is running (with an ETA) everywhere.
    let (status, page, _) = browse(&server, &format!("/runs/{run}")).await;
    assert_eq!(status, 200);
    assert!(page.contains("in progress"), "{page}");
    assert!(
        !page.contains("FAIL"),
        "a healthy run in progress shows no failure:\n{page}"
    );
    assert!(!page.contains("stalled since"), "{page}");
    let (_, runs, _) = browse(&server, "/").await;
    let row = run_row(&runs, run);
    assert!(row.contains("running") && !row.contains("stalled since"), "{row}");
    assert_eq!(runs_json(&env)[0]["state"], "running");

    // SIGKILL: no clean stop, no last heartbeat.
    worker.kill().unwrap();
    worker.wait().unwrap();
    let committed = env
        .scalar_i64(&format!(
            "SELECT count(*) FROM settlement.reward_ledger WHERE period = '{PERIOD}'"
        ))
        .await;
    let left = env
        .scalar_i64(&format!(
            "SELECT count(*) FROM settlement.token_trade_volume WHERE period = '{PERIOD}' AND status <> 'settled'"
        ))
        .await;
    assert!(
        committed > 0 && left > 0,
        "killed mid-run: {committed} paid, {left} left"
    );

    // A real violation during the run is still shown: a ledger row for an
    // item that is not settled.
    let victim = env
        .scalar_text(&format!(
            "SELECT creator FROM settlement.token_trade_volume WHERE period = '{PERIOD}' AND status = 'eligible'
             ORDER BY creator DESC LIMIT 1"
        ))
        .await;
    sqlx::query("INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt) VALUES ($1::date, $2, 1, $3, 1)")
        .bind(PERIOD)
        .bind(&victim)
        .bind(run)
        .execute(&env.pool)
        .await
        .unwrap();

    // The worker counts as alive until its heartbeat is older than the
    // liveness limit of SettledNoLiveWorker (60 s): wait for it, as an
    // operator would.
    let mut stalled = serde_json::Value::Null;
    for _ in 0..90 {
        stalled = runs_json(&env)[0].clone();
        if stalled["state"] == "stalled" {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(stalled["state"], "stalled", "{stalled}");
    assert!(stalled["stalled_since"].is_string(), "{stalled}");
    assert_eq!(
        env.scalar_text(&format!("SELECT state FROM settled_engine.runs WHERE id = {run}"))
            .await,
        "running",
        "derived when read: the row keeps its state"
    );
    let text = env.run_ok(&["runs"]);
    assert!(text.contains("stalled since"), "{text}");

    let (_, runs, _) = browse(&server, "/").await;
    let row = run_row(&runs, run);
    assert!(row.contains("stalled since"), "{row}");
    assert!(!row.contains(" s</td>"), "a stalled run has no ETA: {row}");
    let (status, page, _) = browse(&server, &format!("/runs/{run}")).await;
    assert_eq!(status, 200);
    assert!(page.contains("stalled since"), "{page}");
    assert!(
        page.contains("FAILED") && page.contains(&format!("{victim} has a ledger row but its item is eligible")),
        "a real violation is shown during the run:\n{page}"
    );
    assert!(
        !page.contains(&format!("{victim} is eligible")),
        "work not done is no offence:\n{page}"
    );

    // The dead worker's row: its counters as of the last heartbeat, labelled,
    // and the committed figure beside them.
    let (_, workers, _) = browse(&server, "/workers").await;
    assert!(workers.contains("dead"), "{workers}");
    assert!(workers.contains("as of the last heartbeat"), "{workers}");
    assert!(
        workers.contains(&format!("data-committed=\"{}\"", committed + 1)),
        "committed {committed} (+ the row inserted above):\n{workers}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_dashboard_status_is_html_with_the_navigation_and_v1_keeps_problem_json() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "3"]);
    let server = env.serve(TOKEN).await;
    for (path, status) in [
        ("/runs/999", 404),
        ("/runs/x", 400),
        ("/no/such/page", 404),
        ("/creators/0x12", 400),
        ("/creators/0x00000000000000000000000000000000000000ff", 404),
    ] {
        let (got, body, kind) = browse(&server, path).await;
        assert_eq!(got, status, "{path}: {body}");
        assert!(kind.starts_with("text/html"), "{path}: {kind}");
        assert!(
            body.contains("<nav>") && body.contains("href=\"/workers\""),
            "{path}: {body}"
        );
    }
    let (got, body, kind) = browse(&server, "/v1/payouts/999999").await;
    assert_eq!(got, 404, "{body}");
    assert_eq!(kind, "application/problem+json");
}

#[tokio::test(flavor = "multi_thread")]
async fn watching_pages_refresh_every_5_s_with_a_link_that_stops_it() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "3"]);
    let server = env.serve(TOKEN).await;
    for path in ["/", "/workers", "/locks", "/payouts", "/queues"] {
        let (status, page, _) = browse(&server, path).await;
        assert_eq!(status, 200, "{path}");
        assert!(
            page.contains("<meta http-equiv=\"refresh\" content=\"5\">"),
            "{path}: {page}"
        );
        assert!(page.contains("refresh=off"), "{path}: a link stops it: {page}");
        let off = if path.contains('?') {
            format!("{path}&refresh=off")
        } else {
            format!("{path}?refresh=off")
        };
        let (status, page, _) = browse(&server, &off).await;
        assert_eq!(status, 200, "{off}");
        assert!(!page.contains("http-equiv=\"refresh\""), "{off}: {page}");
        assert!(
            page.contains("refresh every 5 s"),
            "{off}: a link starts it again: {page}"
        );
    }
}
