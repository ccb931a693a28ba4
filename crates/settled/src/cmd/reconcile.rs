//! `settled reconcile`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

use crate::cmd::{chain_once, exit_code, printable, Global, OnDatabase, Outcome, ReadOnly, Runnable};
use crate::db::Database;
use crate::payouts::reconcile::{self, Comparison, Lag, MismatchKind, Scope};
use crate::provider::HttpProvider;

/// Lags listed by name in the human output (all are in --json).
pub(crate) const LAGS_LISTED: usize = 10;

/// Compare every payout (withdrawals and settlement payments) with the
/// provider's record of it, paging through all of the provider's payments.
///
/// Names each mismatch with its payout id and provider key:
/// missing_at_provider (settled says sent or paid, the provider has no
/// payment under its key), unknown_to_settled (a payment under a key that
/// is no payout's), amount_differs, creator_differs, states_disagree (the
/// provider paid or has pending what settled failed or returned, has
/// pending what settled says paid, or has a payment for a payout never
/// sent), paid_twice (more than one payment that has not failed or come
/// back for one payout: under its key, or with its key or id as the
/// reference), stranded (a queued payout nothing will send),
/// awaiting_operator (past the provider's key window the provider could
/// not say whether it holds the payment; nothing is sent). Not mismatches,
/// listed apart: queued payouts the provider already has (in flight:
/// delivery records its answer), sent payouts the provider has paid,
/// failed or returned, and paid ones it returned (behind: a webhook or a
/// lookup applies it). It changes nothing.
///
/// With --chain-rpc-url and --token-address it compares instead the payouts
/// paid on-chain with the token's Transfer logs from the hot wallet, one to
/// one, naming each mismatch: a transfer no payout explains (and the payout
/// it could pay twice), another amount or recipient, a paid payout with no
/// transfer, a confirmed transaction whose receipt is gone. When it finds
/// any, it compares again two seconds later and names only those found
/// both times (a transaction mined or reorged out between reading the logs
/// and the database looks like a mismatch once).
///
/// Exit codes: 0 settled and the provider agree; 1 anything differs; 2 the
/// comparison could not be made (database or provider unreachable).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The payment provider (e.g. http://127.0.0.1:9100); or compare with
    /// a chain with --chain-rpc-url.
    #[arg(long, required_unless_present = "chain_rpc_url", conflicts_with = "chain_rpc_url")]
    provider_url: Option<String>,
    /// Compare the payouts paid on-chain with the token's Transfer logs from
    /// the hot wallet, through this node's JSON-RPC.
    #[arg(long, env = "SETTLED_CHAIN_RPC_URL", requires = "token_address")]
    chain_rpc_url: Option<String>,
    /// The ERC-20 token paid out.
    #[arg(long, env = "SETTLED_TOKEN_ADDRESS", requires = "chain_rpc_url", value_parser = crate::chain::parse_address)]
    token_address: Option<alloy_primitives::Address>,
    /// The first block whose logs are read.
    #[arg(long, default_value_t = 0, requires = "chain_rpc_url")]
    from_block: u64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// The report `--json` prints.
#[derive(Debug, serde::Serialize)]
struct Report<'a> {
    ok: bool,
    provider_url: &'a str,
    /// Mismatches by kind, every kind named.
    counts: BTreeMap<&'static str, usize>,
    #[serde(flatten)]
    comparison: &'a Comparison,
}

impl ReadOnly for Args {
    async fn read(self, db: &Database) -> Outcome {
        if let (Some(url), Some(token)) = (&self.chain_rpc_url, self.token_address) {
            return reconcile_chain(db, url, token, self.from_block).await;
        }
        let provider_url = self.provider_url.clone().unwrap_or_default();
        let provider = HttpProvider::new(&provider_url, crate::cmd::verify::RECONCILE_TIMEOUT)?;
        let mut conn = db.pool.acquire().await?;
        let comparison = reconcile::reconcile(&mut conn, &provider, Scope::All).await?;
        if self.json {
            let report = Report {
                ok: comparison.ok(),
                provider_url: &provider_url,
                counts: MismatchKind::ALL
                    .into_iter()
                    .map(|k| (k.as_str(), comparison.of(k).count()))
                    .collect(),
                comparison: &comparison,
            };
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            // Ids, creators and dead letters' errors are the provider's text.
            print!("{}", printable(&render(&comparison, &provider_url)));
        }
        Ok(exit_code(comparison.ok()))
    }
}

/// `settled reconcile --chain-rpc-url`: each mismatch on a line; exit 1 on any.
async fn reconcile_chain(db: &Database, url: &str, token: alloy_primitives::Address, from_block: u64) -> Outcome {
    let rpc = crate::chain::Rpc::new(url)?;
    let mut conn = db.pool.acquire().await?;
    let mismatches = crate::chain::reconcile::lasting_mismatches(&mut conn, &rpc, token, from_block).await?;
    if mismatches.is_empty() {
        println!("reconcile with {url}: the chain and settled agree (token {token:#x}, from block {from_block})");
    } else {
        println!("reconcile with {url}: {} mismatches", mismatches.len());
        for m in &mismatches {
            println!("  {}", printable(m));
        }
    }
    Ok(exit_code(mismatches.is_empty()))
}

/// The human rendering: a verdict, the counts, each mismatch by payout
/// and key, then the lags.
pub(crate) fn render(c: &Comparison, provider_url: &str) -> String {
    let mut out = format!(
        "reconcile with {provider_url}: {}\n  {} payouts, {} provider payments, {} agree\n",
        if c.ok() {
            "OK, settled and the provider agree".to_string()
        } else {
            format!("{} mismatch(es)", c.mismatches.len())
        },
        c.payouts,
        c.payments,
        c.agreeing
    );
    for m in &c.mismatches {
        out.push_str(&format!("  [{}] {}\n", m.kind, m.describe()));
    }
    for (lags, what) in [
        (
            &c.in_flight,
            "in flight (queued, or made after settled was read; delivery records the provider's answer)",
        ),
        (
            &c.behind,
            "behind (sent, or paid and returned; the provider's word reaches settled by its webhook or a lookup)",
        ),
    ] {
        if lags.is_empty() {
            continue;
        }
        out.push_str(&format!("  {} {what}, not mismatches:\n", lags.len()));
        for lag in lags.iter().take(LAGS_LISTED) {
            out.push_str(&format!("    - {}\n", describe_lag(lag)));
        }
        if lags.len() > LAGS_LISTED {
            out.push_str(&format!(
                "    - and {} more (--json lists all)\n",
                lags.len() - LAGS_LISTED
            ));
        }
    }
    out
}

fn describe_lag(lag: &Lag) -> String {
    format!(
        "payout {} ({}): settled {}, provider {}",
        lag.payout_id, lag.key, lag.state, lag.provider_status
    )
}

/// `settled reconcile` as the binary runs it: an error exits 2, since 1
/// says a mismatch was found.
pub struct Reconcile(pub Args);

impl Runnable for Reconcile {
    fn run(self: Box<Self>, global: Global) -> Pin<Box<dyn Future<Output = Outcome>>> {
        Box::pin(async move {
            match Box::new(OnDatabase(self.0)).run(global).await {
                Ok(code) => Ok(code),
                Err(err) => {
                    eprintln!("error: {}", chain_once(&err));
                    Ok(ExitCode::from(2))
                }
            }
        })
    }
}
