//! An unpartitioned database moves to partitions with its money intact.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn an_unpartitioned_database_with_settled_periods_moves_to_partitions_and_still_proves_its_money() {
    let env = Env::unmigrated().await;
    migrate_to_unpartitioned(&env).await;
    assert_eq!(
        env.scalar_text("SELECT relkind::text FROM pg_class WHERE oid = 'settlement.token_trade_volume'::regclass")
            .await,
        "r"
    );
    // The old layout holding one settled period (300 creators paid, their
    // balances credited, its run finished) and one loaded but not started.
    exec(
        &env,
        "INSERT INTO settlement.settlement_policy (period, fee_bps) VALUES ('2026-11-27', 250), ('2026-11-28', 300);
         INSERT INTO settled_engine.runs (job, scope, state, finished_at)
             VALUES ('creator-rewards', '2026-11-27', 'finished', now());
         INSERT INTO settlement.token_trade_volume (period, creator, volume, status, attempt)
             SELECT '2026-11-27', '0x' || lpad(to_hex(i), 40, '0'), i::numeric * 10 ^ 18 + 7, 'settled', 1
             FROM generate_series(1, 300) i;
         INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt)
             SELECT period, creator, settlement.reward(volume, 250), (SELECT id FROM settled_engine.runs), 1
             FROM settlement.token_trade_volume WHERE period = '2026-11-27';
         INSERT INTO settlement.creator_balance (creator, balance)
             SELECT creator, amount FROM settlement.reward_ledger;
         INSERT INTO settlement.token_trade_volume (period, creator, volume)
             SELECT '2026-11-28', '0x' || lpad(to_hex(i), 40, '0'), i::numeric * 10 ^ 20 + 3
             FROM generate_series(100, 399) i;",
    )
    .await;
    env.run_ok(&["verify", "--period", "2026-11-27"]);

    env.run_ok(&["migrate"]);
    assert_eq!(
        env.scalar_text("SELECT relkind::text FROM pg_class WHERE oid = 'settlement.token_trade_volume'::regclass")
            .await,
        "p"
    );
    assert_eq!(
        env.scalar_text(&partitions_of("settlement.token_trade_volume")).await,
        "token_trade_volume_p20261127,token_trade_volume_p20261128"
    );
    assert_eq!(
        env.scalar_text(&partitions_of("settlement.reward_ledger")).await,
        "reward_ledger_p20261127,reward_ledger_p20261128"
    );
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger_p20261127")
            .await,
        300
    );
    let verified = env.run_ok(&["verify", "--period", "2026-11-27"]);
    assert!(verified.contains("OK, every check holds"), "{verified}");

    // Every partition keeps the ledger's guarantees: one row per creator,
    // no edit, no truncate, through the parent or the partition itself.
    let creator = "0x0000000000000000000000000000000000000001";
    for table in ["settlement.reward_ledger", "settlement.reward_ledger_p20261127"] {
        let second = sqlx::query(&format!(
            "INSERT INTO {table} (period, creator, amount, run_id, attempt)
             VALUES ('2026-11-27', $1, 1, (SELECT id FROM settled_engine.runs), 2)"
        ))
        .bind(creator)
        .execute(&env.pool)
        .await
        .unwrap_err();
        assert_eq!(second.as_database_error().unwrap().code().unwrap(), "23505", "{second}");
        for edit in [
            format!("UPDATE {table} SET amount = amount + 1 WHERE creator = '{creator}'"),
            format!("DELETE FROM {table} WHERE creator = '{creator}'"),
            format!("TRUNCATE {table}"),
        ] {
            let err = sqlx::query(&edit).execute(&env.pool).await.unwrap_err();
            assert!(err.to_string().contains("append-only"), "{edit}: {err}");
        }
    }
    // A ledger row needs its item and a run of its own period, checked per
    // statement through the parent and through a partition alike; a paid
    // item cannot be deleted.
    for table in ["settlement.reward_ledger", "settlement.reward_ledger_p20261128"] {
        let no_item = sqlx::query(&format!(
            "INSERT INTO {table} (period, creator, amount, run_id, attempt)
             VALUES ('2026-11-28', '0x00000000000000000000000000000000000000ff', 1, (SELECT id FROM settled_engine.runs), 1)"
        ))
        .execute(&env.pool)
        .await
        .unwrap_err();
        assert_eq!(
            no_item.as_database_error().unwrap().constraint(),
            Some("reward_ledger_rows_have_items"),
            "{no_item}"
        );
        // The item exists, but the run is 2026-11-27's.
        let wrong_run = sqlx::query(&format!(
            "INSERT INTO {table} (period, creator, amount, run_id, attempt)
             VALUES ('2026-11-28', '0x0000000000000000000000000000000000000100', 1, (SELECT id FROM settled_engine.runs), 1)"
        ))
        .execute(&env.pool)
        .await
        .unwrap_err();
        assert_eq!(
            wrong_run.as_database_error().unwrap().constraint(),
            Some("reward_ledger_rows_have_items"),
            "{wrong_run}"
        );
    }
    let delete = sqlx::query("DELETE FROM settlement.token_trade_volume WHERE period = '2026-11-27' AND creator = $1")
        .bind(creator)
        .execute(&env.pool)
        .await
        .unwrap_err();
    assert_eq!(
        delete.as_database_error().unwrap().constraint(),
        Some("settled_items_stay"),
        "{delete}"
    );

    // A period without partitions takes no rows until it gets them.
    let orphan =
        sqlx::query("INSERT INTO settlement.token_trade_volume (period, creator, volume) VALUES ('2026-12-30', $1, 1)")
            .bind(creator)
            .execute(&env.pool)
            .await
            .unwrap_err();
    assert!(orphan.to_string().contains("no partition"), "{orphan}");

    // The period that was waiting settles on the new layout, and balances
    // (carried across both periods) still prove.
    env.run_ok(&["run", "--period", PERIOD, "--wait"]);
    let verified = env.run_ok(&["verify", "--period", PERIOD]);
    assert!(verified.contains("OK, every check holds"), "{verified}");
    assert_eq!(
        env.scalar_i64("SELECT count(*) FROM settlement.reward_ledger_p20261128")
            .await,
        300
    );
}
