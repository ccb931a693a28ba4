-- Batches of the chain rail: one transaction through the multi-transfer
-- contract (contracts/PayMany.sol) pays several payouts, from the hot
-- wallet's balance, which the contract may spend once the wallet approved
-- it (an approval is a transaction of its own, signed ahead like any).
--
-- A batch that reverts at the confirmation depth is final: its nonce is
-- spent and none of its attempts can ever be mined again. Its payouts are
-- then given up by that transaction (`given_up`) and signed again in two
-- halves, under new nonces, until the one recipient that makes it revert
-- is alone in its own transaction and fails alone. A payout still has at
-- most one transaction that is not given up: the unique index below, in
-- place of the primary key on the payout alone.

ALTER TABLE settlement.chain_txs
    ADD COLUMN purpose text NOT NULL DEFAULT 'payouts' CHECK (purpose IN ('payouts', 'approve'));

ALTER TABLE settlement.chain_tx_payouts
    ADD COLUMN given_up boolean NOT NULL DEFAULT false,
    DROP CONSTRAINT chain_tx_payouts_pkey,
    ADD PRIMARY KEY (tx_id, position);
CREATE UNIQUE INDEX chain_tx_payouts_one_live ON settlement.chain_tx_payouts (payout_id) WHERE NOT given_up;
CREATE INDEX chain_tx_payouts_payout ON settlement.chain_tx_payouts (payout_id);
ALTER TABLE settlement.chain_tx_payouts DROP CONSTRAINT chain_tx_payouts_tx_id_position_key;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_worker') THEN
        RETURN;
    END IF;
    GRANT UPDATE (given_up) ON settlement.chain_tx_payouts TO settled_worker;
END
$$;
