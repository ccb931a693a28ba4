//! `settled serve`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::api::{AllowedHosts, HttpLimits};
use crate::cmd::secret::SecretParser;
use crate::cmd::{DbCommand, Outcome};
use crate::db::{Access, Database};

/// Serve the HTTP API: payouts (idempotent), holds, creators, continuous
/// queues (/v1/queues), /healthz, /openapi.json, /metrics, and the dashboard.
///
/// Mutating endpoints need `Authorization: Bearer $SETTLED_API_TOKEN` (the
/// dashboard's forms, retry and the queues' pause, resume and replay, take
/// the token as HTTP Basic's password).
/// Any number of servers may serve one database: every once-only rule is
/// kept by the database.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, env = "SETTLED_BIND", default_value = "127.0.0.1:8080")]
    bind: std::net::SocketAddr,
    /// Bearer token for mutating endpoints (one trailing newline, as a
    /// secret file has, is dropped; a blank token, or one with whitespace at
    /// either end or a control character, is refused at start).
    #[arg(long, env = "SETTLED_API_TOKEN", hide_env_values = true, value_parser = SecretParser::new(crate::api::auth::parse_api_token))]
    api_token: Option<Arc<str>>,
    /// How long idempotency keys and their responses are kept, in hours
    /// (then pruned). A key used again after that answers its payout, never
    /// a second one, and a key that paid never serves another request.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u64).range(1..=24 * 90))]
    idempotency_retention_hours: u64,
    /// How long a payout made with `"confirm": true` waits for
    /// `POST /v1/payouts/{id}/confirm`, in seconds; then it expires and its
    /// funds are returned.
    #[arg(long, default_value_t = crate::payouts::DEFAULT_CONFIRM_TTL_SECS,
          value_parser = clap::value_parser!(u64).range(1..=crate::payouts::MAX_CONFIRM_TTL_SECS))]
    confirm_ttl_secs: u64,
    /// The secret the provider signs its webhooks with
    /// (`POST /v1/provider-events`); two separated by a comma are both
    /// accepted, while rotating. Unset: webhooks answer 503 and the
    /// provider sends them again later.
    #[arg(long, env = "SETTLED_PROVIDER_WEBHOOK_SECRET", hide_env_values = true,
          value_parser = SecretParser::new(parse_webhook_secrets))]
    provider_webhook_secret: Option<WebhookSecrets>,
    /// Host names the pages and API answer (the Host header, port ignored;
    /// repeatable). Default: the loopback names when bound to loopback,
    /// any host when bound to all interfaces.
    #[arg(long = "allowed-host", value_name = "HOST")]
    allowed_hosts: Vec<String>,
    /// Time a connection has to send a request's head, from the moment it
    /// waits for one: also the idle timeout between keep-alive requests.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    header_timeout_ms: u64,
    /// Time from a request's head to its answer (then 503, `Retry-After`).
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    request_timeout_ms: u64,
    /// Connections open at once (lowered to fit the open-file limit); more
    /// wait in the listen backlog.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections: u64,
    /// On SIGTERM, how long open connections may finish before they are dropped.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    shutdown_grace_ms: u64,
    /// Decimals of the token, for amounts shown to people next to base units.
    #[arg(long, env = "SETTLED_TOKEN_DECIMALS", default_value_t = crate::money::DEFAULT_DECIMALS,
          value_parser = clap::value_parser!(u32).range(0..=crate::money::MAX_DECIMALS as i64))]
    token_decimals: u32,
    /// `synchronous_commit` of payouts and holds. With a synchronous standby
    /// (`synchronous_standby_names`), `remote-apply` answers 201 only once the
    /// standby has applied the payout, so a failover to it loses none that
    /// was acknowledged. Unset: the server's setting.
    #[arg(long, env = "SETTLED_API_SYNCHRONOUS_COMMIT", value_enum)]
    synchronous_commit: Option<crate::api::SynchronousCommit>,
    /// The workers' schedule: /metrics reports the periods it made due that
    /// are not finished (`settled_runs_due`, `settled_run_due_seconds`).
    #[command(flatten)]
    schedule: crate::cmd::worker::ScheduleFlags,
    /// How long after it is due a period must be finished, in seconds
    /// (`settled_run_deadline_seconds`; the SettledRunLate alert).
    #[arg(long, env = "SETTLED_RUN_DEADLINE_SECS", default_value_t = crate::watch::DEFAULT_RUN_DEADLINE_SECS,
          value_parser = clap::value_parser!(u64).range(1..=30 * 86_400))]
    run_deadline_secs: u64,
    /// Verify the newest finished run (`settled verify`) at start and then
    /// every this many seconds, for `settled_verification_ok`; 0: never.
    #[arg(long, env = "SETTLED_VERIFY_EVERY_SECS", default_value_t = crate::watch::DEFAULT_VERIFY_EVERY_SECS,
          value_parser = clap::value_parser!(u64).range(0..=30 * 86_400))]
    verify_every_secs: u64,
}

impl DbCommand for Args {
    const ROLE: Option<&'static str> = Some("settled_api");
    const ACCESS: Access = Access::Serves;

    fn connections(&self) -> u32 {
        32
    }

    async fn run(self, db: &Database) -> Outcome {
        let limits = HttpLimits {
            header_timeout: Duration::from_millis(self.header_timeout_ms),
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
        }
        .fit_open_file_limit()?;
        let reads = db
            .another_pool(crate::api::READ_POOL_CONNECTIONS, "settled-serve-reads")
            .await?;
        let state = crate::api::AppState {
            api_token: self.api_token,
            idempotency: settled_engine::once::idempotency::IdempotencyConfig {
                retention: Duration::from_secs(self.idempotency_retention_hours * 3600),
                ..Default::default()
            },
            allowed_hosts: AllowedHosts::for_bind(self.bind, &self.allowed_hosts),
            decimals: self.token_decimals,
            synchronous_commit: self.synchronous_commit,
            confirm_ttl: Duration::from_secs(self.confirm_ttl_secs),
            webhook_secrets: self.provider_webhook_secret.map(|s| Arc::new(s.0)),
            limits,
            deadlines: Arc::new(crate::watch::Deadlines::new(&self.schedule, self.run_deadline_secs)?),
            verify_every: (self.verify_every_secs > 0).then(|| Duration::from_secs(self.verify_every_secs)),
            ..crate::api::AppState::new(db.pool.clone(), reads)
        };
        if state.api_token.is_none() {
            tracing::warn!("no SETTLED_API_TOKEN: mutating endpoints answer 401");
        }
        if state.allowed_hosts.is_any() {
            tracing::warn!(bind = %self.bind, "any Host header is answered: pass --allowed-host to refuse others");
        }
        let listener = crate::api::server::bind(self.bind).with_context(|| format!("binding {}", self.bind))?;
        eprintln!("settled serve on http://{}", listener.local_addr()?);
        crate::api::serve(listener, state).await?;
        Ok(std::process::ExitCode::SUCCESS)
    }
}

/// The webhook secrets, parsed once (never shown in errors or `--help`).
#[derive(Clone)]
pub(crate) struct WebhookSecrets(Vec<Vec<u8>>);

impl std::fmt::Debug for WebhookSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WebhookSecrets({} secrets)", self.0.len())
    }
}

fn parse_webhook_secrets(value: &str) -> Result<WebhookSecrets, String> {
    crate::provider::signature::secrets_from_env(value).map(WebhookSecrets)
}
