//! `settled status`: exact counts by status and amounts for a period, read
//! from committed state (never SKIP LOCKED, which would hide claimed rows).

use settled_engine::Run;
use settled_engine::StatusCounts;
use sqlx::PgConnection;

use crate::period::Period;
use crate::settlement::queue;

/// A period's progress.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct PeriodStatus {
    /// The period.
    pub period: String,
    /// Its run, if one exists.
    pub run: Option<Run>,
    /// Items by status (every status, zero included), counted by the engine.
    pub counts: StatusCounts,
    /// All items of the period.
    pub total: i64,
    /// Items in a final status (settled, failed or held).
    pub done: i64,
    /// Paid so far: the period's ledger total, in base units.
    pub settled_amount: String,
    /// What the whole period pays at its policy (all items), in base units.
    pub expected_amount: String,
}

/// Reads a period's status in one snapshot.
pub(crate) async fn period_status(conn: &mut PgConnection, period: Period) -> anyhow::Result<PeriodStatus> {
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *conn)
        .await?;
    let result = read(conn, period).await;
    sqlx::query("ROLLBACK").execute(&mut *conn).await?;
    result
}

/// Reads a period's status inside the caller's transaction (which should be
/// REPEATABLE READ for one snapshot).
pub(crate) async fn period_status_in_tx(conn: &mut PgConnection, period: Period) -> anyhow::Result<PeriodStatus> {
    read(conn, period).await
}

async fn read(conn: &mut PgConnection, period: Period) -> anyhow::Result<PeriodStatus> {
    let p = period.to_string();
    let counts = queue().count_by_status(conn, &p).await?;
    let total = counts.total();
    let done = counts.counts.iter().filter(|(s, _)| s.is_final()).map(|(_, n)| n).sum();
    let run = crate::settlement::job().find_run(&mut *conn, &p).await?;
    let (settled_amount, expected_amount): (String, String) = sqlx::query_as(
        "SELECT coalesce((SELECT sum(amount) FROM settlement.reward_ledger WHERE period = $1::date), 0)::text,
                coalesce((SELECT sum(settlement.reward(v.volume, p.fee_bps))
                          FROM settlement.token_trade_volume v JOIN settlement.settlement_policy p USING (period)
                          WHERE v.period = $1::date), 0)::text",
    )
    .bind(&p) // $1
    .fetch_one(&mut *conn)
    .await?;
    Ok(PeriodStatus {
        period: p,
        run,
        counts,
        total,
        done,
        settled_amount,
        expected_amount,
    })
}

impl PeriodStatus {
    /// The human rendering, amounts in tokens of `decimals` decimals
    /// (grouped, cut to a few decimals) and exactly in base units.
    pub(crate) fn render(&self, decimals: u32) -> String {
        let run = match &self.run {
            Some(r) => format!("run {} {}", r.id, r.state.as_str()),
            None => "no run yet".to_string(),
        };
        let percent = if self.total == 0 {
            100
        } else {
            self.done * 100 / self.total
        };
        let mut out = format!(
            "period {}: {run}, {} of {} items done ({percent}%)\n",
            self.period, self.done, self.total
        );
        for (status, n) in &self.counts.counts {
            out.push_str(&format!("  {:<10} {n}\n", status.as_str()));
        }
        out.push_str(&format!(
            "  paid {} of {} tokens ({decimals} decimals)\n",
            crate::money::tokens(&self.settled_amount, decimals),
            crate::money::tokens(&self.expected_amount, decimals)
        ));
        out.push_str(&format!(
            "  paid {} of {} (base units)\n",
            self.settled_amount, self.expected_amount
        ));
        out
    }
}
