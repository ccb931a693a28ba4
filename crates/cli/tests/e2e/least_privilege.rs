//! The least-privilege deployment of docs/security.md settles. A period the
//! owner seeded is settled by `settled_worker`, under `--role-per-command`
//! (SET ROLE) and as a login that is only a member of the role (no SET
//! ROLE), in both modes; it archives and verifies under
//! `--role-per-command`. A worker that lacks a grant stops within bounded
//! time with one line naming the table and the role, and fails no item.

use crate::common;

use std::process::Stdio;

use common::{wait_bounded, Env, ProviderSim, LEASED_FAST, PERIOD};

/// Runs `settled ARGS` and requires exit 0 and a verification that holds.
fn verified(env: &Env, args: &[&str]) {
    let out = env.run_ok(args);
    assert!(out.contains("OK, every check holds"), "settled {args:?}: {out}");
}

/// `verify --period PERIOD` against the provider at `provider_url`, under
/// `--role-per-command`: every check holds.
fn verified_with_provider(env: &Env, provider_url: &str) {
    verified(
        env,
        &[
            "--role-per-command",
            "verify",
            "--period",
            PERIOD,
            "--provider-url",
            provider_url,
        ],
    );
}

/// `worker --period PERIOD` in leased mode through the provider at
/// `provider_url`, under `--role-per-command`.
fn leased_worker_args(provider_url: &str) -> Vec<&str> {
    let mut args = vec![
        "--role-per-command",
        "worker",
        "--period",
        PERIOD,
        "--provider-url",
        provider_url,
    ];
    args.extend_from_slice(LEASED_FAST);
    args
}

/// A login that is a member of `role` and nothing else, and its URL on the
/// test's database; dropped with [`Login::drop_in`].
struct Login {
    name: String,
    url: String,
}

impl Login {
    async fn create(env: &Env, role: &str) -> Login {
        let name = format!("{role}_login_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE ROLE {name} LOGIN IN ROLE {role}"))
            .execute(&env.pool)
            .await
            .unwrap();
        let url = env.db.url.replacen("postgres@", &format!("{name}@"), 1);
        Login { name, url }
    }

    /// `settled ARGS` logged in as this login, to completion.
    fn run(&self, env: &Env, args: &[&str]) -> std::process::Output {
        env.cmd(args).env("DATABASE_URL", &self.url).output().unwrap()
    }

    fn run_ok(&self, env: &Env, args: &[&str]) -> String {
        let out = self.run(env, args);
        assert!(
            out.status.success(),
            "settled {args:?} as {}: {}{}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    async fn drop_in(self, env: &Env) {
        // Its rows (the worker registry) stay; a role owns no rows.
        sqlx::query(&format!("DROP ROLE {}", self.name))
            .execute(&env.pool)
            .await
            .unwrap();
    }
}

