//! The HTTP edge of `settled serve`: how connections are accepted, timed
//! and closed. hyper's connection builder does the protocol work; this file
//! only sets its limits and the accept loop around it.
//!
//! - A connection must send a request's head within `header_timeout` of the
//!   moment it starts waiting for one, whether it is new or idle between
//!   keep-alive requests (hyper arms the timer whenever it waits for a head
//!   and does not reset it on partial bytes), so one byte every few seconds
//!   does not keep a connection, and idle connections close after the same
//!   time.
//! - At most `max_connections` are open at once; more wait in the kernel's
//!   backlog until one closes. The cap is kept below the open-file limit, so
//!   the database pool and `/healthz` always find a descriptor.
//! - Every request has `request_timeout` from its head to its answer
//!   (tower-http's timeout layer, in `super::router`).
//! - On SIGTERM or SIGINT the listener closes, open connections finish
//!   their current request and close, and whatever is still open after
//!   `shutdown_grace` is dropped: shutdown never waits on a client.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Largest request head (request line and headers) read, in bytes; a larger
/// one is answered 431 by hyper.
pub const MAX_HEAD_BYTES: usize = 32 * 1024;
/// File descriptors kept free for the database pools, logs and the accept
/// itself when the connection cap is derived from the open-file limit.
pub const RESERVED_FDS: u64 = 96;

/// Limits on connections and requests.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    /// Time to send a request head, from the moment the connection waits
    /// for one (so also the idle timeout between keep-alive requests).
    pub header_timeout: Duration,
    /// Time from a request's head to its answer (503 `request-timeout`).
    pub request_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// How long SIGTERM waits for open connections before dropping them.
    pub shutdown_grace: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(30),
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl HttpLimits {
    /// Raises this process's open-file soft limit to its hard limit and
    /// lowers the connection cap, if needed, to what the limit leaves after
    /// [`RESERVED_FDS`]. Returns the cap in force.
    pub fn fit_open_file_limit(mut self) -> anyhow::Result<HttpLimits> {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        let limit = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
            hard
        } else {
            soft
        };
        anyhow::ensure!(
            limit > RESERVED_FDS + 8,
            "the open-file limit is {limit}: too low to serve (it needs more than {} descriptors)",
            RESERVED_FDS + 8
        );
        let fits = usize::try_from(limit - RESERVED_FDS).unwrap_or(usize::MAX);
        if self.max_connections > fits {
            tracing::warn!(
                asked = self.max_connections,
                used = fits,
                open_file_limit = limit,
                "--max-connections lowered to fit the open-file limit"
            );
            self.max_connections = fits;
        }
        Ok(self)
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then drains the
/// open connections for at most `limits.shutdown_grace`.
pub async fn run(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    tokio::pin!(shutdown);
    let mut accept_failing = false;
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit?,
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(err) => {
                    // EMFILE and friends: wait for a descriptor, say so once.
                    if !accept_failing {
                        tracing::warn!(error = %err, "accepting connections fails; retrying");
                        accept_failing = true;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        if accept_failing {
            tracing::info!("accepting connections again");
            accept_failing = false;
        }
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A client that goes away or times out is not an error of ours.
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    let open = limits.max_connections - permits.available_permits();
    tracing::info!(
        open,
        grace_ms = limits.shutdown_grace.as_millis() as u64,
        "shutting down"
    );
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        let open = limits.max_connections - permits.available_permits();
        tracing::warn!(open, "connections still open after the grace period are dropped");
    }
    Ok(())
}
