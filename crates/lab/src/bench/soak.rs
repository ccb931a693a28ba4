//! Long-life benchmarks on one database that keeps its history:
//!
//! - the soak (`settled bench --days N`): N consecutive daily periods of
//!   the same creators (so balances are updated every day), each settled by
//!   W `settled bench-worker` processes on the product's path; after each
//!   day, its throughput and claim latency and the tables' sizes, dead
//!   tuples and autovacuum runs; periods older than `--retain-days` are
//!   archived (`settled archive`'s code) so the hot tables stay one window
//!   wide;
//! - the held snapshot (`settled bench --held-xmin`): the same period
//!   settled twice on fresh databases, once with an idle-in-transaction
//!   session holding a REPEATABLE READ snapshot from before the start to
//!   the end (vacuum can then remove nothing the run leaves behind).

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

use super::casedb::{drop_database, prepare_case, CaseDb};
use super::strategy::{go_and_wait, start_child};
use super::{child, CaseSpec, Ctx, Strategy, BENCH_SEED};
use settled::period::Period;
use settled::progress::Progress;

/// The soak's private server's `autovacuum_naptime` (seconds): its days take
/// seconds, so autovacuum must look more often than once a minute to see
/// them as a real day's idle hours would let it.
pub const SOAK_NAPTIME_SECS: u64 = 1;
/// After each day, how long the soak waits for autovacuum to bring every
/// settlement table under its threshold (what the hours until the next
/// 05:00 would do).
pub const SOAK_VACUUM_WAIT: Duration = Duration::from_secs(5);

/// Settlement tables autovacuum still owes a visit (dead tuples above the
/// default threshold, 50 + 20% of live).
const VACUUM_DUE_SQL: &str = "SELECT count(*) FROM pg_stat_user_tables
     WHERE schemaname = 'settlement' AND n_dead_tup > 50 + 0.2 * n_live_tup";

/// One day of the soak.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SoakDay {
    /// 1-based day.
    pub day: u32,
    /// Its period.
    pub period: String,
    /// Seconds from `go` to the last worker's exit.
    pub seconds: f64,
    /// Creators per second.
    pub creators_per_second: f64,
    /// Claim latency percentiles, ms.
    pub claim_p50_ms: f64,
    /// 99th percentile.
    pub claim_p99_ms: f64,
    /// Work table (all its partitions, indexes included), bytes.
    pub work_bytes: i64,
    /// Ledger (all its partitions, indexes included), bytes.
    pub ledger_bytes: i64,
    /// Balances (table and index), bytes.
    pub balance_bytes: i64,
    /// Dead tuples in the work table's partitions.
    pub work_dead: i64,
    /// Dead tuples in the ledger's partitions.
    pub ledger_dead: i64,
    /// Dead tuples in the balances.
    pub balance_dead: i64,
    /// Autovacuum runs on settlement tables during the day.
    pub autovacuums: i64,
    /// Autoanalyze runs on settlement tables during the day.
    pub autoanalyzes: i64,
    /// Periods archived after the day.
    pub archived: usize,
    /// Seconds waited after the day for autovacuum (at most [`SOAK_VACUUM_WAIT`]).
    pub vacuum_wait_seconds: f64,
    /// Settlement tables still over autovacuum's threshold after the wait.
    pub vacuum_due: i64,
    /// Whether `settled verify` held for the day's period.
    pub verified: bool,
}

/// What the soak measured.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SoakReport {
    /// The command that produced it.
    pub command: String,
    /// PostgreSQL's version string.
    pub server_version: String,
    /// Creators per day.
    pub creators: u64,
    /// Worker processes.
    pub workers: u32,
    /// Items per claim.
    pub chunk: u32,
    /// Days kept in the hot tables (0: never archived).
    pub retain_days: u32,
    /// The balances' fillfactor during the soak.
    pub balance_fillfactor: u32,
    /// The days.
    pub days: Vec<SoakDay>,
}

/// Sizes and vacuum counters of the settlement tables: partitions summed
/// into their parent.
#[derive(Debug, Default, sqlx::FromRow)]
struct TableStats {
    work_bytes: i64,
    ledger_bytes: i64,
    balance_bytes: i64,
    work_dead: i64,
    ledger_dead: i64,
    balance_dead: i64,
    autovacuums: i64,
    autoanalyzes: i64,
}

