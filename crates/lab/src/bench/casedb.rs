//! A case's database: copied from a seeded template, its run started;
//! verified and dropped at the end, whatever the measurement's outcome.
//!
//! Every case of one size starts from the same bytes: the template is
//! seeded once, its run started, then `VACUUM (FREEZE, ANALYZE)` sets every
//! hint bit and visibility-map bit and gives the planner fresh statistics;
//! each case is `CREATE DATABASE ... TEMPLATE` of it followed by a
//! `CHECKPOINT`, so no case pays for the seed's hint bits or dirty pages,
//! and each starts right after a checkpoint (the same full-page images).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use sqlx::{Connection, PgConnection};

use super::{CaseResult, Ctx, BENCH_SEED};
use settled::period::Period;
use settled::progress::Progress;

/// A fresh database with a seeded period and a started run.
pub(super) struct CaseDb {
    pub(super) name: String,
    pub(super) url: String,
    pub(super) period: Period,
    pub(super) run_id: i64,
}

/// A seeded, vacuumed database that cases are copied from.
#[derive(Debug, Clone)]
struct Template {
    name: String,
    period: Period,
    run_id: i64,
}

/// The run's templates, by number of creators; dropped by [`Templates::drop_all`].
#[derive(Debug, Default)]
pub(super) struct Templates {
    by_creators: tokio::sync::Mutex<BTreeMap<u64, Template>>,
    checkpoint_refused: AtomicBool,
}

impl Templates {
    /// The template of `creators`, made on first use.
    async fn get(&self, admin_url: &str, creators: u64) -> anyhow::Result<Template> {
        let mut by_creators = self.by_creators.lock().await;
        if let Some(template) = by_creators.get(&creators) {
            return Ok(template.clone());
        }
        let template = make_template(admin_url, creators).await?;
        by_creators.insert(creators, template.clone());
        Ok(template)
    }

    /// A `CHECKPOINT`, so the copy's pages are written before the clock
    /// starts; said once when the role may not (it then goes on without).
    async fn checkpoint(&self, admin_url: &str) -> anyhow::Result<()> {
        let mut admin = PgConnection::connect(admin_url).await?;
        if let Err(err) = sqlx::query("CHECKPOINT").execute(&mut admin).await {
            if !self.checkpoint_refused.swap(true, Ordering::Relaxed) {
                eprintln!("bench: CHECKPOINT refused ({err}): cases start without one");
            }
        }
        admin.close().await?;
        Ok(())
    }

    /// Drops every template.
    pub(super) async fn drop_all(&self, admin_url: &str) -> anyhow::Result<()> {
        let templates = std::mem::take(&mut *self.by_creators.lock().await);
        for template in templates.values() {
            drop_database_at(admin_url, &template.name).await?;
        }
        Ok(())
    }
}

/// The benchmark's period: yesterday (UTC).
pub(super) fn bench_period() -> Period {
    Period::from_date(chrono::Utc::now().date_naive() - chrono::Duration::days(1))
}

/// Seeds `creators` into a new database, starts its run, vacuums (FREEZE)
/// and analyzes it, and closes it to connections (autovacuum included), so
/// it can be copied.
async fn make_template(admin_url: &str, creators: u64) -> anyhow::Result<Template> {
    let name = format!("settled_bench_template_{}", uuid::Uuid::new_v4().simple());
    create_database_named(admin_url, &name).await?;
    let url = settled_embedded::with_database(admin_url, &name);
    let made = async {
        let db = settled::db::Database::open_url(&url, 4, "settled-bench").await?;
        let period = bench_period();
        settled::seed::seed(
            &db.pool,
            period,
            creators,
            BENCH_SEED,
            None,
            settled::seed::Volumes::Extreme,
            &Progress::hidden(),
        )
        .await?;
        let run_id = settled::settlement::job()
            .start_or_join(&db.pool, &period.to_string(), None)
            .await?
            .run
            .id;
        db.close().await?;
        let mut conn = PgConnection::connect(&url).await?;
        sqlx::query("VACUUM (FREEZE, ANALYZE)")
            .execute(&mut conn)
            .await
            .context("vacuuming the seeded template")?;
        conn.close().await?;
        let mut admin = PgConnection::connect(admin_url).await?;
        sqlx::query(&format!("ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false"))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        anyhow::Ok(Template {
            name: name.clone(),
            period,
            run_id,
        })
    }
    .await;
    if made.is_err() {
        let _ = drop_database_at(admin_url, &name).await;
    }
    made
}

