-- The provider's key window. settled sends every payment under a key the
-- provider applies once, and used to take that for ever. Real providers
-- keep a key for a window (Stripe may prune one after 24 hours; some keep
-- them for minutes) and then take a request under it as new: a payout
-- whose answer was lost and retried late, or a dead letter replayed after
-- the window, would be paid twice under the same key.
--
-- So settled records when it first used each key, and before any call
-- under a key first used longer ago than the window (--provider-key-window)
-- it looks the payment up by its reference instead; it sends again only
-- when the provider certainly has no payment for it. When the provider
-- cannot say, the key waits for an operator and nothing is sent under it.

-- Each provider key settled called under: when first, and whether it waits
-- for an operator. Keyed by the key, not the payout: a settlement item is
-- paid before its payout row exists.
CREATE TABLE settlement.provider_keys (
    key              text        PRIMARY KEY CHECK (key <> '' AND length(key) <= 255),
    first_used_at    timestamptz NOT NULL DEFAULT now(),
    -- Set when, past the window, the provider could not say whether it
    -- holds a payment for the key's reference: nothing is sent under the
    -- key until an operator clears it (settlement.renew_provider_key).
    awaiting_operator_since timestamptz,
    awaiting_operator_detail text CHECK (length(awaiting_operator_detail) <= 1000),
    CHECK ((awaiting_operator_since IS NULL) = (awaiting_operator_detail IS NULL))
);
CREATE INDEX provider_keys_awaiting_operator ON settlement.provider_keys (awaiting_operator_since)
    WHERE awaiting_operator_since IS NOT NULL;

-- Keys used before this migration: first used no later than their payout
-- was made (an earlier first use is the safe side: the look-up comes sooner).
INSERT INTO settlement.provider_keys (key, first_used_at)
SELECT provider_key, created_at FROM settlement.payouts
ON CONFLICT (key) DO NOTHING;

-- Records the first use of each of `keys` unless already recorded, and
-- answers for each how long ago that first use was (`age_ms`; the caller
-- compares it with the provider's key window right before its call, so a
-- process paused in between still counts the pause) and why it waits for
-- an operator, if it does. Called before the calls are made. The first use
-- recorded is now, or the creation of the key's payout if that is earlier:
-- a payout exists before any call under its key, so even when a recorded
-- first use was lost (an asynchronous commit lost in a crash or a
-- failover, the payout's row kept), the key is never taken for younger
-- than it is. (A settlement item's key has no payout before its
-- completion: its first use is the first call settled recorded.)
CREATE FUNCTION settlement.note_provider_key_uses(keys text[])
RETURNS TABLE (key text, age_ms bigint, awaiting_operator text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO settlement.provider_keys AS k (key, first_used_at)
    SELECT u.key, least(now(), (SELECT min(p.created_at) FROM settlement.payouts p WHERE p.provider_key = u.key))
    FROM (SELECT DISTINCT x.key FROM unnest(keys) AS x(key)) u ORDER BY 1
    ON CONFLICT ON CONSTRAINT provider_keys_pkey DO NOTHING;
    -- A new statement, so a new snapshot: a first use another caller
    -- committed meanwhile is read, not overwritten.
    RETURN QUERY
    SELECT k.key, (extract(epoch FROM clock_timestamp() - k.first_used_at) * 1000)::bigint,
           k.awaiting_operator_detail
    FROM settlement.provider_keys k WHERE k.key = ANY(keys);
END
$$;

-- Key `key` waits for an operator: past its window, the provider could not
-- say whether it holds a payment for it (`detail` says what it answered).
-- The first detail stays. True when it did not wait before.
CREATE FUNCTION settlement.await_operator_on_key(key text, detail text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE settlement.provider_keys k
    SET awaiting_operator_since = now(), awaiting_operator_detail = left(detail, 1000)
    WHERE k.key = await_operator_on_key.key AND k.awaiting_operator_since IS NULL;
    RETURN FOUND;
END
$$;

-- An operator checked with the provider that it holds no payment under
-- key `key`: its window starts again (the next call under it may send)
-- and it no longer waits. Only the owner may: it is the one statement
-- that lets a key past its window be sent under again without the
-- provider's word. True when the key was known.
CREATE FUNCTION settlement.renew_provider_key(key text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE settlement.provider_keys k
    SET first_used_at = now(), awaiting_operator_since = NULL, awaiting_operator_detail = NULL
    WHERE k.key = renew_provider_key.key;
    RETURN FOUND;
END
$$;

REVOKE ALL ON FUNCTION settlement.note_provider_key_uses(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.await_operator_on_key(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.renew_provider_key(text) FROM PUBLIC;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_worker') THEN
        RETURN;
    END IF;
    GRANT EXECUTE ON FUNCTION settlement.note_provider_key_uses(text[]),
                              settlement.await_operator_on_key(text, text)
        TO settled_worker;
    GRANT SELECT ON settlement.provider_keys TO settled_worker, settled_api, settled_readonly;
END
$$;
