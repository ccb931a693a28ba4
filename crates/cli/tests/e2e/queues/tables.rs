//! Queue tables: a bigint key column, the payout delivery table as `create_queue` makes it, its dead letters replayed under the least role.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_queue_keyed_by_a_bigint_is_operated_by_its_own_key_column_and_a_key_of_another_type_is_named() {
    let env = Env::new().await;
    let mut conn = env.pool.acquire().await.unwrap();
    sqlx::query("CREATE SCHEMA jobs").execute(&mut *conn).await.unwrap();
    let queue = Queue::with_key("numbers", "jobs.numbers", "id", "bigint").unwrap();
    queue.create_table(&mut conn).await.unwrap();
    let jobs: Vec<NewJob> = ["7", "8", "9"].into_iter().map(NewJob::new).collect();
    queue.enqueue_many(&mut conn, &jobs).await.unwrap();
    sqlx::raw_sql(
        "UPDATE jobs.numbers SET status = 'failed', attempt = 2, last_error = 'no such account' WHERE id = 9;
         GRANT USAGE ON SCHEMA jobs TO settled_api, settled_readonly;
         GRANT SELECT ON jobs.numbers TO settled_readonly;
         GRANT SELECT, UPDATE ON jobs.numbers TO settled_api;",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let (code, out, _) = queues(&env, &["--json"]);
    assert_eq!(code, 0, "{out}");
    let all: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&all[0]["stats"]["ready"], &all[0]["stats"]["failed"]),
        (&json!(2), &json!(1))
    );
    let (code, out, _) = queues(&env, &["dead", "numbers"]);
    assert_eq!(code, 0);
    assert!(out.lines().nth(1).unwrap().starts_with("9 "), "{out}");
    let (code, out, err) = queues(&env, &["cancel", "numbers", "--key", "8"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("job \"8\" of queue numbers cancelled"), "{out}");
    let (code, _, err) = queues(&env, &["cancel", "numbers", "--key", "eight"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("key \"eight\" is not a bigint, the type of queue \"numbers\"'s key"),
        "{err}"
    );
    let (code, out, _) = queues(&env, &["replay", "numbers", "--key", "9"]);
    assert_eq!(code, 0, "{out}");
    let status: String = sqlx::query_scalar("SELECT status FROM jobs.numbers WHERE id = 9")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(status, "eligible");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_payout_deliverys_dead_letter_is_replayed_under_the_least_role_by_the_cli_and_the_api() {
    let env = Env::new().await;
    env.run_ok(&["seed", "--period", "2026-11-28", "--creators", "10"]);
    env.run_ok(&["worker", "--period", "2026-11-28"]);
    let creator = env
        .scalar_text("SELECT creator FROM settlement.creator_balance ORDER BY balance DESC LIMIT 1")
        .await;
    let mut ids = Vec::new();
    for key in ["dead-1", "dead-2"] {
        let id: i64 =
            sqlx::query_scalar("SELECT payout_id FROM settlement.debit_for_payout($1, 100, $2, 'h', NULL, NULL, NULL)")
                .bind(&creator)
                .bind(key)
                .fetch_one(&env.pool)
                .await
                .unwrap();
        ids.push(id.to_string());
    }
    // Both deliveries ran out of attempts: dead letters, their payouts queued.
    sqlx::query(
        "UPDATE settlement.payout_jobs SET status = 'failed', attempt = 5, last_error = 'the provider is unavailable'",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let job = |id: &str| format!("SELECT status FROM settlement.payout_jobs WHERE payout_id = {id}");
    let (code, out, err) = queues(&env, &["replay", "payout_delivery", "--key", &ids[0]]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(env.scalar_text(&job(&ids[0])).await, "eligible");
    // A cancel is refused by the payout's guard, not by a missing grant.
    let (code, out, err) = queues(&env, &["cancel", "payout_delivery", "--key", &ids[0]]);
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("is queued with its funds held"), "{err}");
    let server = env.serve(TOKEN).await;
    let client = reqwest::Client::new();
    let (status, body) = post(
        &client,
        &format!("{}/v1/queues/payout_delivery/replay", server.base),
        Some(TOKEN),
        Some(&json!({ "key": ids[1] }).to_string()),
    )
    .await;
    assert_eq!((status, body["replayed"].as_i64()), (200, Some(1)), "{body}");
    assert_eq!(env.scalar_text(&job(&ids[1])).await, "eligible");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payouts WHERE status = 'queued'")
            .await,
        2
    );
    // The deliverer, under its own least role, sends both.
    let sim = common::ProviderSim::start(&["--settle-delay-ms", "100000"]);
    let mut deliverer = env
        .cmd(&[
            "--role-per-command",
            "deliver",
            "--provider-url",
            &sim.url,
            "--lease-ttl-ms",
            "1000",
            "--shutdown-grace-ms",
            "300",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    common::wait_until(60, "both replayed payouts sent", || async {
        env.scalar_i64("SELECT count(*) FROM settlement.payouts WHERE status = 'sent'")
            .await
            == 2
    })
    .await;
    common::stop(&mut deliverer);
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.payout_jobs WHERE status = 'settled'")
            .await,
        2
    );
}

/// What the catalog says of a queue table, with its own name taken out so
/// two tables can be compared: each column (name, type, null, default,
/// identity), each index, check and trigger, and the storage options.
async fn table_shape(env: &Env, table: &str) -> Vec<String> {
    let base = table.rsplit('.').next().unwrap();
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT 'column ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
                || CASE WHEN a.attidentity <> '' THEN ' identity ' || a.attidentity::text ELSE '' END
         FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
         UNION ALL
         SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = $1::regclass
         UNION ALL
         SELECT 'constraint ' || pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::regclass AND contype <> 't'
         UNION ALL
         SELECT 'trigger ' || pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal
         UNION ALL
         SELECT 'options ' || array_to_string(reloptions, ',') FROM pg_class WHERE oid = $1::regclass",
    )
    .bind(table)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    let mut shape: Vec<String> = rows
        .into_iter()
        .map(|row| row.replace(table, "TABLE").replace(base, "BASE"))
        .collect();
    shape.sort();
    shape
}

/// The one continuous queue whose table an earlier migration wrote by hand
/// (settled's `settlement.payout_jobs`, before the engine had
/// `settled_engine.create_queue`) is the table that function creates: the
/// same columns, defaults, indexes, checks, trigger and storage options.
#[tokio::test]
async fn the_payout_delivery_table_is_the_table_the_engines_create_queue_makes() {
    let env = Env::new().await;
    sqlx::query(
        "SELECT settled_engine.create_queue('payout_delivery_twin', 'public.payout_jobs', 'payout_id', 'bigint')",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let made = table_shape(&env, "public.payout_jobs").await;
    let written = table_shape(&env, "settlement.payout_jobs").await;
    let made_wake = "trigger CREATE TRIGGER BASE_wake AFTER INSERT ON TABLE FOR EACH STATEMENT EXECUTE FUNCTION \
                     settled_engine.queue_wake('payout_delivery_twin')";
    let written_wake = "trigger CREATE TRIGGER BASE_wake AFTER INSERT ON TABLE FOR EACH STATEMENT EXECUTE FUNCTION \
                        settled_engine.queue_wake('payout_delivery')";
    assert!(made.iter().any(|row| row == made_wake), "{made:#?}");
    let made: Vec<String> = made.into_iter().filter(|row| row != made_wake).collect();
    let only_written: Vec<&String> = written.iter().filter(|row| !made.contains(row)).collect();
    let only_made: Vec<&String> = made.iter().filter(|row| !written.contains(row)).collect();
    assert!(only_made.is_empty(), "the hand-written table lacks: {only_made:#?}");
    // What settled added to its queue table since (its own guard trigger
    // and grants live elsewhere), beside the engine's wake-up.
    let own: Vec<&String> = only_written.into_iter().filter(|row| *row != written_wake).collect();
    assert!(
        own.iter().all(|row| row.starts_with("trigger ")),
        "settled's queue table differs from the engine's: {own:#?}"
    );
    let registered: String =
        sqlx::query_scalar("SELECT table_name FROM settled_engine.queues WHERE name = 'payout_delivery_twin'")
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(registered, "public.payout_jobs");
}

/// `create_queue` checks its names itself (it can be called from any
/// client): nothing that is not an identifier reaches its DDL.
#[tokio::test]
async fn create_queue_refuses_a_name_that_is_not_an_identifier_and_creates_nothing() {
    let env = Env::new().await;
    for (args, field) in [
        (["bad name", "public.q", "key", "text"], "name"),
        (["q", "public.q; DROP TABLE x", "key", "text"], "table"),
        (["q", "public.q", "k\"ey", "text"], "key"),
        (["q", "public.q", "key", "text) ; --"], "key type"),
    ] {
        let err = sqlx::query("SELECT settled_engine.create_queue($1, $2, $3, $4)")
            .bind(args[0])
            .bind(args[1])
            .bind(args[2])
            .bind(args[3])
            .execute(&env.pool)
            .await
            .unwrap_err();
        let message = err.as_database_error().unwrap().message().to_string();
        assert!(
            message.starts_with(&format!("create_queue: {field} ")),
            "{args:?}: {message}"
        );
    }
    let made: Option<String> = sqlx::query_scalar("SELECT to_regclass('public.q')::text")
        .fetch_one(&env.pool)
        .await
        .unwrap();
    assert_eq!(made, None);
}
