//! Least privilege: a `settled_worker` login cannot delete or rewrite ledger
//! rows, even with crafted SQL on its own connection, nor change what an
//! item pays; a `settled_api` login changes a balance only through the
//! payout function; every command runs with the least role it needs.

use crate::common;

use common::Env;
use sqlx::{Connection, PgConnection};

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_login_cannot_delete_or_rewrite_the_ledger() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "50"]);
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let login = format!("worker_login_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE ROLE {login} LOGIN IN ROLE settled_worker"))
        .execute(&env.pool)
        .await
        .unwrap();
    // The same server and database, logged in as the worker.
    let url = env.db.url.replacen("postgres@", &format!("{login}@"), 1);
    let mut worker = PgConnection::connect(&url).await.expect("connect as the worker login");
    let whoami: String = sqlx::query_scalar("SELECT current_user")
        .fetch_one(&mut worker)
        .await
        .unwrap();
    assert_eq!(whoami, login);

    let crafted = [
        "DELETE FROM settlement.reward_ledger",
        "UPDATE settlement.reward_ledger SET amount = amount * 2",
        "TRUNCATE settlement.reward_ledger CASCADE",
        "ALTER TABLE settlement.reward_ledger DISABLE TRIGGER reward_ledger_append_only",
        "DROP TRIGGER reward_ledger_append_only ON settlement.reward_ledger",
        "SET session_replication_role = replica",
        "SET ROLE postgres",
        "DELETE FROM settlement.token_trade_volume",
        "DELETE FROM settlement.creator_balance",
        "DELETE FROM settled_engine.runs",
        "UPDATE settlement.settlement_policy SET fee_bps = 10000",
        "CREATE TABLE settlement.sneaky (x int)",
        "GRANT settled_api TO CURRENT_USER",
    ];
    for sql in crafted {
        let err = sqlx::query(sql).execute(&mut worker).await.expect_err(sql);
        let code = err
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned())
            .unwrap_or_default();
        assert!(
            code == "42501" || code == "42809",
            "{sql}: expected a privilege error, got {code}: {err}"
        );
    }
    // What a worker must do, it can: read its items, claim them.
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM settlement.reward_ledger")
        .fetch_one(&mut worker)
        .await
        .unwrap();
    assert_eq!(n, 50);
    worker.close().await.unwrap();
    sqlx::query(&format!("DROP ROLE {login}"))
        .execute(&env.pool)
        .await
        .unwrap();
    env.run_ok(&["verify", "--period", "2026-11-28"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_run_with_the_least_role_they_need() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "300"]);
    env.run_ok(&[
        "--role-per-command",
        "lab-worker",
        "--period",
        "2026-11-28",
        "--mode",
        "leased",
        "--lease-ttl-ms",
        "2000",
    ]);
    env.run_ok(&["--role-per-command", "verify", "--period", "2026-11-28"]);
    let out = env.run_ok(&["--role-per-command", "runs"]);
    assert!(out.contains("finished"), "{out}");
    // The readonly role really is read-only: a write through it fails.
    let out = env.run(&["--role-per-command", "status", "--period", "2026-11-28"]);
    assert!(out.status.success());
    let mut conn = PgConnection::connect(&env.db.url).await.unwrap();
    sqlx::query("SET ROLE settled_readonly")
        .execute(&mut conn)
        .await
        .unwrap();
    let err = sqlx::query("UPDATE settlement.creator_balance SET balance = 0")
        .execute(&mut conn)
        .await
        .unwrap_err();
    assert_eq!(err.as_database_error().unwrap().code().unwrap(), "42501");
}

