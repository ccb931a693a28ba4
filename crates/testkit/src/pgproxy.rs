//! A TCP proxy in front of a test database that loses one transaction's
//! COMMIT, or the server's answer to it, on purpose: the two faults a
//! broken network makes at the worst moment, for tests of code that must
//! learn an outcome it never heard. Everything else passes through.
//!
//! It reads the client's side of the protocol message by message: simple
//! queries (`Q`) and the extended protocol (a `Parse`'s text, found again
//! through `Bind` and `Execute`). It never parses the server's side.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::Notify;

/// What happens to the faulted COMMIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitFault {
    /// COMMIT reaches the server, which commits; its answer is dropped and
    /// both sides are closed once it has arrived: the client sees a lost
    /// connection after a commit.
    LoseAnswer,
    /// Both sides are closed instead of forwarding COMMIT: the server rolls
    /// back, the client sees the same lost connection.
    CutBefore,
}

/// Which COMMIT to fault, and what the network does afterwards.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    /// Only a connection that has run a statement containing this text is
    /// faulted, at its next COMMIT, once (until [`PgProxy::arm`] arms the
    /// proxy again).
    pub armed_by: String,
    /// The fault.
    pub fault: CommitFault,
    /// After the fault, every other connection through the proxy is closed
    /// too, and new ones are closed at once: the database stays
    /// unreachable through the proxy.
    pub then_refuse: bool,
}

/// Longest wait for the server's answer to a COMMIT whose answer is lost.
pub(crate) const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// Pause between the answer's arrival and closing both sides.
pub(crate) const CUT_PAUSE: Duration = Duration::from_millis(100);

/// A running proxy; stops accepting on drop.
pub struct PgProxy {
    port: u16,
    user: String,
    database: String,
    shared: Arc<Shared>,
    accept: tokio::task::JoinHandle<()>,
}

struct Shared {
    plan: FaultPlan,
    /// The text that arms a connection now, and its arming (0 for the
    /// plan's `armed_by`, one more for each [`PgProxy::arm`]).
    trigger: std::sync::Mutex<(String, u64)>,
    /// Faults allowed so far: one per arming.
    shots: AtomicUsize,
    upstream: Upstream,
    faults: AtomicUsize,
    /// Set when the network goes down for good (`then_refuse`).
    down: tokio::sync::watch::Sender<bool>,
}

#[derive(Debug, Clone)]
enum Upstream {
    Tcp(String, u16),
    Unix(PathBuf),
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

impl Upstream {
    async fn connect(&self) -> std::io::Result<Box<dyn Stream>> {
        Ok(match self {
            Upstream::Tcp(host, port) => Box::new(TcpStream::connect((host.as_str(), *port)).await?),
            Upstream::Unix(path) => Box::new(UnixStream::connect(path).await?),
        })
    }
}

impl PgProxy {
    /// Starts a proxy on a free 127.0.0.1 port in front of the server of
    /// `database_url` (TCP or a socket directory). Call inside a runtime.
    pub async fn start(database_url: &str, plan: FaultPlan) -> PgProxy {
        let target: PgConnectOptions = database_url.parse().expect("a PostgreSQL URL");
        let upstream = match target.get_socket() {
            Some(dir) => Upstream::Unix(dir.join(format!(".s.PGSQL.{}", target.get_port()))),
            None => Upstream::Tcp(target.get_host().to_string(), target.get_port()),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            trigger: std::sync::Mutex::new((plan.armed_by.clone(), 0)),
            shots: AtomicUsize::new(1),
            plan,
            upstream,
            faults: AtomicUsize::new(0),
            down: tokio::sync::watch::Sender::new(false),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        PgProxy {
            port,
            user: target.get_username().to_string(),
            database: target.get_database().unwrap_or("postgres").to_string(),
            shared,
            accept,
        }
    }

    /// A URL of the same database through the proxy (no TLS, so the proxy
    /// can read the messages).
    pub fn url(&self) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{}?sslmode=disable",
            self.user, self.port, self.database
        )
    }

    /// Arms the proxy again: the next COMMIT of a connection that runs a
    /// statement containing `armed_by` from now on is faulted, once, as the
    /// plan says. Connections armed before are no longer.
    pub fn arm(&self, armed_by: &str) {
        let mut trigger = self.shared.trigger.lock().unwrap_or_else(|e| e.into_inner());
        *trigger = (armed_by.to_string(), trigger.1 + 1);
        self.shared.shots.fetch_add(1, Ordering::SeqCst);
    }

