-- One chunk of the in-transaction settlement, generated from the product's own
-- statement (settled-engine's one-statement chunk with settled's effects and holds):
-- claim with SKIP LOCKED, mark settled, pay, credit, in one statement; commit.
-- Variables: :period (date), :run (run id), :chunk. Do not edit: a test compares it.
BEGIN;
WITH run AS (SELECT CAST(:run AS bigint) AS id),
         picked AS (
             SELECT t.tableoid AS engine_rel, t.ctid AS engine_tid, t.period, t.creator
             FROM settlement.token_trade_volume t
             WHERE t.period = CAST(:period AS date)
                   AND t.status = 'eligible'
                   AND (t.not_before IS NULL OR t.not_before <= now())
                   AND EXISTS (SELECT 1 FROM settled_engine.runs r WHERE r.id = :run AND r.state = 'running')
             ORDER BY t.creator
             LIMIT :chunk
             FOR NO KEY UPDATE OF t SKIP LOCKED),
         held AS MATERIALIZED (SELECT h.creator AS key FROM settlement.creator_holds h
     WHERE h.released_at IS NULL AND h.creator IN (SELECT creator FROM picked)),
         marked AS (
             UPDATE settlement.token_trade_volume t
             SET status = CASE WHEN h.key IS NULL THEN 'settled' ELSE 'held' END,
                 attempt = t.attempt + 1, lease_owner = NULL, lease_until = NULL,
                 last_error = CASE WHEN h.key IS NULL THEN NULL ELSE t.last_error END,
                 not_before = CASE WHEN h.key IS NULL THEN NULL ELSE t.not_before END,
                 updated_at = now()
             FROM picked p LEFT JOIN held h ON h.key = p.creator
             WHERE t.period = CAST(:period AS date)
               AND t.tableoid = p.engine_rel AND t.ctid = p.engine_tid
               AND t.creator = p.creator AND t.status = 'eligible'
             RETURNING t.*),
         settled AS (SELECT * FROM marked WHERE status = 'settled'),
         
credited AS (
    INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt)
    SELECT s.period, s.creator, settlement.reward(s.volume, p.fee_bps), r.id, s.attempt
    FROM settled s
    JOIN settlement.settlement_policy p ON p.period = s.period
    CROSS JOIN run r
    ORDER BY s.creator
    RETURNING creator, amount
),
raised AS (
    UPDATE settlement.creator_balance b
    SET balance = b.balance + c.amount, updated_at = now()
    FROM credited c
    WHERE b.creator = c.creator
    RETURNING b.creator
),
opened AS (
    INSERT INTO settlement.creator_balance (creator, balance)
    SELECT c.creator, c.amount FROM credited c
    WHERE c.creator NOT IN (SELECT r.creator FROM raised r)
    ORDER BY c.creator
    RETURNING creator
),
effects AS (SELECT creator FROM raised UNION ALL SELECT creator FROM opened)
         SELECT c.claimed, m.marked, m.settled, e.effects, c.last_key, m.held_keys
         FROM (SELECT count(*) AS claimed, max(p.creator)::text AS last_key FROM picked p) c,
              (SELECT count(*) AS marked, count(*) FILTER (WHERE m.status = 'settled') AS settled,
                      array_agg(m.creator::text) FILTER (WHERE m.status = 'held') AS held_keys
               FROM marked m) m,
              (SELECT count(*) AS effects FROM effects) e;
COMMIT;
