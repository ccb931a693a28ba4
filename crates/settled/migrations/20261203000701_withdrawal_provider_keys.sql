-- A withdrawal's provider key comes from its request's idempotency key, no
-- longer from its id. An asynchronous failover can lose the commits of
-- payouts already delivered, their ids with them: the new primary hands
-- those ids out again, and a payout keyed by its id then met the lost
-- payout's payment at the provider (a different body under the key,
-- refused; the payout stuck in 'queued'). The idempotency key is the
-- client's: it comes back only with the same request (its retry after the
-- failover, which the provider then answers with the first payment, so it
-- is paid once), never with another. Settlement payouts keep their
-- (period, creator) keys; payouts made before this migration keep
-- 'payout-' || id, which may already be at the provider.

ALTER TABLE settlement.payouts ADD COLUMN provider_key_from_id boolean NOT NULL DEFAULT true;
ALTER TABLE settlement.payouts ALTER COLUMN provider_key_from_id SET DEFAULT false;

DROP INDEX settlement.payouts_provider_key;
ALTER TABLE settlement.payouts DROP COLUMN provider_key;
ALTER TABLE settlement.payouts
    ADD COLUMN provider_key text GENERATED ALWAYS AS (
        coalesce(settlement_key,
                 CASE WHEN provider_key_from_id THEN 'payout-' || id::text
                      ELSE 'withdrawal-' || md5(idempotency_key) END)) STORED;
CREATE UNIQUE INDEX payouts_provider_key ON settlement.payouts (provider_key);

-- How a payout's key is made never changes (neither does anything it is
-- made from: settlement.check_payout_change).
CREATE FUNCTION settlement.refuse_provider_key_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.provider_key_from_id IS DISTINCT FROM OLD.provider_key_from_id THEN
        RAISE EXCEPTION 'payout %: its provider key never changes', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'payouts_immutable';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER payouts_provider_key_fixed BEFORE UPDATE OF provider_key_from_id ON settlement.payouts
    FOR EACH ROW EXECUTE FUNCTION settlement.refuse_provider_key_change();
