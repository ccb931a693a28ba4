-- The roles' privileges on settled_engine.queues (the engine's migration
-- 20261203000001), for the operators of continuous queues: settled_readonly
-- lists queues (`settled queues`, `settled queues dead`); settled_api
-- (`serve`, and the CLI's verbs) also pauses and resumes them. A queue's
-- own table is the application's: it grants SELECT to settled_readonly,
-- and SELECT, UPDATE to settled_api for cancel and replay.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_api') THEN
        RETURN;
    END IF;
    GRANT SELECT ON settled_engine.queues TO settled_api, settled_readonly;
    GRANT UPDATE (paused_at, updated_at) ON settled_engine.queues TO settled_api;
END
$$;
