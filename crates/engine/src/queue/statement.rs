//! A whole chunk in one statement: the claim (`FOR NO KEY UPDATE SKIP
//! LOCKED`), the status change and the application's effects as CTEs of a
//! single statement, for handlers that can say their effects in SQL
//! ([`ChunkSql`]).
//!
//! The claimed rows are updated by their `ctid` (and `tableoid`), which the
//! claim just locked in the same statement, so nothing can move them in
//! between; the application's CTEs read the updated rows (`settled`)
//! instead of looking every item up again. The statement returns counts the
//! engine checks before it commits: every claimed row marked, one effect
//! per settled item.

use sqlx::PgConnection;

use super::scope::{ScopeArg, ScopeKind};
use super::{KeyWindow, Names, WindowShape, WorkQueue, MAX_CHUNK_ITEMS};
use crate::{EngineError, HandlerError};

/// A handler's effects in SQL, spliced into the engine's chunk statement.
///
/// In `effects` (one or more CTEs, `name AS (...)`, comma separated, no
/// leading `WITH`) the application reads:
/// - `settled`: every column of the work rows this chunk settles, as
///   updated (`attempt` is the fence to record with each effect);
/// - `run`: one row, `id`, the run's id.
///
/// The last CTE must be named `effects` and return one row per settled item
/// it paid (a data-modifying CTE's `RETURNING`); the engine rolls the chunk
/// back unless its count equals the settled count.
///
/// `held`, if any, is a query over `picked` (the claimed rows' scope and key
/// columns) returning, as one column `key`, the keys to put on hold instead
/// of working on them.
///
/// The CTE names `run`, `picked`, `held`, `marked`, `settled` and the
/// columns `engine_rel`, `engine_tid` are the engine's; the application's
/// CTEs take other names. Values come only from the work rows and the
/// database: the statement binds nothing the application supplies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkSql {
    /// The effects CTEs (see above).
    pub effects: String,
    /// The held-keys query (see above); None holds nothing.
    pub held: Option<String>,
}

/// Which rows a chunk statement claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    /// Eligible rows of a key window (its bounds from $4 on).
    Window(WindowShape),
    /// Eligible rows among chosen keys ($4: the keys).
    Keys,
}

/// A queue's chunk statements for one [`ChunkSql`], rendered once per drain.
#[derive(Debug, Clone)]
pub struct ChunkStatements {
    /// One per window shape ([`WindowShape::index`]).
    windows: [String; 4],
    keys: String,
    scope: ScopeKind,
    scope_type: String,
}

/// What one chunk statement did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChunkDone {
    /// Items settled (their effects written).
    pub settled: u64,
    /// Keys put on hold.
    pub held: Vec<String>,
    /// The largest key claimed (None when nothing was claimed).
    pub last_key: Option<String>,
    /// Items claimed.
    pub claimed: u64,
}

#[derive(sqlx::FromRow)]
struct DoneRow {
    claimed: i64,
    marked: i64,
    settled: i64,
    effects: i64,
    last_key: Option<String>,
    held_keys: Option<Vec<String>>,
}

fn render(n: &Names, sql: &ChunkSql, pick: Pick) -> String {
    let (table, scope, scope_type, key, key_type) = n.parts();
    let (filter, order) = match pick {
        Pick::Window(shape) => n.window(shape),
        Pick::Keys => (
            format!("\n               AND t.{key} = ANY(CAST($4 AS {key_type}[]))"),
            String::new(),
        ),
    };
    let held = sql
        .held
        .clone()
        .unwrap_or_else(|| format!("SELECT CAST(NULL AS {key_type}) AS key WHERE false"));
    let effects = &sql.effects;
    format!(
        "WITH run AS (SELECT CAST($3 AS bigint) AS id),
         picked AS (
             SELECT t.tableoid AS engine_rel, t.ctid AS engine_tid, t.{scope}, t.{key}
             FROM {table} t
             WHERE t.{scope} = CAST($1 AS {scope_type})
               AND t.status = 'eligible'{filter}
               AND (t.not_before IS NULL OR t.not_before <= now())
               AND EXISTS (SELECT 1 FROM settled_engine.runs r WHERE r.id = $3 AND r.state = 'running'){order}
             LIMIT $2
             FOR NO KEY UPDATE OF t SKIP LOCKED),
         held AS MATERIALIZED ({held}),
         marked AS (
             UPDATE {table} t
             SET status = CASE WHEN h.key IS NULL THEN 'settled' ELSE 'held' END,
                 attempt = t.attempt + 1, lease_owner = NULL, lease_until = NULL,
                 last_error = CASE WHEN h.key IS NULL THEN NULL ELSE t.last_error END,
                 not_before = CASE WHEN h.key IS NULL THEN NULL ELSE t.not_before END,
                 updated_at = now()
             FROM picked p LEFT JOIN held h ON h.key = p.{key}
             WHERE t.{scope} = CAST($1 AS {scope_type})
               AND t.tableoid = p.engine_rel AND t.ctid = p.engine_tid
               AND t.{key} = p.{key} AND t.status = 'eligible'
             RETURNING t.*),
         settled AS (SELECT * FROM marked WHERE status = 'settled'),
         {effects}
         SELECT (SELECT count(*) FROM picked) AS claimed,
                (SELECT count(*) FROM marked) AS marked,
                (SELECT count(*) FROM settled) AS settled,
                (SELECT count(*) FROM effects) AS effects,
                (SELECT max(p.{key})::text FROM picked p) AS last_key,
                (SELECT array_agg(m.{key}::text) FROM marked m WHERE m.status = 'held') AS held_keys"
    )
}

