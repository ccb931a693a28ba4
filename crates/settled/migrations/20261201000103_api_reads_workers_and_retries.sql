-- `serve` under --role-per-command: its /metrics and /workers pages read the
-- worker registry, and the dashboard's retry sets `attempt_base` (the
-- attempts so far stop counting toward the limit; the fence keeps growing).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_api') THEN
        RETURN;
    END IF;
    GRANT SELECT ON settled_engine.workers TO settled_api;
    GRANT UPDATE (status, attempt_base, not_before, updated_at) ON settlement.token_trade_volume TO settled_api;
END
$$;
