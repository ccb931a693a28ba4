-- A paid payout can come back. Real rails do not keep "a final status
-- never changes": a bank returns a payout days or weeks after it was paid
-- (Stripe shows such a payout paid, then failed; Wise calls it bounced
-- back; Adyen's transfer becomes returned). Until now settled recorded
-- that as a conflict for an operator, and the creator's money was gone
-- from the balance and arrived nowhere.
--
-- The return is its own named transition with its own money effect:
--
--   created ──► queued ──► sent ──► paid ──► returned  (funds returned)
--                  │         ├────► failed             (funds returned)
--                  │         └────► returned           (a return that came before its paid)
--                  ├──────────────► paid | failed | returned
--                  ...
--
-- A return's amount goes back to the balance once, in the transition's
-- transaction, through settlement.payout_returns as every other unpaid
-- ending (its primary key refuses a second one). A return that arrives
-- before the payment's paid (events come in any order, or a look-up finds
-- the payment already returned) moves a queued or sent payout straight to
-- `returned`: the provider paid it and took it back, so nothing left for
-- good; the late `paid` finds the payout returned and changes nothing.
-- `failed` after `paid` (a provider with no returned status) is the same
-- return.

ALTER TABLE settlement.payouts DROP CONSTRAINT payouts_status_check;
ALTER TABLE settlement.payouts ADD CONSTRAINT payouts_status_check
    CHECK (status IN ('created', 'queued', 'sent', 'paid', 'failed', 'returned', 'cancelled', 'expired'));

INSERT INTO settlement.payout_transitions (from_state, to_state) VALUES
    ('paid', 'returned'), ('sent', 'returned'), ('queued', 'returned');

-- What each word of the provider moves, from each state: the provider's
-- status of the payout's payment (pending, paid, failed, returned), the
-- payout's state, and the state it goes to. Every row is an allowed
-- transition (its foreign key); a state not listed for a word does not
-- move by it. settlement.apply_provider_word makes these moves, and
-- nothing else; payouts/word.rs holds the same table, pinned to this one
-- by a test.
CREATE TABLE settlement.provider_word_moves (
    provider_status text NOT NULL CHECK (provider_status IN ('pending', 'paid', 'failed', 'returned')),
    from_state      text NOT NULL,
    to_state        text NOT NULL,
    PRIMARY KEY (provider_status, from_state),
    FOREIGN KEY (from_state, to_state) REFERENCES settlement.payout_transitions (from_state, to_state)
);
INSERT INTO settlement.provider_word_moves (provider_status, from_state, to_state) VALUES
    ('pending', 'queued', 'sent'),
    ('paid', 'queued', 'paid'), ('paid', 'sent', 'paid'),
    ('failed', 'queued', 'failed'), ('failed', 'sent', 'failed'),
    -- failed after paid: the provider has no returned status; it is a return.
    ('failed', 'paid', 'returned'),
    ('returned', 'queued', 'returned'), ('returned', 'sent', 'returned'), ('returned', 'paid', 'returned');

-- Before any change of a payout: what it pays never changes, and its state
-- moves only along settlement.payout_transitions. Replaces the function of
-- 20261203000501: a return ends a payout too (finished_at).
CREATE OR REPLACE FUNCTION settlement.check_payout_change() RETURNS trigger
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
        IF NEW.status IN ('paid', 'failed', 'returned', 'cancelled', 'expired') THEN
            NEW.finished_at := now();
        END IF;
    END IF;
    RETURN NEW;
END
$$;

