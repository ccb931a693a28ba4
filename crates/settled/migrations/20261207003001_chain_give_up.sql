-- A nonce given up (docs/architecture.md, "A nonce given up"): a
-- transaction that can never be valid as signed (the node refuses its bytes
-- for a reason no later state of the chain changes, or an operator gives it
-- up with `settled give-up`) has its nonce filled by a zero-value transfer of
-- the chain's coin from the hot wallet to itself: one more attempt of the
-- same transaction (same nonce, fees raised enough to replace), marked
-- `filler`. Whichever of its attempts is mined counts, exactly as for a
-- replacement. Its payouts are given up by it and signed again under new
-- nonces only when the filler is the attempt confirmed at depth: then the
-- original can never be mined. Mined original: its payouts are paid.

ALTER TABLE settlement.chain_txs
    ADD COLUMN given_up_at  timestamptz,
    ADD COLUMN given_up_why text CHECK (length(given_up_why) BETWEEN 1 AND 500),
    ADD CONSTRAINT chain_txs_given_up_why CHECK ((given_up_at IS NULL) = (given_up_why IS NULL)),
    DROP CONSTRAINT chain_txs_state_check,
    ADD CONSTRAINT chain_txs_state_check
        CHECK (state IN ('signed', 'broadcast', 'included', 'confirmed', 'reverted', 'filled')),
    DROP CONSTRAINT chain_txs_check,
    ADD CONSTRAINT chain_txs_mined_check
        CHECK ((state IN ('included', 'confirmed', 'reverted', 'filled'))
               = (block_number IS NOT NULL AND block_hash IS NOT NULL AND mined_hash IS NOT NULL)),
    -- Only a transaction given up can end filled.
    ADD CONSTRAINT chain_txs_filled_given_up CHECK (state <> 'filled' OR given_up_at IS NOT NULL);

ALTER TABLE settlement.chain_tx_attempts
    ADD COLUMN filler boolean NOT NULL DEFAULT false;

-- Filled is final, like confirmed: its filler at the confirmation depth.
INSERT INTO settlement.chain_tx_moves (from_state, to_state) VALUES ('included', 'filled');

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_worker') THEN
        RETURN;
    END IF;
    GRANT UPDATE (given_up_at, given_up_why) ON settlement.chain_txs TO settled_worker;
END
$$;
