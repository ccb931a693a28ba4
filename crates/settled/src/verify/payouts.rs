//! `settled verify --payouts`: proves from committed state, in one
//! snapshot, that every unit that left a balance went out as a payout or
//! came back, per creator and in total; that each payout's history is a
//! path of allowed transitions ending in its state; and that funds came
//! back exactly for the payouts that ended unpaid (failed, cancelled,
//! expired, or returned by the provider after it paid), once. With a provider,
//! its payments match settled's payouts one to one
//! ([`crate::payouts::reconcile`]); with a chain, the token's transfers from
//! the hot wallet do ([`crate::chain::reconcile`], the one home of that rule).

use sqlx::PgConnection;

use super::{begin_snapshot, render_checks, run_check, Check, CheckSql, BALANCE_CHECK, MAX_OFFENDERS};
use crate::payouts::reconcile::{self, Comparison, Scope};
use crate::provider::HttpProvider;

/// The money in and out, over every creator (base units, decimal strings).
#[derive(Debug, Clone, Default, serde::Serialize, sqlx::FromRow)]
pub(crate) struct Totals {
    /// Credited by settlement: every ledger row, archived periods' carried.
    pub settled: String,
    /// Every payout's amount (debited when it was made).
    pub payouts: String,
    /// Returned to balances by payouts that ended unpaid.
    pub returned: String,
    /// Of that, what the provider paid and took back (payouts `returned`).
    pub returned_after_paid: String,
    /// The payouts not returned: what left, or is leaving, for good.
    pub not_returned: String,
    /// Every balance added up.
    pub balances: String,
    /// `balances = settled + returned - payouts`.
    pub holds: bool,
}

/// `verify --payouts`'s findings.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct PayoutsReport {
    /// True when every check holds.
    pub ok: bool,
    /// The totals.
    pub totals: Totals,
    /// The checks, in order.
    pub checks: Vec<Check>,
    /// The reconciliation with the provider, when asked for.
    pub provider: Option<Comparison>,
    /// The mismatches with the chain, when asked for (each names its payout
    /// or transfer; none when the chain and settled agree).
    pub chain: Option<Vec<String>>,
    /// Seconds the database's checks took (one snapshot).
    pub seconds: f64,
}

const TOTALS_SQL: &str = "
WITH s AS (SELECT (SELECT coalesce(sum(amount), 0) FROM settlement.reward_ledger)
                + (SELECT coalesce(sum(amount), 0) FROM settlement.ledger_carry) AS settled),
     p AS (SELECT coalesce(sum(p.amount), 0) AS payouts,
                  coalesce(sum(p.amount) FILTER (WHERE r.payout_id IS NULL), 0) AS not_returned
           FROM settlement.payouts p LEFT JOIN settlement.payout_returns r ON r.payout_id = p.id),
     r AS (SELECT coalesce(sum(r.amount), 0) AS returned,
                  coalesce(sum(r.amount) FILTER (WHERE p.status = 'returned'), 0) AS returned_after_paid
           FROM settlement.payout_returns r JOIN settlement.payouts p ON p.id = r.payout_id),
     b AS (SELECT coalesce(sum(balance), 0) AS balances FROM settlement.creator_balance)
SELECT s.settled::text, p.payouts::text, r.returned::text, r.returned_after_paid::text, p.not_returned::text,
       b.balances::text,
       b.balances = s.settled + r.returned - p.payouts AS holds
FROM s, p, r, b";

/// Every state of [`PayoutState::ALL`] (a test pins the list to it).
const STATES_CHECK: CheckSql = CheckSql {
    name: "payouts_in_known_states",
    description: "every payout is in exactly one of the eight states",
    offenders:
        "SELECT 'payout ' || id || ' is in ' || coalesce(quote_literal(status), 'no state')
                FROM settlement.payouts
                WHERE status IS NULL
                   OR status NOT IN ('created', 'queued', 'sent', 'paid', 'failed', 'returned', 'cancelled', 'expired')",
};

