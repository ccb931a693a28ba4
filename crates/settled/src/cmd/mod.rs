//! The product's commands, one file each: an `Args` struct (what clap
//! parses, with the command's help) and its `run`. The binary's `main.rs`
//! names every command once, in one `match`, and hands it to [`execute`].
//!
//! Exit codes: 0 success; 1 the command ran and found a problem
//! (verification failed, a worker failed, bad input); 2 it could not start
//! (bad usage, no database and no PostgreSQL server binaries).

pub mod archive;
pub mod audit;
pub mod deliver;
pub mod demo;
pub mod give_up;
pub mod import;
pub mod lease;
pub mod migrate;
pub mod policy;
pub mod queues;
pub mod reconcile;
pub mod retry;
pub mod run;
pub mod runs;
pub mod secret;
pub mod seed;
pub mod serve;
pub mod status;
pub mod tokens;
pub mod verify;
pub mod wallet;
pub mod worker;
pub mod workers;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;

use crate::db::{Access, Database, DbOptions};

/// Default claim loops per worker process.
pub(crate) const DEFAULT_CONCURRENCY: u32 = 4;
/// Default items per claim in tx mode: a chunk is one statement, and at a
/// million creators 5,000 per claim settles 2.4 times as fast as 100 (one
/// process of four loops on two cores, docs/benchmarks.md).
pub(crate) const DEFAULT_CHUNK: u32 = 5_000;
/// Default items per claim in leased mode: each item is a provider call,
/// and a chunk completes when its slowest call has answered.
pub(crate) const DEFAULT_LEASED_CHUNK: u32 = 100;

/// Flags every command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Global {
    /// PostgreSQL URL. Unset: start a private server in --data-dir.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true, value_parser = secret::SecretParser::text())]
    pub database_url: Option<String>,

    /// Data directory of the private PostgreSQL (used when DATABASE_URL is unset).
    #[arg(long, env = "SETTLED_DATA_DIR", default_value = ".settled", global = true)]
    pub data_dir: PathBuf,

    /// Connect with the least-privilege role each command needs (SET ROLE
    /// settled_worker / settled_api / settled_readonly); the login role must be
    /// a member. Commands that change input or schema keep the login role.
    /// The variable takes 1/0, true/false, yes/no or on/off.
    #[arg(long, env = "SETTLED_ROLE_PER_COMMAND", global = true,
          value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub role_per_command: bool,

    /// What sits between settled and PostgreSQL: none, a session pooler, or
    /// a transaction pooler (PgBouncer `pool_mode = transaction`). Behind a
    /// transaction pooler statements are unnamed and sent in one round trip,
    /// migrations and LISTEN use --direct-url, and --role-per-command is
    /// refused (its SET ROLE is session state).
    #[arg(long, env = "SETTLED_POOLER", value_enum, default_value_t = Pooler::None, global = true)]
    pub pooler: Pooler,

    /// A URL that reaches PostgreSQL without the transaction pooler, for what
    /// needs a session: migrations (a session advisory lock) and LISTEN.
    #[arg(long, env = "SETTLED_DIRECT_URL", global = true, hide_env_values = true,
          value_parser = secret::SecretParser::text())]
    pub direct_url: Option<String>,

    /// Log format on stderr: human, or json (one object per line).
    #[arg(long, env = "SETTLED_LOG_FORMAT", value_enum, default_value_t = LogFormat::Human, global = true)]
    pub log_format: LogFormat,

    /// Export OpenTelemetry traces over OTLP/HTTP (protobuf) to this base
    /// URL (spans go to URL/v1/traces), e.g. http://127.0.0.1:4318.
    /// Unset: no spans are recorded. Processes this one starts inherit it.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
}

impl Global {
    /// DATABASE_URL, if set and not empty.
    pub fn database_url(&self) -> Option<String> {
        self.database_url.clone().filter(|u| !u.is_empty())
    }

    /// The OTLP endpoint, if set and not empty.
    pub(crate) fn otlp_endpoint(&self) -> Option<&str> {
        self.otlp_endpoint.as_deref().filter(|u| !u.is_empty())
    }
}

pub(crate) use crate::db::Pooler;

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable (colored on a terminal).
    Human,
    /// One JSON object per line, for log collectors.
    Json,
}

/// What a command's `run` returns.
pub type Outcome = anyhow::Result<ExitCode>;

