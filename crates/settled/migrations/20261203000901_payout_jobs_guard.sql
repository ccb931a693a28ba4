-- A queued payout's funds are held until its delivery job sends it (or the
-- provider refuses it, which returns them). Two engine verbs could strand
-- them: a cancel of the delivery job, and retention deleting a dead letter
-- (a delivery that ran out of attempts) before anyone replayed it. Neither
-- may happen while the payout is queued:
--  * a cancel is refused. The provider may already hold the payment (an
--    earlier attempt's answer lost), so returning the funds is no answer
--    either: the payout is owed until its delivery settles it;
--  * a delete leaves the row where it is (the trigger returns NULL): the
--    dead letter stays until `settled queues replay payout_delivery` sends
--    the payout, and `settled reconcile` names it until then.
CREATE FUNCTION settlement.guard_payout_job() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM settlement.payouts p WHERE p.id = OLD.payout_id AND p.status = 'queued') THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'payout % is queued with its funds held, and only its delivery sends it or returns them', OLD.payout_id
        USING ERRCODE = 'object_in_use',
              HINT = 'the payout stays owed until delivered; a delivery that ran out of attempts is sent again by settled queues replay payout_delivery --key ID';
END
$$;
CREATE TRIGGER payout_jobs_guard_cancel BEFORE UPDATE OF status ON settlement.payout_jobs
    FOR EACH ROW WHEN (NEW.status = 'cancelled' AND OLD.status IS DISTINCT FROM 'cancelled')
    EXECUTE FUNCTION settlement.guard_payout_job();
CREATE TRIGGER payout_jobs_guard_delete BEFORE DELETE ON settlement.payout_jobs
    FOR EACH ROW EXECUTE FUNCTION settlement.guard_payout_job();
