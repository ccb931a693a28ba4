//! The one-statement path ([`crate::ChunkSql`]): a chunk is BEGIN, one
//! statement that claims, marks and runs the effects, COMMIT; a failing
//! chunk is claimed again without effects to learn its keys and retried in
//! halves.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::cursor::{ClaimCursor, Window};
use super::{fail_alone, Step, Target};
use crate::batch::queue::ChunkStatements;
use crate::common::error::{EngineError, HandlerError};

/// One transaction of the one-statement path: claim in the loop's window
/// (see [`ClaimCursor`]), mark and pay in one statement, commit.
pub(super) async fn settle_one_statement(
    t: &Target,
    statements: &ChunkStatements,
    cursor: &ClaimCursor,
) -> Result<Step, EngineError> {
    let mut conn = t.conn().await?;
    let window = cursor.window(&mut conn).await?;
    let mut tx = statements.begin(&mut conn).await?;
    let started = Instant::now();
    let ran = statements
        .run(&mut tx, &t.scope, t.cfg.chunk, t.run_id, window.keys())
        .await?;
    t.stats.record_claim("tx", started.elapsed());
    let done = match ran {
        Ok(done) => done,
        Err(err) => {
            let _ = tx.rollback().await;
            drop(conn);
            return statement_failed(t, statements, &window, err).await;
        }
    };
    cursor.advance(&window, done.claimed as usize, t.cfg.chunk, done.last_key.clone());
    if done.claimed == 0 {
        // Decided outside the chunk's transaction, which runs only chunk statements.
        tx.rollback().await.map_err(EngineError::db("ending an empty claim"))?;
        return window.after_empty_claim(&mut conn, t).await;
    }
    t.stats.items_claimed.fetch_add(done.claimed, Ordering::Relaxed);
    tx.commit().await.map_err(EngineError::db("committing a chunk"))?;
    t.committed(done.settled, done.held.len() as u64);
    Ok(Step::Worked)
}

/// A chunk statement failed (and was rolled back). A transient failure is
/// retried by the loop; a permanent one is narrowed down: the same claim is
/// made again without effects to learn its keys, then the keys are settled
/// in halves until the failing item is alone.
async fn statement_failed(
    t: &Target,
    statements: &ChunkStatements,
    window: &Window,
    err: HandlerError,
) -> Result<Step, EngineError> {
    let first_key = window
        .after
        .as_ref()
        .map_or_else(|| "(from the start)".to_string(), |a| format!("after {a}"));
    if err.is_fatal() || !err.is_permanent() {
        return Err(EngineError::Handler {
            items: t.cfg.chunk as usize,
            first_key,
            source: err,
        });
    }
    let mut conn = t.conn().await?;
    let mut tx = sqlx::Connection::begin(&mut *conn)
        .await
        .map_err(EngineError::db("beginning a transaction"))?;
    let claimed = t
        .queue
        .claim_chunk_in_tx_window(&mut tx, &t.scope, t.cfg.chunk, t.run_id, window.keys())
        .await?;
    tx.rollback().await.map_err(EngineError::db("ending a claim"))?;
    let keys: Vec<String> = claimed.into_iter().map(|i| i.key).collect();
    if keys.is_empty() {
        // Others took the rows meanwhile; nothing to narrow down here.
        return Ok(Step::Worked);
    }
    tracing::warn!(run = t.run_id, scope = %t.scope, items = keys.len(), error = %err, "chunk failed; retrying it in halves");
    isolate_statement_failure(t, statements, keys).await?;
    Ok(Step::Worked)
}

/// [`isolate_failure`] for the one-statement path. `keys` are the rows the
/// failed chunk's window holds now, which another loop may have thinned
/// since the failure: they are run as a set first, and only a set that
/// failed is split, so an item is failed only by its own statement failing
/// alone (never for another's error: a failing chunk re-claimed down to one
/// good item would otherwise fail that item unrun).
async fn isolate_statement_failure(
    t: &Target,
    statements: &ChunkStatements,
    keys: Vec<String>,
) -> Result<(), EngineError> {
    // (keys, why they failed as a set): None for a set not run yet.
    let mut pending: Vec<(Vec<String>, Option<HandlerError>)> = vec![(keys, None)];
    while let Some((keys, failed)) = pending.pop() {
        match failed {
            None => {
                let mut conn = t.conn().await?;
                let mut tx = statements.begin(&mut conn).await?;
                match statements.run_keys(&mut tx, &t.scope, t.run_id, &keys).await? {
                    Ok(done) => {
                        tx.commit().await.map_err(EngineError::db("committing a chunk"))?;
                        t.committed(done.settled, done.held.len() as u64);
                    }
                    Err(err) => {
                        let _ = tx.rollback().await;
                        if err.is_fatal() || !err.is_permanent() {
                            return Err(EngineError::Handler {
                                items: keys.len(),
                                first_key: keys[0].clone(),
                                source: err,
                            });
                        }
                        pending.push((keys, Some(err)));
                    }
                }
            }
            Some(err) if keys.len() == 1 => {
                let failed = fail_alone(t, &keys[0], &err).await?;
                tracing::warn!(run = t.run_id, scope = %t.scope, item = %keys[0], failed, error = %err, "item failed");
            }
            Some(_) => {
                t.stats.chunks_split.fetch_add(1, Ordering::Relaxed);
                let mid = keys.len() / 2;
                pending.push((keys[mid..].to_vec(), None));
                pending.push((keys[..mid].to_vec(), None));
            }
        }
    }
    Ok(())
}
