//! The model's copies of the database's tables are the database's: a
//! migrated database's `settlement.payout_transitions` holds exactly the
//! moves the payouts model allows, and `payouts.status` exactly its states.
//! Change one side without the other and this fails, naming the move.

use std::collections::BTreeSet;

use settled_models::payouts::{transitions, PayoutState};
use sqlx::postgres::PgPoolOptions;

#[tokio::test]
async fn the_models_payout_transitions_are_the_databases_transitions_table() {
    let db = settled_testkit::TestDb::create().await.unwrap();
    let pool = PgPoolOptions::new().max_connections(2).connect(&db.url).await.unwrap();
    settled::db::migrate(&pool).await.unwrap();
    let table: BTreeSet<(String, String)> =
        sqlx::query_as("SELECT from_state, to_state FROM settlement.payout_transitions")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let model: BTreeSet<(String, String)> = transitions()
        .into_iter()
        .map(|(from, to)| (from.as_str().to_string(), to.as_str().to_string()))
        .collect();
    let only_table: Vec<_> = table.difference(&model).collect();
    let only_model: Vec<_> = model.difference(&table).collect();
    assert!(
        only_table.is_empty() && only_model.is_empty(),
        "in settlement.payout_transitions, not in the model: {only_table:?}; in the model, not in the table: {only_model:?}"
    );
    // Every state the model knows is one the status check takes, and no other.
    for state in PayoutState::ALL {
        let taken: bool = sqlx::query_scalar(
            "SELECT pg_get_constraintdef(c.oid) LIKE '%''' || $1 || '''%'
             FROM pg_constraint c WHERE c.conname = 'payouts_status_check'",
        )
        .bind(state.as_str())
        .fetch_one(&pool)
        .await
        .unwrap();
        assert!(
            taken,
            "payouts_status_check does not take the model's state {}",
            state.as_str()
        );
    }
    let checked: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c WHERE c.conname = 'payouts_status_check'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let quoted = checked.matches("'").count() / 2;
    assert_eq!(
        quoted,
        PayoutState::ALL.len(),
        "payouts_status_check takes other states than the model's: {checked}"
    );
    pool.close().await;
    drop(db);
}