/// A command that runs on the product's database (opened, migrated and
/// closed around it).
pub trait DbCommand: Sized + 'static {
    /// The least role it needs under `--role-per-command` (None: the login role).
    const ROLE: Option<&'static str> = None;
    /// Whether it writes, so whether it can run on a standby.
    const ACCESS: Access = Access::Writes;
    /// Shown in `pg_stat_activity.application_name`.
    const APPLICATION_NAME: &'static str = "settled";
    /// Whether one runtime thread serves it best (its loops mostly wait on
    /// the database, and more threads only compete with PostgreSQL).
    const SINGLE_THREADED: bool = false;

    /// Connections its pool needs.
    fn connections(&self) -> u32 {
        4
    }

    /// The least role this invocation needs: [`DbCommand::ROLE`], unless
    /// the command's verbs need different roles.
    fn role(&self) -> Option<&'static str> {
        Self::ROLE
    }

    /// Runs it.
    fn run(self, db: &Database) -> impl Future<Output = Outcome>;
}

/// A command that only reads: under `--role-per-command` it runs as
/// `settled_readonly`, and it runs on a standby too.
pub(crate) trait ReadOnly: Sized + 'static {
    /// Runs it.
    fn read(self, db: &Database) -> impl Future<Output = Outcome>;
}

impl<C: ReadOnly> DbCommand for C {
    const ROLE: Option<&'static str> = Some("settled_readonly");
    const ACCESS: Access = Access::Reads;

    fn run(self, db: &Database) -> impl Future<Output = Outcome> {
        self.read(db)
    }
}

