//! The producer: enqueued in bulk, paced by the runner's tokens, its own
//! clock or a target depth, through database outages.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use settled_engine::NewJob;
use sqlx::{PgConnection, PgPool};

use super::Shared;
use crate::bench::continuous::{parse_token, Pacer};

/// Enqueues `n` jobs with one bulk statement. Their keys follow the count
/// of jobs enqueued, so a retry after a lost answer enqueues nothing twice.
pub(super) async fn enqueue(shared: &Shared, conn: &mut PgConnection, n: u64) -> anyhow::Result<()> {
    let first = shared.enqueued.load(Ordering::Relaxed);
    let jobs = (first..first + n)
        .map(|seq| {
            NewJob::new(format!("{}-{seq}", shared.key_prefix))
                .payload(&serde_json::json!({ "seq": seq, "padding": shared.padding }))
        })
        .collect::<Result<Vec<_>, _>>()?;
    shared.queue.enqueue_many(conn, &jobs).await?;
    shared.enqueued.fetch_add(n, Ordering::Relaxed);
    Ok(())
}

/// Shortest pause of the producer after a failure.
pub const PRODUCER_BACKOFF_MIN_MS: u64 = 250;
/// Longest pause of the producer after failures.
pub const PRODUCER_BACKOFF_MAX_MS: u64 = 5_000;

/// The producer's connection through database outages (a restart, lost
/// connections): a failed statement drops it, and the next statement takes
/// a new one after a pause that doubles up to [`PRODUCER_BACKOFF_MAX_MS`].
/// One line when the producer starts failing, one when it works again.
pub(super) struct Link {
    conn: Option<sqlx::pool::PoolConnection<sqlx::Postgres>>,
    failing_since: Option<Instant>,
    pause: Duration,
}

impl Link {
    pub(super) fn new() -> Link {
        Link {
            conn: None,
            failing_since: None,
            pause: Duration::from_millis(PRODUCER_BACKOFF_MIN_MS),
        }
    }

    async fn conn(&mut self, pool: &PgPool) -> anyhow::Result<&mut PgConnection> {
        if self.conn.is_none() {
            self.conn = Some(pool.acquire().await?);
        }
        Ok(self.conn.as_deref_mut().expect("a connection was just taken"))
    }

    pub(super) fn worked(&mut self) {
        if let Some(since) = self.failing_since.take() {
            let down_secs = since.elapsed().as_secs_f64();
            tracing::info!(down_secs, "the producer works again");
        }
        self.pause = Duration::from_millis(PRODUCER_BACKOFF_MIN_MS);
    }

    async fn failed(&mut self, err: anyhow::Error) {
        self.conn = None;
        if self.failing_since.is_none() {
            self.failing_since = Some(Instant::now());
            tracing::warn!(error = %format!("{err:#}"), "the producer failed; retrying with backoff");
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(Duration::from_millis(PRODUCER_BACKOFF_MAX_MS));
    }
}

/// Enqueues `n` jobs, retrying through failures until they are in or the
/// adapter stops.
async fn enqueue_through_outages(shared: &Shared, link: &mut Link, n: u64) {
    while !shared.stop.load(Ordering::Relaxed) {
        let done = match link.conn(&shared.pool).await {
            Ok(conn) => enqueue(shared, conn, n).await,
            Err(err) => Err(err),
        };
        match done {
            Ok(()) => return link.worked(),
            Err(err) => link.failed(err).await,
        }
    }
}

/// The producer: runner-paced tokens, its own clock, or a target depth.
/// It never stops on a database error: it waits the outage out.
pub(super) async fn produce(shared: Arc<Shared>) {
    match (shared.env.producer_mode.as_str(), shared.env.producer_pacing.as_str()) {
        ("fixed", "harness") => produce_from_tokens(&shared).await,
        ("fixed", _) => produce_paced(&shared).await,
        _ => produce_to_depth(&shared).await,
    }
}

async fn produce_from_tokens(shared: &Shared) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(1024);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { return };
            if let Some(n) = parse_token(&line) {
                if tx.blocking_send(n).is_err() {
                    return;
                }
            }
        }
    });
    let mut link = Link::new();
    while let Some(n) = rx.recv().await {
        enqueue_through_outages(shared, &mut link, n.min(shared.env.producer_batch_max)).await;
    }
}

async fn produce_paced(shared: &Shared) {
    let env = &shared.env;
    let mut pacer = Pacer::with(
        env.producer_rate,
        Duration::from_millis(env.producer_batch_ms),
        env.producer_batch_max,
    );
    let mut link = Link::new();
    while !shared.stop.load(Ordering::Relaxed) {
        for n in pacer.next().await {
            enqueue_through_outages(shared, &mut link, n).await;
        }
    }
}

async fn produce_to_depth(shared: &Shared) {
    let mut link = Link::new();
    while !shared.stop.load(Ordering::Relaxed) {
        let ready = match link.conn(&shared.pool).await {
            Ok(conn) => shared.queue.stats(conn).await.map_err(anyhow::Error::from),
            Err(err) => Err(err),
        };
        let ready = match ready {
            Ok(stats) => stats.ready.max(0) as u64,
            Err(err) => {
                link.failed(err).await;
                continue;
            }
        };
        link.worked();
        if ready < shared.env.target_depth {
            let n = (shared.env.target_depth - ready).min(shared.env.producer_batch_max);
            enqueue_through_outages(shared, &mut link, n).await;
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
