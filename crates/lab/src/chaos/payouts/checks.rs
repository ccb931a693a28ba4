//! What must hold after the storm, from the database, the provider's own
//! ledger and what the clients were answered; and the counts of what
//! happened. Each invariant names its offenders (ten at most).

use std::collections::{BTreeMap, HashMap, HashSet};

use sqlx::PgConnection;

use settled::payouts::{PayoutRow, PayoutState, PAYOUT_COLUMNS};
use settled::provider::{Payment, PaymentStatus};

use super::clients::{Answer, ConfirmPlan, Intent, IntentLog};
use crate::provider_sim::SimCounters;

/// Offenders listed per invariant.
const OFFENDERS_MAX: usize = 10;

/// An invariant: name, held, what it says (with offenders when it failed).
pub(super) type Invariant = (String, bool, String);

/// What the payout storm did, for the report.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PayoutCounts {
    /// Payout requests planned (distinct idempotency keys).
    pub requests: u64,
    /// Payouts made.
    pub payouts: i64,
    /// Payouts by final state.
    pub by_state: BTreeMap<String, i64>,
    /// Payments the provider applied (one per provider key).
    pub provider_applications: u64,
    /// Payouts returned (funds back on the balance).
    pub returned: i64,
    /// Of them, payouts the provider paid and then took back (`returned`).
    pub returned_after_paid: i64,
    /// Paid payments the provider returned.
    pub provider_returns: u64,
    /// Look-ups of payments by reference (keys past the key window).
    pub reference_lookups: u64,
    /// Keys the provider forgot.
    pub keys_forgotten: u64,
    /// Contradictions of a final state recorded.
    pub conflicts: i64,
    /// Repeats of a request answered with the first payout (API keys).
    pub api_replays: u64,
    /// Repeats that arrived while the first was in progress (409, retried).
    pub api_in_progress: u64,
    /// Provider calls repeated under a key and answered with the first
    /// payment (provider keys).
    pub provider_replays: u64,
    /// Webhook events sent twice by the provider.
    pub webhooks_duplicated: u64,
    /// Webhook sends held back so later ones overtook them.
    pub webhooks_reordered: u64,
    /// Webhook events the provider never sent.
    pub webhooks_lost: u64,
    /// Provider events stored, by outcome (a repeat is not stored).
    pub events: BTreeMap<String, i64>,
    /// Look-ups of sent payouts at the provider.
    pub lookups: u64,
    /// Provider answers: 503s, 429s, late applies, refusals.
    pub provider_503s: u64,
    /// Calls answered 429.
    pub provider_429s: u64,
    /// Payments applied whose answer came after the caller's timeout.
    pub late_applies: u64,
    /// Calls refused (402).
    pub refusals: u64,
    /// Requests refused by settled, by problem type (insufficient funds...).
    pub api_refusals: BTreeMap<String, u64>,
    /// Client tries that got no answer and were sent again.
    pub client_retries: u64,
    /// Confirmations and cancels answered 200.
    pub confirmations: u64,
    /// Cancels answered 200.
    pub cancels: u64,
}

impl PayoutCounts {
    /// The duplicates absorbed by keys: API replays and requests in
    /// progress, provider replays, webhook repeats.
    pub fn duplicates_absorbed(&self) -> u64 {
        self.api_replays + self.api_in_progress + self.provider_replays + self.webhooks_duplicated
    }

