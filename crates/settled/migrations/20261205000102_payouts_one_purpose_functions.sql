-- A payout moves only through functions that each do one thing, and that
-- decide in the database what their callers used to decide: settled_api
-- and settled_worker could call settlement.move_payout, which makes any
-- allowed transition, so a stolen login of either could confirm a payout
-- without its token, return the funds of a payout the provider was paying,
-- or mark paid a payout never sent. move_payout stays the owner's.
--
--   confirm_payout        created -> queued, redeeming the one-time token
--                         inside; refused while the creator is on hold (api)
--   cancel_payout         created -> cancelled (api)
--   apply_provider_word   the provider's pending, paid or failed, naming
--                         its payment: queued -> sent, queued|sent -> paid
--                         or failed; a word that contradicts the payout is
--                         recorded as a conflict, never applied (api: the
--                         webhooks; worker: delivery and polling)
--   fail_refused_payout   queued -> failed on the provider's refusal (worker)
--   record_payment_clash  a payment id another payout holds, or other than
--                         the one recorded: a conflict (worker, before it
--                         records a delivery)
--
-- A payout's delivery job is settled only once the payout left `queued`
-- (checked at commit: the engine settles the job, then the handler moves
-- the payout, in one transaction), and the roles update only the job
-- columns the engine writes. A payout's recorded payment id is never
-- replaced.

