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
//! - At most `max_connections` are open at once, a cap kept below the
//!   open-file limit so the database pools always find a descriptor. When a
//!   new connection arrives at the cap, the connection that has waited
//!   longest without a request in progress (slow, silent or idle) is closed
//!   to make room, once it is at least `EVICT_MIN_AGE` old: a flood of
//!   slow clients evicts itself at a bounded rate, and a client that sends
//!   its request at once (`/healthz`, a payout) is served. While no
//!   connection can be evicted yet, or every one has a request in progress,
//!   a new one waits (and the kernel's backlog holds the rest).
//! - Every request has `request_timeout` from its head to its answer
//!   (tower-http's timeout layer, in `super::router`).
//! - On SIGTERM or SIGINT the listener closes, open connections finish
//!   their current request and close, and whatever is still open after
//!   `shutdown_grace` is dropped: shutdown never waits on a client.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// Largest request head (request line, headers and the blank line that
/// ends them), in bytes; a larger one is answered 431 by hyper and its
/// connection closed. hyper's `max_header_size` counts the parsed head
/// exactly; its read buffer (`max_buf_size`, bounded too) may hold more
/// than that after one read, so the buffer alone would let a head that
/// arrived in one read through.
pub const MAX_HEAD_BYTES: usize = 32 * 1024;
/// File descriptors kept free for the database pools, logs and the accept
/// itself when the connection cap is derived from the open-file limit.
pub(crate) const RESERVED_FDS: u64 = 96;

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
    /// [`RESERVED_FDS`].
    pub(crate) fn fit_open_file_limit(mut self) -> anyhow::Result<HttpLimits> {
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

/// A connection at least this old may be evicted at the cap: time enough
/// to send a request head, so that a flood of reconnecting slow clients
/// evicts itself at a bounded rate and cannot evict a real client first.
pub(crate) const EVICT_MIN_AGE: Duration = Duration::from_millis(200);

/// Connections the kernel queues for `accept` (capped by
/// `net.core.somaxconn`). The standard library's 128 overflows under a flood
/// at the cap, and an overflowing queue drops the SYNs of real clients too.
pub(crate) const LISTEN_BACKLOG: u32 = 4096;

/// Listens on `addr` with [`LISTEN_BACKLOG`].
pub(crate) fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// One open connection, as the accept loop sees it.
struct Open {
    id: u64,
    accepted: Instant,
    /// Requests in progress on it.
    busy: Arc<AtomicUsize>,
    /// Told to close it.
    evict: Arc<Notify>,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Registry {
    open: Mutex<VecDeque<Open>>,
    /// Told whenever a connection ends or a request on one finishes (a
    /// connection that may be evicted now).
    changed: Notify,
}

impl Registry {
    fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Closes the oldest connection without a request in progress if it is
    /// at least [`EVICT_MIN_AGE`] old.
    fn evict_oldest_waiting(&self) -> Eviction {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let Some(at) = open.iter().position(|c| c.busy.load(Ordering::Acquire) == 0) else {
            return Eviction::AllBusy;
        };
        let ripe = open[at].accepted + EVICT_MIN_AGE;
        if ripe > Instant::now() {
            return Eviction::NotBefore(ripe);
        }
        if let Some(c) = open.remove(at) {
            c.evict.notify_one();
        }
        Eviction::Evicted
    }

    fn remove(&self, id: u64) {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|c| c.id != id);
        self.changed.notify_waiters();
    }
}

/// What [`Registry::evict_oldest_waiting`] did.
enum Eviction {
    Evicted,
    /// The oldest waiting connection may be evicted at this time.
    NotBefore(Instant),
    /// Every connection has a request in progress.
    AllBusy,
}

/// Counts a request in progress on its connection for as long as it lives.
struct InProgress {
    busy: Arc<AtomicUsize>,
    registry: Arc<Registry>,
}

impl InProgress {
    fn start(busy: &Arc<AtomicUsize>, registry: &Arc<Registry>) -> InProgress {
        busy.fetch_add(1, Ordering::AcqRel);
        InProgress {
            busy: busy.clone(),
            registry: registry.clone(),
        }
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.busy.fetch_sub(1, Ordering::AcqRel);
        self.registry.changed.notify_waiters();
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
    let registry = Arc::new(Registry::default());
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    tokio::pin!(shutdown);
    let mut accept_failing = false;
    let mut evicted_since_log = 0u64;
    let mut next_id = 0u64;
    'accept: loop {
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
            () = &mut shutdown => break 'accept,
        };
        if accept_failing {
            tracing::info!("accepting connections again");
            accept_failing = false;
        }
        // At the cap, make room for it: evict the oldest connection that
        // waits without a request, or, when every one has a request in
        // progress, hold this one (and accept no other) until one ends.
        while registry.len() >= limits.max_connections {
            let changed = registry.changed.notified();
            let wait_until = match registry.evict_oldest_waiting() {
                Eviction::Evicted => {
                    evicted_since_log += 1;
                    if evicted_since_log.is_power_of_two() {
                        tracing::warn!(
                            evicted = evicted_since_log,
                            max_connections = limits.max_connections,
                            "at the connection cap: closing connections that wait without a request"
                        );
                    }
                    break;
                }
                Eviction::NotBefore(at) => Some(at),
                Eviction::AllBusy => None,
            };
            let ripe = async {
                match wait_until {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = changed => {},
                () = ripe => {},
                () = &mut shutdown => break 'accept,
            }
        }
        let _ = stream.set_nodelay(true);
        next_id += 1;
        let (id, busy, evict) = (next_id, Arc::new(AtomicUsize::new(0)), Arc::new(Notify::new()));
        registry.open.lock().unwrap_or_else(|e| e.into_inner()).push_back(Open {
            id,
            accepted: Instant::now(),
            busy: busy.clone(),
            evict: evict.clone(),
        });
        let app = app.clone();
        let in_registry = registry.clone();
        let service = hyper::service::service_fn(move |request| {
            let in_progress = InProgress::start(&busy, &in_registry);
            let mut app = app.clone();
            async move {
                let response = tower_service::Service::call(&mut app, request).await;
                drop(in_progress);
                response
            }
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        let registry = registry.clone();
        tokio::spawn(async move {
            // A client that goes away, times out or is evicted is not an
            // error of ours; dropping the connection closes its socket.
            tokio::select! {
                _ = connection => {},
                () = evict.notified() => {},
            }
            registry.remove(id);
        });
    }
    drop(listener);
    drain(graceful, &registry, limits).await
}

/// Closes the listener's connections: each finishes its request, then what
/// is left after the grace is dropped.
async fn drain(graceful: GracefulShutdown, registry: &Registry, limits: HttpLimits) -> anyhow::Result<()> {
    tracing::info!(
        open = registry.len(),
        grace_ms = limits.shutdown_grace.as_millis() as u64,
        "shutting down"
    );
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            open = registry.len(),
            "connections still open after the grace period are dropped"
        );
    }
    Ok(())
}
