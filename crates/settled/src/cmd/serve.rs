//! `settled serve`.

use std::time::Duration;

use anyhow::Context;

use crate::cmd::{DbCommand, Outcome};
use crate::db::Database;

/// Serve the HTTP API: payouts (idempotent), holds, creators, /healthz,
/// /openapi.json, /metrics, and the dashboard.
///
/// Mutating endpoints need `Authorization: Bearer $SETTLED_API_TOKEN`.
/// Any number of servers may serve one database: every once-only rule is
/// kept by the database.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    bind: std::net::SocketAddr,
    /// Bearer token for mutating endpoints.
    #[arg(long, env = "SETTLED_API_TOKEN", hide_env_values = true)]
    api_token: Option<String>,
    /// How long idempotency keys and their responses are kept, in hours.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u64).range(1..=24 * 90))]
    idempotency_retention_hours: u64,
}

impl DbCommand for Args {
    const ROLE: Option<&'static str> = Some("settled_api");

    fn connections(&self) -> u32 {
        32
    }

    async fn run(self, db: &Database) -> Outcome {
        let state = crate::api::AppState {
            pool: db.pool.clone(),
            api_token: self.api_token.filter(|t| !t.is_empty()).map(Into::into),
            idempotency: settled_engine::once::idempotency::IdempotencyConfig {
                retention: Duration::from_secs(self.idempotency_retention_hours * 3600),
                ..Default::default()
            },
        };
        if state.api_token.is_none() {
            tracing::warn!("no SETTLED_API_TOKEN: mutating endpoints answer 401");
        }
        let listener = tokio::net::TcpListener::bind(self.bind)
            .await
            .with_context(|| format!("binding {}", self.bind))?;
        eprintln!("settled serve on http://{}", listener.local_addr()?);
        crate::api::serve(listener, state).await?;
        Ok(std::process::ExitCode::SUCCESS)
    }
}
