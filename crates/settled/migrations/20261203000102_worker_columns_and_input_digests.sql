-- settled_worker may update only the work table's columns its statements
-- write (claims, completions, failures, the rescuer, lease renewals and
-- releases, in both modes): never `period`, `creator` or `volume`, which
-- decide what is paid, nor `attempt_base`, which only `settled retry` and
-- the API's retry set. A volume raised by a worker login was paid, and
-- `settled verify` (which recomputes amounts from the volumes) said OK.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_worker') THEN
        RETURN;
    END IF;
    REVOKE UPDATE ON settlement.token_trade_volume FROM settled_worker;
    GRANT UPDATE (status, attempt, fence_epoch, lease_owner, lease_until, not_before, last_error, updated_at)
        ON settlement.token_trade_volume TO settled_worker;
END
$$;

-- What each period's input was when it was written: its number of items and
-- an order-independent digest of them, the sum of one number per item
-- (settlement.input_digest of its creator and volume). A sum, so rows added
-- by `import --append` add to it. Written by a statement trigger on the work
-- table in the inserting transaction, so seed and import (and any INSERT
-- through the work table) record what they wrote, and nothing else does: an
-- UPDATE or DELETE of an item leaves it as it was, and `settled verify`
-- (check `items_match_their_input`) recomputes both from the items and
-- names a difference. A check against change, not a signature: whoever may
-- write this table may write it to match.
CREATE TABLE settlement.period_inputs (
    period     date        PRIMARY KEY,
    items      bigint      NOT NULL CHECK (items >= 0),
    digest     numeric     NOT NULL CHECK (digest = trunc(digest)),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One item's share of the digest: the first 64 bits of the SHA-256 of
-- `creator:volume`, as a signed integer. Immutable and inlined, like
-- settlement.reward: a million items cost about a second.
CREATE FUNCTION settlement.input_digest(creator text, volume numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ('x' || encode(sha256((creator || ':' || volume::text)::bytea), 'hex'))::bit(64)::bigint::numeric $$;

CREATE FUNCTION settlement.record_period_inputs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO settlement.period_inputs AS p (period, items, digest)
    SELECT n.period, count(*), sum(settlement.input_digest(n.creator, n.volume))
    FROM new_items n GROUP BY n.period ORDER BY n.period
    ON CONFLICT (period) DO UPDATE
    SET items = p.items + EXCLUDED.items, digest = p.digest + EXCLUDED.digest, updated_at = now();
    RETURN NULL;
END
$$;

CREATE TRIGGER token_trade_volume_inputs_recorded
    AFTER INSERT ON settlement.token_trade_volume REFERENCING NEW TABLE AS new_items
    FOR EACH STATEMENT EXECUTE FUNCTION settlement.record_period_inputs();

-- The periods present, as they are now.
INSERT INTO settlement.period_inputs (period, items, digest)
SELECT period, count(*), sum(settlement.input_digest(creator, volume))
FROM settlement.token_trade_volume GROUP BY period;

-- Read by `settled verify` and by the dashboard's verification of a run.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_readonly') THEN
        RETURN;
    END IF;
    GRANT SELECT ON settlement.period_inputs TO settled_readonly, settled_api;
END
$$;

-- The work table's partitions follow its grants (migration 20261203000101).
SELECT settlement.sync_partition_grants();
