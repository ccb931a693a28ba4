//! A work table: its spec, and the statements that claim, complete, fail,
//! release and count its items.
//!
//! Each operation's statement text sits in the file of its operation, beside
//! the function that binds and runs it: `claim.rs`, `complete.rs`,
//! `fail.rs`, `lease.rs`, `count.rs`, `manage.rs`, and the whole chunk in
//! one statement in `statement.rs`. Statements are rendered
//! once, when the [`WorkQueue`] is built, from identifiers [`QueueSpec`]
//! validated; values are always bound parameters. `check.rs` proves at start
//! that the table has what the statements need.

pub(crate) mod check;
mod claim;
mod complete;
mod count;
mod fail;
mod lease;
mod manage;
mod scope;
mod statement;

pub use check::{REQUIRED_COLUMNS, REQUIRED_INDEXES};
pub use count::StatusCounts;
pub use statement::{ChunkDone, ChunkSql, ChunkStatements};

use crate::common::error::EngineError;
use crate::common::fence::Fence;
use crate::common::ident::check_identifier;
use crate::common::item::ClaimedItem;

/// Largest chunk one claim may take.
pub const MAX_CHUNK_ITEMS: u32 = 10_000;

/// Describes a work table. All fields are SQL identifiers (or type names),
/// validated by [`WorkQueue::new`].
#[derive(Debug, Clone)]
pub struct QueueSpec {
    /// The job's name, as stored in `settled_engine.runs.job`.
    pub job: String,
    /// The work table, `schema.table` or `table`.
    pub table: String,
    /// The column that one run covers (e.g. `period`, `week`).
    pub scope_column: String,
    /// Its SQL type (e.g. `date`).
    pub scope_type: String,
    /// The column that identifies an item within a scope (e.g. `creator`).
    pub key_column: String,
    /// Its SQL type (e.g. `text`).
    pub key_type: String,
}

/// A validated work table with its rendered statements.
#[derive(Debug, Clone)]
pub struct WorkQueue {
    spec: QueueSpec,
    scope: scope::ScopeKind,
    sql: Statements,
}

/// The validated identifiers statements are rendered from.
#[derive(Clone, Copy)]
struct Names<'a> {
    table: &'a str,
    scope: &'a str,
    scope_type: &'a str,
    key: &'a str,
    key_type: &'a str,
}

impl<'a> Names<'a> {
    /// The names of a (validated) spec.
    fn of(spec: &'a QueueSpec) -> Names<'a> {
        Names {
            table: &spec.table,
            scope: &spec.scope_column,
            scope_type: &spec.scope_type,
            key: &spec.key_column,
            key_type: &spec.key_type,
        }
    }

    /// A claim's key conditions for `window`'s shape (parameters from `$4`)
    /// and its order: always key order, so the largest key claimed is where
    /// the claim loop goes on from, and a claim from the start of the scope
    /// walks the eligible index rather than the heap (the planner's
    /// statistics from before a run say every row is eligible, and would
    /// scan the whole scope for an empty sweep at the end of it).
    fn window(&self, window: WindowShape) -> (String, String) {
        let (key, key_type) = (self.key, self.key_type);
        let mut filter = String::new();
        let mut param = 4;
        if window.after {
            filter.push_str(&format!("\n               AND t.{key} > CAST(${param} AS {key_type})"));
            param += 1;
        }
        if window.upto {
            filter.push_str(&format!("\n               AND t.{key} <= CAST(${param} AS {key_type})"));
        }
        let order = format!("\n             ORDER BY t.{key}");
        (filter, order)
    }
}

/// Which keys a claim looks at: those after `after` and up to `upto`
/// (inclusive), each bound optional. Claims take keys in key order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyWindow<'a> {
    /// Only keys greater than this one.
    pub after: Option<&'a str>,
    /// Only keys up to and including this one.
    pub upto: Option<&'a str>,
}

impl KeyWindow<'_> {
    /// The whole scope.
    pub const ALL: KeyWindow<'static> = KeyWindow {
        after: None,
        upto: None,
    };

    fn shape(&self) -> WindowShape {
        WindowShape {
            after: self.after.is_some(),
            upto: self.upto.is_some(),
        }
    }

    /// Binds the window's bounds (`$4` on) to a query whose other
    /// parameters are bound already.
    fn bind<'q, O>(
        &self,
        mut query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>
    where
        Self: 'q,
    {
        if let Some(after) = self.after {
            query = query.bind(after);
        }
        if let Some(upto) = self.upto {
            query = query.bind(upto);
        }
        query
    }
}

