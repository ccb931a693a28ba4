//! What the dashboard reads: exact queries on committed state, as rows
//! with names. No HTML here.

use settled_engine::StatusCounts;
use settled_engine::{ItemStatus, Run, RunState};
use sqlx::PgPool;

/// Runs listed on the front page.
pub(crate) const RUNS_SHOWN: i64 = 20;
/// Items listed on the items page.
pub(crate) const ITEMS_SHOWN: i64 = 200;

/// A run with its period's exact progress.
pub(crate) struct RunProgress {
    /// The run.
    pub run: Run,
    /// All items of its period.
    pub total: i64,
    /// Items in a final status.
    pub done: i64,
    /// Settled items.
    pub settled: i64,
    /// Failed items.
    pub failed: i64,
    /// Held items.
    pub held: i64,
    /// Paid so far (base units).
    pub paid: String,
}

/// The newest runs with their progress: the engine's exact counts and the
/// ledger total of each run's period (not the full status read, whose
/// expected total sums the whole period at every refresh).
pub(crate) async fn runs_with_progress(pool: &PgPool) -> anyhow::Result<Vec<RunProgress>> {
    let job = crate::settlement::job();
    let runs = job.list_runs(pool, RUNS_SHOWN).await?;
    let mut conn = pool.acquire().await?;
    let mut out = Vec::with_capacity(runs.len());
    for run in runs {
        // A run whose scope is not a period (written by hand, or by another
        // job's mistake) is listed without counts instead of failing the page.
        if crate::period::Period::parse(&run.scope).is_err() {
            out.push(RunProgress {
                total: 0,
                done: 0,
                settled: 0,
                failed: 0,
                held: 0,
                paid: "-".to_string(),
                run,
            });
            continue;
        }
        // A finished run's counts and total are its stored report (exact,
        // computed once by its finisher): the page reads no finished period
        // again, so it costs the same at 10 million items as at 100.
        let (counts, paid) = match StoredReport::of(&run) {
            Some(stored) => (stored.counts, stored.paid),
            None => {
                let counts = job.queue().count_by_status(&mut conn, &run.scope).await?;
                let paid: String = sqlx::query_scalar(
                    "SELECT coalesce(sum(amount), 0)::text FROM settlement.reward_ledger WHERE period = $1::date",
                )
                .bind(&run.scope) // $1
                .fetch_one(&mut *conn)
                .await?;
                (counts, paid)
            }
        };
        out.push(RunProgress {
            total: counts.total(),
            done: counts.counts.iter().filter(|(s, _)| s.is_final()).map(|(_, n)| n).sum(),
            settled: counts.get(ItemStatus::Settled),
            failed: counts.get(ItemStatus::Failed),
            held: counts.get(ItemStatus::Held),
            paid,
            run,
        });
    }
    Ok(out)
}

/// What a finished run's stored report says (see `Settlement::report`):
/// its period's exact counts and the total paid.
pub(crate) struct StoredReport {
    /// Items by status.
    pub counts: StatusCounts,
    /// Paid (base units).
    pub paid: String,
}

impl StoredReport {
    /// The stored report of a run that is not running (a reopened run keeps
    /// its last report until it finishes again, so a running one is counted
    /// live); None as well if the report lacks a field.
    pub(crate) fn of(run: &Run) -> Option<StoredReport> {
        if run.state == RunState::Running {
            return None;
        }
        let report = run.report.as_ref()?;
        let counts = ItemStatus::ALL
            .iter()
            .map(|s| Some((*s, report["counts"][s.as_str()].as_i64()?)))
            .collect::<Option<Vec<_>>>()?;
        Some(StoredReport {
            counts: StatusCounts { counts },
            paid: report["paid"].as_str()?.to_string(),
        })
    }
}

/// Periods with more items than this get a sampled throughput chart.
pub(crate) const CHART_EXACT_MAX_ITEMS: i64 = 500_000;

/// Items settled in one second.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub(crate) struct Second {
    /// The second, as a Unix time.
    pub at: f64,
    /// Items paid in it.
    pub settled: i64,
}

/// Settled items per second of a period, oldest first (from ledger times).
/// A period of `items` above [`CHART_EXACT_MAX_ITEMS`] is read through a
/// block sample of about that many rows (`TABLESAMPLE SYSTEM`), its counts
/// scaled back up: a chart's shape, read in bounded time (exact counts are
/// on the page and in `settled status`).
pub(crate) async fn throughput(pool: &PgPool, period: &str, items: i64) -> Result<Vec<Second>, sqlx::Error> {
    if items <= CHART_EXACT_MAX_ITEMS {
        return sqlx::query_as(
            "SELECT extract(epoch FROM date_trunc('second', created_at))::float8 AS at, count(*) AS settled
             FROM settlement.reward_ledger WHERE period = $1::date GROUP BY 1 ORDER BY 1",
        )
        .bind(period) // $1
        .fetch_all(pool)
        .await;
    }
    let percent = 100.0 * CHART_EXACT_MAX_ITEMS as f64 / items as f64;
    sqlx::query_as(
        "SELECT extract(epoch FROM date_trunc('second', created_at))::float8 AS at,
                round(count(*) * 100.0 / $2)::int8 AS settled
         FROM settlement.reward_ledger TABLESAMPLE SYSTEM ($2) WHERE period = $1::date GROUP BY 1 ORDER BY 1",
    )
    .bind(period) // $1
    .bind(percent) // $2
    .fetch_all(pool)
    .await
}

