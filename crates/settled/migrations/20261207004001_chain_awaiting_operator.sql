-- A spent nonce settled cannot account for (docs/architecture.md, "A spent
-- nonce with no receipt"): the node counts the hot wallet's nonce as mined,
-- no attempt of the transaction has a receipt, and no canonical block the
-- node still has holds a transaction of the hot wallet under that nonce (or
-- one of its attempts is mined at depth without a receipt and the token's
-- Transfer logs do not show its transfers). settled does not guess: the
-- transaction keeps its state (its payouts stay `sent`, never paid, never
-- failed), is marked here, and `settled reconcile --chain-rpc-url` names
-- it until an operator acts. A receipt found later still moves it as usual.

ALTER TABLE settlement.chain_txs
    ADD COLUMN awaiting_operator_at  timestamptz,
    ADD COLUMN awaiting_operator_why text CHECK (length(awaiting_operator_why) BETWEEN 1 AND 500),
    ADD CONSTRAINT chain_txs_awaiting_operator_why
        CHECK ((awaiting_operator_at IS NULL) = (awaiting_operator_why IS NULL));

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_worker') THEN
        RETURN;
    END IF;
    GRANT UPDATE (awaiting_operator_at, awaiting_operator_why) ON settlement.chain_txs TO settled_worker;
END
$$;
