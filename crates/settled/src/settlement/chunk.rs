//! Paying a chunk in one transaction: the statement that writes the ledger
//! rows and balance credits, the held creators it skips, and the batch
//! handler that runs them.

use settled_engine::ChunkSql;
use settled_engine::{Chunk, ChunkHandler, Handled, HandlerError};
use sqlx::PgConnection;

use super::chunk_period;
use crate::period::Period;

/// What paying a chunk writes, the one home of that rule: one ledger row
/// per creator at the period's fee, recorded with the fence the engine gave
/// the claim (`attempt`), and the same amount credited to the creator's
/// balance. It reads the CTEs `settled` (period, creator, volume, attempt:
/// the items paid) and `run` (id); the last CTE, `effects`, returns one row
/// per credited creator. The engine's one-statement chunk puts it after the
/// claim and the marking (its `settled` is the rows it marked); the
/// several-statement path ([`pay_chunk_sql`]) after a look-up of the items.
/// The ledger's primary key refuses a second payment.
///
/// The balances are credited by an `UPDATE` of those that exist and a plain
/// `INSERT` of the others, not by `INSERT ... ON CONFLICT DO UPDATE`: no
/// speculative insertion and no lock of the conflicting row first, so less
/// WAL per creator (docs/benchmarks.md, "What the chunk statement's parts
/// cost"). Both see the statement's snapshot. A balance created by another
/// transaction meanwhile makes the insert fail on the key, and a balance
/// removed meanwhile makes the update miss it: either way the chunk rolls
/// back (the engine checks one effect per settled item) and is run again.
/// Chunks running at once hold distinct creators (one running run per job,
/// each item claimed once), so the update's row order cannot deadlock them.
pub(crate) const CHUNK_EFFECTS_SQL: &str = "
credited AS (
    INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt)
    SELECT s.period, s.creator, settlement.reward(s.volume, p.fee_bps), r.id, s.attempt
    FROM settled s
    JOIN settlement.settlement_policy p ON p.period = s.period
    CROSS JOIN run r
    ORDER BY s.creator
    RETURNING creator, amount
),
raised AS (
    UPDATE settlement.creator_balance b
    SET balance = b.balance + c.amount, updated_at = now()
    FROM credited c
    WHERE b.creator = c.creator
    RETURNING b.creator
),
opened AS (
    INSERT INTO settlement.creator_balance (creator, balance)
    SELECT c.creator, c.amount FROM credited c
    WHERE c.creator NOT IN (SELECT r.creator FROM raised r)
    ORDER BY c.creator
    RETURNING creator
),
effects AS (SELECT creator FROM raised UNION ALL SELECT creator FROM opened)";

/// The creators of the CTE `picked` with an active hold: not paid now. The
/// engine's one-statement chunk runs it over the rows it claimed; the
/// several-statement path over the chunk's keys (`held_creators`).
pub(crate) const CHUNK_HELD_SQL: &str = "SELECT h.creator AS key FROM settlement.creator_holds h
     WHERE h.released_at IS NULL AND h.creator IN (SELECT creator FROM picked)";

/// [`CHUNK_EFFECTS_SQL`] over a chunk's items looked up by key, for the
/// several-statement path (`handle_chunk`): $1 period, $2 creators, $3
/// run, $4 fences (beside the creators); answers the count of credited
/// creators. The items are looked up first (`OFFSET 0` keeps the planner
/// from folding the look-up into the join, where it would hash the whole
/// period per chunk), then matched with their fences.
pub(crate) fn pay_chunk_sql() -> &'static str {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "WITH settled AS (
                 SELECT v.period, v.creator, v.volume, f.fence AS attempt
                 FROM (SELECT t.period, t.creator, t.volume FROM settlement.token_trade_volume t
                       WHERE t.period = $1 AND t.creator = ANY($2) OFFSET 0) v
                 JOIN unnest($2::text[], $4::integer[]) AS f(creator, fence) ON f.creator = v.creator
             ),
             run AS (SELECT $3::bigint AS id),
             {CHUNK_EFFECTS_SQL}
             SELECT count(*) FROM effects"
        )
    });
    &SQL
}

/// [`CHUNK_HELD_SQL`] over a chunk's keys ($1).
fn held_creators_sql() -> &'static str {
    static SQL: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| format!("WITH picked AS (SELECT unnest($1::text[]) AS creator) {CHUNK_HELD_SQL}"));
    &SQL
}

/// The settlement handler for in-transaction mode. The engine runs each
/// chunk as one statement with `CHUNK_EFFECTS_SQL`; `handle_chunk` does
/// the same in separate statements (for wrappers that add work per item).
#[derive(Debug, Clone, Copy, Default)]
pub struct SettleRewards;

impl ChunkHandler for SettleRewards {
    async fn handle_chunk(&self, tx: &mut PgConnection, chunk: &Chunk) -> Result<Handled, HandlerError> {
        let held = held_creators(&mut *tx, chunk).await?;
        let to_pay = chunk.with_items(chunk.items.iter().filter(|i| !held.contains(&i.key)).cloned().collect());
        if !to_pay.items.is_empty() {
            pay_chunk(tx, chunk_period(chunk)?, &to_pay).await?;
        }
        Ok(Handled { held })
    }

    fn chunk_sql(&self) -> Option<ChunkSql> {
        Some(ChunkSql {
            effects: CHUNK_EFFECTS_SQL.into(),
            held: Some(CHUNK_HELD_SQL.into()),
        })
    }
}

/// The chunk's creators with an active hold: not paid now.
pub(super) async fn held_creators<'e, E: sqlx::PgExecutor<'e>>(
    conn: E,
    chunk: &Chunk,
) -> Result<Vec<String>, HandlerError> {
    Ok(sqlx::query_scalar(held_creators_sql())
        .bind(chunk.keys()) // $1
        .fetch_all(conn)
        .await?)
}

/// Writes the ledger rows and balance credits of a chunk of `period` (its
/// scope); refuses (so the caller rolls back) unless every creator of the
/// chunk was credited exactly once.
pub(super) async fn pay_chunk(tx: &mut PgConnection, period: Period, chunk: &Chunk) -> Result<(), HandlerError> {
    let credited: i64 = sqlx::query_scalar(pay_chunk_sql())
        .bind(period.date()) // $1
        .bind(chunk.keys()) // $2
        .bind(chunk.run_id) // $3
        .bind(chunk.fences()) // $4
        .fetch_one(&mut *tx)
        .await?;
    if credited != chunk.items.len() as i64 {
        return Err(HandlerError::Permanent(format!(
            "credited {credited} balances for {} claimed creators of period {}",
            chunk.items.len(),
            chunk.scope
        )));
    }
    Ok(())
}
