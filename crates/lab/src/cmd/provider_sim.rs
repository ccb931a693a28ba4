//! `settled provider-sim`.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

use anyhow::Context;
use settled::cmd::{Global, Outcome, Runnable};

use crate::provider_sim::{Faults, Options, WebhookEndpoint};

/// Run a local payment provider that speaks the provider protocol
/// (docs/api.md), for tests, demos and chaos runs.
///
/// Payments are accepted pending and end paid or failed, and a share of the
/// paid ones is returned later (--return-rate); a repeat under a key
/// answers the first payment and pays nothing more, until the key is
/// forgotten (--forget-keys-after-ms). GET /v1/payments?reference=R finds
/// payments by their reference. Every paid, failed or returned payment is
/// POSTed as a signed webhook to --webhook-url; POST
/// /v1/payments/{id}/return returns a paid payment now. Each
/// fault below can also be changed while it runs with POST /v1/faults (a
/// JSON object of the flags' names with underscores), the webhook endpoint
/// with POST /v1/webhook-endpoint; GET /v1/counters says what it did.
/// DELETE /v1/payments/{id} loses a payment and PATCH /v1/payments/{id}
/// changes what it says (amount, creator, status, failure_reason,
/// reference), for reconciliation drills; neither sends a webhook.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Port on 127.0.0.1.
    #[arg(long, default_value_t = 9100)]
    port: u16,
    /// Seed of everything random (the same seed makes the same choices).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where to POST webhooks (settled's is http://HOST/v1/provider-events).
    #[arg(long, requires = "webhook_secret")]
    webhook_url: Option<String>,
    /// The secret webhooks are signed with.
    #[arg(long, requires = "webhook_url", value_parser = settled::cmd::secret::SecretParser::text())]
    webhook_secret: Option<String>,
    #[command(flatten)]
    faults: Faults,
}

impl Runnable for Args {
    fn run(self: Box<Self>, _global: Global) -> Pin<Box<dyn Future<Output = Outcome>>> {
        Box::pin(async move {
            let options = self.options()?;
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
                .await
                .with_context(|| format!("binding 127.0.0.1:{}", self.port))?;
            eprintln!("provider simulator on http://127.0.0.1:{}", self.port);
            crate::provider_sim::serve_with(listener, options).await?;
            Ok(ExitCode::SUCCESS)
        })
    }
}

impl Args {
    fn options(&self) -> anyhow::Result<Options> {
        self.faults
            .validate()
            .map_err(|why| anyhow::anyhow!("--{}", why.replace('_', "-")))?;
        let webhook = match (&self.webhook_url, &self.webhook_secret) {
            (Some(url), Some(secret)) => {
                let endpoint = WebhookEndpoint {
                    url: url.clone(),
                    secret: secret.clone(),
                };
                endpoint.validate().map_err(anyhow::Error::msg)?;
                Some(endpoint)
            }
            _ => None,
        };
        Ok(Options {
            faults: self.faults,
            seed: self.seed,
            webhook,
        })
    }
}
