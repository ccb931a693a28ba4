-- Least-privilege roles (NOLOGIN groups; give them to login roles with
-- `GRANT settled_worker TO app_login`). Roles are cluster-wide: created once,
-- if the migrating user may create roles; privileges are granted per database.
DO $$
DECLARE
    r text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = current_user AND (rolsuper OR rolcreaterole)) THEN
        RAISE NOTICE 'settled roles not created: % may not create roles', current_user;
        RETURN;
    END IF;
    FOREACH r IN ARRAY ARRAY['settled_worker', 'settled_api', 'settled_readonly'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- another database's migration created it at the same moment
            END;
        END IF;
    END LOOP;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_worker') THEN
        RETURN;
    END IF;
    -- Everyone: see the schemas and which migrations are applied.
    GRANT USAGE ON SCHEMA settlement, settled_engine TO settled_worker, settled_api, settled_readonly;
    GRANT SELECT ON public._sqlx_migrations TO settled_worker, settled_api, settled_readonly;

    -- settled_readonly: dashboards and reports.
    GRANT SELECT ON ALL TABLES IN SCHEMA settlement, settled_engine TO settled_readonly;

    -- settled_worker: claim and settle. No DELETE anywhere, no UPDATE of the ledger.
    GRANT SELECT, UPDATE ON settlement.token_trade_volume TO settled_worker;
    GRANT SELECT ON settlement.settlement_policy, settlement.creator_holds, settlement.payouts TO settled_worker;
    -- A run start holds the policy row FOR SHARE, which needs an UPDATE grant
    -- (on a bookkeeping column only; the trigger freezes the policy anyway).
    GRANT UPDATE (updated_at) ON settlement.settlement_policy TO settled_worker;
    GRANT SELECT, INSERT ON settlement.reward_ledger TO settled_worker;
    GRANT SELECT, INSERT, UPDATE ON settlement.creator_balance TO settled_worker;
    GRANT SELECT, INSERT, UPDATE ON settled_engine.runs, settled_engine.workers TO settled_worker;

    -- settled_api: payouts and holds.
    GRANT SELECT ON settlement.token_trade_volume, settlement.reward_ledger, settlement.settlement_policy TO settled_api;
    GRANT UPDATE (status, not_before, updated_at) ON settlement.token_trade_volume TO settled_api;
    GRANT SELECT, UPDATE ON settlement.creator_balance TO settled_api;
    GRANT SELECT, INSERT ON settlement.payouts TO settled_api;
    GRANT SELECT, INSERT, UPDATE ON settlement.creator_holds TO settled_api;
    GRANT SELECT, UPDATE ON settled_engine.runs TO settled_api;
    GRANT SELECT, INSERT, UPDATE, DELETE ON settled_engine.idempotency_keys TO settled_api;
    GRANT SELECT, INSERT, UPDATE ON settled_engine.once_tokens, settled_engine.leases TO settled_api;
END
$$;