/// Privileges of `relation` by grantee, table-wide and per column, in one
/// comparable text.
async fn acl(env: &Env, relation: &str) -> String {
    env.scalar_text(&format!(
        "SELECT coalesce(string_agg(g, '; ' ORDER BY g), '') FROM (
             SELECT pg_get_userbyid(a.grantee) || ' ' || a.privilege_type AS g
             FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
             WHERE c.oid = '{relation}'::regclass AND a.grantee <> c.relowner
             UNION ALL
             SELECT pg_get_userbyid(a.grantee) || ' ' || a.privilege_type || ' (' || att.attname || ')'
             FROM pg_attribute att CROSS JOIN LATERAL aclexplode(att.attacl) a
             WHERE att.attrelid = '{relation}'::regclass) grants"
    ))
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_role_settles_in_transaction_mode_and_the_period_archives_and_verifies_under_role_per_command() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "3000"]);
    // The partitions the owner's seed created carry their parents' grants.
    for (parent, partition) in [
        (
            "settlement.token_trade_volume",
            "settlement.token_trade_volume_p20261128",
        ),
        ("settlement.reward_ledger", "settlement.reward_ledger_p20261128"),
    ] {
        let expected = acl(&env, parent).await;
        assert!(expected.contains("settled_worker"), "{expected}");
        assert_eq!(acl(&env, partition).await, expected, "{partition}");
    }
    let out = env.run_ok(&["--role-per-command", "worker", "--period", PERIOD, "--chunk", "500"]);
    assert!(out.contains("settled 3000 creators"), "{out}");
    // It read the partition's statistics (pg_stats shows a role only the
    // columns it may read) and cut the run into key ranges of a chunk each.
    let ranges = env
        .scalar_i64("SELECT count(*) FROM settled_engine.run_key_ranges")
        .await;
    assert!(ranges > 1, "{ranges} key ranges");
    verified(&env, &["--role-per-command", "verify", "--period", PERIOD]);

    let dir = tempfile::tempdir().unwrap();
    let archived = env.run_ok(&[
        "--role-per-command",
        "archive",
        "--before",
        "2026-11-29",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(archived.contains("archived 2026-11-28: 3000 ledger rows"), "{archived}");
    // What the archive keeps has the ledger's grants too.
    assert_eq!(
        acl(&env, "settlement_archive.reward_ledger_p20261128").await,
        acl(&env, "settlement.reward_ledger").await
    );
    let file = dir.path().join("ledger-2026-11-28.csv");
    verified(
        &env,
        &["--role-per-command", "verify", "--archive", file.to_str().unwrap()],
    );
    verified(&env, &["--role-per-command", "verify", "--period", PERIOD]);
    let status = env.run_ok(&["--role-per-command", "status", "--period", PERIOD]);
    assert!(status.contains("run 1 finished"), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_role_settles_in_leased_mode_through_the_provider_under_role_per_command() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "400"]);
    let sim = ProviderSim::start(&[]);
    let args = leased_worker_args(&sim.url);
    let out = env.run_ok(&args);
    assert!(out.contains("settled 400 creators"), "{out}");
    verified_with_provider(&env, &sim.url);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_login_that_is_only_a_member_of_settled_worker_settles_in_both_modes_without_set_role() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-27", "--creators", "2000"]);
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "300"]);
    let login = Login::create(&env, "settled_worker").await;
    // It may not migrate (PostgreSQL 15 gives it no CREATE on public): with
    // every migration applied, it checks them and goes on.
    let out = login.run_ok(&env, &["worker", "--period", "2026-11-27", "--chunk", "500"]);
    assert!(out.contains("settled 2000 creators"), "{out}");
    let sim = ProviderSim::start(&[]);
    let mut args = vec!["worker", "--period", PERIOD, "--provider-url", &sim.url];
    args.extend_from_slice(LEASED_FAST);
    let out = login.run_ok(&env, &args);
    assert!(out.contains("settled 300 creators"), "{out}");
    verified(&env, &["--role-per-command", "verify", "--period", "2026-11-27"]);
    verified_with_provider(&env, &sim.url);
    login.drop_in(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_login_that_may_not_migrate_says_in_one_line_what_to_do_when_a_migration_is_missing() {
    let env = Env::new().await;
    let login = Login::create(&env, "settled_worker").await;
    let latest: i64 = env.scalar_i64("SELECT max(version) FROM public._sqlx_migrations").await;
    let (description, checksum): (String, Vec<u8>) =
        sqlx::query_as("SELECT description, checksum FROM public._sqlx_migrations WHERE version = $1")
            .bind(latest)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    sqlx::query("DELETE FROM public._sqlx_migrations WHERE version = $1")
        .bind(latest)
        .execute(&env.pool)
        .await
        .unwrap();
    let out = login.run(&env, &["worker", "--period", PERIOD]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("lacks migrations this version needs ({latest})"))
            && stderr.contains(&format!("login {} may not apply", login.name))
            && stderr.contains("run `settled migrate` as the owner"),
        "{stderr}"
    );
    // Under --role-per-command, the same in the role's words.
    let out = env.run(&["--role-per-command", "status", "--period", PERIOD]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("role settled_readonly may not apply") && stderr.contains("with the owner role first"),
        "{stderr}"
    );
    sqlx::query(
        "INSERT INTO public._sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, $2, true, $3, 0)",
    )
    .bind(latest)
    .bind(description)
    .bind(checksum)
    .execute(&env.pool)
    .await
    .unwrap();
    // Restored, the same login's worker starts (and finds nothing to seed from).
    let out = login.run_ok(&env, &["runs"]);
    assert!(!out.contains("error"), "{out}");
    login.drop_in(&env).await;
}

