//! The floors: the product's own claim-and-settle SQL driven by pgbench at
//! the same concurrency (the floor of this approach), and one set-based
//! transaction that settles the whole period (the floor of any approach).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use sqlx::{Connection, PgConnection};

use super::casedb::{measure_case, CaseDb};
use super::{scratch_file, transactions, wait_disconnected, CaseResult, Ctx};

/// The pgbench script, built from the product's own statement (the
/// engine's one-statement chunk with settlement's effects and holds), so it
/// is one chunk of `settled worker`, claimed from the start of the index,
/// and cannot drift from it. This is the form on the partitioned work table
/// (what the engine sends when a period's partition is not known), which
/// names no period and so serves `bench/pgbench/compare.sh` on any period
/// (`settled lab pgbench-script` prints it); the bench's own cases send the
/// form a worker sends on the case's partition ([`case_statements`]).
/// Variables: :period, :run, :chunk.
pub(crate) fn settle_chunk_script() -> String {
    chunk_script(&settled::settlement::queue().chunk_statements(&settlement_chunk_sql()))
}

/// The product's claim inside a key range on `period`'s partition of the
/// database at `url`, as a pgbench script ([`range_script`]): what
/// `bench/pgbench/statement-cost.sh` measures (`settled lab pgbench-script
/// --range --period`). Variables: :period, :run, :chunk, :lo, :hi.
pub(crate) async fn settle_range_script(url: &str, period: settled::period::Period) -> anyhow::Result<String> {
    let mut conn = PgConnection::connect(url).await?;
    let statements = partition_statements(&mut conn, period).await?;
    conn.close().await?;
    Ok(range_script(&statements))
}

fn settlement_chunk_sql() -> settled_engine::ChunkSql {
    use settled_engine::ChunkHandler;
    settled::settlement::SettleRewards
        .chunk_sql()
        .expect("settlement's handler has a chunk statement")
}

/// The chunk statements a worker's drain of the case's period sends (on
/// the period's partition).
async fn case_statements(db: &super::CaseDb) -> anyhow::Result<settled_engine::ChunkStatements> {
    let mut conn = PgConnection::connect(&db.url).await?;
    let statements = partition_statements(&mut conn, db.period).await?;
    conn.close().await?;
    Ok(statements)
}

/// The chunk statements a worker's drain of `period` sends, on the
/// period's partition (an error when it has none).
async fn partition_statements(
    conn: &mut PgConnection,
    period: settled::period::Period,
) -> anyhow::Result<settled_engine::ChunkStatements> {
    let statements = settled::settlement::queue()
        .chunk_statements_for(conn, &period.to_string(), &settlement_chunk_sql())
        .await?;
    anyhow::ensure!(
        statements.on_scope_relation(),
        "period {period} has no partition of its own"
    );
    Ok(statements)
}

/// `sql` with pgbench variables for its parameters, `names` in order from $1.
fn with_variables(sql: &str, names: &[&str]) -> String {
    let mut sql = sql.trim().to_string();
    for (i, name) in names.iter().enumerate().rev() {
        sql = sql.replace(&format!("${}", i + 1), &format!(":{name}"));
    }
    sql
}

fn chunk_script(statements: &settled_engine::ChunkStatements) -> String {
    let chunk = with_variables(statements.from_start_sql(), &["period", "chunk", "run"]);
    format!(
        "-- One chunk of the in-transaction settlement, generated from the product's own\n\
         -- statement (settled-engine's one-statement chunk with settled's effects and holds):\n\
         -- claim with SKIP LOCKED, mark settled, pay, credit, in one statement; commit.\n\
         -- Variables: :period (date), :run (run id), :chunk. Do not edit: a test compares it.\n\
         BEGIN;\n{chunk};\nCOMMIT;\n"
    )
}

/// The product's claim inside a key range (keys after :lo, up to :hi, in
/// key order) on the case's partition, as a pgbench script. Variables:
/// :period, :run, :chunk, :lo, :hi.
fn range_script(statements: &settled_engine::ChunkStatements) -> String {
    let chunk = with_variables(statements.range_sql(), &["period", "chunk", "run", "lo", "hi"]);
    format!("BEGIN;\n{chunk};\nCOMMIT;\n")
}

