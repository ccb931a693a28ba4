//! A TCP proxy in front of a test's PostgreSQL that can lose the server's
//! answer to a COMMIT: the COMMIT reaches the server, which commits, and
//! the connection is cut before the answer reaches the client, as when the
//! network fails at that moment. For tests of code that must not take a
//! failed COMMIT for one that did not commit.
//!
//! It reads the protocol only as far as it must: the startup (an SSL or
//! GSSAPI request is answered "no" by the proxy itself, so the rest flows
//! in the clear), the text of the statements a client runs (simple
//! queries, and prepared ones by their name) and the server's
//! CommandComplete tags. Everything else passes through unchanged.
//!
//! ```no_run
//! # async fn demo(db: settled_testkit::TestDb) {
//! let proxy = settled_testkit::LostCommitProxy::start(&db.url);
//! let url = proxy.url(db.name()); // give this URL to the code under test
//! proxy.lose_commit_answer_after("INSERT INTO settlement.payouts");
//! // ... the code under test commits a transaction that ran that statement:
//! // the transaction commits, and its COMMIT fails with a lost connection.
//! assert_eq!(proxy.lost_answers(), 1);
//! # }
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::postgres::PgConnectOptions;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Startup request codes a client sends before its StartupMessage.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
/// Largest protocol message relayed, in bytes (a guard against a garbled length).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A running proxy; stopped (with every connection through it) on drop.
pub struct LostCommitProxy {
    port: u16,
    user: String,
    armed: Arc<Armed>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the proxy is told to do, shared by its connections.
#[derive(Default)]
struct Armed {
    /// Text whose statement dooms the COMMIT answer of its connection (one shot).
    trigger: Mutex<Option<String>>,
    lost: AtomicUsize,
}

/// Where the server listens.
#[derive(Clone)]
enum Upstream {
    Tcp(String, u16),
    Unix(PathBuf),
}

impl LostCommitProxy {
    /// Starts a proxy on a free 127.0.0.1 port in front of the server of
    /// `database_url` (TCP or a Unix socket), on a thread of its own.
    pub fn start(database_url: &str) -> LostCommitProxy {
        let target: PgConnectOptions = database_url.parse().expect("a PostgreSQL URL");
        let upstream = match target.get_socket() {
            Some(dir) => Upstream::Unix(dir.join(format!(".s.PGSQL.{}", target.get_port()))),
            None => Upstream::Tcp(target.get_host().to_string(), target.get_port()),
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let port = listener.local_addr().expect("the proxy's address").port();
        let armed = Arc::new(Armed::default());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn({
            let armed = armed.clone();
            move || serve(listener, upstream, armed, stopped)
        });
        LostCommitProxy {
            port,
            user: target.get_username().to_string(),
            armed,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// A URL for `database` through this proxy.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{}@127.0.0.1:{}/{database}", self.user, self.port)
    }

    /// Loses the answer to the next COMMIT of the connection that next runs
    /// a statement containing `statement` (once): the server commits, the
    /// connection is cut, the client never learns the outcome.
    pub fn lose_commit_answer_after(&self, statement: &str) {
        *self.armed.trigger.lock().unwrap_or_else(|e| e.into_inner()) = Some(statement.to_string());
    }

    /// COMMIT answers lost so far.
    pub fn lost_answers(&self) -> usize {
        self.armed.lost.load(Ordering::Acquire)
    }
}

impl Drop for LostCommitProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The proxy's thread: accepts until told to stop; dropping the runtime
/// then closes every connection.
fn serve(
    listener: std::net::TcpListener,
    upstream: Upstream,
    armed: Arc<Armed>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the proxy's runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).expect("the proxy's listener");
        tokio::pin!(stopped);
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                accepted = listener.accept() => {
                    let Ok((client, _)) = accepted else { continue };
                    // Small protocol messages, one write each: no Nagle delay.
                    let _ = client.set_nodelay(true);
                    tokio::spawn(relay(client, upstream.clone(), armed.clone()));
                }
            }
        }
    });
}

type Stream = Box<dyn AsyncStream>;
trait AsyncStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncStream for T {}