    /// The human rendering.
    pub fn render(&self) -> String {
        let states: Vec<String> = self.by_state.iter().map(|(s, n)| format!("{n} {s}")).collect();
        let events: Vec<String> = self.events.iter().map(|(s, n)| format!("{n} {s}")).collect();
        let refusals: Vec<String> = self.api_refusals.iter().map(|(s, n)| format!("{n} {s}")).collect();
        format!(
            "payouts:\n  {} requests, {} payouts ({})\n  {} provider applications, {} returned ({} after the provider \
             paid; the provider returned {}), {} conflicts\n  provider keys: {} forgotten, {} look-ups by reference\n  \
             {} duplicates absorbed by keys: {} API replays, {} API requests in progress, {} provider replays, \
             {} webhooks sent twice\n  provider: {} 503s, {} 429s, {} late applies, {} refusals, {} look-ups; \
             webhooks {} lost, {} held back\n  events stored: {}\n  settled refused: {}\n  \
             {} client retries, {} confirmations, {} cancels\n",
            self.requests,
            self.payouts,
            states.join(", "),
            self.provider_applications,
            self.returned,
            self.returned_after_paid,
            self.provider_returns,
            self.conflicts,
            self.keys_forgotten,
            self.reference_lookups,
            self.duplicates_absorbed(),
            self.api_replays,
            self.api_in_progress,
            self.provider_replays,
            self.webhooks_duplicated,
            self.provider_503s,
            self.provider_429s,
            self.late_applies,
            self.refusals,
            self.lookups,
            self.webhooks_lost,
            self.webhooks_reordered,
            events.join(", "),
            refusals.join(", "),
            self.client_retries,
            self.confirmations,
            self.cancels,
        )
    }
}

/// A payout as the checks read it.
type Row = PayoutRow;

/// Everything the checks read.
pub(super) struct Evidence<'a> {
    pub(super) intents: &'a [Intent],
    pub(super) logs: &'a [IntentLog],
    pub(super) payments: &'a [Payment],
    pub(super) sim: SimCounters,
    /// Replayed 201s, 409s in progress and retried tries the clients saw.
    pub(super) api_replays: u64,
    pub(super) api_in_progress: u64,
    pub(super) client_retries: u64,
}

pub(super) fn invariant(name: &str, offenders: Vec<String>, holds: String) -> Invariant {
    let ok = offenders.is_empty();
    let detail = if ok {
        holds
    } else {
        let shown: Vec<&str> = offenders.iter().take(OFFENDERS_MAX).map(String::as_str).collect();
        format!("{} offender(s): {}", offenders.len(), shown.join("; "))
    };
    (name.to_string(), ok, detail)
}

/// The payout invariants and the counts.
pub(super) async fn check(
    conn: &mut PgConnection,
    evidence: &Evidence<'_>,
) -> anyhow::Result<(Vec<Invariant>, PayoutCounts)> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT {PAYOUT_COLUMNS} FROM settlement.payouts p ORDER BY p.id"
    ))
    .fetch_all(&mut *conn)
    .await?;
    let returns: HashMap<i64, String> =
        sqlx::query_as::<_, (i64, String)>("SELECT payout_id, amount::text FROM settlement.payout_returns")
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect();
    let mut invariants = vec![
        no_payout_stuck(&rows),
        paid_once_at_the_provider(&rows, evidence.payments),
        unpaid_never_paid(&rows, evidence.payments),
        provider_payments_match(&rows, evidence.payments),
        returned_exactly_once(&rows, &returns),
        one_payout_per_request(&rows, evidence),
        confirmations_have_one_winner(&rows, evidence),
    ];
    invariants.push(balances_hold(conn).await?);
    let conflicts: Vec<String> = sqlx::query_scalar(
        "SELECT 'payout ' || payout_id || ' ' || state || ', provider says ' || provider_status || ' (' || source || ')'
         FROM settlement.payout_conflicts ORDER BY payout_id",
    )
    .fetch_all(&mut *conn)
    .await?;
    let conflict_count = conflicts.len() as i64;
    invariants.push(invariant(
        "no_conflicts_recorded",
        conflicts,
        "the provider never contradicted a final state".into(),
    ));
    let counts = counts(conn, &rows, &returns, evidence, conflict_count).await?;
    Ok((invariants, counts))
}

fn no_payout_stuck(rows: &[Row]) -> Invariant {
    let stuck = rows
        .iter()
        .filter(|r| matches!(r.state, PayoutState::Created | PayoutState::Queued | PayoutState::Sent))
        .map(|r| format!("payout {} is {}", r.id, r.state))
        .collect();
    invariant(
        "no_payout_stuck",
        stuck,
        "no payout is created, queued or sent after the drain".into(),
    )
}

