//! The ledger refuses a second payment and any edit; verify catches every
//! kind of tampering, a volume changed after its import included; the
//! database's reward arithmetic equals Rust's, and its creator check accepts
//! exactly the address form.

use crate::common;

use common::{Env, PERIOD};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use settled::money::{reward, Amount, FeeBps, U256};

async fn settled_period(creators: &str) -> Env {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", creators, "--fee-bps", "250"]);
    env.run_ok(&["worker", "--period", PERIOD]);
    env.run_ok(&["verify", "--period", PERIOD]);
    env
}

fn sqlstate(err: &sqlx::Error) -> String {
    err.as_database_error()
        .and_then(|e| e.code())
        .map(|c| c.into_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_refuses_a_second_row_and_any_edit() {
    let env = settled_period("50").await;
    let creator = env
        .scalar_text("SELECT creator FROM settlement.reward_ledger ORDER BY creator LIMIT 1")
        .await;
    let run_id = env.scalar_i64("SELECT id FROM settled_engine.runs").await;

    let second = sqlx::query(
        "INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt)
         VALUES ('2026-11-28', $1, 1, $2, 9)",
    )
    .bind(&creator)
    .bind(run_id)
    .execute(&env.pool)
    .await
    .unwrap_err();
    assert_eq!(sqlstate(&second), "23505", "{second}");

    for statement in [
        "UPDATE settlement.reward_ledger SET amount = amount + 1 WHERE creator = $1",
        "DELETE FROM settlement.reward_ledger WHERE creator = $1",
    ] {
        let err = sqlx::query(statement)
            .bind(&creator)
            .execute(&env.pool)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("append-only"), "{statement}: {err}");
    }
    let err = sqlx::query("TRUNCATE settlement.reward_ledger CASCADE")
        .execute(&env.pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("append-only"), "{err}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger").await,
        50
    );
    env.run_ok(&["verify", "--period", PERIOD]);
}

