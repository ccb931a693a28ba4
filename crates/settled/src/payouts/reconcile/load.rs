//! Reconciliation against the database and the provider: the payouts in a
//! scope read in one statement, the provider's payments listed, and the
//! unknown payments explained.

use std::collections::{HashMap, HashSet};

use sqlx::PgConnection;

use super::{compare, Comparison, Lag, Mismatch, MismatchKind, PayoutRecord};
use crate::money::Amount;
use crate::payouts::word::same_amount;
use crate::payouts::{row, PAYOUT_COLUMNS};
use crate::period::Period;
use crate::provider::{payout_key, HttpProvider, Payment, PaymentStatus};

/// Which payouts are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Every payout, and every payment the provider has.
    All,
    /// The settlement payouts of one period, and the payments under its
    /// settlement keys (`settled:PERIOD:`).
    Period(Period),
}

/// The payouts in `scope`, in one statement (one snapshot).
pub(crate) async fn load_payouts(conn: &mut PgConnection, scope: Scope) -> anyhow::Result<Vec<PayoutRecord>> {
    let period = match scope {
        Scope::All => None,
        Scope::Period(p) => Some(p.date()),
    };
    Ok(sqlx::query_as(&format!(
        "SELECT {},
                CASE WHEN p.status <> 'queued' OR p.kind <> 'withdrawal' THEN NULL
                     WHEN j.payout_id IS NULL THEN 'it has no delivery job'
                     WHEN j.status = 'failed' THEN 'its delivery job is a dead letter after '
                          || j.attempt || ' attempt(s) (' || coalesce(j.last_error, 'no error recorded')
                          || '); settled queues replay payout_delivery --key ' || p.id || ' sends it'
                     WHEN j.status IN ('settled', 'cancelled') THEN 'its delivery job is ' || j.status
                END AS stranded,
                k.awaiting_operator_detail AS awaiting_operator
         FROM settlement.payouts p LEFT JOIN settlement.payout_jobs j ON j.payout_id = p.id
         LEFT JOIN settlement.provider_keys k ON k.key = p.provider_key
         WHERE $1::date IS NULL OR (p.kind = 'settlement' AND p.period = $1::date)
         ORDER BY p.id",
        PAYOUT_COLUMNS
    ))
    .bind(period) // $1
    .fetch_all(conn)
    .await?)
}

/// Reads settled's payouts in `scope`, then every payment of the
/// provider's (in that order: a payout sent after settled was read is
/// still at the provider when it is listed), and compares them. A payment
/// whose key matched no payout is asked about again: a payout made after
/// the read is in flight, and a settlement of a reward that rounded to zero
/// (its ledger row is 0, and settled records no payout for it) pays nothing.
pub(crate) async fn reconcile(
    conn: &mut PgConnection,
    provider: &HttpProvider,
    scope: Scope,
) -> anyhow::Result<Comparison> {
    let payouts = load_payouts(conn, scope).await?;
    let mut payments = provider.list_all().await?;
    if let Scope::Period(period) = scope {
        let prefix = payout_key(period, "");
        payments.retain(|p| p.idempotency_key.starts_with(&prefix));
    }
    let mut comparison = compare(&payouts, &payments);
    explain_unknown(conn, &mut comparison, &payments).await?;
    awaiting_without_payout(conn, scope, &mut comparison).await?;
    Ok(comparison)
}

/// The keys in `scope` that wait for an operator and have no payout yet (a
/// settlement item paid before its payout row): named as mismatches too.
async fn awaiting_without_payout(conn: &mut PgConnection, scope: Scope, out: &mut Comparison) -> anyhow::Result<()> {
    let prefix = match scope {
        Scope::All => String::new(),
        Scope::Period(period) => payout_key(period, ""),
    };
    let keys: Vec<(String, String)> = sqlx::query_as(
        "SELECT k.key, k.awaiting_operator_detail FROM settlement.provider_keys k
         WHERE k.awaiting_operator_since IS NOT NULL AND starts_with(k.key, $1)
           AND NOT EXISTS (SELECT 1 FROM settlement.payouts p WHERE p.provider_key = k.key)
         ORDER BY k.key",
    )
    .bind(&prefix) // $1
    .fetch_all(&mut *conn)
    .await?;
    for (key, why) in keys {
        out.mismatches.push(Mismatch {
            kind: MismatchKind::AwaitingOperator,
            payout_id: None,
            detail: format!("nothing is sent under this key until an operator checks: {why}"),
            key,
            provider_ids: Vec::new(),
        });
    }
    Ok(())
}

/// Takes out of the unknown payments those made for payouts that came
/// after the read (in flight) and those paying a zero reward.
async fn explain_unknown(conn: &mut PgConnection, out: &mut Comparison, payments: &[Payment]) -> anyhow::Result<()> {
    let unknown: Vec<String> = out.of(MismatchKind::UnknownToSettled).map(|m| m.key.clone()).collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let made_since = row::load_by_provider_keys(conn, &unknown).await?;
    let (mut periods, mut creators, mut keys) = (Vec::new(), Vec::new(), Vec::new());
    for key in &unknown {
        let Some((period, creator)) = key.strip_prefix("settled:").and_then(|rest| rest.split_once(':')) else {
            continue;
        };
        if let Ok(period) = Period::parse(period) {
            periods.push(period.date());
            creators.push(creator.to_string());
            keys.push(key.clone());
        }
    }
    let zero: Vec<String> = sqlx::query_scalar(
        "SELECT k.key FROM unnest($1::date[], $2::text[], $3::text[]) AS k(period, creator, key)
         JOIN settlement.reward_ledger l ON l.period = k.period AND l.creator = k.creator
         WHERE l.amount = 0",
    )
    .bind(&periods) // $1
    .bind(&creators) // $2
    .bind(&keys) // $3
    .fetch_all(&mut *conn)
    .await?;
    let status_of: HashMap<&str, PaymentStatus> = payments
        .iter()
        .map(|p| (p.idempotency_key.as_str(), p.status))
        .collect();
    let zero_paid: HashSet<&str> = payments
        .iter()
        .filter(|p| same_amount(&p.amount, Amount::ZERO))
        .map(|p| p.idempotency_key.as_str())
        .collect();
    let mut explained: HashSet<String> = HashSet::new();
    for payout in made_since {
        if let Some(status) = status_of.get(payout.provider_key.as_str()) {
            out.in_flight.push(Lag {
                payout_id: payout.id,
                key: payout.provider_key.clone(),
                state: payout.state,
                provider_status: *status,
            });
            explained.insert(payout.provider_key);
        }
    }
    for key in zero.into_iter().filter(|k| zero_paid.contains(k.as_str())) {
        out.agreeing += 1;
        explained.insert(key);
    }
    out.mismatches
        .retain(|m| !(m.kind == MismatchKind::UnknownToSettled && explained.contains(&m.key)));
    Ok(())
}
