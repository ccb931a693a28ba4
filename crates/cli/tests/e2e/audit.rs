//! The audit log (#38 item 4): every request that acts, every refusal
//! (counted per actor, action and minute) and every operator command of the
//! CLI leaves one row, written in the transaction of its effect; the roles
//! may add and read rows but never change or remove them.

use crate::common;

use common::{status_of, Env};
use sqlx::{Connection, PgConnection};

const TOKEN: &str = "t0ken";
const PERIOD: &str = "2026-11-28";

/// `settled tokens create`'s token.
fn make_token(env: &Env, name: &str, role: &str) -> String {
    env.run_ok(&["tokens", "create", "--name", name, "--role", role])
        .trim_end()
        .to_string()
}

/// `settled audit --json ARGS`, oldest first.
fn audit_rows(env: &Env, args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec!["audit", "--json"];
    all.extend_from_slice(args);
    let out = env.run_ok(&all);
    let mut rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    rows.reverse();
    rows
}

/// The rows as `actor | action | outcome` lines.
fn lines(rows: &[serde_json::Value]) -> Vec<String> {
    rows.iter()
        .map(|r| {
            for key in ["at", "actor", "action", "target", "outcome"] {
                assert!(r[key].is_string(), "{key} in {r}");
            }
            format!(
                "{} | {} | {}",
                r["actor"].as_str().unwrap(),
                r["action"].as_str().unwrap(),
                r["outcome"].as_str().unwrap()
            )
        })
        .collect()
}

/// Waits until the server has written `n` refusals (it counts them in
/// memory and writes them once a second).
async fn refusals_written(env: &Env, n: i64) {
    common::wait_until(30, "the refusals to be written", || async {
        env.scalar_i64("SELECT coalesce(sum(count), 0)::bigint FROM settlement.audit_log WHERE minute IS NOT NULL")
            .await
            >= n
    })
    .await;
}

async fn creator(env: &Env) -> String {
    env.scalar_text("SELECT creator FROM settlement.creator_balance ORDER BY creator LIMIT 1")
        .await
}

