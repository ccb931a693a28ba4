//! The operator's console tells the truth (#38): a run in progress is never
//! a failed verification, a run whose workers died is `stalled` (on its
//! pages and in `settled runs`), a dead worker's committed work is shown
//! beside its last heartbeat's counters, every dashboard status is HTML
//! with the navigation, and watching pages refresh with a way to stop.

use crate::common;

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

/// The payout ids listed on a `/payouts` page, in order, and its `next` link.
fn listed(page: &str) -> (Vec<i64>, Option<String>) {
    let ids = page
        .split("data-listed=\"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap().parse().unwrap())
        .collect();
    let next = page
        .split("<a rel=\"next\" href=\"")
        .nth(1)
        .map(|s| s.split('"').next().unwrap().replace("&amp;", "&"));
    (ids, next)
}

#[tokio::test(flavor = "multi_thread")]
async fn payouts_are_listed_filtered_and_walked_by_keyset_and_a_payout_page_shows_its_whole_history() {
    const SECRET: &str = "whsec-console";
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "40"]);
    env.run_ok(&["worker", "--period", PERIOD]);
    let server = env.serve_with(TOKEN, &["--provider-webhook-secret", SECRET]).await;
    let sim = common::ProviderSim::start(&[
        "--webhook-url",
        &format!("{}/v1/provider-events", server.base),
        "--webhook-secret",
        SECRET,
        "--failure-rate",
        "0.3",
        "--seed",
        "7",
    ]);
    let creators: Vec<String> =
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance ORDER BY creator LIMIT 30")
            .fetch_all(&env.pool)
            .await
            .unwrap();
    let client = reqwest::Client::new();
    for (i, creator) in creators.iter().enumerate() {
        let r = client
            .post(format!("{}/v1/payouts", server.base))
            .bearer_auth(TOKEN)
            .header("Idempotency-Key", format!("console-{i}"))
            .json(&serde_json::json!({ "creator": creator, "amount": "1" }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let mut deliver = env.deliver(&sim.url, &[]);
    common::wait_until(60, "every payout paid or failed, its webhook received", || async {
        env.scalar_i64(
            "SELECT count(*) FROM settlement.payouts p WHERE status IN ('paid', 'failed')
               AND EXISTS (SELECT 1 FROM settlement.provider_events e WHERE e.payout_id = p.id)",
        )
        .await
            == 30
    })
    .await;
    common::stop(&mut deliver);
    let ids_in = |status: &'static str| {
        let pool = env.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT id FROM settlement.payouts WHERE status = $1 ORDER BY id DESC")
                .bind(status)
                .fetch_all(&pool)
                .await
                .unwrap()
        }
    };
    let (paid, failed) = (ids_in("paid").await, ids_in("failed").await);
    assert!(!paid.is_empty() && !failed.is_empty(), "{paid:?} {failed:?}");

    // The list, newest first under the counts; filters.
    let (status, page, _) = browse(&server, "/payouts").await;
    assert_eq!(status, 200);
    assert!(
        page.find("id=\"state-paid\"").unwrap() < page.find("data-listed=").unwrap(),
        "{page}"
    );
    let (_, page, _) = browse(&server, "/payouts?status=failed").await;
    assert_eq!(listed(&page), (failed.clone(), None), "{page}");
    let (_, page, _) = browse(&server, &format!("/payouts?creator={}", creators[3])).await;
    let one: i64 = env
        .scalar_i64(&format!(
            "SELECT id FROM settlement.payouts WHERE creator = '{}'",
            creators[3]
        ))
        .await;
    assert_eq!(listed(&page).0, vec![one]);
    let (_, page, _) = browse(&server, &format!("/payouts?id={one}")).await;
    assert_eq!(listed(&page).0, vec![one]);
    let (_, page, _) = browse(&server, "/payouts?from=2999-01-01").await;
    assert!(listed(&page).0.is_empty(), "{page}");
    let (status, _, _) = browse(&server, "/payouts?status=lost").await;
    assert_eq!(status, 422, "an unknown state is an invalid field");

    // A keyset walk of the paid ones, 7 at a time, to its end.
    let mut walked = Vec::new();
    let mut next = Some("/payouts?status=paid&limit=7".to_string());
    let mut pages = 0;
    while let Some(path) = next {
        let (status, page, _) = browse(&server, &path).await;
        assert_eq!(status, 200, "{path}");
        let (ids, following) = listed(&page);
        assert!(ids.len() <= 7);
        if following.is_some() {
            assert!(following.as_deref().unwrap().contains("after="), "{following:?}");
        }
        walked.extend(ids);
        next = following;
        pages += 1;
    }
    assert_eq!(walked, paid, "every paid payout once, newest first");
    assert_eq!(pages, paid.len().div_ceil(7).max(1));

    // A paid payout's page: its history with what moved it, the provider's
    // id, the webhook received for it.
    let (status, page, _) = browse(&server, &format!("/payouts/{}", paid[0])).await;
    assert_eq!(status, 200);
    let provider_id = env
        .scalar_text(&format!(
            "SELECT provider_id FROM settlement.payouts WHERE id = {}",
            paid[0]
        ))
        .await;
    let event = env
        .scalar_text(&format!(
            "SELECT id FROM settlement.provider_events WHERE payout_id = {}",
            paid[0]
        ))
        .await;
    for needle in [
        "data-moved-by=\"api\"",
        "data-to=\"queued\"",
        "data-to=\"paid\"",
        provider_id.as_str(),
        event.as_str(),
        "no action",
    ] {
        assert!(page.contains(needle), "{needle}:\n{page}");
    }
    // Paid on the provider's word: the deliverer's answer or its webhook,
    // whichever came first (the other finds it paid and moves nothing).
    let paid_row = page.split("<tr data-to=\"paid\">").nth(1).unwrap();
    assert!(
        ["deliverer", "webhook"]
            .iter()
            .any(|by| paid_row.contains(&format!("data-moved-by=\"{by}\""))),
        "{paid_row}"
    );
    // A failed one's: its funds returned.
    let (_, page, _) = browse(&server, &format!("/payouts/{}", failed[0])).await;
    assert!(
        page.contains("data-to=\"failed\"") && page.contains("data-returned=\"1\""),
        "{page}"
    );
    let (status, _, kind) = browse(&server, "/payouts/999999").await;
    assert_eq!((status, kind.starts_with("text/html")), (404, true));
}

