//! The leased model's counterexamples, replayed against the real database:
//! the real engine (`drain_leased`, `rescue_expired_leases`,
//! `claim_leased`) and settlement's real leased handler, paying through the
//! provider simulator, driven through the model's interleaving by a
//! scripted layer that stops at named points. Each counterexample is shown
//! twice: with the guard left out (a hand-written statement, or a handler
//! deriving its key from the attempt) the model's bad state appears in the
//! database or at the provider; with the real code it does not.
//!
//! The traces are `settled-models --counterexamples` (`without the fence`,
//! `without the idempotency key`).

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use settled::provider::HttpProvider;
use settled_engine::DrainStats;
use settled_engine::{Chunk, LeasedHandler, RunTarget};
use uuid::Uuid;

/// Runs a worker's drain of [`PERIOD`] in the background.
fn spawn_drain<H: LeasedHandler>(s: &Settled, handler: Arc<H>, stats: Arc<DrainStats>) -> tokio::task::JoinHandle<()> {
    let (pool, run_id) = (s.pool.clone(), s.run_id);
    tokio::spawn(async move {
        let queue = settled::settlement::queue();
        let target = RunTarget {
            pool: &pool,
            queue: &queue,
            run_id,
            scope: PERIOD,
            worker: Uuid::new_v4(),
            cfg: &drain_config(),
            stats: &stats,
        };
        settled_engine::raw::drain_leased(target, handler, long_leases())
            .await
            .unwrap();
    })
}

