//! The wake-up: one LISTEN connection per serving process and queue. A
//! notification for the queue (one per committed transaction that enqueued
//! into it) wakes one idle loop; a loop whose claim came back full wakes
//! one more (`Ctx::claimed`), so a backlog draws in loops one at a time
//! and a trickle wakes one loop per commit rather than all of them. A lost
//! or re-opened connection wakes every loop: notifications sent meanwhile
//! are lost, so the loops look for themselves. The listener reconnects for as long as the
//! process serves, with a capped backoff, so a restart or a failover of
//! the database never leaves the loops asleep: at worst they poll.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;

use super::super::{Queue, WAKE_CHANNEL};
use super::Wake;

/// Longest pause between two attempts to listen again.
const RELISTEN_BACKOFF_MAX_MS: u64 = 2_000;

/// Listens for `queue`'s notifications until the task is aborted.
pub(super) async fn listen(pool: PgPool, wake: Wake, queue: Arc<Queue>, woken: Arc<Notify>) {
    let via = match wake {
        Wake::Poll => return,
        Wake::Listen => pool,
        Wake::ListenVia(direct) => direct,
    };
    let mut failures = 0u32;
    loop {
        match listen_once(&via, &queue, &woken).await {
            Ok(()) => failures = 0,
            Err(err) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(queue = queue.name(), error = %err, "listening for new jobs failed; polling until it works again");
                }
            }
        }
        // Whatever was sent while not listening: look now.
        woken.notify_waiters();
        let pause = (50u64 << failures.min(6)).min(RELISTEN_BACKOFF_MAX_MS);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// One LISTEN connection, until it is lost.
async fn listen_once(via: &PgPool, queue: &Queue, woken: &Notify) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(via).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(WAKE_CHANNEL).await?;
    // Jobs committed before this LISTEN sent nothing we heard.
    woken.notify_waiters();
    loop {
        match listener.try_recv().await? {
            Some(notification) if notification.payload() == queue.name() => woken.notify_one(),
            Some(_) => {}
            None => return Ok(()),
        }
    }
}
