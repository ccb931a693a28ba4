//! The handler path: claim a chunk, run [`ChunkHandler::handle_chunk`] on
//! the claiming transaction, mark the items, commit; a failing chunk is
//! retried in halves.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Instant;

use sqlx::{Connection, PgConnection};

use super::cursor::ClaimCursor;
use super::{fail_alone, Step, Target};
use crate::batch::queue::{ChunkSql, WorkQueue};
use crate::common::error::{EngineError, HandlerError};
use crate::common::item::{Chunk, Handled};

/// The application's work for a chunk, done on the claiming transaction.
///
/// It must do its effects with set-based statements on `tx` (one statement
/// per chunk, not per item) and must not commit: the engine marks the items
/// settled and commits, so effects and status change commit together or not
/// at all.
pub trait ChunkHandler: Send + Sync + 'static {
    /// Performs the chunk's effects inside the claiming transaction.
    fn handle_chunk<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        chunk: &'a Chunk,
    ) -> impl Future<Output = Result<Handled, HandlerError>> + Send + 'a;

    /// The same effects in SQL, if the handler can say them so: the engine
    /// then claims, marks and runs them as one statement per chunk (see
    /// [`ChunkSql`]) and never calls [`ChunkHandler::handle_chunk`]. Both
    /// must do the same thing.
    fn chunk_sql(&self) -> Option<ChunkSql> {
        None
    }
}

/// Marks a handled chunk: held keys `held`, the rest `settled`.
async fn mark_handled(
    tx: &mut PgConnection,
    queue: &WorkQueue,
    chunk: &Chunk,
    handled: &Handled,
) -> Result<usize, EngineError> {
    let settled: Vec<String> = chunk
        .items
        .iter()
        .filter(|i| !handled.held.contains(&i.key))
        .map(|i| i.key.clone())
        .collect();
    if !handled.held.is_empty() {
        queue.mark_held_in_tx(tx, &chunk.scope, &handled.held).await?;
    }
    if !settled.is_empty() {
        queue.mark_settled_in_tx(tx, &chunk.scope, &settled).await?;
    }
    Ok(settled.len())
}

/// One transaction: claim (in the loop's window), handle, mark settled, commit.
pub(super) async fn settle_one_chunk<H: ChunkHandler>(
    t: &Target,
    handler: &H,
    cursor: &ClaimCursor,
) -> Result<Step, EngineError> {
    let mut conn = t.conn().await?;
    let window = cursor.window(&mut conn).await?;
    let mut tx = conn.begin().await.map_err(EngineError::db("beginning a transaction"))?;
    let started = Instant::now();
    let claimed = t
        .queue
        .claim_chunk_in_tx_window(&mut tx, &t.scope, t.cfg.chunk, t.run_id, window.keys())
        .await?;
    t.stats.record_claim("tx", started.elapsed());
    let last = claimed.iter().map(|i| i.key.clone()).max();
    cursor.advance(&window, claimed.len(), t.cfg.chunk, last);
    if claimed.is_empty() {
        tx.rollback().await.map_err(EngineError::db("ending an empty claim"))?;
        return window.after_empty_claim(&mut conn, t).await;
    }
    t.stats.items_claimed.fetch_add(claimed.len() as u64, Ordering::Relaxed);
    let chunk = Chunk::new(t.run_id, &t.scope, claimed);
    let handling = Instant::now();
    let handled = handler.handle_chunk(&mut tx, &chunk).await;
    metrics::histogram!(crate::common::telemetry::HANDLER_DURATION, "mode" => "tx")
        .record(handling.elapsed().as_secs_f64());
    match handled {
        Ok(handled) => {
            let settled = mark_handled(&mut tx, &t.queue, &chunk, &handled).await?;
            tx.commit().await.map_err(EngineError::db("committing a chunk"))?;
            t.committed(settled as u64, handled.held.len() as u64);
            Ok(Step::Worked)
        }
        Err(err) => {
            let _ = tx.rollback().await;
            drop(conn);
            if err.is_fatal() || !err.is_permanent() {
                // A lost connection says nothing about the items: retry the
                // whole chunk later instead of hunting for a culprit. A
                // missing grant says nothing about them either: stop.
                return Err(EngineError::Handler {
                    items: chunk.items.len(),
                    first_key: chunk.items[0].key.clone(),
                    source: err,
                });
            }
            isolate_failure(t, handler, chunk, err).await?;
            Ok(Step::Worked)
        }
    }
}

/// Retries a failed chunk in halves, each in its own transaction, until the
/// failing item is alone; it alone records the failure.
async fn isolate_failure<H: ChunkHandler>(
    t: &Target,
    handler: &H,
    chunk: Chunk,
    err: HandlerError,
) -> Result<(), EngineError> {
    // Depth-first over halves; bounded by 2 * chunk size transactions.
    let mut pending = vec![(chunk, err)];
    while let Some((chunk, err)) = pending.pop() {
        if chunk.items.len() == 1 {
            let item = &chunk.items[0];
            let failed = fail_alone(t, &item.key, &err).await?;
            tracing::warn!(
                run = chunk.run_id, scope = %chunk.scope, item = %item.key, attempt = item.fence.get(),
                failed, error = %err, "item failed"
            );
            continue;
        }
        t.stats.chunks_split.fetch_add(1, Ordering::Relaxed);
        let mid = chunk.items.len() / 2;
        for half in [chunk.items[..mid].to_vec(), chunk.items[mid..].to_vec()] {
            let keys: Vec<String> = half.iter().map(|i| i.key.clone()).collect();
            let mut conn = t.conn().await?;
            let mut tx = conn.begin().await.map_err(EngineError::db("beginning a transaction"))?;
            let locked = t.queue.lock_keys_in_tx(&mut tx, &chunk.scope, &keys).await?;
            if locked.is_empty() {
                tx.rollback().await.map_err(EngineError::db("ending an empty retry"))?;
                continue;
            }
            let part = Chunk::new(chunk.run_id, &chunk.scope, locked);
            match handler.handle_chunk(&mut tx, &part).await {
                Ok(handled) => {
                    let settled = mark_handled(&mut tx, &t.queue, &part, &handled).await?;
                    tx.commit().await.map_err(EngineError::db("committing a chunk"))?;
                    t.committed(settled as u64, handled.held.len() as u64);
                }
                Err(half_err) => {
                    let _ = tx.rollback().await;
                    if half_err.is_fatal() || !half_err.is_permanent() {
                        return Err(EngineError::Handler {
                            items: part.items.len(),
                            first_key: part.items[0].key.clone(),
                            source: half_err,
                        });
                    }
                    pending.push((part, half_err));
                }
            }
        }
    }
    Ok(())
}
