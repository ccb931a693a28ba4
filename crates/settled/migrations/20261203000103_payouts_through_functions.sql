-- A payout changes a balance only through settlement.debit_for_payout, and
-- a hold is placed only through settlement.place_hold: settled_api keeps no
-- UPDATE on balances and no INSERT on payouts or holds, so a stolen API
-- login can no longer mint a balance (UPDATE ... SET balance = ...) and
-- withdraw it, nor record a payout that debited nothing. Both functions run
-- as their owner (SECURITY DEFINER, fixed search_path) and keep the rules
-- the API's statements kept: the creator's balance row is locked first
-- (FOR NO KEY UPDATE, the lock a hold also takes), holds are read after the
-- lock, the debit never overdraws, and the payout row is written in the
-- same transaction as its debit. A later payout state (a failed payout's
-- return of funds) is another function here, the one place a payout
-- changes a balance.

-- Debits `amount` from `creator`'s balance and records the payout under
-- `idempotency_key`, or says why not, as `outcome`:
--   paid               payout_id, payout_status, payout_created_at; balance_before
--   unknown_creator    the creator has no balance
--   on_hold            active_hold: the creator's active hold
--   insufficient_funds balance_before: less than the amount
CREATE FUNCTION settlement.debit_for_payout(creator text, amount numeric, idempotency_key text, request_hash text)
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
    INSERT INTO settlement.payouts AS p (creator, amount, idempotency_key, request_hash)
    VALUES (debit_for_payout.creator, amount, debit_for_payout.idempotency_key, debit_for_payout.request_hash)
    RETURNING p.* INTO made;
    RETURN QUERY SELECT 'paid', made.id, made.status, made.created_at, held, NULL::bigint;
END
$$;

-- Places a hold on `creator` under the creator's balance-row lock, the lock
-- every payout takes before it reads holds: once the caller commits, no
-- payout that has not committed yet can pay the creator. At most one active
-- hold per creator (unique index creator_holds_one_active).
CREATE FUNCTION settlement.place_hold(creator text, reason text) RETURNS settlement.creator_holds
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    placed settlement.creator_holds;
BEGIN
    PERFORM 1 FROM settlement.creator_balance b WHERE b.creator = place_hold.creator FOR NO KEY UPDATE;
    INSERT INTO settlement.creator_holds AS h (creator, reason) VALUES (place_hold.creator, place_hold.reason)
    RETURNING h.* INTO placed;
    RETURN placed;
END
$$;

REVOKE ALL ON FUNCTION settlement.debit_for_payout(text, numeric, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.place_hold(text, text) FROM PUBLIC;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_api') THEN
        RETURN;
    END IF;
    REVOKE UPDATE ON settlement.creator_balance FROM settled_api;
    REVOKE INSERT ON settlement.payouts FROM settled_api;
    REVOKE INSERT ON settlement.creator_holds FROM settled_api;
    GRANT EXECUTE ON FUNCTION settlement.debit_for_payout(text, numeric, text, text) TO settled_api;
    GRANT EXECUTE ON FUNCTION settlement.place_hold(text, text) TO settled_api;
END
$$;