fn by_key(payments: &[Payment]) -> HashMap<&str, Vec<&Payment>> {
    let mut map: HashMap<&str, Vec<&Payment>> = HashMap::new();
    for p in payments {
        map.entry(p.idempotency_key.as_str()).or_default().push(p);
    }
    map
}

fn paid_once_at_the_provider(rows: &[Row], payments: &[Payment]) -> Invariant {
    let at_provider = by_key(payments);
    let mut offenders = Vec::new();
    for r in rows
        .iter()
        .filter(|r| matches!(r.state, PayoutState::Paid | PayoutState::Returned))
    {
        // A returned payout's one payment was paid, then returned.
        let status = match r.state {
            PayoutState::Paid => PaymentStatus::Paid,
            _ => PaymentStatus::Returned,
        };
        match at_provider.get(r.provider_key.as_str()).map(Vec::as_slice) {
            Some([p]) if p.status == status && p.amount == r.amount.to_string() && p.creator == r.creator.as_str() => {}
            Some([p]) => offenders.push(format!(
                "payout {} ({} to {}) is {}, the provider has {} of {} to {}",
                r.id,
                r.amount,
                r.creator,
                r.state,
                p.status.as_str(),
                p.amount,
                p.creator
            )),
            Some(many) => offenders.push(format!("payout {}: {} payments under its key", r.id, many.len())),
            None => offenders.push(format!("payout {} is {}, the provider has no payment", r.id, r.state)),
        }
    }
    invariant(
        "paid_exactly_once_at_the_provider",
        offenders,
        "every paid payout is one paid payment at the provider, and every returned one one returned payment, under its key, of its amount to its creator".into(),
    )
}

fn unpaid_never_paid(rows: &[Row], payments: &[Payment]) -> Invariant {
    let at_provider = by_key(payments);
    let mut offenders = Vec::new();
    for r in rows.iter() {
        let found = at_provider.get(r.provider_key.as_str());
        let bad = match r.state {
            PayoutState::Failed => found.is_some_and(|ps| ps.iter().any(|p| p.status != PaymentStatus::Failed)),
            PayoutState::Returned => found.is_some_and(|ps| ps.iter().any(|p| !p.status.is_unpaid_ending())),
            PayoutState::Cancelled | PayoutState::Expired => found.is_some(),
            _ => false,
        };
        if bad {
            offenders.push(format!(
                "payout {} is {} but the provider has a payment under its key",
                r.id, r.state
            ));
        }
    }
    invariant(
        "unpaid_payouts_never_paid",
        offenders,
        "a failed payout was refused or failed at the provider, a returned one came back; a cancelled or expired one never reached it".into(),
    )
}

fn provider_payments_match(rows: &[Row], payments: &[Payment]) -> Invariant {
    let by_provider_key: HashMap<&str, &Row> = rows.iter().map(|r| (r.provider_key.as_str(), r)).collect();
    let mut seen = HashSet::new();
    let mut offenders = Vec::new();
    for p in payments {
        if !seen.insert(p.idempotency_key.as_str()) {
            offenders.push(format!("two payments under key {}", p.idempotency_key));
        }
        match by_provider_key.get(p.idempotency_key.as_str()) {
            None => offenders.push(format!(
                "payment {} under key {} has no payout",
                p.id, p.idempotency_key
            )),
            Some(r) if r.state.as_str() != p.status.as_str() => offenders.push(format!(
                "payment {} is {}, payout {} is {}",
                p.id,
                p.status.as_str(),
                r.id,
                r.state
            )),
            Some(_) => {}
        }
    }
    invariant(
        "every_provider_payment_is_its_payout",
        offenders,
        "each provider payment is one payout's, in the same final state".into(),
    )
}

