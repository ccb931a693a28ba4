-- What each deliverer paying on a chain last saw of its hot wallet on the
-- node, so `settled serve` can export it at scrape time without a node of
-- its own (docs/operations.md, "The chain rail"): the gas balance, and the
-- newest reconciliation with the chain's Transfer logs. One row per
-- (chain, sender), overwritten in place: it is a gauge, not history.
CREATE TABLE settlement.chain_wallet_watch (
    chain_id             bigint        NOT NULL,
    sender               text          NOT NULL,
    -- The wallet's balance of the chain's own coin (for gas), in wei.
    gas_balance          numeric(78,0) NOT NULL CHECK (gas_balance >= 0),
    observed_at          timestamptz   NOT NULL DEFAULT now(),
    -- The newest `chain::reconcile` the deliverer ran: how many mismatches,
    -- the first of them, and when (NULL until one ran).
    reconcile_mismatches integer       CHECK (reconcile_mismatches >= 0),
    reconcile_first      text,
    reconciled_at        timestamptz,
    PRIMARY KEY (chain_id, sender),
    FOREIGN KEY (chain_id, sender) REFERENCES settlement.chain_senders (chain_id, sender),
    CHECK ((reconcile_mismatches IS NULL) = (reconciled_at IS NULL))
);

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_worker') THEN
        RETURN;
    END IF;
    GRANT SELECT, INSERT, UPDATE ON settlement.chain_wallet_watch TO settled_worker;
    GRANT SELECT ON settlement.chain_wallet_watch TO settled_api, settled_readonly;
END
$$;

-- Reorgs seen (an included transaction sent back to broadcast), counted at
-- every scrape: a partial index keeps that count off the whole history.
CREATE INDEX chain_tx_history_reorgs ON settlement.chain_tx_history (tx_id)
    WHERE from_state = 'included' AND to_state = 'broadcast';