/// pgbench next to the server binaries, else on PATH.
pub(super) fn pgbench_program() -> Option<PathBuf> {
    if let Ok(bin) = settled_embedded::find_binaries() {
        let p = bin.program("pgbench");
        if p.is_file() {
            return Some(p);
        }
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("pgbench"))
            .find(|p| p.is_file())
    })
}

/// Which pgbench floor: every client on the whole period, or each alone
/// on its own key range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PgbenchFloor {
    /// The chunk from the start of the index (what a claim loop sends),
    /// `workers` clients on the whole period, until it is settled.
    Shared,
    /// The product's own chunk statement, `workers` clients, each alone on
    /// its own key range of the period (cut at the period's key
    /// quantiles): no client code, no claim that meets another's rows. The
    /// ceiling of splitting the work with SKIP LOCKED on this server.
    Ranges,
}

/// One pgbench floor's case, on the case's partition.
pub(super) async fn pgbench_case(
    ctx: &Ctx,
    pgbench: &Path,
    floor: PgbenchFloor,
    workers: u32,
    creators: u64,
    chunk: u32,
) -> CaseResult {
    let name = match floor {
        PgbenchFloor::Shared => "pgbench",
        PgbenchFloor::Ranges => "pgbench-ranges",
    };
    let mut case = CaseResult::new("pgbench", name, workers, 0, creators);
    case.chunk = Some(chunk);
    measure_case(ctx, case, async |db, case| {
        let statements = case_statements(db).await?;
        let (file, script) = match floor {
            PgbenchFloor::Shared => ("settle_chunk.sql", chunk_script(&statements)),
            PgbenchFloor::Ranges => ("settle_range.sql", range_script(&statements)),
        };
        let run = PgbenchRun {
            ctx,
            program: pgbench,
            script: scratch_file(&ctx.scratch, file, &script)?,
            chunk,
            db,
        };
        match floor {
            PgbenchFloor::Shared => measure_pgbench(&run, case).await,
            PgbenchFloor::Ranges => measure_pgbench_ranges(&run, case).await,
        }
    })
    .await
}

/// A pgbench floor's script on its case's database.
struct PgbenchRun<'a> {
    ctx: &'a Ctx,
    program: &'a Path,
    script: PathBuf,
    chunk: u32,
    db: &'a CaseDb,
}

impl PgbenchRun<'_> {
    /// pgbench running the script with its variables on the case's
    /// database; `args` (clients, transactions, more variables) before them.
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(self.program);
        command
            .args(["-n", "-M", "prepared"])
            .args(args)
            .arg("-f")
            .arg(&self.script)
            .args(["-D", &format!("period={}", self.db.period)])
            .args(["-D", &format!("run={}", self.db.run_id)])
            .args(["-D", &format!("chunk={}", self.chunk)])
            .arg(&self.db.url);
        command
    }
}

async fn measure_pgbench(run: &PgbenchRun<'_>, case: &mut CaseResult) -> anyhow::Result<()> {
    let (ctx, db) = (run.ctx, run.db);
    let (workers, creators) = (case.workers, case.creators);
    // Enough transactions for every item, plus slack for the empty claims
    // at the end (as bench/pgbench/compare.sh).
    let per_client = (creators / u64::from(run.chunk) + u64::from(workers)) / u64::from(workers) + 2;
    let mut admin = PgConnection::connect(&ctx.admin_url).await?;
    let before = transactions(&mut admin, &db.name).await?;
    let cpu_before = super::client_cpu();
    let started = Instant::now();
    let out = run
        .command(&[
            "-c",
            &workers.to_string(),
            "-j",
            &workers.min(2).to_string(),
            "-t",
            &per_client.to_string(),
        ])
        .output()
        .await
        .context("running pgbench")?;
    let elapsed = started.elapsed();
    case.client_cpu_seconds = Some(super::client_cpu() - cpu_before);
    pgbench_succeeded(&out)?;
    wait_disconnected(&mut admin, &db.name).await?;
    let after = transactions(&mut admin, &db.name).await?;
    admin.close().await?;
    all_settled(db).await?;
    // The strategies' clocks stop when their workers exit, after the
    // last one finished the run (its report counts and sums the
    // period); the floor's clock includes the same finish.
    let finished = finish_run(db).await?;
    case.record_time(elapsed + finished);
    case.transactions_per_item = Some((after - before) as f64 / creators as f64);
    Ok(())
}