const TABLE_STATS_SQL: &str = "
WITH t AS (
    SELECT CASE WHEN s.relname LIKE 'token_trade_volume%' THEN 'work'
                WHEN s.relname LIKE 'reward_ledger%' THEN 'ledger'
                WHEN s.relname = 'creator_balance' THEN 'balance' END AS kind,
           pg_total_relation_size(s.relid) AS bytes, s.n_dead_tup AS dead,
           s.autovacuum_count AS av, s.autoanalyze_count AS aa
    FROM pg_stat_user_tables s WHERE s.schemaname = 'settlement'
)
SELECT coalesce(sum(bytes) FILTER (WHERE kind = 'work'), 0)::int8 AS work_bytes,
       coalesce(sum(bytes) FILTER (WHERE kind = 'ledger'), 0)::int8 AS ledger_bytes,
       coalesce(sum(bytes) FILTER (WHERE kind = 'balance'), 0)::int8 AS balance_bytes,
       coalesce(sum(dead) FILTER (WHERE kind = 'work'), 0)::int8 AS work_dead,
       coalesce(sum(dead) FILTER (WHERE kind = 'ledger'), 0)::int8 AS ledger_dead,
       coalesce(sum(dead) FILTER (WHERE kind = 'balance'), 0)::int8 AS balance_dead,
       coalesce(sum(av), 0)::int8 AS autovacuums,
       coalesce(sum(aa), 0)::int8 AS autoanalyzes
FROM t";

/// Starts the case's workers and lets them settle: the time from `go` to
/// the last exit, and their reports.
async fn settle_with_children(
    ctx: &Ctx,
    spec: &CaseSpec,
    db: &CaseDb,
) -> anyhow::Result<(Duration, Vec<child::ChildReport>)> {
    let mut children = Vec::new();
    for index in 0..spec.workers {
        children.push(start_child(ctx, spec, db, index).await?);
    }
    go_and_wait(children).await
}

fn percentiles(reports: &[child::ChildReport]) -> anyhow::Result<(f64, f64)> {
    let latency = child::merged_latency(reports)?;
    Ok((
        latency.value_at_quantile(0.5) as f64 / 1e3,
        latency.value_at_quantile(0.99) as f64 / 1e3,
    ))
}