/// A connection logged in as a new login that is a member of `role` only
/// (and the login's name, to drop it).
async fn login_as(env: &Env, role: &str) -> (PgConnection, String) {
    let login = format!("{role}_login_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(&format!("CREATE ROLE {login} LOGIN IN ROLE {role}"))
        .execute(&env.pool)
        .await
        .unwrap();
    let url = env.db.url.replacen("postgres@", &format!("{login}@"), 1);
    (PgConnection::connect(&url).await.unwrap(), login)
}

async fn drop_login(env: &Env, conn: PgConnection, login: &str) {
    conn.close().await.unwrap();
    sqlx::query(&format!("DROP ROLE {login}"))
        .execute(&env.pool)
        .await
        .unwrap();
}

/// The SQLSTATE of `sql` on `conn`, or "ok".
async fn outcome(conn: &mut PgConnection, sql: &str) -> String {
    match sqlx::query(sql).execute(&mut *conn).await {
        Ok(_) => "ok".into(),
        Err(err) => err
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned())
            .unwrap_or_else(|| err.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_role_may_not_change_what_an_item_pays() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "20"]);
    let (mut worker, login) = login_as(&env, "settled_worker").await;
    let one = "(SELECT creator FROM settlement.token_trade_volume ORDER BY creator LIMIT 1)";
    for table in [
        "settlement.token_trade_volume",
        "settlement.token_trade_volume_p20261128",
    ] {
        for set in [
            "volume = 10::numeric ^ 70",
            "period = '2026-11-27'",
            "creator = '0x00000000000000000000000000000000000000aa'",
            "attempt_base = attempt",
            "created_at = now()",
        ] {
            let sql = format!("UPDATE {table} SET {set} WHERE creator = {one}");
            assert_eq!(outcome(&mut worker, &sql).await, "42501", "{sql}");
        }
    }
    // What its statements write, it may (here in a transaction rolled back).
    sqlx::query("BEGIN").execute(&mut worker).await.unwrap();
    let sql = format!(
        "UPDATE settlement.token_trade_volume_p20261128
         SET status = 'eligible', attempt = attempt, fence_epoch = 0, lease_owner = NULL, lease_until = NULL,
             not_before = NULL, last_error = NULL, updated_at = now()
         WHERE creator = {one}"
    );
    assert_eq!(outcome(&mut worker, &sql).await, "ok", "{sql}");
    sqlx::query("ROLLBACK").execute(&mut worker).await.unwrap();
    drop_login(&env, worker, &login).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_api_role_changes_a_balance_only_through_the_payout_function() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "20"]);
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let (creator, balance): (String, String) = sqlx::query_as(
        "SELECT creator, balance::text FROM settlement.creator_balance WHERE balance > 10 ORDER BY creator LIMIT 1",
    )
    .fetch_one(&env.pool)
    .await
    .unwrap();
    let (mut api, login) = login_as(&env, "settled_api").await;
    for sql in [
        format!("UPDATE settlement.creator_balance SET balance = balance * 1000 WHERE creator = '{creator}'"),
        "INSERT INTO settlement.creator_balance (creator, balance) VALUES ('0x00000000000000000000000000000000000000aa', 10)"
            .to_string(),
        format!(
            "INSERT INTO settlement.payouts (creator, amount, idempotency_key, request_hash) VALUES ('{creator}', 1, 'k', 'h')"
        ),
        format!("INSERT INTO settlement.creator_holds (creator, reason) VALUES ('{creator}', 'r')"),
        format!("SELECT 1 FROM settlement.creator_balance WHERE creator = '{creator}' FOR NO KEY UPDATE"),
    ] {
        assert_eq!(outcome(&mut api, &sql).await, "42501", "{sql}");
    }
    let debit = |amount: &str| {
        format!("SELECT outcome, balance_before::text FROM settlement.debit_for_payout('{creator}', {amount}, 'key-{amount}', 'h', NULL, NULL, NULL)")
    };
    // More than the balance, or not above zero: refused, nothing changes.
    let (said, before): (String, Option<String>) = sqlx::query_as(&debit(&format!("{balance} + 1")))
        .fetch_one(&mut api)
        .await
        .unwrap();
    assert_eq!(
        (said.as_str(), before.as_deref()),
        ("insufficient_funds", Some(balance.as_str()))
    );
    assert_eq!(outcome(&mut api, &debit("-5")).await, "23514");
    assert_eq!(outcome(&mut api, &debit("0")).await, "23514");
    let (said, _): (String, Option<String>) = sqlx::query_as(&debit("7")).fetch_one(&mut api).await.unwrap();
    assert_eq!(said, "paid");
    let after = env
        .scalar_text(&format!(
            "SELECT (balance + 7)::text FROM settlement.creator_balance WHERE creator = '{creator}'"
        ))
        .await;
    assert_eq!(after, balance);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payouts WHERE amount = 7")
            .await,
        1
    );
    drop_login(&env, api, &login).await;
    // Nobody else may call it.
    let (mut worker, login) = login_as(&env, "settled_worker").await;
    assert_eq!(outcome(&mut worker, &debit("1")).await, "42501");
    drop_login(&env, worker, &login).await;
    env.run_ok(&["--role-per-command", "verify", "--period", "2026-11-28"]);
}

