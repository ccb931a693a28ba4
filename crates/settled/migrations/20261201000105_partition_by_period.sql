-- The work table and the ledger are partitioned by period: one partition per
-- day in each, created ahead (settlement.ensure_period_partitions) when a
-- period is seeded, imported or started. A settled period's partitions can
-- then leave the hot tables whole (`settled archive`): no DELETE, no dead
-- tuples, no bloat left behind by old periods. Native declarative
-- partitioning, so no extension is needed. There is no default partition:
-- a row for a period without partitions is refused, never parked.
--
-- An existing database is moved here in this migration: the unpartitioned
-- tables are renamed, their rows copied into the partitioned ones (every
-- period present gets its partitions), and the old tables dropped, in the
-- migration's one transaction.

-- Periods whose ledger was archived: what left, and where to re-check it.
CREATE TABLE settlement.archived_periods (
    period        date        PRIMARY KEY,
    ledger_rows   bigint      NOT NULL CHECK (ledger_rows >= 0),
    ledger_total  numeric     NOT NULL CHECK (ledger_total >= 0 AND ledger_total = trunc(ledger_total)),
    sha256        text        NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    file          text        NOT NULL,
    -- Where the detached ledger partition is kept (NULL once dropped).
    kept_as       text,
    archived_at   timestamptz NOT NULL DEFAULT now()
);