/// The soak: `days` periods of `ctx.opts.creators` creators on one database.
pub(super) async fn soak(ctx: &Ctx, days: u32, retain_days: u32, server_version: String) -> anyhow::Result<SoakReport> {
    let opts = &ctx.opts;
    let workers = opts.workers.first().copied().unwrap_or(4);
    let spec = CaseSpec {
        strategy: Strategy::SkipLockedChunk,
        workers,
        concurrency: 1,
        work_ms: 0,
        creators: opts.creators,
        chunk: opts.chunk,
    };
    let name = format!("settled_soak_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&ctx.admin_url).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    let url = settled_embedded::with_database(&ctx.admin_url, &name);
    let result = async {
        let db = settled::db::Database::open_url(&url, 4, "settled-soak").await?;
        let first = chrono::Utc::now().date_naive() - chrono::Duration::days(i64::from(days) + 1);
        let mut report = SoakReport {
            command: opts.command.clone(),
            server_version,
            creators: opts.creators,
            workers,
            chunk: opts.chunk,
            retain_days,
            balance_fillfactor: 100,
            days: Vec::new(),
        };
        let mut conn = db.pool.acquire().await?;
        if let Some(ff) = opts.balance_fillfactor {
            sqlx::query(&format!("ALTER TABLE settlement.creator_balance SET (fillfactor = {ff})"))
                .execute(&mut *conn)
                .await?;
        }
        report.balance_fillfactor = sqlx::query_scalar(
            "SELECT coalesce((SELECT substring(o from 'fillfactor=([0-9]+)')::int4
                              FROM unnest(reloptions) o WHERE o LIKE 'fillfactor=%'), 100)
             FROM pg_class WHERE oid = 'settlement.creator_balance'::regclass",
        )
        .fetch_one(&mut *conn)
        .await
        .map(|ff: i32| ff as u32)?;
        let mut before: TableStats = sqlx::query_as(TABLE_STATS_SQL).fetch_one(&mut *conn).await?;
        let archive_dir = ctx.scratch.join("soak-archive");
        for day in 1..=days {
            let period = Period::from_date(first + chrono::Duration::days(i64::from(day)));
            settled::seed::seed(&db.pool, period, opts.creators, BENCH_SEED, None, settled::seed::Volumes::Extreme, &Progress::hidden()).await?;
            let run_id = settled::settlement::job()
                .start_or_join(&db.pool, &period.to_string(), None)
                .await?
                .run
                .id;
            let case = CaseDb {
                name: name.clone(),
                url: url.clone(),
                period,
                run_id,
            };
            let (elapsed, reports) = settle_with_children(ctx, &spec, &case).await?;
            let (p50, p99) = percentiles(&reports)?;
            let verified = settled::verify::verify(&mut conn, period).await?.ok;
            let mut archived = 0;
            if retain_days > 0 {
                let before_date = period.date() - chrono::Duration::days(i64::from(retain_days) - 1);
                archived = settled::archive::archive(
                    &db.pool,
                    &settled::archive::ArchiveOptions {
                        before: before_date,
                        dir: archive_dir.clone(),
                        drop_ledger: true,
                        actor: Some("bench soak".to_string()),
                    },
                )
                .await?
                .archived
                .len();
            }
            // The hours until the next day: let autovacuum do what it owes.
            let waited = Instant::now();
            let mut vacuum_due: i64 = 0;
            while waited.elapsed() < SOAK_VACUUM_WAIT {
                tokio::time::sleep(Duration::from_millis(500)).await;
                vacuum_due = sqlx::query_scalar(VACUUM_DUE_SQL).fetch_one(&mut *conn).await?;
                if vacuum_due == 0 {
                    break;
                }
            }
            let vacuum_wait_seconds = waited.elapsed().as_secs_f64();
            let now: TableStats = sqlx::query_as(TABLE_STATS_SQL).fetch_one(&mut *conn).await?;
            let d = SoakDay {
                day,
                period: period.to_string(),
                seconds: elapsed.as_secs_f64(),
                creators_per_second: opts.creators as f64 / elapsed.as_secs_f64(),
                claim_p50_ms: p50,
                claim_p99_ms: p99,
                work_bytes: now.work_bytes,
                ledger_bytes: now.ledger_bytes,
                balance_bytes: now.balance_bytes,
                work_dead: now.work_dead,
                ledger_dead: now.ledger_dead,
                balance_dead: now.balance_dead,
                // Counters of dropped partitions vanish with them: count
                // only what grew.
                autovacuums: (now.autovacuums - before.autovacuums).max(0),
                autoanalyzes: (now.autoanalyzes - before.autoanalyzes).max(0),
                archived,
                vacuum_wait_seconds,
                vacuum_due,
                verified,
            };
            eprintln!(
                "soak: day {day} ({period}): {:.2} s, {:.0} creators/s, claim p99 {:.1} ms, dead work/ledger/balance {}/{}/{}, verify {}",
                d.seconds,
                d.creators_per_second,
                d.claim_p99_ms,
                d.work_dead,
                d.ledger_dead,
                d.balance_dead,
                if verified { "ok" } else { "FAILED" }
            );
            report.days.push(d);
            before = now;
        }
        drop(conn);
        db.close().await?;
        anyhow::Ok(report)
    }
    .await;
    drop_database(ctx, &name).await?;
    result
}

impl SoakReport {
    /// The markdown table, with day 1 against the last day.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Soak: {} creators a day, {} worker processes, chunk {}, balances fillfactor {}, {}\n\n\
             | day | s | creators/s | claim p50 ms | claim p99 ms | work MiB | ledger MiB | balances MiB | dead work | dead ledger | dead balances | autovacuums | vacuum wait s | archived | verify |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
            self.creators,
            self.workers,
            self.chunk,
            self.balance_fillfactor,
            if self.retain_days > 0 {
                format!("periods older than {} days archived", self.retain_days)
            } else {
                "nothing archived".into()
            }
        );
        let mib = |b: i64| b as f64 / (1024.0 * 1024.0);
        for d in &self.days {
            out.push_str(&format!(
                "| {} | {:.2} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} | {:.1} | {} | {} |\n",
                d.day,
                d.seconds,
                d.creators_per_second,
                d.claim_p50_ms,
                d.claim_p99_ms,
                mib(d.work_bytes),
                mib(d.ledger_bytes),
                mib(d.balance_bytes),
                d.work_dead,
                d.ledger_dead,
                d.balance_dead,
                d.autovacuums,
                d.vacuum_wait_seconds,
                d.archived,
                if d.verified { "ok" } else { "FAILED" }
            ));
        }
        if let (Some(first), Some(last)) = (self.days.first(), self.days.last()) {
            out.push_str(&format!(
                "\nLast day against day 1: throughput {:.2}x, claim p99 {:.2}x\n",
                last.creators_per_second / first.creators_per_second,
                last.claim_p99_ms / first.claim_p99_ms.max(0.001)
            ));
        }
        out
    }
}

