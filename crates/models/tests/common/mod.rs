//! What the replays share: a settled database with one creator to pay and
//! its run started, the provider simulator on a loopback port, a scripted
//! layer around a leased handler that stops at named points, and the
//! hand-written statements that leave a guard out.

#![allow(dead_code)] // each test file uses its part

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use settled::money::Amount;
use settled::period::Period;
use settled::provider::{HttpProvider, Payment, PayoutProvider};
use settled::settlement::SettleWithProvider;
use settled_engine::{Chunk, DrainConfig, HandlerError, LeaseConfig, LeasedHandler};
use settled_engine::{ClaimedItem, RetryPolicy};
use settled_lab::simulate::{ItemLayer, Layered};
use settled_models::suite::Counterexample;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};
use tokio::sync::{mpsc, Mutex};

/// The period every replay settles.
pub(crate) const PERIOD: &str = "2026-11-28";

/// A settled database with one creator of [`PERIOD`] and its run.
pub(crate) struct Settled {
    /// The database's pool.
    pub pool: PgPool,
    /// The run.
    pub run_id: i64,
    /// The one creator.
    pub creator: String,
}

/// Migrates the database at `pool`, seeds one creator and starts the run.
pub(crate) async fn settled_on(pool: PgPool) -> Settled {
    settled::db::migrate(&pool).await.unwrap();
    let period = Period::parse(PERIOD).unwrap();
    let hidden = settled::progress::Progress::hidden();
    settled::seed::seed(&pool, period, 1, 7, None, settled::seed::Volumes::default(), &hidden)
        .await
        .unwrap();
    let run = settled::settlement::job()
        .start_or_join(&pool, PERIOD, None)
        .await
        .unwrap()
        .run;
    let creator: String =
        sqlx::query_scalar("SELECT creator FROM settlement.token_trade_volume WHERE period = $1::date")
            .bind(PERIOD)
            .fetch_one(&pool)
            .await
            .unwrap();
    Settled {
        pool,
        run_id: run.id,
        creator,
    }
}

/// A pool of a few connections on `url`.
pub(crate) async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new().max_connections(8).connect(url).await.unwrap()
}

/// The provider simulator (crates/lab), served on a loopback port until the
/// test ends. Returns its base URL.
pub(crate) async fn provider_sim() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(settled_lab::provider_sim::serve(listener, Default::default(), 1));
    url
}

/// Sets the simulator's faults (`POST /v1/faults`).
pub(crate) async fn set_faults(url: &str, faults: serde_json::Value) {
    let status = reqwest::Client::new()
        .post(format!("{url}/v1/faults"))
        .json(&faults)
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success(), "setting faults: {status}");
}

/// Every payment the simulator applied to `creator`.
pub(crate) async fn payments_to(url: &str, creator: &str) -> Vec<Payment> {
    let provider = HttpProvider::new(url, Duration::from_secs(5)).unwrap();
    let all = provider.list_all().await.unwrap();
    all.into_iter().filter(|p| p.creator == creator).collect()
}

/// The settlement's real leased handler on the simulator, with calls that
/// time out after `timeout`.
pub(crate) fn real_handler(url: &str, timeout: Duration) -> SettleWithProvider<HttpProvider> {
    SettleWithProvider::new(HttpProvider::new(url, timeout).unwrap())
}

/// A named point a scripted handler stops at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Point {
    /// `work_item` is about to call the provider.
    Calling,
    /// The provider answered (the item is paid, or the call failed).
    Called,
}

/// Named stops of a scripted handler: at each of its points it reports
/// (point, the claim `C`) and waits to be let go.
pub(crate) struct Stops<C> {
    points: Vec<Point>,
    reached: mpsc::UnboundedSender<(Point, C)>,
    go: Mutex<mpsc::UnboundedReceiver<()>>,
}

impl<C: Clone> Stops<C> {
    /// At one of the stops, reports `claim` and waits to be let go.
    pub(crate) async fn at(&self, point: Point, claim: &C) {
        if self.points.contains(&point) {
            self.reached.send((point, claim.clone())).unwrap();
            self.go.lock().await.recv().await;
        }
    }
}

/// The test's end of a scripted handler's [`Stops`].
pub(crate) struct Script<C> {
    reached: mpsc::UnboundedReceiver<(Point, C)>,
    go: mpsc::UnboundedSender<()>,
}