#[tokio::test(flavor = "multi_thread")]
async fn holds_are_listed_placed_and_released_from_the_console() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "5"]);
    env.run_ok(&["worker", "--period", PERIOD]);
    let server = env.serve(TOKEN).await;
    let creator = env
        .scalar_text("SELECT creator FROM settlement.creator_balance ORDER BY creator LIMIT 1")
        .await;
    let (status, page, _) = browse(&server, "/holds").await;
    assert_eq!(status, 200);
    assert!(page.contains("No active holds"), "{page}");
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let place = |token: &'static str| {
        client
            .post(format!("{}/dashboard/holds", server.base))
            .basic_auth("operator", Some(token))
            .form(&[("creator", creator.as_str()), ("reason", "KYC <review>")])
            .send()
    };
    assert_eq!(place("wrong").await.unwrap().status(), 401);
    assert_eq!(place(TOKEN).await.unwrap().status(), 303);
    let (_, page, _) = browse(&server, "/holds").await;
    assert!(page.contains(&creator) && page.contains("KYC &lt;review&gt;"), "{page}");
    let hold = env
        .scalar_i64("SELECT id FROM settlement.creator_holds WHERE released_at IS NULL")
        .await;
    // The creator's page shows it with its release form.
    let (_, page, _) = browse(&server, &format!("/creators/{creator}")).await;
    assert!(page.contains(&format!("/dashboard/holds/{hold}/release")), "{page}");
    assert!(page.contains("data-verdict=\"ok\""), "the verifier's verdict: {page}");
    assert!(
        page.contains("ledger by period") && page.contains(&format!("<td>{PERIOD}</td>")),
        "{page}"
    );
    let r = client
        .post(format!("{}/dashboard/holds/{hold}/release", server.base))
        .basic_auth("operator", Some(TOKEN))
        .form(&[("from", "holds")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.creator_holds WHERE released_at IS NOT NULL")
            .await,
        1
    );
    let (_, page, _) = browse(&server, "/holds").await;
    assert!(page.contains("No active holds"), "{page}");
}