impl WorkQueue {
    /// Renders the chunk statements for `sql`.
    pub fn chunk_statements(&self, sql: &ChunkSql) -> ChunkStatements {
        let names = Names::of(&self.spec);
        ChunkStatements {
            windows: WindowShape::ALL.map(|shape| render(&names, sql, Pick::Window(shape))),
            keys: render(&names, sql, Pick::Keys),
            scope: self.scope,
            scope_type: self.spec.scope_type.clone(),
        }
    }
}

impl ChunkStatements {
    fn scope_arg(&self, scope: &str) -> Result<ScopeArg, EngineError> {
        self.scope.arg(scope, &self.scope_type)
    }

    /// The statement that claims from the start of the index (for tools that
    /// must send exactly the engine's statement, such as a pgbench script).
    /// $1 scope, $2 limit, $3 run.
    pub fn from_start_sql(&self) -> &str {
        &self.windows[KeyWindow::ALL.shape().index()]
    }

    /// The statement that claims keys after `$4` up to `$5` (inclusive),
    /// in key order: what a claim loop sends inside its key range (for
    /// tools, as [`Self::from_start_sql`]). $1 scope, $2 limit, $3 run.
    pub fn range_sql(&self) -> &str {
        let both = KeyWindow {
            after: Some(""),
            upto: Some(""),
        };
        &self.windows[both.shape().index()]
    }

    /// Claims up to `limit` eligible items of `scope` in `window` (in key
    /// order when it has a bound), settles or holds them and runs the effects, in
    /// one statement on `tx`. The caller commits; any error means roll
    /// back: the outer one is the engine's (a claimed row not marked), the
    /// inner one the handler's (a failed statement, effects missing).
    pub async fn run(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        limit: u32,
        run_id: i64,
        window: KeyWindow<'_>,
    ) -> Result<Result<ChunkDone, HandlerError>, EngineError> {
        debug_assert!((1..=MAX_CHUNK_ITEMS).contains(&limit));
        let query = sqlx::query_as::<_, DoneRow>(&self.windows[window.shape().index()])
            .bind(self.scope_arg(scope)?) // $1
            .bind(i64::from(limit)) // $2
            .bind(run_id); // $3
        match window.bind(query).fetch_one(tx).await {
            Ok(row) => check(row),
            Err(err) => Ok(Err(HandlerError::Database(err))),
        }
    }

    /// The same for chosen keys (retrying halves of a failed chunk).
    pub async fn run_keys(
        &self,
        tx: &mut PgConnection,
        scope: &str,
        run_id: i64,
        keys: &[String],
    ) -> Result<Result<ChunkDone, HandlerError>, EngineError> {
        let limit = i64::try_from(keys.len()).unwrap_or(i64::MAX);
        let row = sqlx::query_as::<_, DoneRow>(&self.keys)
            .bind(self.scope_arg(scope)?) // $1
            .bind(limit) // $2
            .bind(run_id) // $3
            .bind(keys) // $4
            .fetch_one(tx)
            .await;
        match row {
            Ok(row) => check(row),
            Err(err) => Ok(Err(HandlerError::Database(err))),
        }
    }
}

/// The statement's own accounting: every claimed row marked, one effect per
/// settled item; anything else and the chunk must roll back.
fn check(row: DoneRow) -> Result<Result<ChunkDone, HandlerError>, EngineError> {
    if row.marked != row.claimed {
        return Err(EngineError::Invariant(format!(
            "marked {} of {} claimed items; rolling the chunk back",
            row.marked, row.claimed
        )));
    }
    if row.effects != row.settled {
        return Ok(Err(HandlerError::Permanent(format!(
            "the effects returned {} rows for {} settled items; rolling the chunk back",
            row.effects, row.settled
        ))));
    }
    Ok(Ok(ChunkDone {
        settled: row.settled as u64,
        held: row.held_keys.unwrap_or_default(),
        last_key: row.last_key,
        claimed: row.claimed as u64,
    }))
}
