//! `settled verify`.

use std::time::Duration;

use crate::cmd::{exit_code, printable, Outcome, ReadOnly};
use crate::db::Database;
use crate::period::Period;
use crate::provider::HttpProvider;
use crate::verify::payouts::ChainSide;

/// How long one provider call of a reconciliation may take.
pub(crate) const RECONCILE_TIMEOUT: Duration = Duration::from_secs(60);

/// Prove from committed state that a period was paid exactly once and
/// money is conserved, or that payouts are; exit 1 and list offenders
/// otherwise.
///
/// --period checks: a policy exists; the items are those seed and import
/// wrote (no volume changed since); no work left; every settled creator has
/// one ledger row; no ledger row lacks its settled item; every amount
/// follows the policy; the ledger total equals the expected total; every
/// balance equals its ledger total less its payouts plus their returns.
///
/// --payouts checks, per creator and in total: balance = everything
/// settlement credited + what came back - every payout; every payout in one
/// known state, its history a path of allowed transitions ending in it;
/// funds returned exactly for the payouts that failed, were cancelled or
/// expired, once, of their amount. With --chain-rpc-url and
/// --token-address, also the chain's side: the token's Transfer logs from
/// the hot wallet match the payouts paid on-chain one to one (the rule of
/// `settled reconcile --chain-rpc-url`), each mismatch naming its payout.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The period (YYYY-MM-DD).
    #[arg(long, required_unless_present_any = ["archive", "payouts"], conflicts_with_all = ["archive", "payouts"])]
    period: Option<Period>,
    /// Re-check an archive file written by `settled archive` (the .csv or
    /// its .manifest.json): its SHA-256, row count and total against its
    /// manifest and this database's record, and every row well-formed.
    #[arg(long, value_name = "FILE", conflicts_with = "payouts")]
    archive: Option<std::path::PathBuf>,
    /// Verify payouts instead of a period: balances against credits and
    /// payouts, histories, returns (and, with --provider-url, the
    /// provider's payments one to one).
    #[arg(long)]
    payouts: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Also reconcile with this payment provider. With --period (leased
    /// mode): each ledger row was recorded as its settlement payout, and the
    /// provider's payments under the period's keys match those payouts one
    /// to one. With --payouts: every payout against every payment. Matching
    /// means none missing, none unknown, same amount and creator, states
    /// that agree, none paid twice (`settled reconcile` lists them).
    #[arg(long, conflicts_with = "archive")]
    provider_url: Option<String>,
    /// With --payouts: also compare the payouts paid on-chain with the
    /// token's Transfer logs from the hot wallet, through this node's
    /// JSON-RPC. (No environment variable: a deliverer's
    /// SETTLED_CHAIN_RPC_URL must not turn every verify into this one.)
    #[arg(long, requires = "token_address", conflicts_with_all = ["period", "archive"])]
    chain_rpc_url: Option<String>,
    /// The ERC-20 token paid out (with --chain-rpc-url).
    #[arg(long, requires = "chain_rpc_url", value_parser = crate::chain::parse_address)]
    token_address: Option<alloy_primitives::Address>,
}

impl ReadOnly for Args {
    async fn read(self, db: &Database) -> Outcome {
        let provider = match &self.provider_url {
            Some(url) => Some(HttpProvider::new(url, RECONCILE_TIMEOUT)?),
            None => None,
        };
        if let Some(file) = &self.archive {
            let mut conn = db.pool.acquire().await?;
            let report = crate::archive::verify_archive(&mut conn, file).await?;
            return self.print(&report, report.render(), report.ok);
        }
        if self.payouts {
            let rpc = match &self.chain_rpc_url {
                Some(url) => Some(crate::chain::Rpc::new(url)?),
                None => None,
            };
            let chain = rpc
                .as_ref()
                .zip(self.token_address)
                .map(|(rpc, token)| ChainSide { rpc, token });
            let mut conn = db.pool.acquire().await?;
            let report = crate::verify::payouts::verify_payouts(&mut conn, provider.as_ref(), chain).await?;
            return self.print(&report, report.render(), report.ok);
        }
        let period = self
            .period
            .expect("clap requires --period without --archive or --payouts");
        let mut report = crate::verify::verify_pool(&db.pool, period).await?;
        if let Some(provider) = &provider {
            let mut conn = db.pool.acquire().await?;
            crate::verify::reconcile_provider(&mut conn, period, provider, &mut report).await?;
        }
        self.print(&report, report.render(), report.ok)
    }
}

impl Args {
    fn print(&self, report: &impl serde::Serialize, human: String, ok: bool) -> Outcome {
        if self.json {
            println!("{}", serde_json::to_string_pretty(report)?);
        } else {
            // Offenders may quote the provider's text (with --provider-url).
            print!("{}", printable(&human));
        }
        Ok(exit_code(ok))
    }
}
