-- Payouts that leave the database exactly once: one state machine over
-- every payout, its history appended, funds returned exactly once, and a
-- delivery job committed with the debit (the outbox).
--
--   created ──► queued ──► sent ──► paid
--      │           │         └────► failed  (funds returned)
--      │           ├──────────────► paid    (the provider answered paid at once)
--      │           └──────────────► failed  (refused, or failed at once)
--      ├──► cancelled (funds returned)
--      └──► expired   (funds returned: never confirmed)
--
-- paid, failed, cancelled and expired are final: a late or contrary event
-- is recorded, never applied.

-- The allowed transitions: the one table the trigger below checks.
CREATE TABLE settlement.payout_transitions (
    from_state text NOT NULL,
    to_state   text NOT NULL,
    PRIMARY KEY (from_state, to_state)
);
INSERT INTO settlement.payout_transitions (from_state, to_state) VALUES
    ('created', 'queued'), ('created', 'cancelled'), ('created', 'expired'),
    ('queued', 'sent'), ('queued', 'paid'), ('queued', 'failed'),
    ('sent', 'paid'), ('sent', 'failed');

-- Payouts made before this migration were debited and never delivered:
-- they are queued for delivery (and get delivery jobs below).
ALTER TABLE settlement.payouts DROP CONSTRAINT payouts_status_check;
UPDATE settlement.payouts SET status = 'queued' WHERE status = 'completed';
ALTER TABLE settlement.payouts
    ALTER COLUMN status SET DEFAULT 'queued',
    ADD CONSTRAINT payouts_status_check
        CHECK (status IN ('created', 'queued', 'sent', 'paid', 'failed', 'cancelled', 'expired')),
    -- The provider's id, once it accepted the payment.
    ADD COLUMN provider_id text CHECK (length(provider_id) <= 255),
    -- Why the last transition happened (a refusal, a webhook event, an expiry).
    ADD COLUMN reason text CHECK (length(reason) <= 1000),
    -- A payout awaiting confirmation expires then (status 'created' only).
    ADD COLUMN expires_at timestamptz,
    -- The confirmation token (settled_engine.once_tokens), when asked for.
    ADD COLUMN confirm_token uuid,
    -- The W3C trace context of the request that made it.
    ADD COLUMN traceparent text CHECK (length(traceparent) <= 255),
    -- A withdrawal through the API, or a settlement paid to the creator
    -- through the provider (leased mode: the reward credited and paid out
    -- in one transaction, so a failed payment returns it to the balance).
    ADD COLUMN kind text NOT NULL DEFAULT 'withdrawal' CHECK (kind IN ('withdrawal', 'settlement')),
    ADD COLUMN period date,
    ADD COLUMN settlement_key text CHECK (length(settlement_key) <= 255),
    ADD CONSTRAINT payouts_kind_keys CHECK (
        (kind = 'withdrawal' AND idempotency_key IS NOT NULL AND request_hash IS NOT NULL
             AND settlement_key IS NULL AND period IS NULL)
        OR (kind = 'settlement' AND idempotency_key IS NULL AND request_hash IS NULL
             AND settlement_key IS NOT NULL AND period IS NOT NULL)),
    ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN sent_at timestamptz,
    ADD COLUMN finished_at timestamptz,
    ADD CONSTRAINT payouts_expiry_only_while_created
        CHECK (status <> 'created' OR expires_at IS NOT NULL);
ALTER TABLE settlement.payouts ALTER COLUMN idempotency_key DROP NOT NULL, ALTER COLUMN request_hash DROP NOT NULL;
-- The key settled sends the provider: derived from the payout itself, so
-- it is the same on every retry, after any crash, from any worker.
ALTER TABLE settlement.payouts
    ADD COLUMN provider_key text GENERATED ALWAYS AS (coalesce(settlement_key, 'payout-' || id::text)) STORED;
CREATE UNIQUE INDEX payouts_provider_key ON settlement.payouts (provider_key);
CREATE INDEX payouts_by_status ON settlement.payouts (status, updated_at)
    WHERE status IN ('created', 'queued', 'sent');