/// A [`KeyWindow`]'s shape: which bounds it has (one rendered statement each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WindowShape {
    after: bool,
    upto: bool,
}

impl WindowShape {
    /// Every shape, in [`Self::index`] order.
    const ALL: [WindowShape; 4] = [
        WindowShape {
            after: false,
            upto: false,
        },
        WindowShape {
            after: true,
            upto: false,
        },
        WindowShape {
            after: false,
            upto: true,
        },
        WindowShape {
            after: true,
            upto: true,
        },
    ];

    fn index(self) -> usize {
        usize::from(self.after) | (usize::from(self.upto) << 1)
    }
}

/// Every statement of a queue, rendered once.
#[derive(Debug, Clone)]
struct Statements {
    claim: claim::Sql,
    complete: complete::Sql,
    fail: fail::Sql,
    lease: lease::Sql,
    count: count::Sql,
    manage: manage::Sql,
    statement: statement::Sql,
}

impl WorkQueue {
    /// Validates the spec and renders the queue's statements.
    pub fn new(spec: QueueSpec) -> Result<WorkQueue, EngineError> {
        check_identifier("table", &spec.table, true)?;
        check_identifier("scope_column", &spec.scope_column, false)?;
        check_identifier("scope_type", &spec.scope_type, false)?;
        check_identifier("key_column", &spec.key_column, false)?;
        check_identifier("key_type", &spec.key_type, false)?;
        if spec.job.is_empty() || spec.job.len() > 100 {
            return Err(EngineError::InvalidIdentifier {
                field: "job",
                value: spec.job.clone(),
            });
        }
        let names = Names::of(&spec);
        let sql = Statements {
            claim: claim::Sql::render(&names),
            complete: complete::Sql::render(&names),
            fail: fail::Sql::render(&names),
            lease: lease::Sql::render(&names),
            count: count::Sql::render(&names),
            manage: manage::Sql::render(&names),
            statement: statement::Sql::render(&names),
        };
        let scope = scope::ScopeKind::of(&spec.scope_type);
        Ok(WorkQueue { spec, scope, sql })
    }

    /// The spec this queue was built from.
    pub fn spec(&self) -> &QueueSpec {
        &self.spec
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.spec.job
    }

    /// `scope` as the statements bind it: in the scope column's type where
    /// the engine knows it ([`scope`]'s text says why).
    fn scope_arg(&self, scope: &str) -> Result<scope::ScopeArg, EngineError> {
        self.scope.arg(scope, &self.spec.scope_type)
    }
}

/// A claimed (key, fence) row as the claim statements return it.
#[derive(sqlx::FromRow)]
struct KeyFence {
    key: String,
    fence: Fence,
}

impl From<KeyFence> for ClaimedItem {
    fn from(row: KeyFence) -> ClaimedItem {
        ClaimedItem {
            key: row.key,
            fence: row.fence,
        }
    }
}

/// Runs a statement that returns (key, fence) rows, as claimed items.
async fn fetch_items<'q>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, KeyFence, sqlx::postgres::PgArguments>,
    conn: &mut sqlx::PgConnection,
    context: &'static str,
) -> Result<Vec<ClaimedItem>, EngineError> {
    let rows = query.fetch_all(conn).await.map_err(EngineError::db(context))?;
    Ok(rows.into_iter().map(ClaimedItem::from).collect())
}

/// Splits items into the two arrays the fenced statements bind.
fn keys_and_fences(items: &[ClaimedItem]) -> (Vec<String>, Vec<i64>) {
    items.iter().map(|i| (i.key.clone(), i.fence.packed())).unzip()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> QueueSpec {
        QueueSpec {
            job: "j".into(),
            table: "s.t".into(),
            scope_column: "period".into(),
            scope_type: "date".into(),
            key_column: "k".into(),
            key_type: "text".into(),
        }
    }

    #[test]
    fn rejects_identifiers_that_are_not_plain_names() {
        for bad in ["t; drop table x", "T", "a.b.c", "", "1t", "t\"", "a b"] {
            let mut s = spec();
            s.table = bad.into();
            assert!(WorkQueue::new(s).is_err(), "{bad:?} accepted");
        }
        let mut s = spec();
        s.key_type = "text[]".into();
        assert!(WorkQueue::new(s).is_err());
        assert!(WorkQueue::new(spec()).is_ok());
    }
}