/// Prints a listing: with `json`, `rows` as one pretty JSON array; else
/// `header`, then each row's `line`.
pub(crate) fn print_listing<T: serde::Serialize>(
    json: bool,
    rows: &[T],
    header: &str,
    line: impl Fn(&T) -> String,
) -> Outcome {
    if json {
        println!("{}", serde_json::to_string_pretty(rows)?);
    } else {
        println!("{header}");
        for row in rows {
            println!("{}", line(row));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Anything the binary runs: a [`DbCommand`] through `OnDatabase`, or a
/// command that sets up its own databases (the lab's).
pub trait Runnable {
    /// See [`DbCommand::SINGLE_THREADED`].
    fn single_threaded(&self) -> bool {
        false
    }

    /// Runs it.
    fn run(self: Box<Self>, global: Global) -> Pin<Box<dyn Future<Output = Outcome>>>;
}

/// Runs a [`DbCommand`] on the database the global flags name.
pub(crate) struct OnDatabase<C>(pub C);

impl<C: DbCommand> Runnable for OnDatabase<C> {
    fn single_threaded(&self) -> bool {
        C::SINGLE_THREADED
    }

    fn run(self: Box<Self>, global: Global) -> Pin<Box<dyn Future<Output = Outcome>>> {
        Box::pin(async move {
            let opts = DbOptions {
                url: global.database_url(),
                data_dir: global.data_dir.clone(),
                max_connections: self.0.connections(),
                role: if global.role_per_command { self.0.role() } else { None },
                application_name: C::APPLICATION_NAME.to_string(),
                pooler: global.pooler,
                direct_url: global.direct_url.clone().filter(|u| !u.is_empty()),
                access: C::ACCESS,
            };
            let db = Database::open(&opts).await?;
            let result = self.0.run(&db).await;
            db.close().await?;
            result
        })
    }
}

/// Boxes a [`DbCommand`] for the dispatch.
pub fn on_database<C: DbCommand>(command: C) -> Box<dyn Runnable> {
    Box::new(OnDatabase(command))
}

/// What the binary parsed: the global flags, the subcommand's name (for
/// traces) and the command.
pub struct Parsed {
    /// The flags every command takes.
    pub global: Global,
    /// The subcommand's name (`serve`, `deliver`, ...).
    pub name: String,
    /// The command to run.
    pub command: Box<dyn Runnable>,
}

/// The binary's whole life: settings file into the environment, `parse`
/// the arguments, start logging, traces and the runtime, run, flush the
/// traces, map the outcome to an exit code.
pub fn execute(parse: impl FnOnce() -> Parsed) -> ExitCode {
    if let Err(err) = crate::config::load_into_env() {
        eprintln!("error: {err:#}");
        return ExitCode::from(2);
    }
    let Parsed { global, name, command } = parse();
    let traces = match init_logging(&global, &name) {
        Ok(traces) => traces,
        Err(err) => {
            eprintln!("error: {}", chain_once(&err));
            return ExitCode::from(2);
        }
    };
    let code = run(global, command);
    if let Some(traces) = traces {
        traces.shutdown();
    }
    code
}

/// Runs `command` on a runtime of its own; its outcome as an exit code.
fn run(global: Global, command: Box<dyn Runnable>) -> ExitCode {
    let built = if command.single_threaded() {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    };
    let runtime = match built {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: starting the async runtime: {err}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(command.run(global)) {
        Ok(code) => code,
        Err(err) => {
            if let Some(settled_embedded::Error::NoBinaries) = err.downcast_ref::<settled_embedded::Error>() {
                eprintln!("error: {}", settled_embedded::Error::NoBinaries);
                return ExitCode::from(2);
            }
            eprintln!("error: {}", chain_once(&err));
            ExitCode::from(1)
        }
    }
}

/// A layer of this binary's subscriber.
type BoxedLayer = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;

/// Log lines on stderr (events only, filtered by SETTLED_LOG) and, with an
/// OTLP endpoint, spans exported (settled's own, whatever SETTLED_LOG
/// says). Without one no span is of interest to any layer, so every span
/// callsite stays disabled and costs nothing.
fn init_logging(global: &Global, command: &str) -> anyhow::Result<Option<crate::telemetry::Traces>> {
    use tracing_subscriber::filter::{filter_fn, FilterExt, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let levels = tracing_subscriber::EnvFilter::try_from_env("SETTLED_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=error"));
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    let lines: BoxedLayer = match global.log_format {
        LogFormat::Human => lines
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(levels.and(filter_fn(|meta| meta.is_event())))
            .boxed(),
        LogFormat::Json => lines
            .json()
            .flatten_event(true)
            .with_filter(levels.and(filter_fn(|meta| meta.is_event())))
            .boxed(),
    };
    let mut layers = vec![lines];
    let mut traces = None;
    if let Some(endpoint) = global.otlp_endpoint() {
        // Processes this one starts (the bench's, the lab's) export too.
        std::env::set_var("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
        let (started, layer) = crate::telemetry::Traces::start(endpoint, command)?;
        // "settled" also covers settled_engine and settled_lab (a prefix).
        layers.push(
            layer
                .with_filter(Targets::new().with_target("settled", tracing::Level::INFO))
                .boxed(),
        );
        traces = Some(started);
    }
    tracing_subscriber::registry().with(layers).init();
    Ok(traces)
}

/// `text` as one line a terminal shows as it is: each control character
/// (escape sequences' ESC, carriage return, newline, bell) and direction
/// override becomes a space. Text from elsewhere (a provider's answer, a
/// handler's error) is printed through it or [`printable`], never raw:
/// it could rewrite the operator's terminal.
pub(crate) fn one_line(text: &str) -> String {
    let bidi = |c: char| matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}');
    text.chars()
        .map(|c| if c.is_control() || bidi(c) { ' ' } else { c })
        .collect()
}

/// `text`'s lines, each made [`one_line`]: a report with text from
/// elsewhere in it, as a terminal may show it.
pub(crate) fn printable(text: &str) -> String {
    text.split('\n').map(one_line).collect::<Vec<_>>().join("\n")
}

/// An error and its causes on one line, each said once: a cause whose
/// text its parent already ends with (sqlx and its migrator repeat their
/// source in their own message) is not printed again. The line is
/// [`one_line`]: a cause may quote a provider's answer.
pub(crate) fn chain_once(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    one_line(&out)
}

/// Exit code 0 when `ok`, else 1.
pub fn exit_code(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::{chain_once, one_line, printable};

    #[derive(Debug)]
    struct Leaf;

    impl std::fmt::Display for Leaf {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("prepared statement \"sqlx_s_1\" already exists")
        }
    }

    impl std::error::Error for Leaf {}

    /// Like sqlx::Error::Database: says its source in its own message.
    #[derive(Debug)]
    struct Repeats(Leaf);

    impl std::fmt::Display for Repeats {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error returned from database: {}", self.0)
        }
    }

    impl std::error::Error for Repeats {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_error_chain_says_each_cause_once() {
        let err = anyhow::Error::new(Repeats(Leaf)).context("applying the settlement migrations");
        assert_eq!(
            chain_once(&err),
            "applying the settlement migrations: error returned from database: prepared statement \"sqlx_s_1\" already exists"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(chain_once(&plain), "outer: inner");
    }

    #[test]
    fn text_from_elsewhere_prints_without_control_characters_or_direction_overrides() {
        let hostile = "paid\u{1b}[2J\u{1b}]0;owned\u{7}\rok\u{202e}\tend";
        assert_eq!(one_line(hostile), "paid [2J ]0;owned  ok  end");
        assert_eq!(printable("a\rb\nc\u{1b}d\n"), "a b\nc d\n", "lines are kept");
        let err = anyhow::anyhow!("500: {hostile}\nsecond line").context("listing");
        assert!(!chain_once(&err).contains(|c: char| c.is_control()));
    }
}