/// A failed or held item.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ItemRow {
    /// Its period.
    pub period: chrono::NaiveDate,
    /// The creator.
    pub creator: String,
    /// Its attempt (fence).
    pub attempt: i32,
    /// Why its last attempt failed.
    pub last_error: Option<String>,
}

/// The newest items with `status`.
pub(crate) async fn items(pool: &PgPool, status: ItemStatus) -> Result<Vec<ItemRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT period, creator, attempt, last_error FROM settlement.token_trade_volume
         WHERE status = $1 ORDER BY period DESC, creator LIMIT $2",
    )
    .bind(status.as_str()) // $1
    .bind(ITEMS_SHOWN) // $2
    .fetch_all(pool)
    .await
}

/// One lock, with who holds or waits for it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct LockRow {
    /// The backend.
    pub pid: i32,
    /// Its application name.
    pub application: Option<String>,
    /// `relation`, `tuple`, `transactionid`...
    pub locktype: String,
    /// The lock mode.
    pub mode: String,
    /// False while it waits.
    pub granted: bool,
    /// The table or transaction it is on.
    pub target: Option<String>,
    /// The backends it waits for.
    pub blocked_by: Vec<i32>,
    /// Age of its transaction, in seconds.
    pub xact_age_secs: Option<f64>,
    /// Its state (`active`, `idle in transaction`...).
    pub state: Option<String>,
    /// Its query (as much as `track_activity_query_size` keeps).
    pub query: Option<String>,
}

/// Who holds which lock on the settlement and engine tables, and who waits
/// for whom (`pg_locks` joined with `pg_stat_activity`).
pub(crate) async fn locks(pool: &PgPool) -> Result<Vec<LockRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT l.pid, a.application_name AS application, l.locktype, l.mode, l.granted,
                coalesce(c.relname, CASE WHEN l.locktype = 'transactionid' THEN 'xid ' || l.transactionid::text END)
                    AS target,
                pg_blocking_pids(l.pid) AS blocked_by,
                extract(epoch FROM now() - a.xact_start)::float8 AS xact_age_secs,
                a.state, a.query
         FROM pg_locks l
         JOIN pg_stat_activity a ON a.pid = l.pid
         LEFT JOIN pg_class c ON c.oid = l.relation
         LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE a.datname = current_database() AND l.pid <> pg_backend_pid()
           AND (n.nspname IN ('settlement', 'settled_engine') OR NOT l.granted OR l.locktype IN ('tuple', 'transactionid'))
           AND (c.relkind IS NULL OR c.relkind = 'r')
         ORDER BY l.granted, l.pid, l.locktype",
    )
    .fetch_all(pool)
    .await
}

/// For each of `workers` (in order): None for a live or stopped one (its
/// counters are current or final); for a dead one, the ledger rows of the
/// runs it lived through (among the newest [`RUNS_SHOWN`]): its counters
/// stop at its last heartbeat, the ledger does not. One count per period.
pub(crate) async fn committed_by_dead_workers(
    pool: &PgPool,
    workers: &[settled_engine::raw::workers::WorkerRow],
) -> anyhow::Result<Vec<Option<Committed>>> {
    use settled_engine::raw::workers::WORKER_DEAD_AFTER_SECS;
    if !workers.iter().any(|w| w.state == "dead") {
        return Ok(workers.iter().map(|_| None).collect());
    }
    let runs = crate::settlement::job().list_runs(pool, RUNS_SHOWN).await?;
    let mut ledger_rows: std::collections::HashMap<String, i64> = std::collections::HashMap::new();
    let mut out = Vec::with_capacity(workers.len());
    for w in workers {
        if w.state != "dead" {
            out.push(None);
            continue;
        }
        let died = w.heartbeat_at + chrono::Duration::seconds(WORKER_DEAD_AFTER_SECS);
        let lived: Vec<&Run> = runs
            .iter()
            .filter(|r| r.started_at <= died && r.finished_at.is_none_or(|f| f >= w.started_at))
            .filter(|r| crate::period::Period::parse(&r.scope).is_ok())
            .collect();
        let mut items = 0;
        for run in &lived {
            if !ledger_rows.contains_key(&run.scope) {
                let n: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM settlement.reward_ledger WHERE period = $1::date")
                        .bind(&run.scope) // $1
                        .fetch_one(pool)
                        .await?;
                ledger_rows.insert(run.scope.clone(), n);
            }
            items += ledger_rows[&run.scope];
        }
        out.push(Some(Committed {
            items,
            runs: lived.iter().map(|r| (r.id, r.scope.clone())).collect(),
        }));
    }
    Ok(out)
}

/// What the ledger committed for the runs a dead worker lived through.
pub(crate) struct Committed {
    /// Ledger rows of those runs' periods.
    pub items: i64,
    /// The runs (id, period).
    pub runs: Vec<(i64, String)>,
}
