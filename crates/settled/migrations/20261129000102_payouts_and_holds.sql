-- Withdrawals through the API, and holds that stop settlement paying a creator.

-- A withdrawal from a creator's balance. The debit and this row commit in one
-- transaction; the idempotency key makes a repeated request one payout.
CREATE TABLE settlement.payouts (
    id              bigint        GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    creator         text          NOT NULL CHECK (creator ~ '^0x[0-9a-f]{40}$'),
    amount          numeric(78,0) NOT NULL CHECK (amount > 0),
    idempotency_key text          NOT NULL UNIQUE CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    request_hash    text          NOT NULL,
    status          text          NOT NULL DEFAULT 'completed' CHECK (status IN ('completed')),
    created_at      timestamptz   NOT NULL DEFAULT now()
);
CREATE INDEX payouts_creator ON settlement.payouts (creator);

-- An administrative hold: while active (released_at IS NULL), settlement
-- does not pay the creator; its items become 'held'.
CREATE TABLE settlement.creator_holds (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    creator     text        NOT NULL CHECK (creator ~ '^0x[0-9a-f]{40}$'),
    reason      text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 500),
    created_at  timestamptz NOT NULL DEFAULT now(),
    released_at timestamptz,
    CHECK (released_at IS NULL OR released_at >= created_at)
);
-- At most one active hold per creator: the database decides, not a check in code.
CREATE UNIQUE INDEX creator_holds_one_active ON settlement.creator_holds (creator) WHERE released_at IS NULL;