-- After a payout is made or changes state: the history row, and for a
-- payout that ends without paying for good (failed, returned, cancelled,
-- expired), its amount back to the balance, in the same transaction as
-- the transition, once (payout_returns' primary key). Replaces the
-- function of 20261203000501 with the return.
CREATE OR REPLACE FUNCTION settlement.record_payout_transition() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.status IS NOT DISTINCT FROM OLD.status THEN
        RETURN NULL;
    END IF;
    INSERT INTO settlement.payout_history (payout_id, from_state, to_state, reason)
    VALUES (NEW.id, CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END, NEW.status, NEW.reason);
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

-- Applies the provider's word about payout `payout`: `provider_status`
-- (pending, paid, failed or returned) of its payment `payment_id`, from
-- `source` (delivery, webhook, poll, reconcile). The move is one
-- conditional update along settlement.provider_word_moves from the
-- payout's state at that moment; its row count is the answer:
--   applied   it moved: pending queued -> sent; paid queued|sent -> paid;
--             failed queued|sent -> failed, paid -> returned; returned
--             queued|sent|paid -> returned (funds back, once). The
--             payment's id is recorded, never overwritten.
--   already   nothing new: a repeat, a late pending, paid, failed or
--             returned of a payout already returned (the provider pays,
--             then takes back), a failure or return of a payout that ended
--             unpaid
--   conflict  recorded in settlement.payout_conflicts, not applied: the id
--             is another payout's or not the one recorded; the payout awaits
--             its confirmation (it was never sent); or the word contradicts
--             a final state (paid after failed; paid, pending or returned
--             after cancelled or expired)
-- Replaces the function of 20261205000102 (same signature and grants).
CREATE OR REPLACE FUNCTION settlement.apply_provider_word(payout bigint, provider_status text, payment_id text,
                                                          reason text, source text, event_id text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p settlement.payouts;
    moved bigint;
BEGIN
    IF provider_status IS NULL OR provider_status NOT IN ('pending', 'paid', 'failed', 'returned') THEN
        RAISE EXCEPTION 'the provider says pending, paid, failed or returned, not %', provider_status
            USING ERRCODE = 'check_violation';
    END IF;
    IF payment_id IS NULL OR payment_id = '' THEN
        RAISE EXCEPTION 'the provider''s word about payout % names its payment', payout
            USING ERRCODE = 'not_null_violation';
    END IF;
    SELECT * INTO p FROM settlement.payouts x WHERE x.id = payout FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'payout % does not exist', payout USING ERRCODE = 'no_data_found';
    END IF;
    IF settlement.record_payment_clash(payout, payment_id, provider_status, source, event_id) IS NOT NULL THEN
        RETURN 'conflict';
    END IF;
    UPDATE settlement.payouts x
    SET status = w.to_state, reason = apply_provider_word.reason, provider_id = coalesce(x.provider_id, payment_id)
    FROM settlement.provider_word_moves w
    WHERE x.id = payout AND w.provider_status = apply_provider_word.provider_status AND w.from_state = x.status;
    GET DIAGNOSTICS moved = ROW_COUNT;
    IF moved = 1 THEN
        RETURN 'applied';
    END IF;
    IF p.status = 'created'
       OR (p.status = 'failed' AND provider_status = 'paid')
       OR (p.status IN ('cancelled', 'expired') AND provider_status IN ('paid', 'pending', 'returned')) THEN
        INSERT INTO settlement.payout_conflicts (payout_id, state, provider_status, source, event_id, detail)
        VALUES (payout, p.status, provider_status, source, event_id,
                CASE WHEN p.status = 'created'
                     THEN format('the provider says %s of a payout awaiting its confirmation, never sent to it: not applied',
                                 provider_status)
                     ELSE format('the provider says %s of a payout that is %s', provider_status, p.status) END);
        RETURN 'conflict';
    END IF;
    RETURN 'already';
END
$$;

-- Paid payouts are looked up again for a while (a return whose webhook
-- was lost): oldest look-up first, as sent ones are (payouts_sent_by_poll).
CREATE INDEX payouts_paid_by_poll ON settlement.payouts ((coalesce(polled_at, finished_at))) WHERE status = 'paid';

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_api') THEN
        RETURN;
    END IF;
    GRANT SELECT ON settlement.provider_word_moves TO settled_api, settled_worker, settled_readonly;
END
$$;
