//! What the payout benches (`--payouts` and `--payouts --chain`) share:
//! settled balances to pay from, and waiting for `settled` processes to
//! be ready.

use std::path::Path;
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};

use settled::period::Period;
use settled::progress::Progress;

/// Seeds `n` creators for yesterday's period and settles it (`settled
/// worker`); the creators whose balance is at least `min_balance`.
pub(in crate::bench) async fn settled_balances(
    pool: &PgPool,
    exe: &Path,
    url: &str,
    n: u64,
    min_balance: i64,
) -> anyhow::Result<Vec<String>> {
    let period = Period::from_date(chrono::Utc::now().date_naive() - chrono::Duration::days(1));
    settled::seed::seed(
        pool,
        period,
        n,
        crate::bench::BENCH_SEED,
        None,
        settled::seed::Volumes::Realistic,
        &Progress::hidden(),
    )
    .await?;
    crate::settle_in_a_worker(exe, url, &period.to_string()).await?;
    let creators: Vec<String> =
        sqlx::query_scalar("SELECT creator FROM settlement.creator_balance WHERE balance >= $1 ORDER BY creator")
            .bind(min_balance) // $1
            .fetch_all(pool)
            .await?;
    anyhow::ensure!(
        creators.len() >= 10,
        "too few creators with a balance: {}",
        creators.len()
    );
    Ok(creators)
}

/// Waits until `settled serve` at `base` answers `/readyz`, at most a minute.
pub(in crate::bench) async fn wait_ready(base: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reqwest::get(format!("{base}/readyz"))
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        anyhow::ensure!(Instant::now() < deadline, "settled serve did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Waits until `n` deliverers are asleep on LISTEN (their connections
/// open), at most a minute.
pub(in crate::bench) async fn wait_listening(pool: &PgPool, n: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listening: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'settled-deliver' AND query ILIKE 'LISTEN%'",
        )
        .fetch_one(pool)
        .await?;
        if listening >= i64::from(n) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the deliverers did not start listening");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The id the next payout made on `tx` gets: a backlog's first.
pub(in crate::bench) async fn next_payout_id(tx: &mut PgConnection) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT coalesce(max(id), 0) + 1 FROM settlement.payouts")
            .fetch_one(tx)
            .await?,
    )
}

/// A target's word in the reports: met or missed.
pub(in crate::bench) fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "missed"
    }
}