/// Waits until `counter` reaches `value`.
async fn wait_until(counter: &std::sync::atomic::AtomicU64, value: u64, what: &str) {
    for _ in 0..1500 {
        if counter.load(Ordering::Relaxed) >= value {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("waited too long for {what}");
}

/// What the fence replay left behind.
struct FenceOutcome {
    ledger: Vec<(String, i32)>,
    item: (String, i32),
    payments: usize,
    zombie_refused: bool,
    live_refused: u64,
    live_settled: u64,
}

/// The model's trace without the fence: w0 claims and pays, the database
/// clock passes its lease, the rescuer takes the item back, w1 claims it
/// (attempt 2) and pays (the key replays the payment), then w0 completes,
/// then w1 does. `guarded`: w0 is a real drain, completing with the real
/// `complete_fenced`; else w0's completion is the hand-written statement
/// without the fence.
async fn fence_replay(guarded: bool) -> FenceOutcome {
    let db = settled_testkit::TestDb::create().await.unwrap();
    let s = settled_on(pool(&db.url).await).await;
    let sim = provider_sim().await;
    let queue = settled::settlement::queue();
    let (zombie_stats, live_stats) = (Arc::new(DrainStats::default()), Arc::new(DrainStats::default()));
    let (zombie_handler, mut zombie) = scripted(real_handler(&sim, Duration::from_secs(5)), &[Point::Called]);

    // 1-3. w0: claim_leased, is_held, work_item pays.
    let (zombie_drain, zombie_chunk) = if guarded {
        let drain = spawn_drain(&s, zombie_handler.clone(), zombie_stats.clone());
        let claim = zombie.reached(Point::Called).await;
        (Some(drain), chunk(&s, claim))
    } else {
        let mut conn = s.pool.acquire().await.unwrap();
        let claimed = queue
            .claim_leased(&mut conn, PERIOD, 1, s.run_id, Uuid::new_v4(), Duration::from_secs(600))
            .await
            .unwrap();
        let chunk = Chunk {
            run_id: s.run_id,
            scope: PERIOD.into(),
            items: claimed,
        };
        let handler = real_handler(&sim, Duration::from_secs(5));
        let batch = handler.prepare(&s.pool, &chunk).await.unwrap();
        handler.work_item(&batch, &chunk, &chunk.items[0]).await.unwrap();
        (None, chunk)
    };
    assert_eq!(zombie_chunk.items[0].fence.get(), 1);

    // 4-5. The database clock passes w0's lease (made so in SQL, not slept),
    // and rescue_expired_leases takes the item back. The real drain starts
    // its lease keeper and its own rescuer at once, each ticking as it
    // starts: on a loaded machine the keeper's first renewal can land after
    // the expiry and extend the lease again, and the drain's rescuer can
    // take the item back before the test's call. So the expiry and the
    // rescue repeat until one rescue (the test's or the drain's) retried it.
    let policy = drain_config().retry;
    let by_drain = || zombie_stats.leases_rescued.load(Ordering::Relaxed);
    let mut by_test = 0;
    for _ in 0..200 {
        sqlx::query(
            "UPDATE settlement.token_trade_volume SET lease_until = now() - interval '1 second'
             WHERE period = $1::date AND status = 'processing'",
        )
        .bind(PERIOD)
        .execute(&s.pool)
        .await
        .unwrap();
        // None: a drain's own rescuer holds the rescuer's lock for a moment.
        if let Some(rescued) = settled_engine::raw::rescue_expired_leases(&s.pool, &queue, PERIOD, &policy)
            .await
            .unwrap()
        {
            by_test += rescued.retried;
        }
        if by_test + by_drain() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(by_test + by_drain(), 1, "one rescue took the item back");

    // 6. w1: claim_leased (attempt 2), pays: the provider replays the payment.
    let (live_handler, mut live) = scripted(real_handler(&sim, Duration::from_secs(5)), &[Point::Called]);
    let live_drain = spawn_drain(&s, live_handler, live_stats.clone());
    let live_claim = live.reached(Point::Called).await;
    assert_eq!(live_claim.fence.get(), 2);

    // 7. w0 completes.
    let zombie_refused = if guarded {
        zombie.go();
        wait_until(&zombie_stats.fence_rejections, 1, "the zombie's refusal").await;
        true
    } else {
        let mut tx = s.pool.begin().await.unwrap();
        let handler = real_handler(&sim, Duration::from_secs(5));
        let accepted = complete_by_hand(&mut tx, COMPLETE_WITHOUT_FENCE, &handler, &zombie_chunk).await;
        tx.commit().await.unwrap();
        accepted.is_empty()
    };
    // 8. w1 completes.
    live.go();
    live_drain.await.unwrap();
    if let Some(drain) = zombie_drain {
        drain.await.unwrap();
    }
    FenceOutcome {
        ledger: ledger(&s.pool, &s.creator).await,
        item: item(&s.pool, &s.creator).await,
        payments: payments_to(&sim, &s.creator).await.len(),
        zombie_refused,
        live_refused: live_stats.fence_rejections.load(Ordering::Relaxed),
        live_settled: live_stats.items_settled.load(Ordering::Relaxed),
    }
}

fn chunk(s: &Settled, item: settled_engine::ClaimedItem) -> Chunk {
    Chunk {
        run_id: s.run_id,
        scope: PERIOD.into(),
        items: vec![item],
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_fence_a_zombie_completes_in_the_live_claims_name() {
    let unguarded = fence_replay(false).await;
    // The stale completion is accepted: the ledger records the zombie's
    // attempt 1, a claim the rescuer had taken back (the row is at 2), and
    // the live claim's completion is the one refused.
    assert!(!unguarded.zombie_refused);
    assert_eq!(unguarded.item, ("settled".into(), 2));
    assert_eq!(unguarded.ledger.len(), 1);
    assert_eq!(unguarded.ledger[0].1, 1, "the ledger holds the zombie's claim");
    assert_eq!((unguarded.live_refused, unguarded.live_settled), (1, 0));
    // The status re-check and the provider's key still keep it to one
    // ledger row and one payment: the fence is what names the right claim.
    assert_eq!(unguarded.payments, 1);

    let real = fence_replay(true).await;
    assert!(real.zombie_refused, "the real complete_fenced refuses the zombie");
    assert_eq!(real.item, ("settled".into(), 2));
    assert_eq!(real.ledger.len(), 1);
    assert_eq!(real.ledger[0].1, 2, "the ledger holds the live claim");
    assert_eq!((real.live_refused, real.live_settled), (0, 1));
    assert_eq!(real.payments, 1);
}

/// The model's trace without the idempotency key: w0 claims, the provider
/// applies the payment and answers after the caller's timeout, w0 records
/// the failure (`fail_fenced`), claims again (attempt 2) and pays. Returns
/// the payments the provider applied to the creator, and the ledger.
async fn key_replay<H: LeasedHandler>(s: &Settled, sim: &str, handler: H) -> (usize, Vec<(String, i32)>) {
    set_faults(
        sim,
        serde_json::json!({"applied_timeout_rate": 1.0, "applied_timeout_ms": 3000}),
    )
    .await;
    let (handler, mut script) = scripted(handler, &[Point::Calling]);
    let stats = Arc::new(DrainStats::default());
    let drain = spawn_drain(s, handler, stats.clone());
    // 1-3. claim_leased; the call is applied, then times out.
    assert_eq!(script.reached(Point::Calling).await.fence.get(), 1);
    script.go();
    // 4-5. fail_fenced (transient), claim_leased again; the provider is well now.
    assert_eq!(script.reached(Point::Calling).await.fence.get(), 2);
    set_faults(sim, serde_json::json!({})).await;
    // 6. The call pays (a replay under the real key).
    script.go();
    drain.await.unwrap();
    assert_eq!(stats.items_retried.load(Ordering::Relaxed), 1);
    (
        payments_to(sim, &s.creator).await.len(),
        ledger(&s.pool, &s.creator).await,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_idempotency_key_a_retry_pays_the_creator_twice() {
    // Well under the fault's 3 s answer, and long enough that the second
    // attempt's call, to a well provider, never times out on a loaded
    // machine (a third attempt would wait at its point for ever).
    let timeout = Duration::from_millis(1000);

    let db = settled_testkit::TestDb::create().await.unwrap();
    let s = settled_on(pool(&db.url).await).await;
    let sim = provider_sim().await;
    let per_attempt = KeyPerAttempt {
        real: real_handler(&sim, timeout),
        provider: HttpProvider::new(&sim, timeout).unwrap(),
    };
    let (payments, ledger_rows) = key_replay(&s, &sim, per_attempt).await;
    assert_eq!(payments, 2, "with a key per attempt the creator is paid twice");
    assert_eq!(ledger_rows.len(), 1, "while the ledger records one payment");

    let db = settled_testkit::TestDb::create().await.unwrap();
    let s = settled_on(pool(&db.url).await).await;
    let sim = provider_sim().await;
    let (payments, ledger_rows) = key_replay(&s, &sim, real_handler(&sim, timeout)).await;
    assert_eq!(payments, 1, "the real key makes the retry a replay");
    assert_eq!(ledger_rows.len(), 1);
    assert_eq!(ledger_rows[0].1, 2);
}