/// Relays one client connection until either side closes, or until the
/// answer to a doomed COMMIT arrives (then both are closed without it).
async fn relay(client: tokio::net::TcpStream, upstream: Upstream, armed: Arc<Armed>) {
    let server: Stream = match &upstream {
        Upstream::Tcp(host, port) => match tokio::net::TcpStream::connect((host.as_str(), *port)).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                Box::new(s)
            }
            Err(_) => return,
        },
        Upstream::Unix(path) => match tokio::net::UnixStream::connect(path).await {
            Ok(s) => Box::new(s),
            Err(_) => return,
        },
    };
    let (mut client_in, mut client_out) = tokio::io::split(client);
    let (mut server_in, mut server_out) = tokio::io::split(server);
    // The server says nothing before the client's StartupMessage.
    if startup(&mut client_in, &mut client_out, &mut server_out).await.is_err() {
        return;
    }
    let doomed = AtomicBool::new(false);
    let to_server = client_messages(&mut client_in, &mut server_out, &armed, &doomed);
    let to_client = server_messages(&mut server_in, &mut client_out, &armed, &doomed);
    // Whichever ends first ends the connection: the halves are dropped.
    tokio::select! {
        _ = to_server => {},
        _ = to_client => {},
    }
}

/// Relays the client's startup, answering an SSL or GSSAPI request "no".
async fn startup(
    client_in: &mut (impl AsyncRead + Unpin),
    client_out: &mut (impl AsyncWrite + Unpin),
    server_out: &mut (impl AsyncWrite + Unpin),
) -> std::io::Result<()> {
    loop {
        let len = client_in.read_u32().await? as usize;
        if !(8..=MAX_MESSAGE_BYTES).contains(&len) {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        let mut rest = vec![0u8; len - 4];
        client_in.read_exact(&mut rest).await?;
        let code = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
        if code == SSL_REQUEST || code == GSSENC_REQUEST {
            client_out.write_all(b"N").await?;
            continue;
        }
        server_out.write_all(&(len as u32).to_be_bytes()).await?;
        return server_out.write_all(&rest).await;
    }
}

/// One typed protocol message: its type byte and payload.
async fn read_message(from: &mut (impl AsyncRead + Unpin)) -> std::io::Result<(u8, Vec<u8>)> {
    let kind = from.read_u8().await?;
    let len = from.read_u32().await? as usize;
    if !(4..=MAX_MESSAGE_BYTES).contains(&len) {
        return Err(std::io::ErrorKind::InvalidData.into());
    }
    let mut payload = vec![0u8; len - 4];
    from.read_exact(&mut payload).await?;
    Ok((kind, payload))
}

async fn write_message(to: &mut (impl AsyncWrite + Unpin), kind: u8, payload: &[u8]) -> std::io::Result<()> {
    let mut message = Vec::with_capacity(payload.len() + 5);
    message.push(kind);
    message.extend_from_slice(&(payload.len() as u32 + 4).to_be_bytes());
    message.extend_from_slice(payload);
    to.write_all(&message).await
}

/// The NUL-terminated strings at the start of `payload`.
fn strings(payload: &[u8]) -> impl Iterator<Item = String> + '_ {
    payload
        .split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
}

/// Relays the client's messages, dooming the connection when it runs the
/// armed statement: a simple query's text, or a prepared statement's text
/// when it is bound (sqlx prepares once per connection and binds by name).
async fn client_messages(
    client_in: &mut (impl AsyncRead + Unpin),
    server_out: &mut (impl AsyncWrite + Unpin),
    armed: &Armed,
    doomed: &AtomicBool,
) -> std::io::Result<()> {
    let mut prepared: HashMap<String, String> = HashMap::new();
    loop {
        let (kind, payload) = read_message(client_in).await?;
        let run = match kind {
            b'Q' => strings(&payload).next(),
            b'P' => {
                let mut parts = strings(&payload);
                let (name, text) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
                prepared.insert(name, text);
                None
            }
            b'B' => strings(&payload).nth(1).and_then(|name| prepared.get(&name).cloned()),
            _ => None,
        };
        if let Some(text) = run {
            let mut trigger = armed.trigger.lock().unwrap_or_else(|e| e.into_inner());
            if trigger.as_deref().is_some_and(|t| text.contains(t)) {
                *trigger = None;
                doomed.store(true, Ordering::Release);
            }
        }
        write_message(server_out, kind, &payload).await?;
    }
}

/// Relays the server's messages until it answers COMMIT on a doomed
/// connection: that answer is dropped, and the connection with it.
async fn server_messages(
    server_in: &mut (impl AsyncRead + Unpin),
    client_out: &mut (impl AsyncWrite + Unpin),
    armed: &Armed,
    doomed: &AtomicBool,
) -> std::io::Result<()> {
    loop {
        let (kind, payload) = read_message(server_in).await?;
        if kind == b'C' && payload.starts_with(b"COMMIT\0") && doomed.load(Ordering::Acquire) {
            armed.lost.fetch_add(1, Ordering::AcqRel);
            return Ok(());
        }
        write_message(client_out, kind, &payload).await?;
    }
}
