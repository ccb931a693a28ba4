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
//!
//! Where one relation holds every row of the scope (a table that is not
//! partitioned, or the scope's partition of a table partitioned by scope),
//! a drain renders the statements on that relation itself
//! ([`WorkQueue::chunk_statements_for`]): the claimed rows are then updated
//! by one TID scan of their sorted `ctid`s instead of a join that looks
//! each one up, and the statement names no partitioned table, so a cached
//! generic plan can serve every chunk (a generic plan on the partitioned
//! table would lock every partition). Otherwise (no rows yet, sub-partitions,
//! inheritance) the statements name the table, as above.

use sqlx::PgConnection;

use super::scope::{ScopeArg, ScopeKind};
use super::{KeyWindow, Names, WindowShape, WorkQueue, MAX_CHUNK_ITEMS};
use crate::common::error::{EngineError, HandlerError};

/// A handler's effects in SQL, spliced into the engine's chunk statement.
///
/// In `effects` (one or more CTEs, `name AS (...)`, comma separated, no
/// leading `WITH`) the application reads:
/// - `settled`: every column of the work rows this chunk settles, as
///   updated (`attempt` is the fence to record with each effect);
/// - `run`: one row, `id`, the run's id.
///
/// The last CTE must be named `effects` and return one row per settled item
/// it paid (from the `RETURNING` of data-modifying CTEs); the engine rolls
/// the chunk back unless its count equals the settled count.
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

/// The one relation that holds every row of a scope (see the module's text).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ScopeRelation {
    /// Its schema-qualified name, quoted where it must be.
    name: String,
    /// When it is a partition: its oid and its table's. Every statement
    /// then checks that it is still attached, so a drain claims nothing from
    /// a partition detached under it.
    partition_of: Option<(u32, u32)>,
}

/// What a chunk statement names.
#[derive(Debug, Clone, Copy)]
enum Target<'a> {
    /// The queue's table (any layout).
    Table,
    /// The scope's one relation.
    Relation(&'a ScopeRelation),
}

/// A queue's chunk statements for one [`ChunkSql`], rendered once per drain.
#[derive(Debug, Clone)]
pub struct ChunkStatements {
    /// One per window shape ([`WindowShape::index`]).
    windows: [String; 4],
    keys: String,
    scope: ScopeKind,
    scope_type: String,
    /// They name the scope's own relation, not the queue's table.
    on_relation: bool,
}

/// A plain `BEGIN`, for statements that name the queue's table: the session
/// decides their plans (custom plans, see [`crate::common::session`]).
const BEGIN: &str = "BEGIN";

/// `BEGIN`, and for this transaction the planner's default choice between
/// custom and cached generic plans: statements on the scope's own relation
/// lock only it whatever their plan, and at a chunk of thousands of items
/// PostgreSQL soon keeps the generic plan and stops planning every chunk.
const BEGIN_CACHED_PLANS: &str = "BEGIN; SET LOCAL plan_cache_mode = auto";

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

/// The claim's conditions (after the scope and status) for `pick`, and its order.
fn pick_filter(n: &Names, pick: Pick) -> (String, String) {
    match pick {
        Pick::Window(shape) => n.window(shape),
        Pick::Keys => (
            format!(
                "\n               AND t.{key} = ANY(CAST($4 AS {key_type}[]))",
                key = n.key,
                key_type = n.key_type
            ),
            String::new(),
        ),
    }
}