/// Runs `tamper` with triggers and foreign keys off (what only a superuser
/// could do), then expects verify to fail naming `check`.
async fn expect_verify_to_catch(tamper: &str, check: &str) {
    let env = settled_period("200").await;
    let mut conn = env.pool.acquire().await.unwrap();
    sqlx::query("SET session_replication_role = replica")
        .execute(&mut *conn)
        .await
        .unwrap();
    let changed = sqlx::query(tamper).execute(&mut *conn).await.unwrap().rows_affected();
    assert_eq!(changed, 1, "{tamper}");
    sqlx::query("RESET session_replication_role")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);

    let out = env.run(&["verify", "--period", PERIOD, "--json"]);
    assert_eq!(out.status.code(), Some(1), "verify passed after: {tamper}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    let failed = common::failed_checks(&report);
    assert!(failed.contains(&check), "{tamper}: failed checks {failed:?}");
    let offenders = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == check)
        .unwrap()["offenders"]
        .as_array()
        .unwrap()
        .len();
    assert!(offenders >= 1);
    let human = env.run(&["verify", "--period", PERIOD]);
    assert_eq!(human.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&human.stdout).contains("FAIL"));
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_fails_on_a_deleted_item() {
    expect_verify_to_catch(
        "DELETE FROM settlement.token_trade_volume
         WHERE (period, creator) = (SELECT period, creator FROM settlement.token_trade_volume ORDER BY creator LIMIT 1)",
        "ledger_rows_have_settled_items",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_fails_on_an_altered_amount() {
    expect_verify_to_catch(
        "UPDATE settlement.reward_ledger SET amount = amount + 1
         WHERE creator = (SELECT creator FROM settlement.reward_ledger ORDER BY creator LIMIT 1)",
        "amounts_follow_policy",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_fails_on_a_duplicated_balance_credit() {
    expect_verify_to_catch(
        "UPDATE settlement.creator_balance b SET balance = b.balance + l.amount
         FROM settlement.reward_ledger l
         WHERE l.creator = b.creator AND l.amount > 0
           AND b.creator = (SELECT creator FROM settlement.reward_ledger WHERE amount > 0 ORDER BY creator LIMIT 1)",
        "balances_equal_ledger",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_fails_on_a_settled_item_without_payment() {
    expect_verify_to_catch(
        "INSERT INTO settlement.token_trade_volume (period, creator, volume, status, attempt)
         VALUES ('2026-11-28', '0x00000000000000000000000000000000000000aa', 5, 'settled', 1)",
        "settled_items_have_one_ledger_row",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_fails_on_a_volume_changed_after_settling() {
    expect_verify_to_catch(
        "UPDATE settlement.token_trade_volume SET volume = volume + 1
         WHERE creator = (SELECT creator FROM settlement.token_trade_volume ORDER BY creator LIMIT 1)",
        "items_match_their_input",
    )
    .await;
}

/// The probe of issue 24: a volume raised to 10^70 between seed and run is
/// paid by the policy, so every amount follows it; only the input's record
/// can tell.
#[tokio::test(flavor = "multi_thread")]
async fn a_volume_raised_before_the_run_is_paid_and_verify_names_the_changed_input() {
    let env = Env::new().await;
    env.seed(50);
    sqlx::query(
        "UPDATE settlement.token_trade_volume SET volume = 10::numeric ^ 70
         WHERE creator = (SELECT creator FROM settlement.token_trade_volume ORDER BY creator LIMIT 1)",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    env.run_ok(&["worker", "--period", PERIOD]);
    let out = env.run(&["--role-per-command", "verify", "--period", PERIOD, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let failed = common::failed_checks(&report);
    assert_eq!(failed, ["items_match_their_input"], "{report}");
    let human = env.run(&["verify", "--period", PERIOD]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("[FAIL] items_match_their_input") && text.contains("seed and import wrote 50"),
        "{text}"
    );
}

fn any_amount() -> impl Strategy<Value = Amount> {
    prop_oneof![
        any::<[u64; 4]>().prop_map(|l| Amount::from_u256(U256::from_limbs(l))),
        any::<u64>().prop_map(|v| Amount::from_u256(U256::from(v))),
        (0u64..1_000_000).prop_map(|d| Amount::from_u256(U256::MAX - U256::from(d))),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn the_database_formula_equals_the_rust_formula_over_the_whole_range() {
    let env = Env::new().await;
    let cases: Vec<(Amount, u16)> = proptest::collection::vec((any_amount(), 0u16..=10_000), 5_000)
        .new_tree(&mut proptest::test_runner::TestRunner::deterministic())
        .unwrap()
        .current();
    let volumes: Vec<String> = cases.iter().map(|(v, _)| v.to_string()).collect();
    let fees: Vec<i32> = cases.iter().map(|(_, f)| i32::from(*f)).collect();
    // The one SQL formula every statement calls, on NUMERIC(78,0).
    let rewards: Vec<String> = sqlx::query_scalar(
        "SELECT settlement.reward(v::numeric(78,0), f)::text
         FROM unnest($1::text[], $2::int[]) WITH ORDINALITY AS x(v, f, n) ORDER BY n",
    )
    .bind(&volumes)
    .bind(&fees)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    for ((volume, fee), from_db) in cases.iter().zip(rewards) {
        let ours = reward(*volume, FeeBps::new(u32::from(*fee)).unwrap());
        assert_eq!(ours.to_string(), from_db, "volume {volume} fee {fee}");
    }
}

/// Strings near the address form: right and wrong lengths, cases, prefixes,
/// multibyte characters, whitespace and newlines.
fn near_addresses() -> impl Strategy<Value = String> {
    prop_oneof![
        "0x[0-9a-f]{40}",
        "0x[0-9a-fA-F]{38,42}",
        "[0xX ]{0,3}[0-9a-fg]{39,41}[\\n ]?",
        "0x[0-9a-f]{0,40}[é€x\\t]?[0-9a-f]{0,40}",
        "\\PC{0,44}",
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn the_creator_check_accepts_exactly_the_address_form_in_every_table() {
    // The check is said without a regular expression (it runs on every
    // update of a work row); it must accept exactly what the regular
    // expression it replaced accepted, which is the address parser's
    // lowercase form.
    let env = Env::new().await;
    let mut strings: Vec<String> = proptest::collection::vec(near_addresses(), 5_000)
        .new_tree(&mut proptest::test_runner::TestRunner::deterministic())
        .unwrap()
        .current();
    strings.extend(
        [
            "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed",
            "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaed\n",
            "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beae",
            "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaedd",
            "0X5aaeb6053f3e94c9b9a09f33669435e7ef1beaed",
            "005aaeb6053f3e94c9b9a09f33669435e7ef1beaed",
            "0x5AAEB6053F3E94C9B9A09F33669435E7EF1BEAED",
            "0x5aaeb6053f3e94c9b9a09f33669435e7ef1beaé",
            "0x0x5aaeb6053f3e94c9b9a09f33669435e7ef1bea",
            " 0x5aaeb6053f3e94c9b9a09f33669435e7ef1bead",
            "0x",
            "",
        ]
        .map(String::from),
    );
    let checks: Vec<(String, String)> = sqlx::query_as(
        "SELECT conrelid::regclass::text, pg_get_expr(conbin, conrelid) FROM pg_constraint
         WHERE contype = 'c' AND conname LIKE '%creator_check' AND connamespace = 'settlement'::regnamespace
           AND NOT conrelid::regclass::text LIKE '%\\_p2%' ORDER BY 1",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let tables: Vec<&str> = checks.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        tables,
        [
            "settlement.creator_balance",
            "settlement.creator_holds",
            "settlement.ledger_carry",
            "settlement.payouts",
            "settlement.token_trade_volume"
        ]
    );
    for (table, expr) in &checks {
        assert!(!expr.contains('~'), "{table}: {expr}");
        // The table's own check expression against the regular expression,
        // over every string.
        let differing: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT creator FROM unnest($1::text[]) AS t(creator)
             WHERE ({expr}) IS DISTINCT FROM (creator ~ '^0x[0-9a-f]{{40}}$')"
        ))
        .bind(&strings)
        .fetch_all(&env.pool)
        .await
        .unwrap();
        assert!(
            differing.is_empty(),
            "{table}: {} strings judged unlike the regular expression, such as {:?}",
            differing.len(),
            &differing[..differing.len().min(5)]
        );
    }
    let accepted: Vec<String> = sqlx::query_scalar(&format!(
        "SELECT creator FROM unnest($1::text[]) AS t(creator) WHERE {}",
        checks[0].1
    ))
    .bind(&strings)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert!(
        accepted.len() > 500,
        "too few addresses among the strings: {}",
        accepted.len()
    );
    let accepted: std::collections::HashSet<String> = accepted.into_iter().collect();
    for s in &strings {
        let parsed = settled::address::CreatorAddress::parse(s).map(|a| a.as_str() == s);
        assert_eq!(accepted.contains(s), parsed == Ok(true), "{s:?}");
    }
    // And the check is what refuses a row: a balance one hex digit short.
    let err = sqlx::query("INSERT INTO settlement.creator_balance (creator, balance) VALUES ($1, 0)")
        .bind("0x5aaeb6053f3e94c9b9a09f33669435e7ef1beae")
        .execute(&env.pool)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "23514", "{err}");
    assert!(err.to_string().contains("creator_balance_creator_check"), "{err}");
}

/// Every ledger row (creator, amount, run, fence) and balance of a period
/// settled by `worker_args`, on a database seeded like every other here.
async fn settled_by(worker_args: &[&str]) -> (Vec<(String, String, i64, i32)>, Vec<(String, String)>) {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", PERIOD, "--creators", "300", "--fee-bps", "250"]);
    // 120 of the creators paid before, in an earlier period (the same seed
    // makes the same addresses): their balances are raised, the others'
    // opened.
    env.run_ok(&[
        "seed",
        "--period",
        "2026-11-27",
        "--creators",
        "120",
        "--fee-bps",
        "250",
    ]);
    env.run_ok(&["worker", "--period", "2026-11-27"]);
    env.run_ok(worker_args);
    env.run_ok(&["verify", "--period", PERIOD]);
    let ledger = sqlx::query_as(
        "SELECT creator, amount::text, run_id, attempt FROM settlement.reward_ledger
         WHERE period = '2026-11-28' ORDER BY creator",
    )
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let balances = sqlx::query_as("SELECT creator, balance::text FROM settlement.creator_balance ORDER BY creator")
        .fetch_all(&env.pool)
        .await
        .unwrap();
    (ledger, balances)
}

/// The one rule of what paying a chunk writes (`CHUNK_EFFECTS_SQL`) has two
/// callers in tx mode: the engine's one-statement chunk (`worker`) and the
/// several-statement path (`handle_chunk`, which the lab's simulated work
/// takes, as leased completion does). The same period settled both ways
/// writes the same ledger rows and balances.
#[tokio::test(flavor = "multi_thread")]
async fn a_period_paid_in_one_statement_per_chunk_or_in_several_writes_the_same_ledger_and_balances() {
    let one = settled_by(&["worker", "--period", PERIOD, "--chunk", "50"]).await;
    let several = settled_by(&["lab-worker", "--period", PERIOD, "--chunk", "50", "--work-ms", "1"]).await;
    assert_eq!(one.0.len(), 300, "a ledger row per creator");
    assert_eq!(one.1.len(), 300, "a balance per creator: 120 raised, 180 opened");
    assert_eq!(one, several, "one statement and several disagree");
}