impl<C> Script<C> {
    /// Waits until the handler stops at `point`; returns the claim.
    pub(crate) async fn reached(&mut self, point: Point) -> C {
        let (at, claim) = tokio::time::timeout(Duration::from_secs(30), self.reached.recv())
            .await
            .expect("the handler reaches its stop in time")
            .expect("the handler is alive");
        assert_eq!(at, point, "stopped at {at:?}, expected {point:?}");
        claim
    }

    /// Lets the handler go on from where it stopped.
    pub(crate) fn go(&self) {
        self.go.send(()).unwrap();
    }
}

/// Stops at `points`, and the test's end of them.
pub(crate) fn stops<C>(points: &[Point]) -> (Stops<C>, Script<C>) {
    let (reached_tx, reached_rx) = mpsc::unbounded_channel();
    let (go_tx, go_rx) = mpsc::unbounded_channel();
    let stops = Stops {
        points: points.to_vec(),
        reached: reached_tx,
        go: Mutex::new(go_rx),
    };
    let script = Script {
        reached: reached_rx,
        go: go_tx,
    };
    (stops, script)
}

/// A leased handler with named stops around `work_item`: at each point in
/// `stops` it reports (point, the claim) and waits to be let go.
pub(crate) type Scripted<H> = Layered<H, Stops<ClaimedItem>>;

/// Wraps `inner`, stopping at `points`.
pub(crate) fn scripted<H>(inner: H, points: &[Point]) -> (Arc<Scripted<H>>, Script<ClaimedItem>) {
    let (layer, script) = stops(points);
    (Arc::new(Layered { inner, layer }), script)
}

impl ItemLayer for Stops<ClaimedItem> {
    async fn around<W>(&self, item: &ClaimedItem, work: W) -> Result<(), HandlerError>
    where
        W: Future<Output = Result<(), HandlerError>> + Send,
    {
        self.at(Point::Calling, item).await;
        let worked = work.await;
        self.at(Point::Called, item).await;
        worked
    }
}

/// The settlement's leased handler with the guard left out: the provider
/// key is derived from the attempt as well as the item, so each claim's
/// call is a new payment. Everything else is the real handler's.
pub(crate) struct KeyPerAttempt {
    /// The real handler (prepare, held, commit).
    pub real: SettleWithProvider<HttpProvider>,
    /// The provider.
    pub provider: HttpProvider,
}

impl LeasedHandler for KeyPerAttempt {
    type Batch = (<SettleWithProvider<HttpProvider> as LeasedHandler>::Batch, Amount);

    async fn prepare(&self, pool: &PgPool, chunk: &Chunk) -> Result<Self::Batch, HandlerError> {
        let batch = self.real.prepare(pool, chunk).await?;
        let reward: String = sqlx::query_scalar(
            "SELECT settlement.reward(v.volume, p.fee_bps)::text FROM settlement.token_trade_volume v
             JOIN settlement.settlement_policy p ON p.period = v.period
             WHERE v.period = $1::date AND v.creator = $2",
        )
        .bind(&chunk.scope)
        .bind(&chunk.items[0].key)
        .fetch_one(pool)
        .await?;
        Ok((batch, Amount::parse_decimal(&reward).unwrap()))
    }

    fn held(&self, batch: &Self::Batch) -> Vec<String> {
        self.real.held(&batch.0)
    }

    async fn work_item(&self, batch: &Self::Batch, chunk: &Chunk, item: &ClaimedItem) -> Result<(), HandlerError> {
        let key = format!(
            "{}:attempt-{}",
            settled::provider::payout_key(Period::parse(&chunk.scope).unwrap(), &item.key),
            item.fence.get()
        );
        match self.provider.pay(&key, &item.key, batch.1, None).await {
            Ok(_) => Ok(()),
            Err(e) => Err(settled::settlement::item_error(e)),
        }
    }