fn returned_exactly_once(rows: &[Row], returns: &HashMap<i64, String>) -> Invariant {
    let mut offenders = Vec::new();
    for r in rows {
        let unpaid = r.state.returns_funds();
        match (unpaid, returns.get(&r.id)) {
            (true, Some(amount)) if *amount == r.amount.to_string() => {}
            (true, Some(amount)) => offenders.push(format!("payout {} of {} returned {amount}", r.id, r.amount)),
            (true, None) => offenders.push(format!("payout {} is {} and was not returned", r.id, r.state)),
            (false, Some(_)) => offenders.push(format!("payout {} is {} and was returned", r.id, r.state)),
            (false, None) => {}
        }
    }
    invariant(
        "returned_exactly_once",
        offenders,
        "every failed, returned, cancelled or expired payout returned its amount once; no other".into(),
    )
}

fn one_payout_per_request(rows: &[Row], evidence: &Evidence<'_>) -> Invariant {
    let by_request: HashMap<&str, &Row> = rows
        .iter()
        .filter_map(|r| r.idempotency_key.as_deref().map(|k| (k, r)))
        .collect();
    let planned: HashSet<&str> = evidence.intents.iter().map(|i| i.key.as_str()).collect();
    let mut offenders: Vec<String> = by_request
        .keys()
        .filter(|k| !planned.contains(*k))
        .map(|k| format!("payout for unknown key {k}"))
        .collect();
    for (intent, log) in evidence.intents.iter().zip(evidence.logs) {
        let ids: HashSet<i64> = log
            .answers
            .iter()
            .filter_map(|a| match a {
                Answer::Made { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        let row = by_request.get(intent.key.as_str());
        for a in &log.answers {
            if let Answer::Unexpected(what) = a {
                offenders.push(format!("{}: answered {what}", intent.key));
            }
        }
        match (ids.len(), row) {
            // No answer at all: a request the run's stop cut off may have made it.
            (0, None) => {}
            (0, Some(_)) if log.answers.is_empty() => {}
            (0, Some(r)) => offenders.push(format!("{}: refused, yet payout {} exists", intent.key, r.id)),
            (1, Some(r)) if ids.contains(&r.id) => {
                if r.creator.as_str() != intent.creator.to_lowercase()
                    || r.amount.to_string() != intent.amount.to_string()
                {
                    offenders.push(format!(
                        "{}: payout {} pays another creator or amount",
                        intent.key, r.id
                    ));
                }
            }
            (1, _) => offenders.push(format!(
                "{}: answered payout {ids:?}, which is not its payout",
                intent.key
            )),
            (_, _) => offenders.push(format!("{}: answered with different payouts {ids:?}", intent.key)),
        }
    }
    invariant(
        "one_payout_per_request",
        offenders,
        "each idempotency key made at most one payout, and every answer under it named that payout".into(),
    )
}

fn confirmations_have_one_winner(rows: &[Row], evidence: &Evidence<'_>) -> Invariant {
    let by_request: HashMap<&str, &Row> = rows
        .iter()
        .filter_map(|r| r.idempotency_key.as_deref().map(|k| (k, r)))
        .collect();
    let mut offenders = Vec::new();
    for (intent, log) in evidence.intents.iter().zip(evidence.logs) {
        let (Some(plan), Some(r)) = (intent.confirm, by_request.get(intent.key.as_str())) else {
            continue;
        };
        let status = r.state.as_str();
        let wins = log.confirmed + log.cancelled;
        let bad = if wins > 1 {
            Some(format!("{wins} of the racing requests succeeded"))
        } else if log.confirmed == 1 && !matches!(status, "paid" | "failed" | "returned") {
            Some(format!("confirmed, yet {status}"))
        } else if log.cancelled == 1 && status != "cancelled" {
            Some(format!("cancelled, yet {status}"))
        } else if plan == ConfirmPlan::Never && status != "expired" {
            Some(format!("never confirmed, yet {status}"))
        } else if plan != ConfirmPlan::Never && wins == 0 && !log.control_retried && status != "expired" {
            // Both were answered at their first try, and neither won: only
            // an expired token explains that.
            Some(format!("no racing request succeeded, and it is {status}"))
        } else {
            None
        };
        if let Some(why) = bad {
            offenders.push(format!("payout {} ({:?}): {why}", r.id, plan));
        }
    }
    invariant(
        "racing_confirmations_have_one_winner",
        offenders,
        "of two confirmations, or a confirmation and a cancel, raced on two servers, one won and the state agrees"
            .into(),
    )
}

/// Balance = credits - payouts not returned, per creator, in SQL.
async fn balances_hold(conn: &mut PgConnection) -> anyhow::Result<Invariant> {
    let offenders: Vec<String> = sqlx::query_scalar(
        "SELECT b.creator || ': balance ' || b.balance || ', credits ' || coalesce(l.total, 0)
                || ', payouts not returned ' || coalesce(p.total, 0)
         FROM settlement.creator_balance b
         LEFT JOIN (SELECT creator, sum(amount) AS total FROM settlement.reward_ledger GROUP BY creator) l
                USING (creator)
         LEFT JOIN (SELECT creator, sum(amount) AS total FROM settlement.payouts p
                    WHERE NOT EXISTS (SELECT 1 FROM settlement.payout_returns r WHERE r.payout_id = p.id)
                    GROUP BY creator) p USING (creator)
         WHERE b.balance <> coalesce(l.total, 0) - coalesce(p.total, 0)
         ORDER BY b.creator",
    )
    .fetch_all(conn)
    .await?;
    Ok(invariant(
        "balance_is_credits_less_unreturned_payouts",
        offenders,
        "every creator's balance equals its credits less its payouts not returned".into(),
    ))
}

async fn counts(
    conn: &mut PgConnection,
    rows: &[Row],
    returns: &HashMap<i64, String>,
    evidence: &Evidence<'_>,
    conflicts: i64,
) -> anyhow::Result<PayoutCounts> {
    let mut by_state = BTreeMap::new();
    for r in rows {
        *by_state.entry(r.state.as_str().to_string()).or_insert(0) += 1;
    }
    let events: BTreeMap<String, i64> =
        sqlx::query_as::<_, (String, i64)>("SELECT outcome, count(*) FROM settlement.provider_events GROUP BY outcome")
            .fetch_all(conn)
            .await?
            .into_iter()
            .collect();
    let mut api_refusals = BTreeMap::new();
    for log in evidence.logs {
        for a in &log.answers {
            if let Answer::Refused(kind) = a {
                *api_refusals
                    .entry(kind.trim_start_matches("/problems/").to_string())
                    .or_insert(0) += 1;
            }
        }
    }
    let sim = &evidence.sim;
    Ok(PayoutCounts {
        requests: evidence.intents.len() as u64,
        payouts: rows.len() as i64,
        by_state,
        provider_applications: sim.applied,
        returned: returns.len() as i64,
        returned_after_paid: rows.iter().filter(|r| r.state == PayoutState::Returned).count() as i64,
        provider_returns: sim.returned,
        reference_lookups: sim.reference_lookups,
        keys_forgotten: sim.keys_forgotten,
        conflicts,
        provider_replays: sim.replayed,
        webhooks_duplicated: sim.webhooks_duplicated,
        webhooks_reordered: sim.webhooks_reordered,
        webhooks_lost: sim.webhooks_lost,
        events,
        lookups: sim.lookups,
        provider_503s: sim.injected_errors,
        provider_429s: sim.rate_limited,
        late_applies: sim.applied_then_timed_out,
        refusals: sim.refused,
        api_refusals,
        api_replays: evidence.api_replays,
        api_in_progress: evidence.api_in_progress,
        client_retries: evidence.client_retries,
        confirmations: evidence.logs.iter().map(|l| u64::from(l.confirmed)).sum(),
        cancels: evidence.logs.iter().map(|l| u64::from(l.cancelled)).sum(),
    })
}
