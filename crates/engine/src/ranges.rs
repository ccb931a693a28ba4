//! A run's key ranges: where its claim loops work.
//!
//! The planner's histogram of the scope's keys cuts the key space into
//! ranges of about equal size, once per run, into
//! `settled_engine.run_key_ranges`. A claim loop of any process takes the
//! next free range (`FOR UPDATE SKIP LOCKED` on the range's row, committed
//! at once), claims inside it from its lower end to its upper one in key
//! order, and takes another when a claim runs short. So no two loops work
//! the same range, however many processes there are, and no loop walks a
//! range another one finished: the claims meet no locked rows and skip no
//! dead index entries but their own.
//!
//! The ranges are a hint for speed only and must never be needed for
//! correctness: what is claimed, and by whom, is decided by the items' row
//! locks; when no range is free a loop claims from the start of the scope,
//! the sweep that finds whatever the ranges left behind (rows another
//! transaction held and gave back, retries come due, items added after the
//! cut, ranges whose taker died). Reopening a run frees its ranges again
//! (`runs::reopen`).

use sqlx::PgConnection;

use crate::{EngineError, WorkQueue};

/// Cuts run `$1`'s ranges from the bounds `$2` (in key order) unless they
/// are cut: range 0 holds the keys up to `$2[1]`, range `i` those after
/// `$2[i]` up to `$2[i + 1]`, the last those after the last bound; no
/// bounds make one range of the whole scope. The first range's insert
/// decides between concurrent cutters (the others wait for it, then insert
/// nothing), so every process works the same cut.
const CUT_SQL: &str = "WITH first AS (
         INSERT INTO settled_engine.run_key_ranges (run_id, range_no, after_key, upto_key)
         VALUES ($1, 0, NULL, $2[1])
         ON CONFLICT DO NOTHING
         RETURNING run_id)
     INSERT INTO settled_engine.run_key_ranges (run_id, range_no, after_key, upto_key)
     SELECT f.run_id, i, $2[i], $2[i + 1]
     FROM first f CROSS JOIN generate_series(1, cardinality($2)) AS i";

/// Takes run `$1`'s first free range; no row when none is free.
const TAKE_SQL: &str = "UPDATE settled_engine.run_key_ranges r SET taken_at = now()
     FROM (SELECT range_no FROM settled_engine.run_key_ranges
           WHERE run_id = $1 AND taken_at IS NULL
           ORDER BY range_no LIMIT 1
           FOR UPDATE SKIP LOCKED) f
     WHERE r.run_id = $1 AND r.range_no = f.range_no AND r.taken_at IS NULL
     RETURNING r.after_key, r.upto_key";

/// Keys after `after` up to and including `upto` (each bound optional).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyRange {
    pub(crate) after: Option<String>,
    pub(crate) upto: Option<String>,
}

/// The key ranges of one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunRanges {
    run_id: i64,
}

impl RunRanges {
    /// Chunks a range should hold at least, so a loop claims full chunks.
    /// Each range is now visited once in all (before, once per process):
    /// finer ranges would only add takes.
    const CHUNKS_PER_RANGE: u64 = 1;

    /// The ranges of `run_id`, cut from `scope`'s histogram for chunks of
    /// `chunk` items unless another drain cut them first.
    pub(crate) async fn cut(
        conn: &mut PgConnection,
        queue: &WorkQueue,
        run_id: i64,
        scope: &str,
        chunk: u32,
    ) -> Result<RunRanges, EngineError> {
        let bounds = queue
            .key_ranges(&mut *conn, scope, u64::from(chunk) * Self::CHUNKS_PER_RANGE)
            .await?;
        sqlx::query(CUT_SQL)
            .bind(run_id) // $1
            .bind(&bounds) // $2
            .execute(conn)
            .await
            .map_err(EngineError::db("cutting a run's key ranges"))?;
        Ok(RunRanges { run_id })
    }

    /// Takes the next free range, committed on `conn` at once (outside any
    /// transaction, so that a chunk rolled back does not give it back);
    /// None when every range is taken.
    pub(crate) async fn take(&self, conn: &mut PgConnection) -> Result<Option<KeyRange>, EngineError> {
        let row: Option<(Option<String>, Option<String>)> = sqlx::query_as(TAKE_SQL)
            .bind(self.run_id) // $1
            .fetch_optional(conn)
            .await
            .map_err(EngineError::db("taking a key range"))?;
        Ok(row.map(|(after, upto)| KeyRange { after, upto }))
    }
}