/// Payouts made as the owner for the role tests: one `sent` whose provider
/// payment is `pay-real`, one `queued`, one `created` awaiting `token`.
async fn payouts_in_three_states(env: &Env, token: uuid::Uuid) -> (i64, i64, i64) {
    let creator = env
        .scalar_text("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1")
        .await;
    sqlx::query(
        "INSERT INTO settled_engine.once_tokens (id, purpose, subject, expires_at)
         VALUES ($1, 'payout-confirmation', 'roles-created', now() + interval '1 hour')",
    )
    .bind(token)
    .execute(&env.pool)
    .await
    .unwrap();
    let mut ids = Vec::new();
    for (key, token) in [
        ("roles-sent", None),
        ("roles-queued", None),
        ("roles-created", Some(token)),
    ] {
        let id: i64 = sqlx::query_scalar(
            "SELECT payout_id FROM settlement.debit_for_payout($1, 100, $2, 'h', $3,
                 CASE WHEN $3::uuid IS NULL THEN NULL ELSE now() + interval '1 hour' END, NULL)",
        )
        .bind(&creator)
        .bind(key)
        .bind(token)
        .fetch_one(&env.pool)
        .await
        .unwrap();
        ids.push(id);
    }
    let moved: bool =
        sqlx::query_scalar("SELECT settlement.move_payout($1, ARRAY['queued'], 'sent', 'test', 'pay-real')")
            .bind(ids[0])
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert!(moved);
    (ids[0], ids[1], ids[2])
}

