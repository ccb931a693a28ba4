//! `settled verify`: proves from committed state that a period was paid
//! exactly once, from the input it was given, and that money is conserved
//! to the unit. Every check is one
//! exact query (never SKIP LOCKED); each failing check lists up to
//! `MAX_OFFENDERS` offenders.

pub(crate) mod payouts;

use sqlx::PgConnection;

use crate::payouts::reconcile::{self, Scope};
use crate::period::Period;
use crate::provider::HttpProvider;

/// `work_mem` for verify's transaction (see [`verify`]).
pub(crate) const VERIFY_WORK_MEM: &str = "256MB";

/// Offenders listed per failing check.
pub(crate) const MAX_OFFENDERS: i64 = 20;

/// One check's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    /// Stable name of the check.
    pub name: &'static str,
    /// What it proves.
    pub description: &'static str,
    /// Whether it holds.
    pub ok: bool,
    /// How many rows break it.
    pub violations: i64,
    /// The first offenders, described.
    pub offenders: Vec<String>,
}

/// All checks for a period.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyReport {
    /// The period verified.
    pub period: String,
    /// True when every check holds.
    pub ok: bool,
    /// Ledger total of the period (base units).
    pub ledger_total: String,
    /// Expected total: the policy applied to every settled item.
    pub expected_total: String,
    /// The checks, in order.
    pub checks: Vec<Check>,
    /// Seconds the checks took (one snapshot, every statement).
    pub seconds: f64,
}

pub(crate) struct CheckSql {
    name: &'static str,
    description: &'static str,
    /// One text column, `offender`, describing each row that breaks the
    /// check; $1 = period. [`run_check`] counts and limits it in one statement.
    offenders: &'static str,
}

/// The checks that need no scan of the period: answered one statement each.
const POLICY_CHECK: CheckSql = CheckSql {
    name: "policy_exists",
    description: "the period has a fee policy",
    offenders: "SELECT 'no policy for ' || $1::date::text
                WHERE NOT EXISTS (SELECT 1 FROM settlement.settlement_policy WHERE period = $1::date)",
};