/// `settled tokens create --name NAME --role ROLE`'s stdout: the token alone.
fn make_token(env: &Env, name: &str, role: &str) -> String {
    let out = env.run_ok(&["tokens", "create", "--name", name, "--role", role]);
    let token = out.trim_end_matches('\n');
    assert!(
        !token.contains('\n') && token.starts_with("stl_"),
        "only the token: {out:?}"
    );
    token.to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_answers_every_role_as_the_one_table_says_and_a_revoked_token_is_refused_at_once() {
    use settled::api::routes::{Access, ROUTES};
    use settled::tokens::Role;
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "3"]);
    let creator = env
        .scalar_text("SELECT creator FROM settlement.token_trade_volume ORDER BY creator LIMIT 1")
        .await;
    let server = env.serve(TOKEN).await;
    let tokens: Vec<(Role, String)> = Role::ALL
        .iter()
        .map(|role| (*role, make_token(&env, &format!("t-{role}"), role.as_str())))
        .collect();
    let stored = env.scalar_i64("SELECT count(*) FROM settlement.api_tokens").await;
    assert_eq!(stored, 4);
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM settlement.api_tokens WHERE token_sha256 = ANY($1)")
            .bind(tokens.iter().map(|(_, t)| t.clone()).collect::<Vec<_>>())
            .fetch_one(&env.pool)
            .await
            .unwrap(),
        0,
        "only digests are stored"
    );
    let client = reqwest::Client::new();
    let (mut tried, mut refused_401, mut refused_403, mut allowed) = (0, 0, 0, 0);
    for route in ROUTES {
        let path = route
            .path
            .replace("{id}", "999999")
            .replace("{address}", &creator)
            .replace("{name}", "nope");
        let attempts = std::iter::once(None).chain(tokens.iter().map(|(r, t)| Some((*r, t.as_str()))));
        for attempt in attempts {
            let url = format!("{}{path}", server.base);
            let mut request = match route.method {
                "GET" => client.get(&url),
                _ => client.post(&url).header("content-type", "application/json").body("{}"),
            };
            if let Some((_, token)) = attempt {
                request = request.bearer_auth(token);
            }
            let r = request.send().await.unwrap();
            let status = r.status().as_u16();
            let what = format!("{} {path} as {:?}", route.method, attempt.map(|a| a.0));
            tried += 1;
            match (route.access, attempt) {
                (Access::Open | Access::Signed, _) => {
                    assert!(
                        ![401, 403].contains(&status) || route.access == Access::Signed,
                        "{what}: {status}"
                    );
                    assert_ne!(status, 403, "{what}");
                    allowed += 1;
                }
                (Access::Role(_), None) => {
                    assert_eq!(status, 401, "{what}");
                    assert!(r.headers().contains_key("www-authenticate"), "{what}: a challenge");
                    refused_401 += 1;
                }
                (Access::Role(needed), Some((role, _))) if role < needed => {
                    assert_eq!(status, 403, "{what}");
                    let body = r.text().await.unwrap();
                    assert!(body.contains(&format!("needs the role {needed}")), "{what}: {body}");
                    refused_403 += 1;
                }
                (Access::Role(_), Some(_)) => {
                    assert!(![401, 403, 500].contains(&status), "{what}: {status}");
                    allowed += 1;
                }
            }
        }
    }
    eprintln!(
        "{} routes x (no token + {} roles): {tried} requests, {refused_401} refused 401, {refused_403} refused 403, {allowed} let through",
        ROUTES.len(),
        Role::ALL.len()
    );
    assert_eq!(tried, ROUTES.len() * 5);
    assert!(refused_401 > 0 && refused_403 > 0 && allowed > 0);

    // A browser's Basic password works as the token, and revoking a token
    // stops it at the next request.
    let viewer = &tokens[0].1;
    let basic = client
        .get(format!("{}/v1/queues", server.base))
        .basic_auth("anyone", Some(viewer))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), 200);
    env.run_ok(&["tokens", "revoke", "t-viewer"]);
    let after = client
        .get(format!("{}/v1/queues", server.base))
        .bearer_auth(viewer)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 401, "revoked at once");
    let listed: serde_json::Value = serde_json::from_str(&env.run_ok(&["tokens", "list", "--json"])).unwrap();
    let viewer_row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "t-viewer")
        .unwrap();
    assert!(
        viewer_row["revoked_at"].is_string() && viewer_row["last_used_at"].is_string(),
        "{listed}"
    );
    assert!(!listed.to_string().contains("stl_"), "no token listed: {listed}");
}

#[test]
fn the_documents_table_of_routes_and_roles_is_the_servers() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/api.md")).unwrap();
    let start = doc
        .find("<!-- routes: generated -->")
        .expect("docs/api.md has the table of routes")
        + 26;
    let end = doc[start..].find("<!-- end -->").unwrap() + start;
    assert_eq!(doc[start..end].trim(), settled::api::routes::markdown().trim());
}