#[tokio::test(flavor = "multi_thread")]
async fn api_and_worker_logins_move_a_payout_only_through_the_functions_of_their_purpose() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "20"]);
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let token = uuid::Uuid::new_v4();
    let (sent, queued, created) = payouts_in_three_states(&env, token).await;
    let balances = "SELECT sum(balance)::text FROM settlement.creator_balance";
    let before = env.scalar_text(balances).await;
    for role in ["settled_api", "settled_worker"] {
        let (mut conn, login) = login_as(&env, role).await;
        // The function that makes any allowed move is the owner's alone:
        // no failure of a payout the provider pays, no confirmation without
        // the token, no payout marked paid that was never delivered.
        for sql in [
            format!("SELECT settlement.move_payout({sent}, ARRAY['sent'], 'failed', 'x', NULL)"),
            format!("SELECT settlement.move_payout({created}, ARRAY['created'], 'queued', 'x', NULL)"),
            format!("SELECT settlement.move_payout({queued}, ARRAY['queued'], 'paid', 'x', 'pay-made-up')"),
            format!("UPDATE settlement.payout_jobs SET payout_id = payout_id + 1000 WHERE payout_id = {queued}"),
            "UPDATE settlement.payout_jobs SET payload = '{\"x\": 1}'".to_string(),
        ] {
            assert_eq!(outcome(&mut conn, &sql).await, "42501", "{role}: {sql}");
        }
        // A queued payout's delivery job is settled only with the
        // provider's answer that moves the payout.
        let sql = format!("UPDATE settlement.payout_jobs SET status = 'settled' WHERE payout_id = {queued}");
        assert_eq!(outcome(&mut conn, &sql).await, "55006", "{role}: {sql}");
        // The provider's word names the payment the payout records, and
        // one no other payout holds: anything else is a conflict, recorded.
        for (id, status, payment) in [
            (sent, "failed", "pay-other"),
            (sent, "paid", "pay-other"),
            (queued, "paid", "pay-real"),
            (created, "paid", "pay-new"),
        ] {
            let said: String =
                sqlx::query_scalar("SELECT settlement.apply_provider_word($1, $2, $3, 'forged', 'webhook', NULL)")
                    .bind(id)
                    .bind(status)
                    .bind(payment)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap();
            assert_eq!(said, "conflict", "{role}: {status} {payment} of payout {id}");
        }
        let api_only = [
            format!(
                "SELECT * FROM settlement.confirm_payout({created}, '{}')",
                uuid::Uuid::new_v4()
            ),
            format!("SELECT * FROM settlement.cancel_payout({queued})"),
        ];
        let worker_only = [
            format!("SELECT settlement.fail_refused_payout({queued}, 'x')"),
            format!("SELECT settlement.record_payment_clash({queued}, 'pay-real', 'paid', 'delivery', NULL)"),
        ];
        let (mine, theirs) = if role == "settled_api" {
            (api_only, worker_only)
        } else {
            (worker_only, api_only)
        };
        for sql in theirs {
            assert_eq!(outcome(&mut conn, &sql).await, "42501", "{role}: {sql}");
        }
        if role == "settled_api" {
            // A wrong token confirms nothing; a queued payout is not cancelled.
            let mut said = Vec::new();
            for sql in &mine {
                let (outcome, status): (String, String) =
                    sqlx::query_as(&sql.replacen('*', "outcome, payout_status", 1))
                        .fetch_one(&mut conn)
                        .await
                        .unwrap();
                said.push(format!("{outcome} {status}"));
            }
            assert_eq!(said, ["refused created", "not_cancellable queued"]);
        }
        drop_login(&env, conn, &login).await;
    }
    let states = env
        .scalar_text(&format!(
            "SELECT string_agg(id || ':' || status || ':' || coalesce(provider_id, '-'), ' ' ORDER BY id)
             FROM settlement.payouts WHERE id IN ({sent}, {queued}, {created})"
        ))
        .await;
    assert_eq!(
        states,
        format!("{sent}:sent:pay-real {queued}:queued:- {created}:created:-")
    );
    assert_eq!(env.scalar_text(balances).await, before, "no funds came back");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payout_returns").await,
        0
    );
    // The API with the payout's own token confirms it.
    let (mut api, login) = login_as(&env, "settled_api").await;
    let said: String = sqlx::query_scalar("SELECT outcome FROM settlement.confirm_payout($1, $2)")
        .bind(created)
        .bind(token)
        .fetch_one(&mut api)
        .await
        .unwrap();
    assert_eq!(said, "confirmed");
    drop_login(&env, api, &login).await;
    env.run_ok(&["--role-per-command", "verify", "--payouts"]);
    // The recorded payment is never replaced, not even by the owner.
    for sql in [
        format!("UPDATE settlement.payouts SET provider_id = 'pay-other' WHERE id = {sent}"),
        format!("SELECT settlement.move_payout({sent}, ARRAY['sent'], 'paid', 'x', 'pay-other')"),
    ] {
        let err = sqlx::query(&sql).execute(&env.pool).await.expect_err(&sql);
        let err = err.as_database_error().unwrap();
        assert_eq!(
            (err.code().as_deref(), err.constraint()),
            (Some("23514"), Some("payouts_provider_id_fixed")),
            "{sql}: {err}"
        );
    }
    // A queued payout's job settled behind the triggers' back (the owner,
    // with triggers off) strands its funds: verify names it.
    sqlx::raw_sql(&format!(
        "SET session_replication_role = replica;
         UPDATE settlement.payout_jobs SET status = 'settled' WHERE payout_id = {queued};
         RESET session_replication_role;"
    ))
    .execute(&env.pool)
    .await
    .unwrap();
    let out = env.run(&["--role-per-command", "verify", "--payouts"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("payout {queued} is queued, its delivery job is settled")),
        "{text}"
    );
}