/// The balance rule's offenders, the rows of each table narrowed by `$only`
/// (a WHERE clause, or nothing): one text for the whole check and for one
/// creator's verdict ([`creator_verdict`]), so the rule is written once.
macro_rules! balance_offenders {
    ($only:literal) => {
        concat!(
            "SELECT coalesce(b.creator, l.creator, p.creator, r.creator) || ' has balance ' || coalesce(b.balance, 0)
                       || ' but ledger ' || coalesce(l.total, 0) || ' less payouts ' || coalesce(p.total, 0)
                       || ' plus returned ' || coalesce(r.total, 0)
                FROM (SELECT creator, balance FROM settlement.creator_balance ",
            $only,
            ") b
                FULL JOIN (SELECT creator, sum(amount) AS total
                           FROM (SELECT creator, amount FROM settlement.reward_ledger ",
            $only,
            "
                                 UNION ALL SELECT creator, amount FROM settlement.ledger_carry ",
            $only,
            ") AS all_periods
                           GROUP BY creator) l
                       ON l.creator = b.creator
                FULL JOIN (SELECT creator, sum(amount) AS total FROM settlement.payouts ",
            $only,
            " GROUP BY creator) p
                       ON p.creator = coalesce(b.creator, l.creator)
                FULL JOIN (SELECT creator, sum(amount) AS total FROM settlement.payout_returns ",
            $only,
            " GROUP BY creator) r
                       ON r.creator = coalesce(b.creator, l.creator, p.creator)
                WHERE coalesce(b.balance, 0) <> coalesce(l.total, 0) - coalesce(p.total, 0) + coalesce(r.total, 0)"
        )
    };
}

const BALANCE_DESCRIPTION: &str =
    "every creator's balance equals its ledger total (all periods, archived ones carried) less its payouts, plus the payouts returned";

pub(crate) const BALANCE_CHECK: CheckSql = CheckSql {
    name: "balances_equal_ledger",
    description: BALANCE_DESCRIPTION,
    offenders: balance_offenders!(""),
};

/// The balance check for one creator ($1), read through that creator's rows only.
const CREATOR_BALANCE_CHECK: CheckSql = CheckSql {
    name: "balances_equal_ledger",
    description: BALANCE_DESCRIPTION,
    offenders: balance_offenders!("WHERE creator = $1"),
};

/// The verifier's verdict on one creator, now: its balance against its
/// ledger (all periods), payouts and returns, by the rule of
/// `balances_equal_ledger`, in one statement.
pub(crate) async fn creator_verdict(
    conn: &mut PgConnection,
    creator: &crate::address::CreatorAddress,
) -> anyhow::Result<Check> {
    run_check(conn, &CREATOR_BALANCE_CHECK, Some(creator.as_str())).await
}

/// The check that fails for work not done yet: while a run is in progress,
/// its offenders are items still to do, not violations.
pub(crate) const NO_WORK_LEFT: &str = "no_work_left";

/// The checks over the period's items and ledger rows, in report order:
/// (name, description). [`PERIOD_SCAN_SQL`] answers all of them at once.
const PERIOD_CHECKS: [(&str, &str); 4] = [
    (NO_WORK_LEFT, "no item is still eligible or processing"),
    (
        "settled_items_have_one_ledger_row",
        "each settled creator has exactly one ledger row for the period",
    ),
    (
        "ledger_rows_have_settled_items",
        "no ledger row lacks its item, and every paid item is marked settled",
    ),
    (
        "amounts_follow_policy",
        "each ledger amount equals floor(volume * fee_bps / 10000)",
    ),
];

/// One pass over the period: its items FULL JOIN its ledger rows (one
/// partition each), every per-row check counted with its first offenders,
/// and both totals. $1 = period, $2 = offenders listed per check. One scan
/// instead of one per check: a million items verify in a few seconds.
const PERIOD_SCAN_SQL: &str = "
WITH fee AS (SELECT fee_bps FROM settlement.settlement_policy WHERE period = $1::date),
recorded AS (SELECT items, digest FROM settlement.period_inputs WHERE period = $1::date),
joined AS (
    SELECT v.creator AS item, v.status, v.volume, l.creator AS paid, l.amount,
           settlement.reward(v.volume, (SELECT fee_bps FROM fee)) AS due
    FROM (SELECT creator, volume, status FROM settlement.token_trade_volume WHERE period = $1::date) v
    FULL JOIN (SELECT creator, amount FROM settlement.reward_ledger WHERE period = $1::date) l
           ON l.creator = v.creator
),
flagged AS (
    SELECT *,
           status IN ('eligible', 'processing') AS unfinished,
           status = 'settled' AND paid IS NULL AS unpaid,
           paid IS NOT NULL AND (item IS NULL OR status <> 'settled') AS unbacked,
           paid IS NOT NULL AND item IS NOT NULL AND amount <> due AS misprized
    FROM joined
)
SELECT count(*) FILTER (WHERE unfinished) AS unfinished,
       (array_agg(item || ' is ' || status ORDER BY item) FILTER (WHERE unfinished))[1:$2] AS unfinished_list,
       count(*) FILTER (WHERE unpaid) AS unpaid,
       (array_agg(item || ' is settled but has no ledger row' ORDER BY item) FILTER (WHERE unpaid))[1:$2] AS unpaid_list,
       count(*) FILTER (WHERE unbacked) AS unbacked,
       (array_agg(paid || CASE WHEN item IS NULL THEN ' has a ledger row but no item'
                               ELSE ' has a ledger row but its item is ' || status END ORDER BY paid)
            FILTER (WHERE unbacked))[1:$2] AS unbacked_list,
       count(*) FILTER (WHERE misprized) AS misprized,
       (array_agg(paid || ' was paid ' || amount || ', policy gives ' || due ORDER BY paid)
            FILTER (WHERE misprized))[1:$2] AS misprized_list,
       coalesce(sum(amount), 0)::text AS ledger_total,
       coalesce(sum(due) FILTER (WHERE status = 'settled'), 0)::text AS expected_total,
       count(item) AS items,
       coalesce(sum(settlement.input_digest(item, volume)), 0)::text AS items_digest,
       coalesce((SELECT items FROM recorded), 0) AS recorded_items,
       coalesce((SELECT digest FROM recorded), 0)::text AS recorded_digest
FROM flagged";

#[derive(sqlx::FromRow)]
struct PeriodScan {
    unfinished: i64,
    unfinished_list: Option<Vec<String>>,
    unpaid: i64,
    unpaid_list: Option<Vec<String>>,
    unbacked: i64,
    unbacked_list: Option<Vec<String>>,
    misprized: i64,
    misprized_list: Option<Vec<String>>,
    ledger_total: String,
    expected_total: String,
    items: i64,
    items_digest: String,
    recorded_items: i64,
    recorded_digest: String,
}

impl PeriodScan {
    /// The input check: the items now against what seed and import recorded
    /// as they wrote them (`settlement.period_inputs`, migration
    /// 20261203000102): an UPDATE or DELETE of an item, or an INSERT that
    /// went around the work table, leaves the record behind.
    fn input_check(&self) -> Check {
        let ok = self.items == self.recorded_items && self.items_digest == self.recorded_digest;
        Check {
            name: "items_match_their_input",
            description: "the period's items are those seed and import wrote: as many, and the same digest of their creators and volumes",
            ok,
            violations: i64::from(!ok),
            offenders: if ok {
                Vec::new()
            } else {
                vec![format!(
                    "the items are {} with digest {}, but seed and import wrote {} with digest {}: an item's volume or creator changed, or an item came or went, after its import",
                    self.items, self.items_digest, self.recorded_items, self.recorded_digest
                )]
            },
        }
    }
}

/// One check, one statement: the total number of offenders (a window over
/// every row, before the limit) beside the first [`MAX_OFFENDERS`] of them.
/// `period` is its $1 (NULL for a check over no period).
pub(crate) async fn run_check(
    conn: &mut PgConnection,
    check: &CheckSql,
    period: Option<&str>,
) -> anyhow::Result<Check> {
    let sql = format!(
        "SELECT o.offender, count(*) OVER () AS violations
         FROM ({}) AS o(offender) ORDER BY o.offender LIMIT $2",
        check.offenders
    );
    let rows: Vec<OffenderRow> = sqlx::query_as(&sql)
        .bind(period) // $1
        .bind(MAX_OFFENDERS) // $2
        .fetch_all(&mut *conn)
        .await?;
    let violations = rows.first().map_or(0, |r| r.violations);
    Ok(Check {
        name: check.name,
        description: check.description,
        ok: violations == 0,
        violations,
        offenders: rows.into_iter().map(|r| r.offender).collect(),
    })
}

#[derive(sqlx::FromRow)]
struct OffenderRow {
    offender: String,
    violations: i64,
}

/// Opens verify's read-only REPEATABLE READ transaction on `conn`, in
/// `snapshot` when given (one exported by another of verify's sessions).
pub(crate) async fn begin_snapshot(conn: &mut PgConnection, snapshot: Option<&str>) -> anyhow::Result<()> {
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *conn)
        .await?;
    if let Some(id) = snapshot {
        // SET TRANSACTION SNAPSHOT takes no parameter; the id comes from
        // pg_export_snapshot() and is checked to be only its characters.
        anyhow::ensure!(
            !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'),
            "unexpected snapshot id {id:?}"
        );
        sqlx::query(&format!("SET TRANSACTION SNAPSHOT '{id}'"))
            .execute(&mut *conn)
            .await?;
    }
    // The period's join and the balances' aggregate hash a million rows
    // each: with the default 4 MB they spill to disk in batches (about 15%
    // slower at a million). Transaction-local, so pooler-safe.
    sqlx::query("SELECT set_config('work_mem', $1, true)")
        .bind(VERIFY_WORK_MEM) // $1
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Runs every check for `period` in one REPEATABLE READ snapshot, so all
/// checks see the same committed state.
pub async fn verify(conn: &mut PgConnection, period: Period) -> anyhow::Result<VerifyReport> {
    begin_snapshot(conn, None).await?;
    let started = std::time::Instant::now();
    let result = run_checks(conn, None, period).await.map(|mut report| {
        report.seconds = started.elapsed().as_secs_f64();
        report
    });
    sqlx::query("ROLLBACK").execute(&mut *conn).await?;
    result
}

/// [`verify`] on two sessions of `pool` sharing one snapshot (exported by
/// the first, imported by the second, as pg_dump's workers do): the period's
/// checks and the balances' check run at the same time, on two cores.
pub(crate) async fn verify_pool(pool: &sqlx::PgPool, period: Period) -> anyhow::Result<VerifyReport> {
    let mut first = pool.acquire().await?;
    let mut second = pool.acquire().await?;
    begin_snapshot(&mut first, None).await?;
    let snapshot: String = sqlx::query_scalar("SELECT pg_export_snapshot()")
        .fetch_one(&mut *first)
        .await?;
    let started = std::time::Instant::now();
    let result = match begin_snapshot(&mut second, Some(&snapshot)).await {
        Ok(()) => run_checks(&mut first, Some(&mut second), period).await,
        Err(err) => Err(err),
    }
    .map(|mut report| {
        report.seconds = started.elapsed().as_secs_f64();
        report
    });
    let _ = sqlx::query("ROLLBACK").execute(&mut *second).await;
    sqlx::query("ROLLBACK").execute(&mut *first).await?;
    result
}

async fn run_checks(
    conn: &mut PgConnection,
    balances_on: Option<&mut PgConnection>,
    period: Period,
) -> anyhow::Result<VerifyReport> {
    let p = period.to_string();
    let archived: Option<(String, String)> =
        sqlx::query_as("SELECT ledger_total::text, file FROM settlement.archived_periods WHERE period = $1")
            .bind(period.date()) // $1
            .fetch_optional(&mut *conn)
            .await?;
    if let Some((total, file)) = archived {
        // Its rows left the database: what stays provable here is the
        // balances (its totals are carried); the file is re-checked by
        // `settled verify --archive`.
        let checks = vec![
            Check {
                name: "period_archived",
                description: "the period's ledger was exported whole and left the hot tables; re-check its file with `settled verify --archive FILE`",
                ok: true,
                violations: 0,
                offenders: vec![file],
            },
            run_check(conn, &BALANCE_CHECK, Some(&p)).await?,
        ];
        return Ok(VerifyReport {
            period: p,
            ok: checks.iter().all(|c| c.ok),
            ledger_total: total.clone(),
            expected_total: total,
            checks,
            seconds: 0.0,
        });
    }
    let (scan, balances) = match balances_on {
        Some(other) => {
            let (scan, balances) = tokio::join!(period_scan(conn, &p), run_check(other, &BALANCE_CHECK, Some(&p)));
            (scan?, balances?)
        }
        None => {
            let scan = period_scan(conn, &p).await?;
            (scan, run_check(conn, &BALANCE_CHECK, Some(&p)).await?)
        }
    };
    let mut checks = vec![run_check(conn, &POLICY_CHECK, Some(&p)).await?, scan.input_check()];
    for ((name, description), (violations, offenders)) in PERIOD_CHECKS.into_iter().zip([
        (scan.unfinished, scan.unfinished_list),
        (scan.unpaid, scan.unpaid_list),
        (scan.unbacked, scan.unbacked_list),
        (scan.misprized, scan.misprized_list),
    ]) {
        checks.push(Check {
            name,
            description,
            ok: violations == 0,
            violations,
            offenders: offenders.unwrap_or_default(),
        });
    }
    checks.push(Check {
        name: "ledger_total_equals_expected",
        description: "the period's ledger total equals the policy applied to every settled item",
        ok: scan.ledger_total == scan.expected_total,
        violations: i64::from(scan.ledger_total != scan.expected_total),
        offenders: if scan.ledger_total == scan.expected_total {
            Vec::new()
        } else {
            vec![format!(
                "ledger total {} <> expected {}",
                scan.ledger_total, scan.expected_total
            )]
        },
    });
    checks.push(balances);
    Ok(VerifyReport {
        period: p,
        ok: checks.iter().all(|c| c.ok),
        ledger_total: scan.ledger_total,
        expected_total: scan.expected_total,
        checks,
        seconds: 0.0,
    })
}

async fn period_scan(conn: &mut PgConnection, period: &str) -> anyhow::Result<PeriodScan> {
    Ok(sqlx::query_as(PERIOD_SCAN_SQL)
        .bind(period) // $1
        .bind(MAX_OFFENDERS as i32) // $2
        .fetch_one(conn)
        .await?)
}

impl VerifyReport {
    /// The human rendering.
    pub(crate) fn render(&self) -> String {
        let mut out = format!(
            "verify {}: {}\n",
            self.period,
            if self.ok { "OK, every check holds" } else { "FAILED" }
        );
        out.push_str(&render_checks(&self.checks));
        out.push_str(&format!(
            "  checked in {:.2} s, one snapshot\n  ledger total {} = expected {}: {}\n",
            self.seconds,
            self.ledger_total,
            self.expected_total,
            if self.ledger_total == self.expected_total {
                "yes"
            } else {
                "NO"
            }
        ));
        out
    }
}

/// The checks as `verify` prints them: one line each, and under a failing
/// one its count and first offenders.
pub(crate) fn render_checks(checks: &[Check]) -> String {
    let mut out = String::new();
    for check in checks {
        out.push_str(&format!(
            "  [{}] {} ({})\n",
            if check.ok { "ok" } else { "FAIL" },
            check.name,
            check.description
        ));
        if !check.ok {
            out.push_str(&format!("        {} violation(s)\n", check.violations));
            for offender in &check.offenders {
                out.push_str(&format!("        - {offender}\n"));
            }
        }
    }
    out
}

/// Each ledger row of a leased period was recorded as its settlement
/// payout, and no settlement payout lacks its row.
const LEDGER_PAYOUTS_CHECK: CheckSql = CheckSql {
    name: "ledger_rows_have_their_payouts",
    description: "each ledger row of the period paying more than zero was recorded as one settlement payout of its creator and amount, and every settlement payout of the period has its ledger row",
    offenders: "SELECT coalesce(l.creator, p.creator) || CASE
                    WHEN p.id IS NULL THEN ' has a ledger row of ' || l.amount || ' but no settlement payout'
                    WHEN l.creator IS NULL THEN ' has settlement payout ' || p.id || ' of ' || p.amount || ' but no ledger row'
                    ELSE ' has a ledger row of ' || l.amount || ' but its settlement payout ' || p.id || ' is of ' || p.amount
                END
                FROM (SELECT creator, amount FROM settlement.reward_ledger WHERE period = $1::date AND amount > 0) l
                FULL JOIN (SELECT id, creator, amount FROM settlement.payouts
                           WHERE kind = 'settlement' AND period = $1::date) p
                       ON p.creator = l.creator
                WHERE p.id IS NULL OR l.creator IS NULL OR p.amount <> l.amount",
};

/// Reconciles the period with a payment provider (leased mode, where each
/// creator is paid through it): every ledger row became its settlement
/// payout, and those payouts match the provider's payments under the
/// period's keys one to one (`reconcile::compare`: none missing, none
/// unknown, same amounts and creators, states that agree, none paid
/// twice). Adds its checks to `report`. `conn` must not be inside verify's
/// snapshot: a payment the provider made after it would look unknown.
pub async fn reconcile_provider(
    conn: &mut PgConnection,
    period: Period,
    provider: &HttpProvider,
    report: &mut VerifyReport,
) -> anyhow::Result<()> {
    report
        .checks
        .push(run_check(conn, &LEDGER_PAYOUTS_CHECK, Some(&period.to_string())).await?);
    let comparison = reconcile::reconcile(conn, provider, Scope::Period(period)).await?;
    report.checks.extend(comparison.checks());
    report.ok = report.checks.iter().all(|c| c.ok);
    Ok(())
}
