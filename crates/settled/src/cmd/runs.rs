//! `settled runs`.

use crate::cmd::{print_listing, Outcome, ReadOnly};
use crate::db::Database;
use crate::run_state::Shown;
use crate::settlement::job;
use settled_engine::Run;

/// List runs, newest first: state, starter, timing, report summary.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many.
    #[arg(long, default_value_t = 20)]
    limit: i64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

impl ReadOnly for Args {
    async fn read(self, db: &Database) -> Outcome {
        let all = job().list_runs(&db.pool, self.limit).await?;
        let workers = crate::run_state::workers(&db.pool).await?;
        let listed: Vec<Listed> = all.iter().map(|run| Listed(run, Shown::of(run, &workers))).collect();
        let header = format!(
            "{:>5}  {:<10}  {:<9}  {:<8}  {:<19}  {:>9}  report",
            "run", "period", "state", "starter", "started (UTC)", "took"
        );
        print_listing(self.json, &listed, &header, |Listed(run, shown)| line(run, *shown))
    }
}

/// A run and its state as read; its JSON is [`shown_json`]'s.
struct Listed<'a>(&'a Run, Shown);

impl serde::Serialize for Listed<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let value = shown_json(self.0, self.1).map_err(serde::ser::Error::custom)?;
        serde::Serialize::serialize(&value, serializer)
    }
}

/// A run as settlement shows it: the engine's scope is the period, and the
/// state is as read (`stalled`, with `stalled_since`, for a running run
/// without a live worker).
fn shown_json(run: &Run, shown: Shown) -> serde_json::Result<serde_json::Value> {
    let mut value = serde_json::to_value(run)?;
    value["period"] = serde_json::Value::from(run.scope.as_str());
    value["state"] = serde_json::Value::from(shown.as_str());
    if let Some(since) = shown.stalled_since() {
        value["stalled_since"] = serde_json::to_value(since)?;
    }
    Ok(value)
}

fn line(run: &Run, shown: Shown) -> String {
    let took = run
        .finished_at
        .map(|f| format!("{:.1}s", (f - run.started_at).num_milliseconds() as f64 / 1000.0))
        .unwrap_or_else(|| "-".into());
    let starter = run
        .started_by
        .map(|u| u.simple().to_string()[..8].to_string())
        .unwrap_or_else(|| "operator".into());
    let summary = run
        .report
        .as_ref()
        .map(|r| {
            format!(
                "settled {} failed {} held {} paid {}",
                r["counts"]["settled"],
                r["counts"]["failed"],
                r["counts"]["held"],
                r["paid"].as_str().unwrap_or("?")
            )
        })
        .unwrap_or_default();
    format!(
        "{:>5}  {:<10}  {:<9}  {:<8}  {:<19}  {:>9}  {summary}",
        run.id,
        run.scope,
        shown.label(),
        starter,
        run.started_at.format("%Y-%m-%d %H:%M:%S"),
        took
    )
}