/// The grants of the three roles as the catalog has them, as a Markdown
/// table: one row per role and table (table-wide privileges, then column
/// ones: `UPDATE (a, b)`) or function (`EXECUTE`).
async fn grants_table(env: &Env) -> String {
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "WITH grants AS (
             SELECT r.rolname AS role, n.nspname || '.' || c.relname AS tbl, a.privilege_type AS privilege
             FROM pg_class c
             JOIN pg_namespace n ON n.oid = c.relnamespace
             CROSS JOIN LATERAL aclexplode(c.relacl) a
             JOIN pg_roles r ON r.oid = a.grantee
             WHERE r.rolname IN ('settled_worker', 'settled_api', 'settled_readonly')
             UNION ALL
             SELECT r.rolname, n.nspname || '.' || c.relname,
                    a.privilege_type || ' (' || string_agg(att.attname, ', ' ORDER BY att.attnum) || ')'
             FROM pg_attribute att
             JOIN pg_class c ON c.oid = att.attrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             CROSS JOIN LATERAL aclexplode(att.attacl) a
             JOIN pg_roles r ON r.oid = a.grantee
             WHERE r.rolname IN ('settled_worker', 'settled_api', 'settled_readonly')
             GROUP BY r.rolname, n.nspname, c.relname, a.privilege_type
             UNION ALL
             SELECT r.rolname, p.oid::regprocedure::text, a.privilege_type
             FROM pg_proc p
             CROSS JOIN LATERAL aclexplode(p.proacl) a
             JOIN pg_roles r ON r.oid = a.grantee
             WHERE r.rolname IN ('settled_worker', 'settled_api', 'settled_readonly')
         )
         SELECT role, tbl, string_agg(privilege, ', ' ORDER BY privilege ~ '\\(', privilege)
         FROM grants GROUP BY role, tbl
         ORDER BY array_position(ARRAY['settled_worker', 'settled_api', 'settled_readonly'], role), tbl",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let mut out = String::from("| role | table or function | privileges |\n|---|---|---|\n");
    for (role, table, privileges) in rows {
        out.push_str(&format!("| `{role}` | `{table}` | {privileges} |\n"));
    }
    out
}

const GRANTS_BEGIN: &str = "<!-- grants: generated from the catalog; checked by tests/e2e/security.rs -->\n";
const GRANTS_END: &str = "<!-- end of grants -->";
const SECURITY_DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/security.md");

fn documented_grants() -> (String, usize, usize) {
    let doc = std::fs::read_to_string(SECURITY_DOC).unwrap();
    let begin = doc.find(GRANTS_BEGIN).expect("the grants section's start marker") + GRANTS_BEGIN.len();
    let end = doc.find(GRANTS_END).expect("the grants section's end marker");
    (doc, begin, end)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_documented_grants_are_the_grants_the_migrations_make() {
    let env = Env::new().await;
    let actual = grants_table(&env).await;
    let (doc, begin, end) = documented_grants();
    assert_eq!(
        &doc[begin..end],
        actual,
        "docs/security.md's grants differ from the catalog's; regenerate with \
         `cargo test -p settled-cli --test e2e -- --ignored security::write_the_documented_grants`"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "writes docs/security.md"]
async fn write_the_documented_grants() {
    let env = Env::new().await;
    let actual = grants_table(&env).await;
    let (doc, begin, end) = documented_grants();
    std::fs::write(SECURITY_DOC, format!("{}{actual}{}", &doc[..begin], &doc[end..])).unwrap();
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn the_product_reaches_the_engine_only_through_its_api_never_its_tables() {
    // Spelled in two parts, so this file is no offender itself.
    let engine_name = ["settled_engine", "."].concat();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../settled/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 50, "the product's sources under {}", src.display());
    let offenders: Vec<String> = files
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            let path = path.display().to_string();
            text.lines()
                .enumerate()
                .filter(|(_, line)| line.contains(&engine_name))
                .map(|(n, line)| format!("{path}:{}: {}", n + 1, line.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "the product names the engine's schema (use the engine's API instead):\n{}",
        offenders.join("\n")
    );
}