/// The `marked` CTE: the claimed rows set `settled`, or `held` for the
/// holds query's keys, status re-checked.
fn marked_cte(n: &Names, target: Target) -> String {
    let (table, scope, scope_type, key) = (n.table, n.scope, n.scope_type, n.key);
    const SET: &str = "attempt = t.attempt + 1, lease_owner = NULL, lease_until = NULL,";
    match target {
        // Rows of any relation of the table: each found by its partition
        // and tuple, joined with its pick.
        Target::Table => format!(
            "marked AS (
             UPDATE {table} t
             SET status = CASE WHEN h.key IS NULL THEN 'settled' ELSE 'held' END,
                 {SET}
                 last_error = CASE WHEN h.key IS NULL THEN NULL ELSE t.last_error END,
                 not_before = CASE WHEN h.key IS NULL THEN NULL ELSE t.not_before END,
                 updated_at = now()
             FROM picked p LEFT JOIN held h ON h.key = p.{key}
             WHERE t.{scope} = CAST($1 AS {scope_type})
               AND t.tableoid = p.engine_rel AND t.ctid = p.engine_tid
               AND t.{key} = p.{key} AND t.status = 'eligible'
             RETURNING t.*)"
        ),
        // One relation: its tuples by one TID scan. A tuple this statement
        // locked is the row it picked (nobody else can update or remove it
        // meanwhile), so the tuple id alone identifies it.
        Target::Relation(rel) => format!(
            "marked AS (
             UPDATE {name} t
             SET status = CASE WHEN t.{key} IN (SELECT h.key FROM held h) THEN 'held' ELSE 'settled' END,
                 {SET}
                 last_error = CASE WHEN t.{key} IN (SELECT h.key FROM held h) THEN t.last_error END,
                 not_before = CASE WHEN t.{key} IN (SELECT h.key FROM held h) THEN t.not_before END,
                 updated_at = now()
             WHERE t.ctid = ANY(ARRAY(SELECT p.engine_tid FROM picked p))
               AND t.{scope} = CAST($1 AS {scope_type}) AND t.status = 'eligible'
             RETURNING t.*)",
            name = rel.name
        ),
    }
}

fn render(n: &Names, sql: &ChunkSql, pick: Pick, target: Target) -> String {
    let (table, scope, key, key_type) = (n.table, n.scope, n.key, n.key_type);
    let (filter, order) = pick_filter(n, pick);
    let (from, attached) = match target {
        Target::Table => (table.to_string(), String::new()),
        Target::Relation(rel) => (
            rel.name.clone(),
            rel.partition_of.map_or_else(String::new, |(part, parent)| {
                format!(
                    "\n               AND EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = CAST({part} AS oid) AND i.inhparent = CAST({parent} AS oid))"
                )
            }),
        ),
    };
    let held = sql
        .held
        .clone()
        .unwrap_or_else(|| format!("SELECT CAST(NULL AS {key_type}) AS key WHERE false"));
    let marked = marked_cte(n, target);
    let effects = &sql.effects;
    let claimable = super::claim::claimable(n);
    format!(
        "WITH run AS (SELECT CAST($3 AS bigint) AS id),
         picked AS (
             SELECT t.tableoid AS engine_rel, t.ctid AS engine_tid, t.{scope}, t.{key}
             FROM {from} t
             WHERE {claimable}{filter}{attached}{order}
             LIMIT $2
             FOR NO KEY UPDATE OF t SKIP LOCKED),
         held AS MATERIALIZED ({held}),
         {marked},
         settled AS (SELECT * FROM marked WHERE status = 'settled'),
         {effects}
         SELECT c.claimed, m.marked, m.settled, e.effects, c.last_key, m.held_keys
         FROM (SELECT count(*) AS claimed, max(p.{key})::text AS last_key FROM picked p) c,
              (SELECT count(*) AS marked, count(*) FILTER (WHERE m.status = 'settled') AS settled,
                      array_agg(m.{key}::text) FILTER (WHERE m.status = 'held') AS held_keys
               FROM marked m) m,
              (SELECT count(*) AS effects FROM effects) e"
    )
}

/// The statement that finds a scope's relation, rendered once per queue.
#[derive(Debug, Clone)]
pub(super) struct Sql {
    scope_relation: String,
}

