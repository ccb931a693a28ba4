//! Deterministic synthetic input: `n` creators with valid EVM addresses and
//! a skewed volume distribution, generated inside PostgreSQL (fast, and the
//! same seed always gives the same rows).

use anyhow::Context;
use sqlx::PgPool;

use crate::money::FeeBps;
use crate::period::Period;
use crate::progress::Progress;
use crate::settlement::DEFAULT_FEE_BPS;

/// Largest number of creators one seed call may create.
pub const MAX_SEED_CREATORS: u64 = 100_000_000;
/// Rows generated per statement (progress is reported between statements).
pub(crate) const SEED_BATCH_ROWS: u64 = 20_000;

/// The rows a seed generates, kept until they are written in key order.
const SEED_STAGING_SQL: &str = "CREATE TEMPORARY TABLE seed_rows
    (creator text NOT NULL, volume numeric(78,0) NOT NULL) ON COMMIT DROP";

/// Creator `i`'s address depends on (seed, i) only, so creators recur across
/// periods; its volume depends on (seed, period, i). Volumes (token base
/// units, 18 decimals): 5% zero; by default the rest log-uniform from 0.001
/// to about 1,000,000 tokens (four significant digits times 10^(12..20)),
/// with one creator in 997 a whale of 1 million to 1 billion tokens. With
/// `$5` (`--extreme-volumes`) the whales are near 2^256 instead, to
/// exercise the whole range, and the rest are mantissa(1..999999) *
/// 10^(12 + floor(9 r^3)).
const SEED_BATCH_SQL: &str = "
INSERT INTO seed_rows (creator, volume)
SELECT '0x' || substr(encode(sha256(convert_to('settled-creator:' || $2 || ':' || i, 'UTF8')), 'hex'), 1, 40),
       CASE
           WHEN hv.h % 20 = 0 THEN 0
           WHEN $5 AND hv.h % 997 = 1 THEN (2::numeric ^ 256) - 1 - (hv.h % 1000000)
           WHEN $5 THEN (1 + hv.h % 999999)::numeric
                * (10::numeric ^ (12 + floor(9 * power(((hv.h / 20) % 1000000)::numeric / 1000000, 3))::int))
           WHEN hv.h % 997 = 1 THEN (1000 + hv.h % 9000)::numeric * (10::numeric ^ (21 + (hv.h / 9000) % 3))
           ELSE (1000 + hv.h % 9000)::numeric * (10::numeric ^ (12 + (hv.h / 9000) % 9))
       END
FROM generate_series($3::bigint, $4::bigint) AS i,
LATERAL (SELECT ('x' || substr(encode(sha256(convert_to(
             'settled-volume:' || $2 || ':' || $1 || ':' || i, 'UTF8')), 'hex'), 1, 15))::bit(60)::bigint AS h) AS hv";

/// The generated rows into the period, in key order, as `settled import`
/// writes them: a hash-named creator's rows would otherwise lie in the
/// table in random key order, and claim loops, which take keys in order,
/// would then visit a different page for nearly every row
/// (docs/benchmarks.md, "The creator check, and seeded rows in key order").
const SEED_WRITE_SQL: &str = "
INSERT INTO settlement.token_trade_volume (period, creator, volume)
SELECT $1::date, creator, volume FROM seed_rows ORDER BY creator
ON CONFLICT (period, creator) DO NOTHING";

/// Which volumes a seed generates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Volumes {
    /// Trade volumes like real ones: 0.001 to 1,000,000 tokens, a few whales.
    #[default]
    Realistic,
    /// Whales near 2^256, the largest amount there is (for tests of range).
    Extreme,
}

/// What a seed call did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SeedOutcome {
    /// Rows inserted now.
    pub inserted: u64,
    /// Rows that already existed (same seed seeded before).
    pub already_present: u64,
    /// The fee in force for the period.
    pub fee_bps: u16,
}

/// Seeds `creators` items for `period` in one transaction. Sets the fee when
/// given, or the default when the period has none. Refused once the period
/// has a run; holds its input open meanwhile
/// (`crate::settlement::hold_input_open`).
pub async fn seed(
    pool: &PgPool,
    period: Period,
    creators: u64,
    seed: u64,
    fee: Option<FeeBps>,
    volumes: Volumes,
    progress: &Progress,
) -> anyhow::Result<SeedOutcome> {
    anyhow::ensure!(
        (1..=MAX_SEED_CREATORS).contains(&creators),
        "--creators must be 1..={MAX_SEED_CREATORS}, got {creators}"
    );
    let mut tx = pool.begin().await?;
    crate::settlement::hold_input_open(&mut tx, period).await?;
    let default_fee = FeeBps::new(DEFAULT_FEE_BPS).map_err(anyhow::Error::msg)?;
    sqlx::query(
        "INSERT INTO settlement.settlement_policy (period, fee_bps) VALUES ($1, $2)
         ON CONFLICT (period) DO UPDATE SET fee_bps = EXCLUDED.fee_bps, updated_at = now()
         WHERE $3",
    )
    .bind(period.date())
    .bind(i32::from(fee.unwrap_or(default_fee).get()))
    .bind(fee.is_some())
    .execute(&mut *tx)
    .await
    .context("setting the period's policy")?;
    let fee_bps: i32 = sqlx::query_scalar("SELECT fee_bps FROM settlement.settlement_policy WHERE period = $1")
        .bind(period.date())
        .fetch_one(&mut *tx)
        .await?;
    crate::partitions::ensure(&mut tx, period).await?;
    sqlx::query(SEED_STAGING_SQL).execute(&mut *tx).await?;
    let mut from = 1u64;
    while from <= creators {
        let to = (from + SEED_BATCH_ROWS - 1).min(creators);
        sqlx::query(SEED_BATCH_SQL)
            .bind(period.to_string())
            .bind(seed.to_string())
            .bind(from as i64)
            .bind(to as i64)
            .bind(volumes == Volumes::Extreme)
            .execute(&mut *tx)
            .await
            .with_context(|| format!("generating creators {from}..={to}"))?;
        progress.set(to);
        from = to + 1;
    }
    progress.note(&format!("seed: writing {creators} generated creators in key order"));
    let inserted = sqlx::query(SEED_WRITE_SQL)
        .bind(period.date())
        .execute(&mut *tx)
        .await
        .context("writing the generated creators in key order")?
        .rows_affected();
    tx.commit()
        .await
        .context("committing the seed; its outcome is unknown if the connection was lost: the same seed again is safe (rows already there are not added twice)")?;
    // Fresh rows: give the planner their statistics before any worker plans a claim.
    let mut conn = pool.acquire().await?;
    crate::settlement::queue()
        .refresh_statistics(&mut conn, &period.to_string())
        .await?;
    progress.finish();
    Ok(SeedOutcome {
        inserted,
        already_present: creators - inserted,
        fee_bps: fee_bps as u16,
    })
}
