-- The settlement of one creator, as each peer's job runs it: mark the item
-- settled, write its ledger row, credit its balance; one statement, so one
-- round trip and atomic. $1 period, $2 creator, $3 run id.
WITH item AS (
    UPDATE settlement.token_trade_volume
    SET status = 'settled', attempt = attempt + 1, updated_at = now()
    WHERE period = $1::date AND creator = $2 AND status = 'eligible'
    RETURNING period, creator, volume, attempt
), credited AS (
    INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt)
    SELECT i.period, i.creator, div(i.volume * p.fee_bps, 10000), $3::bigint, i.attempt
    FROM item i JOIN settlement.settlement_policy p ON p.period = i.period
    RETURNING creator, amount
)
INSERT INTO settlement.creator_balance AS b (creator, balance)
SELECT creator, amount FROM credited
ON CONFLICT (creator) DO UPDATE
SET balance = b.balance + EXCLUDED.balance, updated_at = now()