CREATE UNIQUE INDEX payouts_provider_id ON settlement.payouts (provider_id) WHERE provider_id IS NOT NULL;

-- Every transition, appended: the path to the current state.
CREATE TABLE settlement.payout_history (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payout_id  bigint      NOT NULL REFERENCES settlement.payouts (id),
    from_state text,
    to_state   text        NOT NULL,
    reason     text,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payout_history_by_payout ON settlement.payout_history (payout_id, id);

-- A returned payout's amount, credited back to the balance once: the
-- primary key refuses a second return of the same payout.
CREATE TABLE settlement.payout_returns (
    payout_id   bigint        PRIMARY KEY REFERENCES settlement.payouts (id),
    creator     text          NOT NULL,
    amount      numeric(78,0) NOT NULL CHECK (amount > 0),
    returned_at timestamptz   NOT NULL DEFAULT now()
);
CREATE INDEX payout_returns_by_creator ON settlement.payout_returns (creator);

CREATE FUNCTION settlement.refuse_payout_record_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % is refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER payout_history_append_only BEFORE UPDATE OR DELETE ON settlement.payout_history
    FOR EACH ROW EXECUTE FUNCTION settlement.refuse_payout_record_change();
CREATE TRIGGER payout_history_no_truncate BEFORE TRUNCATE ON settlement.payout_history
    FOR EACH STATEMENT EXECUTE FUNCTION settlement.refuse_payout_record_change();
CREATE TRIGGER payout_returns_append_only BEFORE UPDATE OR DELETE ON settlement.payout_returns
    FOR EACH ROW EXECUTE FUNCTION settlement.refuse_payout_record_change();
CREATE TRIGGER payout_returns_no_truncate BEFORE TRUNCATE ON settlement.payout_returns
    FOR EACH STATEMENT EXECUTE FUNCTION settlement.refuse_payout_record_change();

-- Before any change of a payout: what it pays never changes, and its state
-- moves only along settlement.payout_transitions.
CREATE FUNCTION settlement.check_payout_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.creator IS DISTINCT FROM OLD.creator OR NEW.amount IS DISTINCT FROM OLD.amount
       OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key OR NEW.created_at IS DISTINCT FROM OLD.created_at
       OR NEW.kind IS DISTINCT FROM OLD.kind OR NEW.settlement_key IS DISTINCT FROM OLD.settlement_key THEN
        RAISE EXCEPTION 'payout %: its creator, amount, key and creation time never change', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'payouts_immutable';
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status THEN
        IF NOT EXISTS (SELECT 1 FROM settlement.payout_transitions t
                       WHERE t.from_state = OLD.status AND t.to_state = NEW.status) THEN
            RAISE EXCEPTION 'payout % cannot go from % to %', OLD.id, OLD.status, NEW.status
                USING ERRCODE = 'check_violation', CONSTRAINT = 'payout_transitions';
        END IF;
        NEW.updated_at := now();
        IF NEW.status = 'sent' THEN
            NEW.sent_at := now();
        END IF;
        IF NEW.status IN ('paid', 'failed', 'cancelled', 'expired') THEN
            NEW.finished_at := now();
        END IF;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER payouts_check_change BEFORE UPDATE ON settlement.payouts
    FOR EACH ROW EXECUTE FUNCTION settlement.check_payout_change();
CREATE TRIGGER payouts_no_delete BEFORE DELETE ON settlement.payouts
    FOR EACH ROW EXECUTE FUNCTION settlement.refuse_payout_record_change();

-- After a payout is made or changes state: the history row, and for a
-- payout that ends without paying, its amount back to the balance, in the
-- same transaction as the transition. Runs as its owner: the roles that
-- move a payout may not write balances themselves.
CREATE FUNCTION settlement.record_payout_transition() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.status IS NOT DISTINCT FROM OLD.status THEN
        RETURN NULL;
    END IF;
    INSERT INTO settlement.payout_history (payout_id, from_state, to_state, reason)
    VALUES (NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status, NEW.reason);
    IF NEW.status IN ('failed', 'cancelled', 'expired') THEN
        INSERT INTO settlement.payout_returns (payout_id, creator, amount)
        VALUES (NEW.id, NEW.creator, NEW.amount);
        UPDATE settlement.creator_balance b SET balance = b.balance + NEW.amount, updated_at = now()
        WHERE b.creator = NEW.creator;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'payout %: creator % has no balance to return % to', NEW.id, NEW.creator, NEW.amount
                USING ERRCODE = 'internal_error';
        END IF;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER payouts_record_transition AFTER INSERT OR UPDATE OF status ON settlement.payouts
    FOR EACH ROW EXECUTE FUNCTION settlement.record_payout_transition();

-- History for the payouts made before this migration.
INSERT INTO settlement.payout_history (payout_id, from_state, to_state, reason, at)
SELECT id, NULL, status, 'made before payouts had states', created_at FROM settlement.payouts ORDER BY id;

-- The delivery queue (a continuous queue of settled-engine, one job per
-- payout, keyed by the payout's id): its table as the engine's
-- Queue::table_sql writes it.
CREATE TABLE settlement.payout_jobs (
    payout_id    bigint PRIMARY KEY,
    payload      jsonb       NOT NULL DEFAULT '{}',
    priority     smallint    NOT NULL DEFAULT 0,
    seq          bigint      GENERATED ALWAYS AS IDENTITY,
    enqueued_at  timestamptz NOT NULL DEFAULT now(),
    not_before   timestamptz NOT NULL DEFAULT now(),
    status       text        NOT NULL DEFAULT 'eligible'
                 CHECK (status IN ('eligible', 'processing', 'settled', 'failed', 'cancelled')),
    attempt      integer     NOT NULL DEFAULT 0,
    attempt_base integer     NOT NULL DEFAULT 0,
    fence_epoch  integer     NOT NULL DEFAULT 0,
    lease_owner  uuid,
    lease_until  timestamptz,
    last_error   text,
    errors       jsonb       NOT NULL DEFAULT '[]',
    traceparent  text,
    updated_at   timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
        autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000,
        autovacuum_vacuum_cost_delay = 0);
CREATE INDEX payout_jobs_eligible ON settlement.payout_jobs (priority, not_before, seq) WHERE status = 'eligible';
CREATE INDEX payout_jobs_processing ON settlement.payout_jobs (lease_until) WHERE status = 'processing';
CREATE INDEX payout_jobs_finished ON settlement.payout_jobs (updated_at) WHERE status IN ('settled', 'failed', 'cancelled');
CREATE TRIGGER payout_jobs_wake AFTER INSERT ON settlement.payout_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION settled_engine.queue_wake('payout_delivery');
INSERT INTO settled_engine.queues (name, table_name) VALUES ('payout_delivery', 'settlement.payout_jobs')
    ON CONFLICT (name) DO NOTHING;
INSERT INTO settlement.payout_jobs (payout_id, traceparent)
SELECT id, traceparent FROM settlement.payouts WHERE status = 'queued' ORDER BY id;

-- Makes a payout: the debit, the payout row (queued, or created until
-- confirmed) and, when queued, its delivery job, in the caller's
-- transaction. Replaces the function without states; same refusals.
DROP FUNCTION settlement.debit_for_payout(text, numeric, text, text);
CREATE FUNCTION settlement.debit_for_payout(creator text, amount numeric, idempotency_key text, request_hash text,
                                            confirm_token uuid, expires_at timestamptz, traceparent text)
RETURNS TABLE (outcome text, payout_id bigint, payout_status text, payout_created_at timestamptz,
               balance_before numeric, active_hold bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held numeric;
    hold_id bigint;
    made settlement.payouts;
BEGIN
    IF amount IS NULL OR amount <= 0 OR amount <> trunc(amount) THEN
        RAISE EXCEPTION 'a payout amount is a whole number of base units greater than zero, got %', amount
            USING ERRCODE = 'check_violation', CONSTRAINT = 'payouts_amount_check';
    END IF;
    IF (confirm_token IS NULL) <> (expires_at IS NULL) THEN
        RAISE EXCEPTION 'a payout awaiting confirmation has both a token and an expiry'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'payouts_expiry_only_while_created';
    END IF;
    SELECT b.balance INTO held FROM settlement.creator_balance b
    WHERE b.creator = debit_for_payout.creator FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown_creator', NULL::bigint, NULL::text, NULL::timestamptz, NULL::numeric, NULL::bigint;
        RETURN;
    END IF;
    -- A new statement, so a new snapshot: a hold committed before the lock
    -- was granted is seen; one placed later waits for this transaction.
    SELECT h.id INTO hold_id FROM settlement.creator_holds h
    WHERE h.creator = debit_for_payout.creator AND h.released_at IS NULL;
    IF hold_id IS NOT NULL THEN
        RETURN QUERY SELECT 'on_hold', NULL::bigint, NULL::text, NULL::timestamptz, held, hold_id;
        RETURN;
    END IF;
    IF held < amount THEN
        RETURN QUERY SELECT 'insufficient_funds', NULL::bigint, NULL::text, NULL::timestamptz, held, NULL::bigint;
        RETURN;
    END IF;
    UPDATE settlement.creator_balance b SET balance = b.balance - amount, updated_at = now()
    WHERE b.creator = debit_for_payout.creator AND b.balance >= amount;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the balance of % changed under its lock', debit_for_payout.creator
            USING ERRCODE = 'internal_error';
    END IF;
    INSERT INTO settlement.payouts AS p (creator, amount, idempotency_key, request_hash, status,
                                         confirm_token, expires_at, traceparent, reason)
    VALUES (debit_for_payout.creator, amount, debit_for_payout.idempotency_key, debit_for_payout.request_hash,
            CASE WHEN debit_for_payout.confirm_token IS NULL THEN 'queued' ELSE 'created' END,
            debit_for_payout.confirm_token, debit_for_payout.expires_at, debit_for_payout.traceparent,
            CASE WHEN debit_for_payout.confirm_token IS NULL THEN 'requested' ELSE 'requested, awaiting confirmation' END)
    RETURNING p.* INTO made;
    IF made.status = 'queued' THEN
        INSERT INTO settlement.payout_jobs (payout_id, traceparent) VALUES (made.id, made.traceparent);
    END IF;
    RETURN QUERY SELECT 'paid', made.id, made.status, made.created_at, held, NULL::bigint;
END
$$;

-- Moves payout `id` from one of `from_states` to `to_state` (one
-- conditional update: true when it moved, false when it was not in any of
-- them). Records the provider's id when given. Confirming (created ->
-- queued) also commits the delivery job. The trigger checks the
-- transition, appends the history and returns funds.
CREATE FUNCTION settlement.move_payout(id bigint, from_states text[], to_state text, reason text, provider_id text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    moved settlement.payouts;
BEGIN
    UPDATE settlement.payouts p
    SET status = move_payout.to_state, reason = move_payout.reason,
        provider_id = coalesce(move_payout.provider_id, p.provider_id),
        expires_at = CASE WHEN move_payout.to_state = 'created' THEN p.expires_at END
    WHERE p.id = move_payout.id AND p.status = ANY(move_payout.from_states)
    RETURNING p.* INTO moved;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF moved.status = 'queued' THEN
        INSERT INTO settlement.payout_jobs (payout_id, traceparent) VALUES (moved.id, moved.traceparent)
        ON CONFLICT (payout_id) DO NOTHING;
    END IF;
    RETURN true;
END
$$;

-- Payouts awaiting confirmation past their expiry: expired, funds returned.
CREATE FUNCTION settlement.expire_unconfirmed_payouts(batch integer) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n bigint;
BEGIN
    WITH due AS (
        SELECT p.id FROM settlement.payouts p
        WHERE p.status = 'created' AND p.expires_at <= now()
        ORDER BY p.expires_at LIMIT batch
        FOR NO KEY UPDATE SKIP LOCKED)
    UPDATE settlement.payouts p SET status = 'expired', reason = 'not confirmed before ' || p.expires_at
    FROM due WHERE p.id = due.id AND p.status = 'created';
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;


-- Leased settlement: the creator's reward, credited by the chunk's
-- completion, is paid out through the provider in the same transaction:
-- the payout row (with the provider's answer: sent, paid or failed, a
-- failure returning the amount at once) and its debit. Called after the
-- ledger row and the credit, on the completion's transaction.
CREATE FUNCTION settlement.record_settlement_payment(creator text, amount numeric, period date, settlement_key text,
                                                     provider_id text, status text, reason text)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    made settlement.payouts;
BEGIN
    IF status NOT IN ('sent', 'paid', 'failed') THEN
        RAISE EXCEPTION 'a settlement payment is recorded as sent, paid or failed, not %', status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'payouts_status_check';
    END IF;
    UPDATE settlement.creator_balance b SET balance = b.balance - amount, updated_at = now()
    WHERE b.creator = record_settlement_payment.creator AND b.balance >= amount;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'settlement payment %: creator % was not credited % first', settlement_key, creator, amount
            USING ERRCODE = 'internal_error';
    END IF;
    INSERT INTO settlement.payouts AS p (creator, amount, kind, period, settlement_key, status, provider_id, reason,
                                         sent_at)
    VALUES (record_settlement_payment.creator, amount, 'settlement', period, settlement_key, status, provider_id,
            reason, now())
    RETURNING p.* INTO made;
    RETURN made.id;
END
$$;

-- One provider's limits, shared by the whole fleet: a token bucket of
-- calls per second, and how long the provider is thought to be down.
CREATE TABLE settlement.provider_limits (
    name        text        PRIMARY KEY CHECK (name <> '' AND length(name) <= 100),
    tokens      double precision NOT NULL,
    refilled_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    down_until  timestamptz,
    down_streak integer     NOT NULL DEFAULT 0
);

-- Takes up to `wanted` calls from `name`'s bucket (refilled at `per_second`,
-- holding at most `burst`); returns how many were granted, the seconds to
-- wait before asking again when none, and until when the provider is down.
CREATE FUNCTION settlement.take_provider_calls(name text, wanted integer, per_second double precision,
                                               burst double precision)
RETURNS TABLE (granted integer, wait_secs double precision, down_until timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    row settlement.provider_limits;
    have double precision;
    give integer;
BEGIN
    INSERT INTO settlement.provider_limits AS l (name, tokens) VALUES (take_provider_calls.name, burst)
    ON CONFLICT ON CONSTRAINT provider_limits_pkey DO NOTHING;
    SELECT * INTO row FROM settlement.provider_limits l WHERE l.name = take_provider_calls.name FOR UPDATE;
    have := least(burst, row.tokens + per_second * extract(epoch FROM clock_timestamp() - row.refilled_at));
    give := least(wanted, floor(have))::integer;
    UPDATE settlement.provider_limits l SET tokens = have - give, refilled_at = clock_timestamp()
    WHERE l.name = take_provider_calls.name;
    RETURN QUERY SELECT give,
                        CASE WHEN give > 0 THEN 0 ELSE (1 - have) / per_second END,
                        row.down_until;
END
$$;

-- The provider answered as if down (5xx, timeouts): the whole fleet waits
-- `base * 2^streak` (capped), raised once per outage window, not once per
-- caller; `up` says it answered again.
CREATE FUNCTION settlement.provider_down(name text, base_ms integer, cap_ms integer) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    until timestamptz;
BEGIN
    UPDATE settlement.provider_limits l
    SET down_streak = l.down_streak + 1,
        down_until = clock_timestamp() + least(cap_ms, base_ms * power(2, least(l.down_streak, 20))) * interval '1 ms'
    WHERE l.name = provider_down.name AND (l.down_until IS NULL OR l.down_until < clock_timestamp())
    RETURNING l.down_until INTO until;
    IF until IS NULL THEN
        SELECT l.down_until INTO until FROM settlement.provider_limits l WHERE l.name = provider_down.name;
    END IF;
    RETURN until;
END
$$;
CREATE FUNCTION settlement.provider_up(name text) RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    UPDATE settlement.provider_limits l SET down_streak = 0, down_until = NULL
    WHERE l.name = provider_up.name AND l.down_streak > 0;
$$;

-- The provider's events (webhooks), each applied once: a repeat of an id
-- finds its row and changes nothing. Events for payouts settled does not
-- know are kept for review.
CREATE TABLE settlement.provider_events (
    id          text        PRIMARY KEY CHECK (id <> '' AND length(id) <= 255),
    type        text        NOT NULL CHECK (length(type) <= 100),
    created     bigint      NOT NULL,
    provider_key text,
    payout_id   bigint      REFERENCES settlement.payouts (id),
    outcome     text        NOT NULL
                CHECK (outcome IN ('applied', 'already', 'conflict', 'unknown_payout', 'ignored')),
    detail      text,
    body        jsonb       NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX provider_events_needing_review ON settlement.provider_events (received_at)
    WHERE outcome IN ('conflict', 'unknown_payout');

-- What the provider said that contradicts a final state (paid after failed,
-- or the reverse), from any source: recorded for operators, never applied.
CREATE TABLE settlement.payout_conflicts (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payout_id   bigint      NOT NULL REFERENCES settlement.payouts (id),
    state       text        NOT NULL,
    provider_status text    NOT NULL,
    source      text        NOT NULL CHECK (source IN ('delivery', 'webhook', 'poll', 'reconcile')),
    event_id    text,
    detail      text,
    at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX payout_conflicts_by_payout ON settlement.payout_conflicts (payout_id);

REVOKE ALL ON FUNCTION settlement.debit_for_payout(text, numeric, text, text, uuid, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.record_settlement_payment(text, numeric, date, text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.take_provider_calls(text, integer, double precision, double precision) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.provider_down(text, integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.provider_up(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.move_payout(bigint, text[], text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.expire_unconfirmed_payouts(integer) FROM PUBLIC;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_api') THEN
        RETURN;
    END IF;
    GRANT EXECUTE ON FUNCTION settlement.debit_for_payout(text, numeric, text, text, uuid, timestamptz, text)
        TO settled_api;
    -- Confirming and cancelling (the API), webhooks (the API), delivery and
    -- polling (the worker): every state change goes through move_payout.
    GRANT EXECUTE ON FUNCTION settlement.move_payout(bigint, text[], text, text, text) TO settled_api, settled_worker;
    GRANT EXECUTE ON FUNCTION settlement.expire_unconfirmed_payouts(integer) TO settled_worker;
    GRANT SELECT ON settlement.payout_transitions, settlement.payout_history, settlement.payout_returns
        TO settled_api, settled_worker, settled_readonly;
    GRANT SELECT ON settlement.payout_jobs TO settled_api, settled_readonly;
    GRANT EXECUTE ON FUNCTION settlement.record_settlement_payment(text, numeric, date, text, text, text, text)
        TO settled_worker;
    GRANT EXECUTE ON FUNCTION settlement.take_provider_calls(text, integer, double precision, double precision),
                              settlement.provider_down(text, integer, integer), settlement.provider_up(text)
        TO settled_worker;
    GRANT SELECT ON settlement.provider_limits TO settled_worker, settled_api, settled_readonly;
    -- Webhooks (the API) and polling (the worker) record events and conflicts.
    GRANT SELECT, INSERT ON settlement.provider_events TO settled_api;
    GRANT SELECT ON settlement.provider_events TO settled_worker, settled_readonly;
    GRANT SELECT, INSERT ON settlement.payout_conflicts TO settled_api, settled_worker;
    GRANT SELECT ON settlement.payout_conflicts TO settled_readonly;
    -- The delivery worker serves the queue: the engine's statements on the
    -- job rows (claim, complete, fail, renew, rescue, prune).
    GRANT SELECT, UPDATE, DELETE ON settlement.payout_jobs TO settled_worker;
    GRANT SELECT ON settled_engine.queues TO settled_worker;
END
$$;