/// One settle of the held-snapshot pair.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct HeldXminCase {
    /// Whether a snapshot was held through the run.
    pub snapshot_held: bool,
    /// Seconds to settle.
    pub seconds: f64,
    /// Creators per second.
    pub creators_per_second: f64,
    /// Claim latency p50, ms.
    pub claim_p50_ms: f64,
    /// Claim latency p99, ms.
    pub claim_p99_ms: f64,
    /// Dead tuples of the work table at the end.
    pub work_dead: i64,
    /// Seconds the run's own finishing report took (`settled verify`).
    pub verify_seconds: f64,
}

/// The same period settled without, then with, a held snapshot.
pub(super) async fn held_xmin(ctx: &Ctx) -> anyhow::Result<Vec<HeldXminCase>> {
    let opts = &ctx.opts;
    let spec = CaseSpec {
        strategy: Strategy::SkipLockedChunk,
        workers: opts.workers.first().copied().unwrap_or(4),
        concurrency: 1,
        work_ms: 0,
        creators: opts.creators,
        chunk: opts.chunk,
    };
    let mut cases = Vec::new();
    for snapshot_held in [false, true] {
        let db = prepare_case(ctx, opts.creators).await?;
        let measured = async {
            let mut holder = PgConnection::connect(&db.url).await?;
            if snapshot_held {
                // An idle-in-transaction session with a snapshot: the
                // database's xmin horizon stays here until it ends.
                sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    .execute(&mut holder)
                    .await?;
                sqlx::query("SELECT count(*) FROM settled_engine.runs")
                    .execute(&mut holder)
                    .await?;
            }
            let (elapsed, reports) = settle_with_children(ctx, &spec, &db).await?;
            let (p50, p99) = percentiles(&reports)?;
            let mut conn = PgConnection::connect(&db.url).await?;
            let stats: TableStats = sqlx::query_as(TABLE_STATS_SQL).fetch_one(&mut conn).await?;
            let started = Instant::now();
            let report = settled::verify::verify(&mut conn, db.period).await?;
            let verify_seconds = started.elapsed().as_secs_f64();
            anyhow::ensure!(report.ok, "verify failed after the held-snapshot case");
            if snapshot_held {
                sqlx::query("ROLLBACK").execute(&mut holder).await?;
            }
            holder.close().await?;
            conn.close().await?;
            anyhow::Ok(HeldXminCase {
                snapshot_held,
                seconds: elapsed.as_secs_f64(),
                creators_per_second: opts.creators as f64 / elapsed.as_secs_f64(),
                claim_p50_ms: p50,
                claim_p99_ms: p99,
                work_dead: stats.work_dead,
                verify_seconds,
            })
        }
        .await;
        drop_database(ctx, &db.name).await?;
        let case = measured?;
        eprintln!(
            "held-xmin: snapshot held {}: {:.2} s, {:.0} creators/s, claim p99 {:.1} ms",
            case.snapshot_held, case.seconds, case.creators_per_second, case.claim_p99_ms
        );
        cases.push(case);
    }
    Ok(cases)
}

/// The held-snapshot pair as markdown.
pub fn held_xmin_markdown(creators: u64, cases: &[HeldXminCase]) -> String {
    let mut out = format!(
        "Held snapshot: {creators} creators\n\n\
         | snapshot held | s | creators/s | claim p50 ms | claim p99 ms | dead work tuples | verify s |\n|---|---|---|---|---|---|---|\n"
    );
    for c in cases {
        out.push_str(&format!(
            "| {} | {:.2} | {:.0} | {:.1} | {:.1} | {} | {:.2} |\n",
            if c.snapshot_held { "yes" } else { "no" },
            c.seconds,
            c.creators_per_second,
            c.claim_p50_ms,
            c.claim_p99_ms,
            c.work_dead,
            c.verify_seconds
        ));
    }
    if let [without, with] = cases {
        out.push_str(&format!(
            "\nWith the snapshot held: {:.2}x the throughput without\n",
            with.creators_per_second / without.creators_per_second
        ));
    }
    out
}
