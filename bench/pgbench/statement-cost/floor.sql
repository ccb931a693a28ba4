-- The set-based floor of `settled bench` (crates/lab/src/bench/floors.rs,
-- SET_BASED_SQL) for period :'period' and run :run: four statements in one
-- transaction. Run with psql -v period=... -v run=....
BEGIN;
UPDATE settlement.token_trade_volume_p20261201 t
SET status = 'held', attempt = t.attempt + 1, lease_owner = NULL, lease_until = NULL, updated_at = now()
WHERE t.period = :'period' AND t.status = 'eligible' AND (t.not_before IS NULL OR t.not_before <= now())
  AND t.creator IN (SELECT h.creator FROM settlement.creator_holds h WHERE h.released_at IS NULL);
INSERT INTO settlement.reward_ledger_p20261201 (period, creator, amount, run_id, attempt)
SELECT v.period, v.creator, settlement.reward(v.volume, p.fee_bps), :run, v.attempt + 1
FROM settlement.token_trade_volume_p20261201 v
JOIN settlement.settlement_policy p ON p.period = v.period
WHERE v.period = :'period' AND v.status = 'eligible' AND (v.not_before IS NULL OR v.not_before <= now());
MERGE INTO settlement.creator_balance b
USING (SELECT l.creator, l.amount FROM settlement.reward_ledger_p20261201 l
       WHERE l.period = :'period' AND l.run_id = :run) c
ON b.creator = c.creator
WHEN MATCHED THEN UPDATE SET balance = b.balance + c.amount, updated_at = now()
WHEN NOT MATCHED THEN INSERT (creator, balance) VALUES (c.creator, c.amount);
UPDATE settlement.token_trade_volume_p20261201 t
SET status = 'settled', attempt = t.attempt + 1, lease_owner = NULL, lease_until = NULL,
    last_error = NULL, not_before = NULL, updated_at = now()
WHERE t.period = :'period' AND t.status = 'eligible' AND (t.not_before IS NULL OR t.not_before <= now());
COMMIT;
