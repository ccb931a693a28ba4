-- The reward formula, defined once: every statement that pays, prepares a
-- payout, checks an import or verifies a period calls it (an immutable SQL
-- function, inlined by the planner). Rust's twin is money::reward, and a
-- property test holds the two equal.
CREATE FUNCTION settlement.reward(volume numeric, fee_bps integer) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS 'SELECT div(volume * fee_bps, 10000)';

-- The engine's runs table now names its column "scope". The refusal names
-- its trigger as the constraint, so callers match it by name, not by text.
CREATE OR REPLACE FUNCTION settlement.refuse_policy_change_after_run() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM settled_engine.runs
               WHERE job = 'creator-rewards' AND scope = OLD.period::text) THEN
        RAISE EXCEPTION 'the policy of period % is frozen: a run for it has started', OLD.period
            USING ERRCODE = 'integrity_constraint_violation',
                  CONSTRAINT = 'settlement_policy_frozen_after_run';
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$;

GRANT EXECUTE ON FUNCTION settlement.reward(numeric, integer) TO PUBLIC;