async fn measure_pgbench_ranges(run: &PgbenchRun<'_>, case: &mut CaseResult) -> anyhow::Result<()> {
    let db = run.db;
    let (workers, creators) = (case.workers, case.creators);
    let mut conn = PgConnection::connect(&db.url).await?;
    // Each range's upper key (the last one is the period's largest).
    let uppers: Vec<String> = sqlx::query_scalar(
        "SELECT max(creator) FROM (SELECT creator, ntile($2) OVER (ORDER BY creator) AS n
                                   FROM settlement.token_trade_volume WHERE period = $1) r
         GROUP BY n ORDER BY n",
    )
    .bind(db.period.date())
    .bind(i32::try_from(workers)?)
    .fetch_all(&mut conn)
    .await?;
    conn.close().await?;
    let per_range = creators.div_ceil(u64::from(workers));
    let transactions = (per_range / u64::from(run.chunk) + 2).to_string();
    let started = Instant::now();
    let mut clients = Vec::new();
    // Below every creator ("0x" and 40 hex digits); pgbench takes no
    // empty variable.
    let mut lower = "0x".to_string();
    for upper in &uppers {
        let (lo, hi) = (format!("lo={lower}"), format!("hi={upper}"));
        clients.push(
            run.command(&["-c", "1", "-t", &transactions, "-D", &lo, "-D", &hi])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .context("starting pgbench")?,
        );
        lower.clone_from(upper);
    }
    for client in clients {
        let out = client.wait_with_output().await.context("running pgbench")?;
        pgbench_succeeded(&out)?;
    }
    let elapsed = started.elapsed();
    all_settled(db).await?;
    let finished = finish_run(db).await?;
    case.record_time(elapsed + finished);
    Ok(())
}

/// An error with pgbench's last line of stderr when it did not succeed.
fn pgbench_succeeded(out: &std::process::Output) -> anyhow::Result<()> {
    anyhow::ensure!(
        out.status.success(),
        "pgbench failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default()
    );
    Ok(())
}

/// An error when pgbench left an item of the case's period unsettled.
async fn all_settled(db: &super::CaseDb) -> anyhow::Result<()> {
    let mut conn = PgConnection::connect(&db.url).await?;
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM settlement.token_trade_volume WHERE period = $1 AND status <> 'settled'",
    )
    .bind(db.period.date())
    .fetch_one(&mut conn)
    .await?;
    anyhow::ensure!(left == 0, "pgbench left {left} items unsettled");
    conn.close().await?;
    Ok(())
}

