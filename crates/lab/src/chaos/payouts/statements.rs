//! After the storm, through a live server's API: every creator's statement,
//! read page by page, adds up to the balances its creator page shows. The
//! arithmetic is this file's own (signed big integers), not the server's.

use std::str::FromStr;

use num_bigint::BigInt;
use serde_json::Value;
use sqlx::PgConnection;

use super::checks::{invariant, Invariant};
use super::clients::API_TOKEN;

/// Lines per statement page: small, so most statements take several pages.
const PAGE: u32 = 7;
/// Creators whose statements are read.
const CREATORS_MAX: i64 = 400;
/// Readings of a creator before its balances are taken as moving.
const READINGS: usize = 3;

fn number(value: &Value, what: &str) -> anyhow::Result<BigInt> {
    let text = value
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("{what} is not a decimal string: {value}"))?;
    BigInt::from_str(text.trim_start_matches('+')).map_err(|e| anyhow::anyhow!("{what} {text:?}: {e}"))
}

async fn get(http: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    Ok(http
        .get(url)
        .bearer_auth(API_TOKEN)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// What a statement adds up to.
#[derive(Debug, PartialEq, Eq)]
struct Sums {
    /// The last line's running balance.
    balance: BigInt,
    /// Carried and credit lines, less payout lines now paid.
    posted: BigInt,
    /// Payout lines now created, queued or sent.
    pending: BigInt,
}

/// Reads `creator`'s whole statement in pages of [`PAGE`]; `Err(text)`
/// names the first line or page whose figures do not follow.
async fn sums(http: &reqwest::Client, base: &str, creator: &str) -> anyhow::Result<Result<Sums, String>> {
    let mut running: Option<BigInt> = None;
    let mut posted = BigInt::from(0);
    let mut pending = BigInt::from(0);
    let mut after: Option<String> = None;
    let mut page_no = 0;
    loop {
        let mut url = format!("{base}/v1/creators/{creator}/statement?limit={PAGE}");
        if let Some(cursor) = &after {
            url.push_str(&format!("&after={cursor}"));
        }
        let page = get(http, &url).await?;
        let opening = number(&page["opening_balance"], "opening_balance")?;
        let expected_opening = running.clone().unwrap_or_default();
        if opening != expected_opening {
            return Ok(Err(format!(
                "page {page_no} opens at {opening}, the previous closed at {expected_opening}"
            )));
        }
        let mut balance = opening;
        for (i, line) in page["lines"].as_array().into_iter().flatten().enumerate() {
            let amount = number(&line["amount"], "amount")?;
            balance += &amount;
            let shown = number(&line["balance"], "balance")?;
            if shown != balance {
                return Ok(Err(format!(
                    "page {page_no} line {i} shows balance {shown}, its lines add up to {balance}"
                )));
            }
            match (line["kind"].as_str(), line["payout_status"].as_str()) {
                (Some("carried" | "credit"), _) => posted += &amount,
                (Some("payout"), Some("paid")) => posted += &amount,
                (Some("payout"), Some("created" | "queued" | "sent")) => pending -= &amount,
                _ => {}
            }
        }
        let closing = number(&page["closing_balance"], "closing_balance")?;
        if closing != balance {
            return Ok(Err(format!(
                "page {page_no} closes at {closing}, its lines at {balance}"
            )));
        }
        running = Some(balance);
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => break,
        }
        page_no += 1;
    }
    Ok(Ok(Sums {
        balance: running.unwrap_or_default(),
        posted,
        pending,
    }))
}

/// Whether `creator`'s statement adds up to its balances: `Some(offence)`
/// when not. Read again when the creator page changed under the reading
/// (an expiry sweep may still move a payout).
async fn offence(http: &reqwest::Client, base: &str, creator: &str) -> anyhow::Result<Option<String>> {
    let mut last = String::new();
    for _ in 0..READINGS {
        let view = get(http, &format!("{base}/v1/creators/{creator}")).await?;
        let sums = sums(http, base, creator).await?;
        let again = get(http, &format!("{base}/v1/creators/{creator}")).await?;
        if view["balances"] != again["balances"] {
            last = "its balances moved while it was read".into();
            continue;
        }
        let sums = match sums {
            Ok(sums) => sums,
            Err(offence) => return Ok(Some(offence)),
        };
        let b = &view["balances"];
        let (posted, pending, available) = (
            number(&b["posted"], "posted")?,
            number(&b["pending"], "pending")?,
            number(&b["available"], "available")?,
        );
        let row = number(&view["balance"], "balance")?;
        let on_hold = b["on_hold"].as_bool() == Some(true);
        let expected_available = if on_hold { BigInt::from(0) } else { sums.balance.clone() };
        let found = Sums {
            balance: row,
            posted,
            pending,
        };
        if found != sums || available != expected_available || &sums.posted - &sums.pending != sums.balance {
            return Ok(Some(format!(
                "balances {found:?} available {available} (on hold: {on_hold}), its statement adds up to {sums:?}"
            )));
        }
        return Ok(None);
    }
    Ok(Some(last))
}

/// `statements_add_up_to_balances`: for every creator with a payout (up to
/// [`CREATORS_MAX`]), its statement, read through `base` in pages, adds up
/// line by line to the posted, pending and available balances its creator
/// page shows, and posted less pending is the balance.
pub(super) async fn statements_add_up(conn: &mut PgConnection, base: &str) -> anyhow::Result<Invariant> {
    let creators: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT creator FROM settlement.payouts ORDER BY creator LIMIT $1")
            .bind(CREATORS_MAX)
            .fetch_all(conn)
            .await?;
    let http = reqwest::Client::new();
    let mut offenders = Vec::new();
    for creator in &creators {
        if let Some(offence) = offence(&http, base, creator).await? {
            offenders.push(format!("{creator}: {offence}"));
        }
    }
    Ok(invariant(
        "statements_add_up_to_balances",
        offenders,
        format!(
            "the statements of {} creators, read in pages of {PAGE} lines, add up to their posted, pending and available balances",
            creators.len()
        ),
    ))
}
