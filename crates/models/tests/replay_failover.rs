//! The counterexample without the timeline in the fence, replayed against a
//! real primary and its streaming standby: w0's claim commits on the
//! primary only (replication cut), w0 pays, the primary crashes and the
//! standby is promoted (a new timeline), w1 claims the item there with the
//! same attempt number and pays (a replay), then the zombie w0 completes.
//! The trace is `settled-models --counterexamples` (`without the timeline`).

mod common;

use std::time::Duration;

use common::*;
use settled_engine::{Chunk, LeasedHandler};
use settled_testkit::{wait_for_true as wait_for, LocalOptions, LocalPostgres};
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

fn options(data_dir: std::path::PathBuf) -> LocalOptions {
    LocalOptions {
        data_dir,
        // Durable: a crash loses only what was not in the WAL yet.
        throwaway: false,
        remove_on_stop: true,
        max_connections: 50,
        settings: Vec::new(),
    }
}

/// Waits until the standby has replayed all the primary has, then stops its
/// replication: what the primary commits from now on, the standby never gets.
async fn cut_replication(primary: &str, standby: &str) {
    let mut conn = PgConnection::connect(primary).await.unwrap();
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let replayed = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
    wait_for(standby, &replayed, "the standby to replay the primary's WAL").await;
    let mut conn = PgConnection::connect(standby).await.unwrap();
    for sql in ["ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"] {
        sqlx::query(sql).execute(&mut conn).await.unwrap();
    }
    wait_for(
        primary,
        "SELECT count(*) = 0 FROM pg_stat_replication",
        "replication to stop",
    )
    .await;
}

/// Claims the item on `pool` and pays it through the real handler: one
/// worker's claim_leased and work_item.
async fn claim_and_pay<H: LeasedHandler>(s: &Settled, pool: &sqlx::PgPool, handler: &H) -> Chunk {
    let mut conn = pool.acquire().await.unwrap();
    let items = settled::settlement::queue()
        .claim_leased(&mut conn, PERIOD, 1, s.run_id, Uuid::new_v4(), Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(items.len(), 1);
    let chunk = Chunk {
        run_id: s.run_id,
        scope: PERIOD.into(),
        items,
    };
    let batch = handler.prepare(pool, &chunk).await.unwrap();
    handler.work_item(&batch, &chunk, &chunk.items[0]).await.unwrap();
    chunk
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_timeline_a_claim_lost_in_a_failover_completes_in_the_new_claims_name() {
    let dir = tempfile::tempdir().unwrap();
    let primary = LocalPostgres::start(&options(dir.path().join("primary"))).expect("start the primary");
    let standby_dir = primary.base_backup(&dir.path().join("standby")).expect("pg_basebackup");
    let standby = LocalPostgres::start(&options(standby_dir)).expect("start the standby");
    let mut admin = PgConnection::connect(&primary.url("postgres")).await.unwrap();
    sqlx::query("CREATE DATABASE settled")
        .execute(&mut admin)
        .await
        .unwrap();
    drop(admin);
    let (old_url, new_url) = (primary.url("settled"), standby.url("settled"));
    let s = settled_on(pool(&old_url).await).await;
    let sim = provider_sim().await;
    let handler = real_handler(&sim, Duration::from_secs(5));
    cut_replication(&old_url, &new_url).await;

    // 1-3. w0 claims on the primary alone, and pays.
    let zombie = claim_and_pay(&s, &s.pool, &handler).await;
    s.pool.close().await;
    // 4. FAILOVER: the primary crashes, the standby is promoted.
    primary.crash().unwrap();
    standby.promote().unwrap();
    let new = pool(&new_url).await;
    // 5. w1 claims there: the same attempt number, a new timeline; it pays
    // (the provider replays the payment the zombie's call made).
    let live = claim_and_pay(&s, &new, &handler).await;
    let (z, l) = (zombie.items[0].fence, live.items[0].fence);
    assert_eq!(z.get(), l.get(), "the attempt number is handed out twice");
    assert!(l.epoch() > z.epoch(), "{l} vs {z}");

    // 7. The zombie completes. Without the timeline in the fence (a
    // hand-written statement) it is accepted in the live claim's name, with
    // its effects; the live claim is then refused.
    let mut tx = new.begin().await.unwrap();
    let accepted = complete_by_hand(&mut tx, COMPLETE_WITHOUT_TIMELINE, &handler, &zombie).await;
    assert_eq!(accepted, vec![s.creator.clone()], "the zombie completes");
    let ledger_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM settlement.reward_ledger WHERE period = $1::date AND creator = $2")
            .bind(PERIOD)
            .bind(&s.creator)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    assert_eq!(ledger_rows, 1, "the zombie's ledger row and credit are written");
    let live_accepted = complete_fenced(&mut tx, &handler, &live).await;
    assert!(live_accepted.is_empty(), "the live claim is refused");
    tx.rollback().await.unwrap();

    // The real complete_fenced: the zombie is refused, the live claim accepted.
    let mut tx = new.begin().await.unwrap();
    assert!(complete_fenced(&mut tx, &handler, &zombie).await.is_empty());
    assert_eq!(complete_fenced(&mut tx, &handler, &live).await, vec![s.creator.clone()]);
    tx.commit().await.unwrap();
    assert_eq!(ledger(&new, &s.creator).await.len(), 1);
    assert_eq!(item(&new, &s.creator).await, ("settled".into(), 1));
    assert_eq!(
        payments_to(&sim, &s.creator).await.len(),
        1,
        "one payment for both calls"
    );
    new.close().await;
}
