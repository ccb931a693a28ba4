//! `settled queues` and its verbs: exact counts, what each verb changed, dead letters replayed by key or filter.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn settled_queues_lists_exact_counts_and_a_queue_it_cannot_read_with_the_error() {
    let env = queue_env().await;
    let (code, out, err) = queues(&env, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("mail "))
        .unwrap_or_else(|| panic!("no row for mail:\n{out}"))
        .split_whitespace()
        .collect();
    assert_eq!(&row[..7], ["mail", "jobs.mail", "serving", "3", "2", "1", "2"], "{out}");
    let oldest: f64 = row[7].trim_end_matches('s').parse().unwrap();
    assert!((90.0..3600.0).contains(&oldest), "oldest ready {oldest}: {out}");

    let (code, out, _) = queues(&env, &["--json"]);
    assert_eq!(code, 0);
    let all: Value = serde_json::from_str(&out).unwrap();
    let stats = &all[0]["stats"];
    assert_eq!(all[0]["name"], "mail");
    assert_eq!(all[0]["paused"], false);
    assert_eq!(
        [
            &stats["ready"],
            &stats["scheduled"],
            &stats["processing"],
            &stats["failed"]
        ],
        [&json!(3), &json!(2), &json!(1), &json!(2)],
        "{out}"
    );
    assert!(stats["oldest_ready_secs"].as_f64().unwrap() >= 90.0, "{out}");

    // A queue whose table is missing, and one whose table the readonly role
    // was never granted: each listed with its error, exit 1, no crash.
    register_ghost(&env).await;
    let mut conn = env.pool.acquire().await.unwrap();
    sqlx::query("CREATE SCHEMA vault").execute(&mut *conn).await.unwrap();
    Queue::new("secret", "vault.secret")
        .unwrap()
        .create_table(&mut conn)
        .await
        .unwrap();
    let (code, out, _) = queues(&env, &[]);
    assert_eq!(code, 1, "{out}");
    let line = |name: &str| out.lines().find(|l| l.starts_with(name)).unwrap().to_string();
    assert!(
        line("ghost ").contains("error: ") && line("ghost ").contains("no such table"),
        "{out}"
    );
    assert!(
        line("secret ").contains("error: ") && line("secret ").contains("permission denied"),
        "{out}"
    );
    assert!(
        line("mail ").contains("serving"),
        "the readable queue is still listed: {out}"
    );
    let (code, out, _) = queues(&env, &["--json"]);
    assert_eq!(code, 1);
    let all: Value = serde_json::from_str(&out).unwrap();
    let ghost = all.as_array().unwrap().iter().find(|q| q["name"] == "ghost").unwrap();
    assert_eq!(ghost["stats"], Value::Null);
    assert!(ghost["error"].as_str().unwrap().contains("jobs.ghost"), "{ghost}");
    // The owner (no --role-per-command) reads the ungranted table.
    let owner = env.run(&["queues"]);
    let text = String::from_utf8_lossy(&owner.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("secret ") && !l.contains("error")),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn each_verb_says_what_it_changed_and_refuses_what_it_cannot_do() {
    let env = queue_env().await;
    let (code, out, _) = queues(&env, &["pause", "mail"]);
    assert_eq!(
        (code, out.trim()),
        (
            0,
            "queue mail paused: its workers claim nothing until `settled queues resume mail`"
        )
    );
    assert!(paused(&env).await);
    let (code, out, _) = queues(&env, &["pause", "mail"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("queue mail was already paused since ") && out.trim().ends_with("nothing changed"),
        "{out}"
    );
    assert!(queues(&env, &[])
        .1
        .lines()
        .any(|l| l.starts_with("mail ") && l.contains(" paused ")));
    let (code, out, _) = queues(&env, &["resume", "mail"]);
    assert_eq!((code, out.trim()), (0, "queue mail resumed: its workers were woken"));
    assert!(!paused(&env).await);
    assert_eq!(
        queues(&env, &["resume", "mail"]).1.trim(),
        "queue mail was not paused; nothing changed"
    );
    let (code, _, err) = queues(&env, &["pause", "nope"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no queue named \"nope\" is registered (registered: mail, payout_delivery)"),
        "{err}"
    );

    // Cancel: a job nobody holds, then the refusals.
    let (code, out, _) = queues(&env, &["cancel", "mail", "--key", "r2"]);
    assert_eq!(
        (code, out.trim()),
        (0, "job \"r2\" of queue mail cancelled: it will not run")
    );
    assert_eq!(status_of(&env, "r2").await, "cancelled");
    for (key, why) in [
        ("p1", "it has started: it is processing under a lease"),
        ("d1", "it has ended: its status is failed"),
        ("r2", "it has ended: its status is cancelled"),
    ] {
        let (code, _, err) = queues(&env, &["cancel", "mail", "--key", key]);
        assert_eq!(code, 1, "{key}");
        assert!(
            err.contains(&format!("job \"{key}\" of queue mail was not cancelled: {why}")),
            "{err}"
        );
    }
    let (code, _, err) = queues(&env, &["cancel", "mail", "--key", "zzz"]);
    assert_eq!(code, 1);
    assert!(err.contains("queue mail has no job \"zzz\""), "{err}");
    // A job a worker's transaction holds (as an in-transaction claim does)
    // has started: refused, and still eligible once the worker lets go.
    let mut worker = sqlx::PgConnection::connect(&env.db.url).await.unwrap();
    let mut tx = worker.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM jobs.mail WHERE key = 'r3' FOR NO KEY UPDATE")
        .execute(&mut *tx)
        .await
        .unwrap();
    let (code, _, err) = queues(&env, &["cancel", "mail", "--key", "r3"]);
    assert_eq!(code, 1);
    assert!(err.contains("it is being handled in a worker's transaction"), "{err}");
    tx.rollback().await.unwrap();
    assert_eq!(status_of(&env, "r3").await, "eligible");
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letters_are_listed_and_replayed_by_key_or_filter_and_bad_flags_are_named() {
    let env = queue_env().await;
    let (code, out, _) = queues(&env, &["dead", "mail"]);
    assert_eq!(code, 0);
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(
        rows[0].starts_with("d2 ") && rows[0].contains("timeout after 30 s"),
        "newest first: {out}"
    );
    assert!(
        rows[1].starts_with("d1 ") && rows[1].contains("smtp 550 mailbox <unknown>"),
        "{out}"
    );
    assert_eq!(rows[1].split_whitespace().nth(1), Some("3"), "attempts: {out}");
    let (_, out, _) = queues(&env, &["dead", "mail", "--json", "--limit", "1"]);
    let dead: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(dead.as_array().unwrap().len(), 1);
    assert_eq!((&dead[0]["key"], &dead[0]["attempts"]), (&json!("d2"), &json!(3)));

    // Usage errors name the flag and exit 2; nothing changes.
    for (args, flag) in [
        (vec!["--failed-since", "yesterday"], "--failed-since"),
        (vec!["--limit", "0"], "--limit"),
        (
            vec![
                "--failed-since",
                "2026-12-03T10:00:00Z",
                "--failed-before",
                "2026-12-03T09:00:00Z",
            ],
            "--failed-before",
        ),
    ] {
        let mut all = vec!["replay", "mail"];
        all.extend(args);
        let (code, _, err) = queues(&env, &all);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(flag), "{flag}: {err}");
    }
    let (code, _, err) = queues(&env, &["replay", "mail", "--error-contains", "refused"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("no dead letter of queue mail matches (last error containing \"refused\"); nothing changed"),
        "{err}"
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM jobs.mail WHERE status = 'failed'")
            .await,
        2
    );

    // By time: only d1 failed over an hour ago.
    let hour_ago = rfc3339(Utc::now() - chrono::Duration::hours(1));
    let (code, out, _) = queues(&env, &["replay", "mail", "--failed-before", &hour_ago]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("1 dead letter(s) of queue mail replayed (failed before "),
        "{out}"
    );
    assert_eq!(status_of(&env, "d1").await, "eligible");
    assert_eq!(status_of(&env, "d2").await, "failed");
    // A replayed job starts a fresh count of attempts; its fence keeps rising.
    assert_eq!(
        env.scalar_i64("SELECT (attempt - attempt_base)::bigint FROM jobs.mail WHERE key = 'd1'")
            .await,
        0
    );
    let (code, out, _) = queues(&env, &["replay", "mail", "--key", "d2", "--error-contains", "timeout"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("1 dead letter(s) of queue mail replayed (key \"d2\", last error containing \"timeout\")"),
        "{out}"
    );
    let (code, _, err) = queues(&env, &["replay", "mail"]);
    assert_eq!(code, 1, "nothing left to replay");
    assert!(err.contains("(any dead letter)"), "{err}");
    assert_eq!(
        queues(&env, &["dead", "mail"]).1.trim(),
        "queue mail has no dead letters"
    );
    let (code, _, err) = queues(&env, &["dead", "nope"]);
    assert_eq!(code, 1);
    assert!(err.contains("no queue named \"nope\""), "{err}");
}
