//! The loops of a batch drain or a continuous serve: spawned side by side,
//! joined together, and stopped together when one fails. What a loop's step
//! does, how it backs off and how it sleeps are the floors' own.

use std::future::Future;

use tokio::task::JoinSet;

use crate::common::error::EngineError;

/// Spawns `count` loops, each the future `spawn_one` returns, and waits for
/// every one. The first to fail (a panic counts, named after `what`) calls
/// `stop`, so the others finish what they hold and end; its error is the
/// result.
pub(crate) async fn run_loops<F, Fut>(
    count: u32,
    what: &'static str,
    mut spawn_one: F,
    stop: impl Fn(),
) -> Result<(), EngineError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), EngineError>> + Send + 'static,
{
    let mut loops = JoinSet::new();
    for _ in 0..count {
        loops.spawn(spawn_one());
    }
    let mut first_error = None;
    while let Some(joined) = loops.join_next().await {
        let result = joined.unwrap_or_else(|e| Err(EngineError::Invariant(format!("{what} panicked: {e}"))));
        if let Err(err) = result {
            stop();
            first_error.get_or_insert(err);
        }
    }
    first_error.map_or(Ok(()), Err)
}