    async fn commit(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<(), HandlerError> {
        self.real.commit(tx, chunk).await
    }
}

/// `complete_fenced`'s statement with the fence left out: the status alone
/// decides (crates/engine/src/batch/queue/complete.rs has `AND ROW_FENCE =
/// f.fence` besides).
pub(crate) const COMPLETE_WITHOUT_FENCE: &str = "UPDATE settlement.token_trade_volume t
     SET status = 'settled', lease_owner = NULL, lease_until = NULL,
         last_error = NULL, not_before = NULL, updated_at = now()
     FROM unnest($2::text[], $3::bigint[]) AS f(key, fence)
     WHERE t.period = $1::date AND t.creator = f.key AND t.status = 'processing'
     RETURNING t.creator";

/// `complete_fenced`'s statement with the timeline left out of the fence:
/// the attempt alone is compared.
pub(crate) const COMPLETE_WITHOUT_TIMELINE: &str = "UPDATE settlement.token_trade_volume t
     SET status = 'settled', lease_owner = NULL, lease_until = NULL,
         last_error = NULL, not_before = NULL, updated_at = now()
     FROM unnest($2::text[], $3::bigint[]) AS f(key, fence)
     WHERE t.period = $1::date AND t.creator = f.key
       AND t.attempt::bigint = (f.fence & 4294967295) AND t.status = 'processing'
     RETURNING t.creator";

/// Runs a hand-written completion for `items` on `tx`, then the real
/// handler's commit (ledger row, balance credit) for the accepted ones, as
/// `complete_once` does. Returns the accepted keys.
pub(crate) async fn complete_by_hand<H: LeasedHandler>(
    tx: &mut PgConnection,
    sql: &str,
    handler: &H,
    chunk: &Chunk,
) -> Vec<String> {
    let keys: Vec<String> = chunk.items.iter().map(|i| i.key.clone()).collect();
    let fences: Vec<i64> = chunk.items.iter().map(|i| i.fence.packed()).collect();
    let accepted: Vec<String> = sqlx::query_scalar(sql)
        .bind(&chunk.scope)
        .bind(&keys)
        .bind(&fences)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    commit_accepted(tx, handler, chunk, &accepted).await;
    accepted
}

/// The real `complete_fenced`, then the real handler's commit for what it
/// accepted, on `tx`. Returns the accepted keys.
pub(crate) async fn complete_fenced<H: LeasedHandler>(
    tx: &mut PgConnection,
    handler: &H,
    chunk: &Chunk,
) -> Vec<String> {
    let queue = settled::settlement::queue();
    let accepted = queue.complete_fenced(tx, &chunk.scope, &chunk.items).await.unwrap();
    commit_accepted(tx, handler, chunk, &accepted).await;
    accepted
}

/// The real handler's commit, on `tx`, for the items of `chunk` whose keys
/// were `accepted` (none: nothing to commit).
async fn commit_accepted<H: LeasedHandler>(tx: &mut PgConnection, handler: &H, chunk: &Chunk, accepted: &[String]) {
    let kept: Vec<ClaimedItem> = chunk
        .items
        .iter()
        .filter(|i| accepted.contains(&i.key))
        .cloned()
        .collect();
    if !kept.is_empty() {
        handler.commit(tx, &chunk.with_items(kept)).await.unwrap();
    }
}

/// A model's counterexample trace, printed; the test fails when the model
/// found none.
pub(crate) fn printed_trace(found: Counterexample) -> String {
    let trace = found.trace.unwrap_or_else(|| {
        panic!(
            "{}: no counterexample to \"{}\" without {}",
            found.model, found.case.property, found.case.guard
        )
    });
    println!(
        "model, without {}: \"{}\" fails ({}):\n{trace}",
        found.case.guard, found.case.property, found.model
    );
    trace
}

/// A drain of one item at a time, retrying at once (1 ms backoff).
pub(crate) fn drain_config() -> DrainConfig {
    DrainConfig {
        chunk: 1,
        concurrency: 1,
        idle_poll: Duration::from_millis(20),
        retry: RetryPolicy {
            max_attempts: 5,
            backoff_base_ms: 1,
            backoff_cap_ms: 1,
        },
        ..DrainConfig::default()
    }
}

/// Leases that outlive the test, renewed and rescued only when the test says.
pub(crate) fn long_leases() -> LeaseConfig {
    LeaseConfig {
        ttl: Duration::from_secs(600),
        rescue_interval: Duration::from_secs(3600),
        shutdown_grace: Duration::from_secs(1),
        calls_in_flight: 1,
    }
}

/// The ledger rows of `creator` for [`PERIOD`]: (amount, attempt).
pub(crate) async fn ledger(pool: &PgPool, creator: &str) -> Vec<(String, i32)> {
    sqlx::query_as(
        "SELECT amount::text, attempt FROM settlement.reward_ledger WHERE period = $1::date AND creator = $2",
    )
    .bind(PERIOD)
    .bind(creator)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The item's (status, attempt).
pub(crate) async fn item(pool: &PgPool, creator: &str) -> (String, i32) {
    sqlx::query_as("SELECT status, attempt FROM settlement.token_trade_volume WHERE period = $1::date AND creator = $2")
        .bind(PERIOD)
        .bind(creator)
        .fetch_one(pool)
        .await
        .unwrap()
}