impl Sql {
    pub(super) fn render(n: &Names) -> Sql {
        let (table, scope, scope_type) = (n.table, n.scope, n.scope_type);
        Sql {
            // $1 scope, $2 the scope column's name. The table's name was
            // validated as plain identifiers; the relation's is quoted here.
            scope_relation: format!(
                "WITH root AS (SELECT c.oid, c.relkind FROM pg_class c WHERE c.oid = CAST('{table}' AS regclass)),
                      part AS (SELECT t.tableoid AS oid FROM {table} t
                               WHERE t.{scope} = CAST($1 AS {scope_type}) LIMIT 1)
                 SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS name,
                        c.oid::bigint AS oid,
                        CASE WHEN r.relkind = 'p' THEN r.oid::bigint END AS parent
                 FROM root r
                 LEFT JOIN part p ON r.relkind = 'p'
                 JOIN pg_class c ON c.oid = CASE WHEN r.relkind = 'p' THEN p.oid ELSE r.oid END
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE (r.relkind = 'r' AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhparent = r.oid))
                    OR (r.relkind = 'p'
                        AND EXISTS (SELECT 1 FROM pg_partitioned_table pt
                                    JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]
                                    WHERE pt.partrelid = r.oid AND pt.partnatts = 1 AND pt.partexprs IS NULL
                                      AND a.attname = $2)
                        AND EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = p.oid AND i.inhparent = r.oid))"
            ),
        }
    }
}

impl WorkQueue {
    /// Renders the chunk statements for `sql` on the queue's table.
    pub fn chunk_statements(&self, sql: &ChunkSql) -> ChunkStatements {
        self.render_chunk_statements(sql, Target::Table)
    }

    /// Renders the chunk statements for `sql` for a drain of `scope`: on
    /// the one relation that holds the scope's rows when there is one (see
    /// the module's text), else on the queue's table.
    pub async fn chunk_statements_for(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        sql: &ChunkSql,
    ) -> Result<ChunkStatements, EngineError> {
        Ok(match self.scope_relation(conn, scope).await? {
            Some(rel) => self.render_chunk_statements(sql, Target::Relation(&rel)),
            None => self.chunk_statements(sql),
        })
    }

    fn render_chunk_statements(&self, sql: &ChunkSql, target: Target) -> ChunkStatements {
        let names = Names::of(&self.spec);
        ChunkStatements {
            windows: WindowShape::ALL.map(|shape| render(&names, sql, Pick::Window(shape), target)),
            keys: render(&names, sql, Pick::Keys, target),
            scope: self.scope,
            scope_type: self.spec.scope_type.clone(),
            on_relation: matches!(target, Target::Relation(_)),
        }
    }

    /// The one relation that holds every row of `scope`, if there is one: the
    /// table itself when it is a plain table without inheritance children;
    /// when it is partitioned by the scope column alone, the partition that
    /// holds the scope's rows, if it has rows and is not partitioned again.
    async fn scope_relation(&self, conn: &mut PgConnection, scope: &str) -> Result<Option<ScopeRelation>, EngineError> {
        let row: Option<(String, i64, Option<i64>)> = sqlx::query_as(&self.sql.statement.scope_relation)
            .bind(self.scope_arg(scope)?) // $1
            .bind(&self.spec.scope_column) // $2
            .fetch_optional(conn)
            .await
            .map_err(EngineError::db("finding the relation that holds a scope"))?;
        Ok(row.map(|(name, oid, parent)| ScopeRelation {
            name,
            partition_of: parent.map(|parent| (oid as u32, parent as u32)),
        }))
    }
}

impl ChunkStatements {
    fn scope_arg(&self, scope: &str) -> Result<ScopeArg, EngineError> {
        self.scope.arg(scope, &self.scope_type)
    }

    /// Begins a chunk's transaction on `conn` (cached plans when the statements name the scope's own relation);
    /// only these statements may run in it.
    pub async fn begin<'c>(
        &self,
        conn: &'c mut PgConnection,
    ) -> Result<sqlx::Transaction<'c, sqlx::Postgres>, EngineError> {
        use sqlx::Connection;
        conn.begin_with(if self.on_relation { BEGIN_CACHED_PLANS } else { BEGIN })
            .await
            .map_err(EngineError::db("beginning a transaction"))
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

    /// Whether the statements name the scope's own relation (see the
    /// module's text) rather than the queue's table.
    pub fn on_scope_relation(&self) -> bool {
        self.on_relation
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
