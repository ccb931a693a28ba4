-- settlement: creator rewards from token trade volume. Money is NUMERIC(78,0):
-- exact integers up to 2^256 - 1 for one amount.
CREATE SCHEMA IF NOT EXISTS settlement;

-- The fee policy of a period: reward = floor(volume * fee_bps / 10000).
CREATE TABLE settlement.settlement_policy (
    period     date        PRIMARY KEY,
    fee_bps    integer     NOT NULL CHECK (fee_bps BETWEEN 0 AND 10000),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The work table: one item per (period, creator). The engine claims its rows.
CREATE TABLE settlement.token_trade_volume (
    period      date          NOT NULL,
    creator     text          NOT NULL CHECK (creator ~ '^0x[0-9a-f]{40}$'),
    volume      numeric(78,0) NOT NULL
                CHECK (volume >= 0 AND volume <= 115792089237316195423570985008687907853269984665640564039457584007913129639935),
    status      text          NOT NULL DEFAULT 'eligible'
                CHECK (status IN ('eligible', 'processing', 'settled', 'failed', 'held')),
    attempt     integer       NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    attempt_base integer      NOT NULL DEFAULT 0 CHECK (attempt_base BETWEEN 0 AND attempt),
    lease_owner uuid,
    lease_until timestamptz,
    not_before  timestamptz,
    last_error  text,
    created_at  timestamptz   NOT NULL DEFAULT now(),
    updated_at  timestamptz   NOT NULL DEFAULT now(),
    PRIMARY KEY (period, creator),
    -- A processing item always has a lease that can expire.
    CHECK (status <> 'processing' OR lease_until IS NOT NULL)
);

-- Claims and progress counts read only what is still to do.
CREATE INDEX token_trade_volume_eligible
    ON settlement.token_trade_volume (period, creator) WHERE status = 'eligible';
CREATE INDEX token_trade_volume_processing
    ON settlement.token_trade_volume (period, lease_until) WHERE status = 'processing';

-- The ledger: one row per creator per period, forever.
CREATE TABLE settlement.reward_ledger (
    period     date          NOT NULL,
    creator    text          NOT NULL,
    amount     numeric(78,0) NOT NULL CHECK (amount >= 0),
    run_id     bigint        NOT NULL REFERENCES settled_engine.runs (id),
    attempt    integer       NOT NULL CHECK (attempt >= 1),
    created_at timestamptz   NOT NULL DEFAULT now(),
    -- No creator is paid twice for a period.
    PRIMARY KEY (period, creator),
    FOREIGN KEY (period, creator) REFERENCES settlement.token_trade_volume (period, creator)
);

-- A creator's balance: the sum of its ledger rows (less what it withdrew).
CREATE TABLE settlement.creator_balance (
    creator    text          PRIMARY KEY CHECK (creator ~ '^0x[0-9a-f]{40}$'),
    balance    numeric(78,0) NOT NULL DEFAULT 0 CHECK (balance >= 0),
    updated_at timestamptz   NOT NULL DEFAULT now()
);

-- The ledger is append-only, for its owner too.
CREATE FUNCTION settlement.refuse_ledger_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'settlement.reward_ledger is append-only: % is refused', TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              HINT = 'a wrong entry is corrected by a new entry in a later period, never by editing';
END
$$;

CREATE TRIGGER reward_ledger_append_only
    BEFORE UPDATE OR DELETE ON settlement.reward_ledger
    FOR EACH ROW EXECUTE FUNCTION settlement.refuse_ledger_change();

CREATE TRIGGER reward_ledger_no_truncate
    BEFORE TRUNCATE ON settlement.reward_ledger
    FOR EACH STATEMENT EXECUTE FUNCTION settlement.refuse_ledger_change();

-- A period's policy is frozen once a run for it exists. The row lock taken by
-- UPDATE/DELETE before this trigger runs orders it after any run start, which
-- holds FOR SHARE on the same row while it inserts the run.
CREATE FUNCTION settlement.refuse_policy_change_after_run() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM settled_engine.runs
               WHERE job = 'creator-rewards' AND period = OLD.period::text) THEN
        RAISE EXCEPTION 'the policy of period % is frozen: a run for it has started', OLD.period
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$;

CREATE TRIGGER settlement_policy_frozen_after_run
    BEFORE UPDATE OR DELETE ON settlement.settlement_policy
    FOR EACH ROW EXECUTE FUNCTION settlement.refuse_policy_change_after_run();
