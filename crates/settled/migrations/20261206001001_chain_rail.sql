-- The chain rail: payouts paid by ERC-20 transfers signed by settled's hot
-- wallet (docs/architecture.md, "The chain rail").
--
-- Write-ahead signing: a transaction is signed and stored (its raw bytes,
-- hash and nonce, with the payouts it pays) in one database transaction,
-- under a row lock on its sender's nonce row, before it is ever broadcast.
-- Whoever broadcasts later (after a crash, from another process) sends
-- those same bytes: a payout has one nonce for ever, so no path can sign a
-- second transfer for it that could also be mined.

-- The next nonce of each sender on each chain; locked FOR UPDATE while a
-- transaction is signed, so processes sharing a sender neither collide nor
-- leave a gap.
CREATE TABLE settlement.chain_senders (
    chain_id   bigint NOT NULL CHECK (chain_id > 0),
    sender     text   NOT NULL CHECK (sender ~ '^0x[0-9a-f]{40}$'),
    next_nonce bigint NOT NULL CHECK (next_nonce >= 0),
    PRIMARY KEY (chain_id, sender)
);

-- One transaction per (chain, sender, nonce): the nonce is its identity;
-- its attempts (replacements under the same nonce) are rows of
-- chain_tx_attempts. `state` moves only along settlement.chain_tx_moves.
CREATE TABLE settlement.chain_txs (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    chain_id     bigint      NOT NULL,
    sender       text        NOT NULL,
    nonce        bigint      NOT NULL CHECK (nonce >= 0),
    -- The called contract: the token (one transfer) or the batch contract.
    target       text        NOT NULL CHECK (target ~ '^0x[0-9a-f]{40}$'),
    token        text        NOT NULL CHECK (token ~ '^0x[0-9a-f]{40}$'),
    state        text        NOT NULL DEFAULT 'signed'
                 CHECK (state IN ('signed', 'broadcast', 'included', 'confirmed', 'reverted')),
    -- Where an attempt of it was mined (set while included, confirmed or reverted).
    block_number bigint      CHECK (block_number >= 0),
    block_hash   text        CHECK (block_hash ~ '^0x[0-9a-f]{64}$'),
    mined_hash   text        CHECK (mined_hash ~ '^0x[0-9a-f]{64}$'),
    created_at   timestamptz NOT NULL DEFAULT now(),
    broadcast_at timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (chain_id, sender, nonce),
    FOREIGN KEY (chain_id, sender) REFERENCES settlement.chain_senders (chain_id, sender),
    CHECK ((state IN ('included', 'confirmed', 'reverted'))
           = (block_number IS NOT NULL AND block_hash IS NOT NULL AND mined_hash IS NOT NULL))
);
CREATE INDEX chain_txs_in_flight ON settlement.chain_txs (chain_id, sender, nonce)
    WHERE state IN ('signed', 'broadcast', 'included');

-- Every signed attempt of a transaction, kept for ever: whichever is mined
-- counts, and exactly one can be (they share the nonce).
CREATE TABLE settlement.chain_tx_attempts (
    tx_id                    bigint        NOT NULL REFERENCES settlement.chain_txs (id),
    attempt                  integer       NOT NULL CHECK (attempt >= 1),
    hash                     text          NOT NULL UNIQUE CHECK (hash ~ '^0x[0-9a-f]{64}$'),
    raw                      bytea         NOT NULL,
    gas_limit                bigint        NOT NULL CHECK (gas_limit > 0),
    max_fee_per_gas          numeric(78,0) NOT NULL CHECK (max_fee_per_gas > 0),
    max_priority_fee_per_gas numeric(78,0) NOT NULL CHECK (max_priority_fee_per_gas >= 0),
    signed_at                timestamptz   NOT NULL DEFAULT now(),
    PRIMARY KEY (tx_id, attempt)
);

-- The payouts a transaction pays, in call order. A payout's row is its
-- one transaction for ever: the primary key refuses a second.
CREATE TABLE settlement.chain_tx_payouts (
    payout_id bigint        PRIMARY KEY REFERENCES settlement.payouts (id),
    tx_id     bigint        NOT NULL REFERENCES settlement.chain_txs (id),
    position  integer       NOT NULL CHECK (position >= 0),
    recipient text          NOT NULL CHECK (recipient ~ '^0x[0-9a-f]{40}$'),
    amount    numeric(78,0) NOT NULL CHECK (amount > 0),
    UNIQUE (tx_id, position)
);

-- The transitions a transaction may make. Included goes back to broadcast
-- when its block leaves the canonical chain (a reorg); confirmed and
-- reverted are final (only at the confirmation depth).
CREATE TABLE settlement.chain_tx_moves (
    from_state text NOT NULL,
    to_state   text NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO settlement.chain_tx_moves (from_state, to_state) VALUES
    ('signed', 'broadcast'),
    ('signed', 'included'),
    ('broadcast', 'included'),
    ('included', 'broadcast'),
    ('included', 'confirmed'),
    ('included', 'reverted');

-- Every transition of a transaction, appended.
CREATE TABLE settlement.chain_tx_history (
    tx_id        bigint      NOT NULL REFERENCES settlement.chain_txs (id),
    from_state   text        NOT NULL,
    to_state     text        NOT NULL,
    block_number bigint,
    block_hash   text,
    mined_hash   text,
    at           timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX chain_tx_history_tx ON settlement.chain_tx_history (tx_id, at);

CREATE FUNCTION settlement.check_chain_tx_move() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM settlement.chain_tx_moves m
                   WHERE m.from_state = OLD.state AND m.to_state = NEW.state) THEN
        RAISE EXCEPTION 'chain transaction % may not move from % to %', OLD.id, OLD.state, NEW.state
            USING ERRCODE = 'check_violation', CONSTRAINT = 'chain_txs_moves';
    END IF;
    INSERT INTO settlement.chain_tx_history (tx_id, from_state, to_state, block_number, block_hash, mined_hash)
    VALUES (OLD.id, OLD.state, NEW.state, NEW.block_number, NEW.block_hash, NEW.mined_hash);
    NEW.updated_at := now();
    RETURN NEW;
END
$$;
CREATE TRIGGER chain_txs_moves BEFORE UPDATE OF state ON settlement.chain_txs
    FOR EACH ROW WHEN (NEW.state IS DISTINCT FROM OLD.state)
    EXECUTE FUNCTION settlement.check_chain_tx_move();
REVOKE ALL ON FUNCTION settlement.check_chain_tx_move() FROM PUBLIC;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_worker') THEN
        RETURN;
    END IF;
    GRANT SELECT, INSERT, UPDATE ON settlement.chain_senders TO settled_worker;
    GRANT SELECT, INSERT ON settlement.chain_txs, settlement.chain_tx_attempts,
                            settlement.chain_tx_payouts, settlement.chain_tx_history TO settled_worker;
    GRANT UPDATE (state, block_number, block_hash, mined_hash, broadcast_at) ON settlement.chain_txs TO settled_worker;
    GRANT SELECT ON settlement.chain_senders, settlement.chain_txs, settlement.chain_tx_attempts,
                    settlement.chain_tx_payouts, settlement.chain_tx_moves, settlement.chain_tx_history
        TO settled_api, settled_readonly;
    GRANT SELECT ON settlement.chain_tx_moves TO settled_worker;
END
$$;