/// A payout's history, step by step: the first step from nothing into a
/// state the payout can start in (a withdrawal in created or queued, a
/// settlement payment in the state the provider answered), each later step
/// from where the one before ended along an allowed transition, the last
/// ending in the payout's state.
const HISTORY_CHECK: CheckSql = CheckSql {
    name: "payout_histories_lead_to_their_states",
    description: "each payout's history starts from nothing, goes by allowed transitions only, each step from where the last ended, and ends in the payout's state",
    offenders: "
WITH steps AS (
    SELECT h.payout_id, h.id, h.from_state, h.to_state, p.kind,
           lag(h.to_state) OVER w AS previous, row_number() OVER w AS step
    FROM settlement.payout_history h
    JOIN settlement.payouts p ON p.id = h.payout_id
    WINDOW w AS (PARTITION BY h.payout_id ORDER BY h.id)),
faults AS (
    SELECT s.payout_id, s.step, s.to_state, CASE
        WHEN s.step = 1 AND s.from_state IS NOT NULL
            THEN 'its first step starts from ' || s.from_state || ', not from nothing'
        WHEN s.step = 1 AND s.kind = 'withdrawal' AND s.to_state NOT IN ('created', 'queued')
            THEN 'a withdrawal that began in ' || s.to_state
        WHEN s.step = 1 AND s.kind = 'settlement' AND s.to_state NOT IN ('sent', 'paid', 'failed')
            THEN 'a settlement payment that began in ' || s.to_state
        WHEN s.step > 1 AND s.from_state IS DISTINCT FROM s.previous
            THEN 'step ' || s.step || ' starts from ' || coalesce(s.from_state, 'nothing')
                 || ' but step ' || (s.step - 1) || ' ended in ' || s.previous
        WHEN s.step > 1 AND NOT EXISTS (SELECT 1 FROM settlement.payout_transitions t
                                        WHERE t.from_state = s.from_state AND t.to_state = s.to_state)
            THEN 'step ' || s.step || ' goes from ' || s.from_state || ' to ' || s.to_state
                 || ', which the state machine does not allow'
    END AS fault
    FROM steps s),
per_payout AS (
    SELECT payout_id, (array_agg(to_state ORDER BY step DESC))[1] AS last_state,
           (array_agg(fault ORDER BY step) FILTER (WHERE fault IS NOT NULL))[1] AS first_fault
    FROM faults GROUP BY payout_id)
SELECT 'payout ' || p.id || ' is ' || p.status || ': ' || CASE
    WHEN h.payout_id IS NULL THEN 'it has no history'
    WHEN h.first_fault IS NOT NULL THEN h.first_fault
    ELSE 'its history ends in ' || h.last_state END
FROM settlement.payouts p
LEFT JOIN per_payout h ON h.payout_id = p.id
WHERE h.payout_id IS NULL OR h.first_fault IS NOT NULL OR h.last_state IS DISTINCT FROM p.status",
};

/// A queued payout's funds are held until its delivery sends it: its job
/// is waiting, running, or a dead letter an operator can replay, never
/// settled or cancelled while the payout is still queued (stranded).
const DELIVERY_CHECK: CheckSql = CheckSql {
    name: "queued_payouts_keep_their_delivery_job",
    description: "every queued payout keeps its delivery job, waiting, running or a dead letter, never settled or cancelled while queued",
    offenders: "SELECT 'payout ' || p.id || ' is queued, '
                       || coalesce('its delivery job is ' || j.status, 'with no delivery job')
                FROM settlement.payouts p
                LEFT JOIN settlement.payout_jobs j ON j.payout_id = p.id
                WHERE p.status = 'queued'
                  AND (j.payout_id IS NULL OR j.status NOT IN ('eligible', 'processing', 'failed'))",
};

const RETURNS_CHECK: CheckSql = CheckSql {
    name: "returns_exactly_for_unpaid_endings",
    description: "funds came back exactly for the payouts that failed, were returned, cancelled or expired, once, of the payout's amount to its creator",
    offenders: "
SELECT 'payout ' || p.id || ' is ' || p.status || CASE WHEN r.n IS NULL
           THEN ' but its funds were never returned'
           ELSE ' but its funds were returned' END
FROM settlement.payouts p
LEFT JOIN (SELECT payout_id, count(*) AS n FROM settlement.payout_returns GROUP BY payout_id) r ON r.payout_id = p.id
WHERE (p.status IN ('failed', 'returned', 'cancelled', 'expired')) <> (r.n IS NOT NULL)
UNION ALL
SELECT 'payout ' || r.payout_id || ' was returned ' || count(*) || ' times'
FROM settlement.payout_returns r GROUP BY r.payout_id HAVING count(*) > 1
UNION ALL
SELECT 'payout ' || p.id || ' returned ' || r.amount || ' to ' || r.creator
       || ' but it took ' || p.amount || ' from ' || p.creator
FROM settlement.payout_returns r JOIN settlement.payouts p ON p.id = r.payout_id
WHERE r.amount <> p.amount OR r.creator <> p.creator
UNION ALL
SELECT 'a return names payout ' || r.payout_id || ', which does not exist'
FROM settlement.payout_returns r
WHERE NOT EXISTS (SELECT 1 FROM settlement.payouts p WHERE p.id = r.payout_id)",
};

/// The chain to compare payouts with: its node and the token paid out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChainSide<'a> {
    /// The node.
    pub rpc: &'a crate::chain::Rpc,
    /// The ERC-20 token paid out.
    pub token: alloy_primitives::Address,
}

/// The check the chain's side adds: `chain::reconcile`'s mismatches, the
/// first [`MAX_OFFENDERS`] listed.
pub(crate) const CHAIN_CHECK_NAME: &str = "chain_transfers_match_payouts";