-- Each creator's ledger total over archived periods, so balances stay
-- provable (balance = carried + live ledger - payouts) after the rows left.
CREATE TABLE settlement.ledger_carry (
    creator    text        PRIMARY KEY CHECK (creator ~ '^0x[0-9a-f]{40}$'),
    amount     numeric     NOT NULL CHECK (amount >= 0 AND amount = trunc(amount)),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Archived ledger partitions are kept here, out of the hot ledger.
CREATE SCHEMA IF NOT EXISTS settlement_archive;

ALTER TABLE settlement.reward_ledger RENAME TO reward_ledger_unpartitioned;
ALTER INDEX settlement.reward_ledger_pkey RENAME TO reward_ledger_unpartitioned_pkey;
ALTER TABLE settlement.token_trade_volume RENAME TO token_trade_volume_unpartitioned;
ALTER INDEX settlement.token_trade_volume_pkey RENAME TO token_trade_volume_unpartitioned_pkey;
ALTER INDEX settlement.token_trade_volume_eligible RENAME TO token_trade_volume_unpartitioned_eligible;
ALTER INDEX settlement.token_trade_volume_processing RENAME TO token_trade_volume_unpartitioned_processing;

CREATE TABLE settlement.token_trade_volume (
    period      date          NOT NULL,
    creator     text          NOT NULL CONSTRAINT token_trade_volume_creator_check CHECK (creator ~ '^0x[0-9a-f]{40}$'),
    volume      numeric(78,0) NOT NULL
                CONSTRAINT token_trade_volume_volume_check CHECK (volume >= 0 AND volume <= 115792089237316195423570985008687907853269984665640564039457584007913129639935),
    status      text          NOT NULL DEFAULT 'eligible'
                CONSTRAINT token_trade_volume_status_check CHECK (status IN ('eligible', 'processing', 'settled', 'failed', 'held')),
    attempt     integer       NOT NULL DEFAULT 0 CONSTRAINT token_trade_volume_attempt_check CHECK (attempt >= 0),
    attempt_base integer      NOT NULL DEFAULT 0
                CONSTRAINT token_trade_volume_attempt_base_check CHECK (attempt_base BETWEEN 0 AND attempt),
    lease_owner uuid,
    lease_until timestamptz,
    not_before  timestamptz,
    last_error  text,
    created_at  timestamptz   NOT NULL DEFAULT now(),
    updated_at  timestamptz   NOT NULL DEFAULT now(),
    fence_epoch integer       NOT NULL DEFAULT 0,
    PRIMARY KEY (period, creator),
    CONSTRAINT token_trade_volume_processing_has_lease CHECK (status <> 'processing' OR lease_until IS NOT NULL)
) PARTITION BY RANGE (period);

CREATE INDEX token_trade_volume_eligible
    ON settlement.token_trade_volume (period, creator) WHERE status = 'eligible';
CREATE INDEX token_trade_volume_processing
    ON settlement.token_trade_volume (period, lease_until) WHERE status = 'processing';

CREATE TABLE settlement.reward_ledger (
    period     date          NOT NULL,
    creator    text          NOT NULL,
    amount     numeric(78,0) NOT NULL CONSTRAINT reward_ledger_amount_check CHECK (amount >= 0),
    run_id     bigint        NOT NULL,
    attempt    integer       NOT NULL CONSTRAINT reward_ledger_attempt_check CHECK (attempt >= 1),
    created_at timestamptz   NOT NULL DEFAULT now(),
    -- No creator is paid twice for a period: the key includes the partition
    -- key, so each partition's unique index is the whole period's.
    PRIMARY KEY (period, creator)
) PARTITION BY RANGE (period);

-- Every ledger row has its item, and its run is a run of its period: checked
-- once per statement over the rows it inserted (a transition table), not
-- per row. The two foreign keys this replaces ((period, creator) to the
-- work table, run_id to the runs) ran two lookups and a row lock per row,
-- half of a million-row insert's time (docs/scale.md, "Ledger checks"); the
-- statement check is a third of theirs and also proves the run's period,
-- which the foreign key did not. What the keys also gave, refusing to
-- delete an item that was paid, is the trigger below.
CREATE FUNCTION settlement.refuse_ledger_rows_without_items() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    SELECT n.period, n.creator, n.run_id INTO bad FROM new_rows n
    WHERE NOT EXISTS (SELECT 1 FROM settlement.token_trade_volume v
                      WHERE v.period = n.period AND v.creator = n.creator)
       OR NOT EXISTS (SELECT 1 FROM settled_engine.runs r
                      WHERE r.id = n.run_id AND r.scope = to_char(n.period, 'YYYY-MM-DD'))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger row (%, %) of run % has no item of its period, or its run is not one of that period',
                        bad.period, bad.creator, bad.run_id
            USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'reward_ledger_rows_have_items';
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER reward_ledger_rows_have_items
    AFTER INSERT ON settlement.reward_ledger REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION settlement.refuse_ledger_rows_without_items();

-- A paid item stays while its period is in the hot tables (archive retires
-- both partitions together).
CREATE FUNCTION settlement.refuse_settled_item_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'item (%, %) is settled: its ledger row needs it', OLD.period, OLD.creator
        USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'settled_items_stay';
END
$$;
CREATE TRIGGER token_trade_volume_settled_items_stay
    BEFORE DELETE ON settlement.token_trade_volume
    FOR EACH ROW WHEN (OLD.status = 'settled') EXECUTE FUNCTION settlement.refuse_settled_item_delete();

-- Row triggers on the parent are cloned onto every partition, present and
-- future; statement triggers (TRUNCATE, the rows-have-items check) are not,
-- and fire only for statements naming the parent, so
-- settlement.ensure_period_partitions adds them to each ledger partition.
CREATE TRIGGER reward_ledger_append_only
    BEFORE UPDATE OR DELETE ON settlement.reward_ledger
    FOR EACH ROW EXECUTE FUNCTION settlement.refuse_ledger_change();
CREATE TRIGGER reward_ledger_no_truncate
    BEFORE TRUNCATE ON settlement.reward_ledger
    FOR EACH STATEMENT EXECUTE FUNCTION settlement.refuse_ledger_change();

-- Creates period p's partitions of the work table and the ledger unless
-- they exist; true when it created one. Refuses an archived period (its
-- ledger rows left the ledger's key, so new items could be paid again).
-- SECURITY DEFINER so a worker starting a run may call it; concurrent
-- callers for one period are serialized by an advisory lock.
CREATE FUNCTION settlement.ensure_period_partitions(p date) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    work   text := 'token_trade_volume_p' || to_char(p, 'YYYYMMDD');
    ledger text := 'reward_ledger_p' || to_char(p, 'YYYYMMDD');
    made   boolean := false;
BEGIN
    IF p IS NULL THEN
        RAISE EXCEPTION 'a period is required' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF to_regclass(format('settlement.%I', work)) IS NOT NULL
       AND to_regclass(format('settlement.%I', ledger)) IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('settlement.ensure_period_partitions'), p - date '2000-01-01');
    IF EXISTS (SELECT 1 FROM settlement.archived_periods WHERE period = p) THEN
        RAISE EXCEPTION 'period % is archived: it can take no new items', p
            USING ERRCODE = 'integrity_constraint_violation', CONSTRAINT = 'period_archived',
                  HINT = 'its ledger was exported and left the database; a correction goes in a later period';
    END IF;
    -- CREATE TABLE then ATTACH, not CREATE TABLE ... PARTITION OF: attaching
    -- takes SHARE UPDATE EXCLUSIVE on the parent, which lets workers and
    -- readers of other periods go on (PARTITION OF would take ACCESS
    -- EXCLUSIVE until the caller commits). The empty table's scan is free;
    -- ATTACH adds the parent's indexes and row triggers.
    IF to_regclass(format('settlement.%I', work)) IS NULL THEN
        EXECUTE format('CREATE TABLE settlement.%I (LIKE settlement.token_trade_volume
                        INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', work);
        EXECUTE format('ALTER TABLE settlement.token_trade_volume ATTACH PARTITION settlement.%I
                        FOR VALUES FROM (%L) TO (%L)', work, p, p + 1);
        made := true;
    END IF;
    IF to_regclass(format('settlement.%I', ledger)) IS NULL THEN
        EXECUTE format('CREATE TABLE settlement.%I (LIKE settlement.reward_ledger
                        INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', ledger);
        EXECUTE format('CREATE TRIGGER reward_ledger_no_truncate BEFORE TRUNCATE ON settlement.%I
                        FOR EACH STATEMENT EXECUTE FUNCTION settlement.refuse_ledger_change()', ledger);
        EXECUTE format('CREATE TRIGGER reward_ledger_rows_have_items AFTER INSERT ON settlement.%I
                        REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
                        EXECUTE FUNCTION settlement.refuse_ledger_rows_without_items()', ledger);
        EXECUTE format('ALTER TABLE settlement.reward_ledger ATTACH PARTITION settlement.%I
                        FOR VALUES FROM (%L) TO (%L)', ledger, p, p + 1);
        made := true;
    END IF;
    RETURN made;
END
$$;
REVOKE ALL ON FUNCTION settlement.ensure_period_partitions(date) FROM PUBLIC;

-- Move the rows of an existing database.
SELECT settlement.ensure_period_partitions(period)
FROM (SELECT period FROM settlement.token_trade_volume_unpartitioned
      UNION SELECT period FROM settlement.reward_ledger_unpartitioned) AS periods;
INSERT INTO settlement.token_trade_volume
    (period, creator, volume, status, attempt, attempt_base, lease_owner, lease_until, not_before,
     last_error, created_at, updated_at, fence_epoch)
SELECT period, creator, volume, status, attempt, attempt_base, lease_owner, lease_until, not_before,
       last_error, created_at, updated_at, fence_epoch
FROM settlement.token_trade_volume_unpartitioned;
INSERT INTO settlement.reward_ledger (period, creator, amount, run_id, attempt, created_at)
SELECT period, creator, amount, run_id, attempt, created_at FROM settlement.reward_ledger_unpartitioned;
DROP TABLE settlement.reward_ledger_unpartitioned;
DROP TABLE settlement.token_trade_volume_unpartitioned;

-- The roles' privileges on the new tables, as before (see the roles migrations).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_worker') THEN
        RETURN;
    END IF;
    GRANT USAGE ON SCHEMA settlement_archive TO settled_readonly;
    GRANT SELECT ON settlement.token_trade_volume, settlement.reward_ledger
          TO settled_readonly, settled_worker, settled_api;
    GRANT SELECT ON settlement.archived_periods, settlement.ledger_carry TO settled_readonly, settled_api;
    GRANT UPDATE ON settlement.token_trade_volume TO settled_worker;
    GRANT INSERT ON settlement.reward_ledger TO settled_worker;
    GRANT UPDATE (status, attempt_base, not_before, updated_at) ON settlement.token_trade_volume TO settled_api;
    GRANT EXECUTE ON FUNCTION settlement.ensure_period_partitions(date) TO settled_worker;
END
$$;
