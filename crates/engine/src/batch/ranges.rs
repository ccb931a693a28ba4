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

use crate::batch::queue::WorkQueue;
use crate::common::error::EngineError;

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

/// Takes run `$1`'s first free range; no row when none is free. The pick
/// is a materialized CTE joined back on the key: as a subquery in `FROM`
/// the planner may run `LIMIT 1 ... SKIP LOCKED` again for every row it
/// joins, and take every range at once.
const TAKE_SQL: &str = "WITH picked AS MATERIALIZED (
         SELECT range_no FROM settled_engine.run_key_ranges
         WHERE run_id = $1 AND taken_at IS NULL
         ORDER BY range_no LIMIT 1
         FOR UPDATE SKIP LOCKED)
     UPDATE settled_engine.run_key_ranges r SET taken_at = now()
     FROM picked p
     WHERE r.run_id = $1 AND r.range_no = p.range_no AND r.taken_at IS NULL
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
        Self::cut_at(conn, run_id, &bounds).await
    }

    /// The ranges of `run_id`, cut at `bounds` unless they are cut.
    async fn cut_at(conn: &mut PgConnection, run_id: i64, bounds: &[String]) -> Result<RunRanges, EngineError> {
        sqlx::query(CUT_SQL)
            .bind(run_id) // $1
            .bind(bounds) // $2
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

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Connection;

    #[tokio::test(flavor = "multi_thread")]
    async fn one_cut_per_run_and_each_range_taken_once_by_loops_taking_at_once() {
        let db = settled_testkit::TestDb::create().await.unwrap();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(14)
            .connect(&db.url)
            .await
            .unwrap();
        crate::migrate::migrate(&pool).await.unwrap();
        let bounds: Vec<String> = (1..=9).map(|i| format!("k{i}")).collect();
        let mut conn = pool.acquire().await.unwrap();
        let ranges = RunRanges::cut_at(&mut conn, 7, &bounds).await.unwrap();
        // A second cut, on other bounds, changes nothing.
        RunRanges::cut_at(&mut conn, 7, &["x".to_string()]).await.unwrap();
        let cut: Vec<(i32, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT range_no, after_key, upto_key FROM settled_engine.run_key_ranges WHERE run_id = 7 ORDER BY 1",
        )
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        assert_eq!(cut.len(), 10);
        assert_eq!(cut[0], (0, None, Some("k1".into())));
        assert_eq!(cut[5], (5, Some("k5".into()), Some("k6".into())));
        assert_eq!(cut[9], (9, Some("k9".into()), None));
        // One take takes one range.
        let first = ranges.take(&mut conn).await.unwrap().unwrap();
        assert_eq!((first.after, first.upto), (None, Some("k1".into())));
        drop(conn);
        // Twelve loops take at once, each on its own connection, each inside
        // an open transaction until all have taken: nine ranges are left.
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(12));
        let takers: Vec<_> = (0..12)
            .map(|_| {
                let (pool, barrier) = (pool.clone(), barrier.clone());
                tokio::spawn(async move {
                    let mut conn = pool.acquire().await.unwrap();
                    let mut tx = conn.begin().await.unwrap();
                    let taken = ranges.take(&mut tx).await.unwrap();
                    barrier.wait().await;
                    tx.commit().await.unwrap();
                    taken
                })
            })
            .collect();
        let mut taken = Vec::new();
        for taker in takers {
            taken.extend(taker.await.unwrap());
        }
        let mut uppers: Vec<Option<String>> = taken.into_iter().map(|r| r.upto).collect();
        uppers.sort();
        let mut expected: Vec<Option<String>> = (2..=9).map(|i| Some(format!("k{i}"))).collect();
        expected.insert(0, None);
        assert_eq!(uppers, expected, "each of the nine free ranges once");
        let mut conn = pool.acquire().await.unwrap();
        assert!(ranges.take(&mut conn).await.unwrap().is_none());
        // A run without bounds is one range of the whole scope.
        let whole = RunRanges::cut_at(&mut conn, 8, &[]).await.unwrap();
        let range = whole.take(&mut conn).await.unwrap().unwrap();
        assert_eq!((range.after, range.upto), (None, None));
        assert!(whole.take(&mut conn).await.unwrap().is_none());
    }
}