#[tokio::test(flavor = "multi_thread")]
async fn each_role_acting_and_refused_leaves_the_rows_settled_audit_shows() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "5"]);
    env.run_ok(&["worker", "--period", PERIOD]);
    let creator = creator(&env).await;
    let server = env.serve(TOKEN).await;
    let viewer = make_token(&env, "ana", "viewer");
    let app = make_token(&env, "shop", "app");
    let operator = make_token(&env, "ops", "operator");
    let admin = make_token(&env, "boss", "admin");
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let url = |path: &str| format!("{}{path}", server.base);
    let hold = serde_json::json!({ "creator": creator, "reason": "KYC review" });

    // A read leaves no row; a viewer placing a hold is refused (403); no
    // token at all is refused (401).
    assert_eq!(status_of(client.get(url("/v1/queues")).bearer_auth(&viewer)).await, 200);
    assert_eq!(
        status_of(client.post(url("/v1/holds")).bearer_auth(&viewer).json(&hold)).await,
        403
    );
    assert_eq!(status_of(client.post(url("/v1/holds")).json(&hold)).await, 401);
    // The app places a hold; the operator retries from the dashboard and
    // pauses a queue that does not exist (404); the admin releases the hold.
    let r = client
        .post(url("/v1/holds"))
        .bearer_auth(&app)
        .json(&hold)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let hold_id = r.json::<serde_json::Value>().await.unwrap()["id"].as_i64().unwrap();
    assert_eq!(
        status_of(
            client
                .post(url("/dashboard/retry"))
                .basic_auth("x", Some(&operator))
                .form(&[("period", PERIOD), ("creator", creator.as_str())])
        )
        .await,
        303
    );
    assert_eq!(
        status_of(client.post(url("/v1/queues/nope/pause")).bearer_auth(&operator)).await,
        404
    );
    assert_eq!(
        status_of(
            client
                .post(url(&format!("/v1/holds/{hold_id}/release")))
                .bearer_auth(&admin)
        )
        .await,
        200
    );
    // An operator command of the CLI, and a viewer refused the audit log.
    env.run_ok(&["retry", "--period", PERIOD]);
    assert_eq!(
        status_of(client.get(url("/audit")).basic_auth("x", Some(&viewer))).await,
        403
    );
    refusals_written(&env, 3).await;

    let rows = audit_rows(&env, &[]);
    let seen = lines(&rows);
    let whoami = std::process::Command::new("id").arg("-un").output().unwrap();
    let me = format!("cli:postgres/{} |", String::from_utf8_lossy(&whoami.stdout).trim());
    let cli: Vec<&String> = seen.iter().filter(|l| l.starts_with(&me)).collect();
    assert_eq!(cli.len(), 5, "4 tokens made and a retry: {seen:#?}");
    assert!(
        cli[0].ends_with("| tokens create | ok") && cli[4].contains("| retry | ok 0 item(s) retried"),
        "{seen:#?}"
    );
    // Rows that acted in the order they committed; refusals are written
    // within a second, so their place among them varies.
    let server_rows: Vec<&str> = seen
        .iter()
        .filter(|l| !l.starts_with("cli:"))
        .map(String::as_str)
        .collect();
    let (mut refusals, acted): (Vec<&str>, Vec<&str>) = server_rows.iter().partition(|l| l.contains("| refused "));
    assert_eq!(
        acted,
        [
            "shop | POST /v1/holds | ok",
            "ops | POST /dashboard/retry | ok 0 item(s) retried",
            "ops | POST /v1/queues/{name}/pause | failed 404",
            "boss | POST /v1/holds/{id}/release | ok",
        ],
        "{seen:#?}"
    );
    refusals.sort();
    assert_eq!(
        refusals,
        [
            "ana | GET /audit | refused 403",
            "ana | POST /v1/holds | refused 403",
            "anonymous | POST /v1/holds | refused 401",
        ],
        "{seen:#?}"
    );
    let placed = rows.iter().find(|r| r["actor"] == "shop").unwrap();
    assert_eq!(placed["target"], format!("hold {hold_id} creator {creator}"));
    let released = rows.iter().find(|r| r["actor"] == "boss").unwrap();
    assert_eq!(released["target"], format!("/v1/holds/{hold_id}/release"));

    // `/audit` shows the same rows to an operator, walked by keyset.
    let mut shown = Vec::new();
    let mut next = Some("/audit?limit=4".to_string());
    while let Some(path) = next.take() {
        let r = client
            .get(url(&path))
            .basic_auth("x", Some(&operator))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let page = r.text().await.unwrap();
        assert!(!page.contains("<script"), "no script");
        shown.extend(page.match_indices("data-audit=\"").map(|(at, _)| {
            let rest = &page[at + 12..];
            rest[..rest.find('"').unwrap()].parse::<i64>().unwrap()
        }));
        next = page
            .split("rel=\"next\" href=\"")
            .nth(1)
            .map(|rest| rest[..rest.find('"').unwrap()].replace("&amp;", "&"));
    }
    let ids: Vec<i64> = rows.iter().rev().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(shown, ids, "newest first, every row once");
    let r = client
        .get(url("/audit?actor=shop"))
        .basic_auth("x", Some(&operator))
        .send()
        .await
        .unwrap();
    let page = r.text().await.unwrap();
    assert_eq!(page.matches("data-audit=").count(), 1, "{page}");
    assert!(page.contains(&format!("hold {hold_id} creator {creator}")), "{page}");

    // --actor and --since filter.
    assert_eq!(lines(&audit_rows(&env, &["--actor", "ops"])).len(), 2);
    assert_eq!(audit_rows(&env, &["--since", "2999-01-01"]).len(), 0);
    assert_eq!(audit_rows(&env, &["--since", "2000-01-01"]).len(), rows.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_refusals_is_one_row_per_actor_and_route_and_minute_with_a_count() {
    let env = Env::new().await;
    let server = env.serve(TOKEN).await;
    let viewer = make_token(&env, "ana", "viewer");
    let client = reqwest::Client::new();
    const TRIES: i64 = 60;
    for _ in 0..TRIES {
        assert_eq!(
            status_of(
                client
                    .post(format!("{}/v1/holds", server.base))
                    .json(&serde_json::json!({}))
            )
            .await,
            401
        );
        assert_eq!(
            status_of(
                client
                    .post(format!("{}/v1/queues/q/pause", server.base))
                    .bearer_auth(&viewer)
            )
            .await,
            403
        );
        assert_eq!(
            status_of(
                client
                    .get(format!("{}/runs/1", server.base))
                    .bearer_auth("stl_not_a_token")
            )
            .await,
            401
        );
    }
    refusals_written(&env, 3 * TRIES).await;
    for (actor, action) in [
        ("anonymous", "POST /v1/holds"),
        ("ana", "POST /v1/queues/{name}/pause"),
        ("unknown-token", "GET /runs/{id}"),
    ] {
        let (rows, count): (i64, i64) = sqlx::query_as(
            "SELECT count(*), sum(count)::bigint FROM settlement.audit_log WHERE actor = $1 AND action = $2",
        )
        .bind(actor)
        .bind(action)
        .fetch_one(&env.pool)
        .await
        .unwrap();
        // One row, or two when the flood crossed a minute's boundary.
        assert!((1..=2).contains(&rows), "{actor} {action}: {rows} rows");
        assert_eq!(count, TRIES, "{actor} {action}");
    }
    let total = env
        .scalar_i64("SELECT count(*) FROM settlement.audit_log WHERE minute IS NOT NULL")
        .await;
    assert!(total <= 6, "{total} refusal rows");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_roles_add_and_read_audit_rows_but_never_change_or_remove_them() {
    let env = Env::new().await;
    for role in ["settled_api", "settled_worker", "settled_readonly"] {
        let login = format!("audit_login_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE ROLE {login} LOGIN IN ROLE {role}"))
            .execute(&env.pool)
            .await
            .unwrap();
        let url = env.db.url.replacen("postgres@", &format!("{login}@"), 1);
        let mut conn = PgConnection::connect(&url).await.unwrap();
        sqlx::query(&format!("SET ROLE {role}"))
            .execute(&mut conn)
            .await
            .unwrap();
        sqlx::query("INSERT INTO settlement.audit_log (actor, action, target, outcome) VALUES ('me', 'x', '', 'ok')")
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{role} inserts: {e}"));
        sqlx::query("SELECT settlement.audit_refused('me', 'y', '', 'refused 403')")
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{role} counts a refusal: {e}"));
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM settlement.audit_log")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert!(n >= 2, "{role} reads");
        for sql in [
            "UPDATE settlement.audit_log SET outcome = 'forged'",
            "UPDATE settlement.audit_log SET count = count + 1",
            "DELETE FROM settlement.audit_log",
            "TRUNCATE settlement.audit_log",
        ] {
            let err = sqlx::query(sql).execute(&mut conn).await.expect_err(sql);
            let code = err
                .as_database_error()
                .and_then(|e| e.code())
                .unwrap_or_default()
                .into_owned();
            assert_eq!(code, "42501", "{role}: {sql}: {err}");
        }
    }
    let forged = env
        .scalar_i64("SELECT count(*) FROM settlement.audit_log WHERE outcome = 'forged'")
        .await;
    assert_eq!(forged, 0);
    let counted = env
        .scalar_i64("SELECT count FROM settlement.audit_log WHERE action = 'y'")
        .await;
    assert_eq!(counted, 3, "the three roles' refusals in one row of this minute");
}

/// Makes every INSERT into the audit log fail, as a full disk or a broken
/// constraint would.
async fn break_the_audit_log(env: &Env) {
    sqlx::raw_sql(
        "CREATE FUNCTION public.no_audit() RETURNS trigger LANGUAGE plpgsql AS
           $$BEGIN RAISE EXCEPTION 'the audit log refuses rows'; END$$;
         CREATE TRIGGER no_audit BEFORE INSERT ON settlement.audit_log FOR EACH ROW EXECUTE FUNCTION public.no_audit();",
    )
    .execute(&env.pool)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_audit_row_and_its_effect_commit_together_or_not_at_all() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "3"]);
    env.run_ok(&["worker", "--period", PERIOD]);
    let creator = creator(&env).await;
    let server = env.serve(TOKEN).await;
    let client = reqwest::Client::new();
    let hold = serde_json::json!({ "creator": creator, "reason": "KYC review" });
    let place_hold = || {
        status_of(
            client
                .post(format!("{}/v1/holds", server.base))
                .bearer_auth(TOKEN)
                .json(&hold),
        )
    };

    // An effect that fails at its commit (a deferred check) leaves no "ok" row.
    sqlx::raw_sql(
        "CREATE FUNCTION public.no_holds() RETURNS trigger LANGUAGE plpgsql AS
           $$BEGIN RAISE EXCEPTION 'no holds today'; END$$;
         CREATE CONSTRAINT TRIGGER no_holds AFTER INSERT ON settlement.creator_holds
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.no_holds();",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let status = place_hold().await;
    assert!(status.is_server_error(), "{status}");
    assert_eq!(env.scalar_i64("SELECT count(*) FROM settlement.creator_holds").await, 0);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.audit_log WHERE outcome = 'ok'")
            .await,
        0,
        "no row says it happened"
    );
    sqlx::raw_sql("DROP TRIGGER no_holds ON settlement.creator_holds")
        .execute(&env.pool)
        .await
        .unwrap();

    // An audit row that cannot be written takes its effect with it: the
    // API's, and the CLI's.
    break_the_audit_log(&env).await;
    let status = place_hold().await;
    assert!(status.is_server_error(), "{status}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.creator_holds").await,
        0,
        "no hold without its row"
    );
    let out = env.run(&["tokens", "create", "--name", "ghost", "--role", "viewer"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no token printed");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.api_tokens").await,
        0,
        "no token without its row"
    );
    let paused = env.run(&["run", "--period", "2026-11-29", "--cancel"]);
    assert!(!paused.status.success(), "a cancel whose row fails fails");
}