/// Starts `settled ARGS` and waits at most `secs` for it to end; returns
/// its exit code and stderr.
fn run_bounded(env: &Env, args: &[&str], secs: u64) -> (Option<i32>, String) {
    let mut child = env
        .cmd(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, secs);
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

/// The one error line of a failed command.
fn error_line(stderr: &str) -> &str {
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    errors[0]
}

/// (eligible items with attempt 0, every other item) of `PERIOD`.
async fn untouched_items(env: &Env) -> (i64, i64) {
    let untouched = env
        .scalar_i64(&format!(
            "SELECT count(*) FROM settlement.token_trade_volume
             WHERE period = '{PERIOD}' AND status = 'eligible' AND attempt = 0"
        ))
        .await;
    let others = env
        .scalar_i64(&format!(
            "SELECT count(*) FROM settlement.token_trade_volume WHERE period = '{PERIOD}' AND status <> 'eligible'"
        ))
        .await;
    (untouched, others)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_without_a_grant_it_needs_stops_in_bounded_time_naming_the_table_and_role_and_fails_no_item() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "1000"]);
    // The grant the first release lacked: the period's own partition.
    sqlx::query("REVOKE ALL ON settlement.token_trade_volume_p20261128 FROM settled_worker")
        .execute(&env.pool)
        .await
        .unwrap();
    let (code, stderr) = run_bounded(
        &env,
        &["--role-per-command", "worker", "--period", PERIOD, "--chunk", "100"],
        60,
    );
    assert_eq!(code, Some(1), "{stderr}");
    let line = error_line(&stderr);
    assert!(
        line.contains("permission denied for table token_trade_volume_p20261128")
            && line.contains("role settled_worker")
            && line.contains("fails no item"),
        "{line}"
    );
    assert_eq!(untouched_items(&env).await, (1000, 0));
    // The daemon, finding the run running, and `run --wait` stop the same way.
    for args in [
        &["--role-per-command", "worker", "--max-poll-ms", "200"][..],
        &["--role-per-command", "run", "--period", PERIOD, "--wait"],
    ] {
        let (code, stderr) = run_bounded(&env, args, 60);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(
            error_line(&stderr).contains("permission denied for table token_trade_volume_p20261128"),
            "{args:?}: {stderr}"
        );
        assert_eq!(untouched_items(&env).await, (1000, 0));
    }

    // In leased mode the claim goes through the parent; the chunk's first
    // read of holds is refused. The leases taken are given back.
    sqlx::query("SELECT settlement.sync_partition_grants()")
        .execute(&env.pool)
        .await
        .unwrap();
    sqlx::query("REVOKE SELECT ON settlement.creator_holds FROM settled_worker")
        .execute(&env.pool)
        .await
        .unwrap();
    let sim = ProviderSim::start(&[]);
    let args = leased_worker_args(&sim.url);
    let (code, stderr) = run_bounded(&env, &args, 60);
    assert_eq!(code, Some(1), "{stderr}");
    let line = error_line(&stderr);
    assert!(
        line.contains("permission denied for table creator_holds") && line.contains("role settled_worker"),
        "{line}"
    );
    assert_eq!(untouched_items(&env).await.1, 0, "no item failed, none left processing");
    assert_eq!(sim.counters().await["applied"], 0, "nothing was paid");

    // Granted again, the same worker settles the period once.
    sqlx::query("GRANT SELECT ON settlement.creator_holds TO settled_worker")
        .execute(&env.pool)
        .await
        .unwrap();
    env.run_ok(&args);
    verified_with_provider(&env, &sim.url);
}