-- Whether the provider's payment `payment_id` clashes with payout
-- `payout`: another payout holds that id, or the payout records another
-- one. Recorded in settlement.payout_conflicts (once per payout, detail and
-- event) and answered in words; NULL when it does not clash.
CREATE FUNCTION settlement.record_payment_clash(payout bigint, payment_id text, provider_status text, source text,
                                                event_id text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    clash text;
    state text;
BEGIN
    SELECT format('the provider''s payment %s is payout %s''s', payment_id, o.id) INTO clash
    FROM settlement.payouts o WHERE o.provider_id = payment_id AND o.id <> payout;
    SELECT p.status,
           coalesce(clash, CASE WHEN p.provider_id <> payment_id
                           THEN format('the payout records the provider''s payment %s, the provider names %s',
                                       p.provider_id, payment_id) END)
    INTO state, clash
    FROM settlement.payouts p WHERE p.id = payout;
    IF clash IS NULL THEN
        RETURN NULL;
    END IF;
    clash := clash || ': not applied';
    INSERT INTO settlement.payout_conflicts (payout_id, state, provider_status, source, event_id, detail)
    SELECT payout, state, provider_status, source, event_id, clash
    WHERE NOT EXISTS (SELECT 1 FROM settlement.payout_conflicts c
                      WHERE c.payout_id = payout AND c.detail = clash AND c.source = record_payment_clash.source
                        AND c.event_id IS NOT DISTINCT FROM record_payment_clash.event_id);
    RETURN clash;
END
$$;

-- Applies the provider's word about payout `payout`: `provider_status`
-- (pending, paid or failed) of its payment `payment_id`, from `source`
-- (delivery, webhook, poll, reconcile). Answers:
--   applied   it moved: pending queued -> sent; paid or failed from queued
--             or sent. The payment's id is recorded, never overwritten.
--   already   nothing new (a repeat, a late pending, a failure of a payout
--             that ended unpaid)
--   conflict  recorded in settlement.payout_conflicts, not applied: the id
--             is another payout's or not the one recorded; the payout awaits
--             its confirmation (it was never sent); or the word contradicts
--             a final state (paid after failed, failed after paid, paid or
--             pending after cancelled or expired)
CREATE FUNCTION settlement.apply_provider_word(payout bigint, provider_status text, payment_id text, reason text,
                                               source text, event_id text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p settlement.payouts;
    to_state text := CASE provider_status WHEN 'pending' THEN 'sent' ELSE provider_status END;
    from_states text[] := CASE provider_status WHEN 'pending' THEN ARRAY['queued'] ELSE ARRAY['queued', 'sent'] END;
BEGIN
    IF provider_status IS NULL OR provider_status NOT IN ('pending', 'paid', 'failed') THEN
        RAISE EXCEPTION 'the provider says pending, paid or failed, not %', provider_status
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
    IF p.status = ANY(from_states) THEN
        UPDATE settlement.payouts x
        SET status = to_state, reason = apply_provider_word.reason, provider_id = coalesce(x.provider_id, payment_id)
        WHERE x.id = payout AND x.status = p.status;
        RETURN 'applied';
    END IF;
    IF p.status = 'created'
       OR (p.status = 'paid' AND provider_status = 'failed') OR (p.status = 'failed' AND provider_status = 'paid')
       OR (p.status IN ('cancelled', 'expired') AND provider_status IN ('paid', 'pending')) THEN
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

-- The provider refused payout `payout` for good (a 4xx to its delivery):
-- queued -> failed, its funds returned. False when it was not queued.
CREATE FUNCTION settlement.fail_refused_payout(payout bigint, reason text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE settlement.payouts x SET status = 'failed', reason = fail_refused_payout.reason
    WHERE x.id = payout AND x.status = 'queued';
    RETURN FOUND;
END
$$;

-- Confirms payout `payout` with its one-time `token`: created -> queued,
-- with its delivery job, the token used up. Answers, with the payout's
-- status and the creator's active hold:
--   confirmed                  done
--   unknown_payout             no such withdrawal
--   not_awaiting_confirmation  it is past `created`
--   on_hold                    the creator has an active hold: nothing
--                              changes, the token stays usable
--   expired, refused           the engine's redemption said so
-- The payout's row is locked first, then the creator's balance row (the
-- lock settlement.place_hold takes), and holds are read after it: a hold
-- committed before is seen; one placed meanwhile waits for this payout,
-- whose delivery then waits for the hold's release.
CREATE FUNCTION settlement.confirm_payout(payout bigint, token uuid)
RETURNS TABLE (outcome text, payout_status text, active_hold bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p settlement.payouts;
    hold_id bigint;
    redeemed text;
BEGIN
    SELECT * INTO p FROM settlement.payouts x WHERE x.id = payout AND x.kind = 'withdrawal' FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown_payout', NULL::text, NULL::bigint;
        RETURN;
    END IF;
    IF p.status <> 'created' THEN
        RETURN QUERY SELECT 'not_awaiting_confirmation', p.status, NULL::bigint;
        RETURN;
    END IF;
    PERFORM 1 FROM settlement.creator_balance b WHERE b.creator = p.creator FOR NO KEY UPDATE;
    -- A new statement, so a new snapshot: a hold committed before the lock was granted is seen.
    SELECT h.id INTO hold_id FROM settlement.creator_holds h WHERE h.creator = p.creator AND h.released_at IS NULL;
    IF hold_id IS NOT NULL THEN
        RETURN QUERY SELECT 'on_hold', p.status, hold_id;
        RETURN;
    END IF;
    redeemed := settled_engine.redeem_once_token(token, 'payout-confirmation', p.idempotency_key);
    IF redeemed <> 'redeemed' THEN
        RETURN QUERY SELECT redeemed, p.status, NULL::bigint;
        RETURN;
    END IF;
    UPDATE settlement.payouts x SET status = 'queued', reason = 'confirmed', expires_at = NULL
    WHERE x.id = payout AND x.status = 'created';
    INSERT INTO settlement.payout_jobs (payout_id, traceparent) VALUES (p.id, p.traceparent)
    ON CONFLICT ON CONSTRAINT payout_jobs_pkey DO NOTHING;
    RETURN QUERY SELECT 'confirmed', 'queued'::text, NULL::bigint;
END
$$;

-- Cancels payout `payout` while it awaits its confirmation: created ->
-- cancelled, its funds returned. Answers cancelled, unknown_payout, or
-- not_cancellable with its status.
CREATE FUNCTION settlement.cancel_payout(payout bigint) RETURNS TABLE (outcome text, payout_status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    state text;
BEGIN
    UPDATE settlement.payouts x SET status = 'cancelled', reason = 'cancelled by request', expires_at = NULL
    WHERE x.id = payout AND x.status = 'created';
    IF FOUND THEN
        RETURN QUERY SELECT 'cancelled', 'cancelled'::text;
        RETURN;
    END IF;
    SELECT x.status INTO state FROM settlement.payouts x WHERE x.id = payout;
    RETURN QUERY SELECT CASE WHEN state IS NULL THEN 'unknown_payout' ELSE 'not_cancellable' END, state;
END
$$;

-- A queued payout's funds are held until its delivery records the
-- provider's answer: its job may be settled only with that answer, which
-- moves the payout past `queued` in the same transaction. Checked at
-- commit, since the engine settles the job before its handler moves the
-- payout.
CREATE FUNCTION settlement.check_payout_job_settled() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM settlement.payouts p WHERE p.id = NEW.payout_id AND p.status = 'queued') THEN
        RAISE EXCEPTION 'payout % is queued with its funds held: its delivery job is settled only with the provider''s answer, which moves the payout', NEW.payout_id
            USING ERRCODE = 'object_in_use';
    END IF;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER payout_jobs_settled_after_delivery AFTER UPDATE OF status ON settlement.payout_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.status = 'settled' AND OLD.status IS DISTINCT FROM 'settled')
    EXECUTE FUNCTION settlement.check_payout_job_settled();

-- A payout's payment at the provider, once recorded, is never replaced
-- (settlement.move_payout wrote whatever id it was given over it): for
-- every role and every path, the owner's too.
CREATE FUNCTION settlement.refuse_provider_id_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'payout % records the provider''s payment %, never replaced (by %)',
        OLD.id, OLD.provider_id, coalesce(NEW.provider_id, 'nothing')
        USING ERRCODE = 'check_violation', CONSTRAINT = 'payouts_provider_id_fixed';
END
$$;
CREATE TRIGGER payouts_provider_id_fixed BEFORE UPDATE OF provider_id ON settlement.payouts
    FOR EACH ROW WHEN (OLD.provider_id IS NOT NULL AND NEW.provider_id IS DISTINCT FROM OLD.provider_id)
    EXECUTE FUNCTION settlement.refuse_provider_id_change();

REVOKE ALL ON FUNCTION settlement.record_payment_clash(bigint, text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.apply_provider_word(bigint, text, text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.fail_refused_payout(bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.confirm_payout(bigint, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.cancel_payout(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.check_payout_job_settled() FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.refuse_provider_id_change() FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.move_payout(bigint, text[], text, text, text) FROM PUBLIC;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_api') THEN
        RETURN;
    END IF;
    REVOKE EXECUTE ON FUNCTION settlement.move_payout(bigint, text[], text, text, text) FROM settled_api, settled_worker;
    GRANT EXECUTE ON FUNCTION settlement.confirm_payout(bigint, uuid), settlement.cancel_payout(bigint) TO settled_api;
    GRANT EXECUTE ON FUNCTION settlement.apply_provider_word(bigint, text, text, text, text, text)
        TO settled_api, settled_worker;
    GRANT EXECUTE ON FUNCTION settlement.fail_refused_payout(bigint, text),
                              settlement.record_payment_clash(bigint, text, text, text, text)
        TO settled_worker;
    -- The delivery queue's rows: the columns the engine's statements write
    -- (claim, complete, fail, snooze, renew, rescue; the worker) and those
    -- of cancel and replay (the API, for operators), never the key, the
    -- payload or the order.
    REVOKE UPDATE ON settlement.payout_jobs FROM settled_worker;
    GRANT UPDATE (status, attempt, attempt_base, fence_epoch, not_before, lease_owner, lease_until, last_error,
                  errors, updated_at) ON settlement.payout_jobs TO settled_worker;
    GRANT UPDATE (status, attempt_base, not_before, updated_at) ON settlement.payout_jobs TO settled_api;
END
$$;