/// The set-based floor: the fastest plain transaction found that keeps
/// every guarantee of the product's chunks (docs/benchmarks.md, "The
/// set-based floor"): each held creator marked held and not paid, a ledger
/// row per other eligible item with its fence (the item's attempt after
/// the update), written through the ledger's key and its statement check,
/// each balance credited through its key and checks, each item marked
/// settled. The period's partitions are named directly, as the workers'
/// statements name theirs. $1 period, $2 run; `{work}` and `{ledger}` the
/// period's partitions. Every statement but the first reads only items
/// still eligible and due, as a claim does.
const SET_BASED_SQL: [&str; 4] = [
    // Held creators: few rows, found through the key.
    "UPDATE settlement.{work} t
     SET status = 'held', attempt = t.attempt + 1, lease_owner = NULL, lease_until = NULL, updated_at = now()
     WHERE t.period = $1 AND t.status = 'eligible' AND (t.not_before IS NULL OR t.not_before <= now())
       AND t.creator IN (SELECT h.creator FROM settlement.creator_holds h WHERE h.released_at IS NULL)",
    "INSERT INTO settlement.{ledger} (period, creator, amount, run_id, attempt)
     SELECT v.period, v.creator, settlement.reward(v.volume, p.fee_bps), $2, v.attempt + 1
     FROM settlement.{work} v
     JOIN settlement.settlement_policy p ON p.period = v.period
     WHERE v.period = $1 AND v.status = 'eligible' AND (v.not_before IS NULL OR v.not_before <= now())",
    // MERGE, not INSERT ... ON CONFLICT: no speculative insertion per new
    // balance. A concurrent insert of the same creator makes it fail (the
    // key holds either way); nothing else credits balances meanwhile.
    "MERGE INTO settlement.creator_balance b
     USING (SELECT l.creator, l.amount FROM settlement.{ledger} l WHERE l.period = $1 AND l.run_id = $2) c
     ON b.creator = c.creator
     WHEN MATCHED THEN UPDATE SET balance = b.balance + c.amount, updated_at = now()
     WHEN NOT MATCHED THEN INSERT (creator, balance) VALUES (c.creator, c.amount)",
    "UPDATE settlement.{work} t
     SET status = 'settled', attempt = t.attempt + 1, lease_owner = NULL, lease_until = NULL,
         last_error = NULL, not_before = NULL, updated_at = now()
     WHERE t.period = $1 AND t.status = 'eligible' AND (t.not_before IS NULL OR t.not_before <= now())",
];

/// [`SET_BASED_SQL`] for `period`'s partitions.
fn set_based_statements(period: settled::period::Period) -> Vec<String> {
    let (work, ledger) = settled::partitions::names(period);
    SET_BASED_SQL
        .iter()
        .map(|sql| sql.replace("{work}", &work).replace("{ledger}", &ledger))
        .collect()
}

/// The whole period in one transaction on one connection.
pub(super) async fn set_based_case(ctx: &Ctx, creators: u64) -> CaseResult {
    let case = CaseResult::new("set-based", "set-based", 1, 0, creators);
    measure_case(ctx, case, async |db, case| measure_set_based(creators, db, case).await).await
}

async fn measure_set_based(creators: u64, db: &CaseDb, case: &mut CaseResult) -> anyhow::Result<()> {
    let statements = set_based_statements(db.period);
    let mut conn = PgConnection::connect(&db.url).await?;
    let started = Instant::now();
    let mut tx = conn.begin().await?;
    let mut rows = Vec::new();
    for sql in &statements {
        let done = sqlx::query(sql)
            .bind(db.period.date())
            .bind(db.run_id)
            .execute(&mut *tx)
            .await?;
        rows.push(done.rows_affected());
    }
    let (held, paid, credited, settled) = (rows[0], rows[1], rows[2], rows[3]);
    anyhow::ensure!(
        held == 0 && paid == creators && credited == creators && settled == creators,
        "set-based held {held}, paid {paid}, credited {credited} and settled {settled} of {creators}"
    );
    tx.commit().await?;
    let elapsed = started.elapsed();
    conn.close().await?;
    // As above: the run's finish is inside every case's clock.
    let finished = finish_run(db).await?;
    case.record_time(elapsed + finished);
    case.transactions_per_item = Some(1.0 / creators as f64);
    Ok(())
}

/// Finishes the case's drained run through the engine, as a worker would;
/// returns how long that took.
async fn finish_run(db: &super::CaseDb) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let pool = sqlx::PgPool::connect(&db.url).await?;
    let finished = settled::settlement::job()
        .finish_if_drained(&pool, db.run_id, &db.period.to_string(), uuid::Uuid::nil())
        .await;
    let took = started.elapsed();
    pool.close().await;
    anyhow::ensure!(finished?, "the floor's run did not finish");
    Ok(took)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pgbench_script_is_the_products_statement_with_variables() {
        let statements = settled::settlement::queue().chunk_statements(&settlement_chunk_sql());
        let script = settle_chunk_script();
        let chunk = with_variables(statements.from_start_sql(), &["period", "chunk", "run"]);
        assert!(script.contains(&format!("BEGIN;\n{chunk};\nCOMMIT;\n")), "{script}");
        assert!(!script.contains('$'), "a parameter left without its variable: {script}");
    }
}
