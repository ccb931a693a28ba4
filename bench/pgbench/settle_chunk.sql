-- One chunk of the in-transaction settlement, generated from the product's own
-- statements (settled-engine's queue, settled's settlement): claim with SKIP LOCKED,
-- look up holds, pay with the claim's fences, mark settled, commit.
-- Variables: :period (date), :run (run id), :chunk. Do not edit: a test compares it.
BEGIN;
SELECT coalesce(array_agg(key), '{}') AS keys, coalesce(array_agg(fence), '{}') AS fences FROM (
SELECT t.creator::text AS key, (t.attempt + 1)::bigint AS fence
                 FROM settlement.token_trade_volume t
                 WHERE t.period = CAST(:period AS date)
                   AND t.status = 'eligible'
                   AND (t.not_before IS NULL OR t.not_before <= now())
                   AND EXISTS (SELECT 1 FROM settled_engine.runs r WHERE r.id = :run AND r.state = 'running')
                 LIMIT :chunk
                 FOR NO KEY UPDATE OF t SKIP LOCKED) claimed \gset
SELECT creator FROM settlement.creator_holds WHERE released_at IS NULL AND creator = ANY(:keys);
WITH credited AS (
    INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt)
    SELECT v.period, v.creator, settlement.reward(v.volume, p.fee_bps), :run, f.fence
    FROM (SELECT t.period, t.creator, t.volume FROM settlement.token_trade_volume t
          WHERE t.period = :period::date AND t.creator = ANY(:keys) OFFSET 0) v
    JOIN unnest(:keys::text[], :fences::integer[]) AS f(creator, fence) ON f.creator = v.creator
    JOIN settlement.settlement_policy p ON p.period = v.period
    ORDER BY v.creator
    RETURNING creator, amount
)
INSERT INTO settlement.creator_balance AS b (creator, balance)
SELECT creator, amount FROM credited ORDER BY creator
ON CONFLICT (creator) DO UPDATE
SET balance = b.balance + EXCLUDED.balance, updated_at = now();
UPDATE settlement.token_trade_volume
                 SET status = 'settled', attempt = attempt + 1, lease_owner = NULL,
                     lease_until = NULL, last_error = NULL, not_before = NULL, updated_at = now()
                 WHERE period = CAST(:period AS date)
                   AND creator = ANY(CAST(:keys AS text[]))
                   AND status = 'eligible';
COMMIT;
