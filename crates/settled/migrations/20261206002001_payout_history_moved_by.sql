-- What moved a payout, on each row of its history: the API (and the
-- token's name), a deliverer, a webhook, a look-up (poll), reconcile, the
-- expiry, a settlement run. The mover names itself in the transaction-local
-- setting `settled.moved_by` (set_config(..., true)), in the statement that
-- moves the payout; the trigger copies it. NULL: a row written before this
-- migration, or a mover that did not say.
ALTER TABLE settlement.payout_history ADD COLUMN moved_by text CHECK (length(moved_by) <= 200);

-- Replaces the function of 20261205000501 with the mover; the rest is as it was.
CREATE OR REPLACE FUNCTION settlement.record_payout_transition() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.status IS NOT DISTINCT FROM OLD.status THEN
        RETURN NULL;
    END IF;
    INSERT INTO settlement.payout_history (payout_id, from_state, to_state, reason, moved_by)
    VALUES (NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status, NEW.reason,
            left(nullif(current_setting('settled.moved_by', true), ''), 200));
    IF NEW.status IN ('failed', 'returned', 'cancelled', 'expired') THEN
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