/// Runs every payout check in one REPEATABLE READ snapshot on `conn`; with
/// `provider` (or `chain`), then reconciles with it outside the snapshot (a
/// payment made after the snapshot would otherwise look unknown).
pub(crate) async fn verify_payouts(
    conn: &mut PgConnection,
    provider: Option<&HttpProvider>,
    chain: Option<ChainSide<'_>>,
) -> anyhow::Result<PayoutsReport> {
    begin_snapshot(conn, None).await?;
    let started = std::time::Instant::now();
    let checked = database_checks(conn).await;
    let seconds = started.elapsed().as_secs_f64();
    sqlx::query("ROLLBACK").execute(&mut *conn).await?;
    let (totals, mut checks) = checked?;
    let comparison = match provider {
        Some(provider) => Some(reconcile::reconcile(conn, provider, Scope::All).await?),
        None => None,
    };
    if let Some(comparison) = &comparison {
        checks.extend(comparison.checks());
    }
    let chain = match chain {
        Some(side) => Some(crate::chain::reconcile::lasting_mismatches(conn, side.rpc, side.token, 0).await?),
        None => None,
    };
    if let Some(mismatches) = &chain {
        checks.push(chain_check(mismatches));
    }
    Ok(PayoutsReport {
        ok: checks.iter().all(|c| c.ok),
        totals,
        checks,
        provider: comparison,
        chain,
        seconds,
    })
}

/// The chain's mismatches as one check.
fn chain_check(mismatches: &[String]) -> Check {
    Check {
        name: CHAIN_CHECK_NAME,
        description: "the token's Transfer logs from each hot wallet match the payouts paid on-chain one to one: \
                      none paid twice, none unexplained, same recipient and amount, every paid payout's transfer \
                      and confirmed receipt on the node",
        ok: mismatches.is_empty(),
        violations: mismatches.len() as i64,
        offenders: mismatches.iter().take(MAX_OFFENDERS as usize).cloned().collect(),
    }
}

async fn database_checks(conn: &mut PgConnection) -> anyhow::Result<(Totals, Vec<Check>)> {
    let totals: Totals = sqlx::query_as(TOTALS_SQL).fetch_one(&mut *conn).await?;
    let balances = run_check(conn, &BALANCE_CHECK, None).await?;
    let total = Check {
        name: "payout_totals",
        description: "all balances add up to everything settlement credited, plus what came back, less every payout",
        ok: totals.holds,
        violations: i64::from(!totals.holds),
        offenders: if totals.holds {
            Vec::new()
        } else {
            vec![format!(
                "balances add up to {}, but settled {} + returned {} - payouts {} gives another number",
                totals.balances, totals.settled, totals.returned, totals.payouts
            )]
        },
    };
    let mut checks = vec![balances, total];
    for check in [&STATES_CHECK, &HISTORY_CHECK, &RETURNS_CHECK, &DELIVERY_CHECK] {
        checks.push(run_check(conn, check, None).await?);
    }
    Ok((totals, checks))
}

impl PayoutsReport {
    /// The human rendering, as `verify --period` prints its own.
    pub(crate) fn render(&self) -> String {
        let mut out = format!(
            "verify payouts: {}\n",
            if self.ok { "OK, every check holds" } else { "FAILED" }
        );
        out.push_str(&render_checks(&self.checks));
        let t = &self.totals;
        out.push_str(&format!(
            "  checked in {:.2} s, one snapshot\n  settled {} + returned {} - payouts {} = balances {}: {}\n  \
             payouts not returned {}; returned after the provider paid {}\n",
            self.seconds,
            t.settled,
            t.returned,
            t.payouts,
            t.balances,
            if t.holds { "yes" } else { "NO" },
            t.not_returned,
            t.returned_after_paid
        ));
        if let Some(c) = &self.provider {
            out.push_str(&format!(
                "  provider: {} payouts, {} payments, {} mismatch(es), {} in flight, {} behind\n",
                c.payouts,
                c.payments,
                c.mismatches.len(),
                c.in_flight.len(),
                c.behind.len()
            ));
        }
        if let Some(mismatches) = &self.chain {
            out.push_str(&format!("  chain: {} mismatch(es)\n", mismatches.len()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payouts::PayoutState;

    #[test]
    fn the_states_check_names_every_state_and_the_returns_check_every_unpaid_ending() {
        let listed = |sql: &str, marker: &str| -> Vec<String> {
            let list = &sql[sql.find(marker).expect(marker) + marker.len()..];
            let list = &list[..list.find(')').expect("a closed list")];
            list.split(',')
                .map(|v| v.trim().trim_matches('\'').to_string())
                .collect()
        };
        let states: Vec<&str> = PayoutState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(listed(STATES_CHECK.offenders, "status NOT IN ("), states);
        let unpaid: Vec<&str> = PayoutState::ALL
            .iter()
            .filter(|s| s.returns_funds())
            .map(|s| s.as_str())
            .collect();
        assert_eq!(listed(RETURNS_CHECK.offenders, "p.status IN ("), unpaid);
    }
}