pub(super) async fn prepare_case(ctx: &Ctx, creators: u64) -> anyhow::Result<CaseDb> {
    let template = ctx.templates.get(&ctx.admin_url, creators).await?;
    let name = format!("settled_bench_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&ctx.admin_url).await?;
    sqlx::query(&format!("CREATE DATABASE {name} TEMPLATE {}", template.name))
        .execute(&mut admin)
        .await
        .with_context(|| format!("copying database {name} from the seeded template"))?;
    admin.close().await?;
    ctx.templates.checkpoint(&ctx.admin_url).await?;
    Ok(CaseDb {
        url: settled_embedded::with_database(&ctx.admin_url, &name),
        name,
        period: template.period,
        run_id: template.run_id,
    })
}

/// Verifies the case's period and drops its database.
pub(super) async fn finish_case(ctx: &Ctx, db: &CaseDb) -> anyhow::Result<settled::verify::VerifyReport> {
    let verified = async {
        let mut conn = PgConnection::connect(&db.url).await?;
        let report = settled::verify::verify(&mut conn, db.period).await?;
        conn.close().await?;
        anyhow::Ok(report)
    }
    .await;
    drop_database(ctx, &db.name).await?;
    verified
}

/// Drops a benchmark database (`name` is generated, never input), its
/// sessions included.
pub(super) async fn drop_database(ctx: &Ctx, name: &str) -> anyhow::Result<()> {
    drop_database_at(&ctx.admin_url, name).await
}

/// Creates an empty benchmark database on `admin_url`'s server; returns its
/// name and URL.
pub(super) async fn create_database_at(admin_url: &str) -> anyhow::Result<(String, String)> {
    let name = format!("settled_bench_{}", uuid::Uuid::new_v4().simple());
    create_database_named(admin_url, &name).await?;
    let url = settled_embedded::with_database(admin_url, &name);
    Ok((name, url))
}

/// Creates an empty database `name` (generated, never input).
async fn create_database_named(admin_url: &str, name: &str) -> anyhow::Result<()> {
    let mut admin = PgConnection::connect(admin_url).await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .with_context(|| format!("creating database {name}"))?;
    admin.close().await?;
    Ok(())
}

/// Drops a benchmark database on `admin_url`'s server (`name` is
/// generated, never input), its sessions included.
pub(super) async fn drop_database_at(admin_url: &str, name: &str) -> anyhow::Result<()> {
    let mut admin = PgConnection::connect(admin_url).await?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    Ok(())
}

/// CPU seconds (user + system) of this process's children that have ended
/// and been waited for, their own children included.
pub(super) fn client_cpu() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| {
            let (user, system) = (u.user_time(), u.system_time());
            user.tv_sec() as f64 + user.tv_usec() as f64 / 1e6 + system.tv_sec() as f64 + system.tv_usec() as f64 / 1e6
        })
        .unwrap_or(0.0)
}

/// Measures `case` with `measure` on a database of its own (made from
/// the template of `case.creators` items), then concludes it; an error of
/// any step is the case's error.
pub(super) async fn measure_case(
    ctx: &Ctx,
    mut case: CaseResult,
    measure: impl AsyncFnOnce(&CaseDb, &mut CaseResult) -> anyhow::Result<()>,
) -> CaseResult {
    let outcome = async {
        let db = prepare_case(ctx, case.creators).await?;
        let measured = measure(&db, &mut case).await;
        conclude(ctx, &db, measured, &mut case).await
    }
    .await;
    if let Err(err) = outcome {
        case.error = Some(format!("{err:#}"));
    }
    case
}

/// Ends a case: verifies its period and drops its database (whatever the
/// measurement's outcome), then records the verification.
pub(super) async fn conclude(
    ctx: &Ctx,
    db: &CaseDb,
    measured: anyhow::Result<()>,
    case: &mut CaseResult,
) -> anyhow::Result<()> {
    let verified = finish_case(ctx, db).await;
    measured?;
    case.set_verify(verified?);
    Ok(())
}

/// Transactions committed and rolled back in database `name` so far.
pub(super) async fn transactions(admin: &mut PgConnection, name: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(xact_commit + xact_rollback), 0)::int8 FROM pg_stat_database WHERE datname = $1",
    )
    .bind(name)
    .fetch_one(admin)
    .await?)
}

/// Waits until no session is connected to database `name` (their statistics
/// are flushed when they end), at most 10 s.
pub(super) async fn wait_disconnected(admin: &mut PgConnection, name: &str) -> anyhow::Result<()> {
    for _ in 0..200 {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = $1")
            .bind(name)
            .fetch_one(&mut *admin)
            .await?;
        if left == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