    /// How many COMMITs were faulted so far (one at most per arming).
    pub fn faults(&self) -> usize {
        self.shared.faults.load(Ordering::SeqCst)
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((client, _)) = listener.accept().await {
        if *shared.down.borrow() {
            drop(client);
            continue;
        }
        tokio::spawn(serve_connection(client, shared.clone()));
    }
}

/// One client connection: forwards both ways until either side ends or the
/// fault cuts both.
async fn serve_connection(client: TcpStream, shared: Arc<Shared>) {
    let Ok(server) = shared.upstream.connect().await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = tokio::io::split(server);
    let conn = Arc::new(Connection::default());
    let mut down = shared.down.subscribe();
    tokio::select! {
        _ = client_to_server(client_read, server_write, &conn, &shared) => {}
        _ = server_to_client(server_read, client_write, &conn, &shared) => {}
        _ = conn.cut.notified() => {}
        _ = down.wait_for(|down| *down) => {}
    }
    // Returning drops all four halves: both sockets close.
}

#[derive(Default)]
struct Connection {
    /// The server's bytes are dropped from now on.
    drop_replies: AtomicBool,
    /// Close both sides now.
    cut: Notify,
}

/// What the client's messages ran so far.
#[derive(Default)]
struct Statements {
    /// The arming this connection ran the trigger's text under.
    armed: Option<u64>,
    prepared: HashMap<String, String>,
    portals: HashMap<String, String>,
}

const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

async fn client_to_server(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    conn: &Arc<Connection>,
    shared: &Arc<Shared>,
) -> std::io::Result<()> {
    // The startup phase: untyped messages (an SSL or GSS request first, maybe).
    loop {
        let len = from.read_u32().await?;
        let mut body = vec![0u8; (len as usize).saturating_sub(4)];
        from.read_exact(&mut body).await?;
        to.write_all(&len.to_be_bytes()).await?;
        to.write_all(&body).await?;
        let code = body.get(..4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
        if !matches!(code, Some(SSL_REQUEST | GSSENC_REQUEST)) {
            break;
        }
    }
    let mut statements = Statements::default();
    loop {
        let kind = from.read_u8().await?;
        let len = from.read_u32().await?;
        let mut body = vec![0u8; (len as usize).saturating_sub(4)];
        from.read_exact(&mut body).await?;
        let trigger = shared.trigger.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if statements.runs_faulted_commit(kind, &body, &trigger) && take_fault(shared) {
            match shared.plan.fault {
                CommitFault::CutBefore => {
                    cut(conn, shared);
                    return Ok(());
                }
                CommitFault::LoseAnswer => {
                    conn.drop_replies.store(true, Ordering::SeqCst);
                    let (conn, shared) = (conn.clone(), shared.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep(ANSWER_WAIT).await;
                        cut(&conn, &shared);
                    });
                }
            }
        }
        to.write_all(&[kind]).await?;
        to.write_all(&len.to_be_bytes()).await?;
        to.write_all(&body).await?;
    }
}

/// Closes both sides of the faulted connection; with `then_refuse`, the
/// network goes down first, so the client finds no way back.
fn cut(conn: &Connection, shared: &Shared) {
    if shared.plan.then_refuse {
        shared.down.send_replace(true);
    }
    conn.cut.notify_one();
}

/// True when the arming has a fault left (one per arming).
fn take_fault(shared: &Shared) -> bool {
    let shots = shared.shots.load(Ordering::SeqCst);
    shared
        .faults
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < shots).then_some(n + 1))
        .is_ok()
}

async fn server_to_client(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    conn: &Arc<Connection>,
    shared: &Arc<Shared>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if conn.drop_replies.load(Ordering::SeqCst) {
            // The answer to the COMMIT has arrived (the server flushes it
            // after committing): let it go nowhere, then cut.
            tokio::time::sleep(CUT_PAUSE).await;
            cut(conn, shared);
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
    }
}

impl Statements {
    /// Follows one client message; true when it runs the COMMIT to fault:
    /// this connection ran the text of `trigger` (text, arming) under the
    /// arming still current.
    fn runs_faulted_commit(&mut self, kind: u8, body: &[u8], trigger: &(String, u64)) -> bool {
        let (armed_by, arming) = (trigger.0.as_str(), trigger.1);
        let ran = match kind {
            b'Q' => Some(cstr(body, 0).0),
            b'P' => {
                let (name, at) = cstr(body, 0);
                let (query, _) = cstr(body, at);
                self.prepared.insert(name, query);
                None
            }
            b'B' => {
                let (portal, at) = cstr(body, 0);
                let (statement, _) = cstr(body, at);
                let text = self.prepared.get(&statement).cloned().unwrap_or_default();
                self.portals.insert(portal, text);
                None
            }
            b'E' => Some(self.portals.get(&cstr(body, 0).0).cloned().unwrap_or_default()),
            _ => None,
        };
        let Some(text) = ran else { return false };
        if text.contains(armed_by) {
            self.armed = Some(arming);
        }
        let statement = text.trim().trim_end_matches(';').trim();
        self.armed == Some(arming)
            && (statement.eq_ignore_ascii_case("commit") || statement.eq_ignore_ascii_case("end"))
    }
}

/// The NUL-terminated string at `at`, and where the next field starts.
fn cstr(body: &[u8], at: usize) -> (String, usize) {
    let rest = body.get(at..).unwrap_or_default();
    let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
    (String::from_utf8_lossy(&rest[..end]).into_owned(), at + end + 1)
}
