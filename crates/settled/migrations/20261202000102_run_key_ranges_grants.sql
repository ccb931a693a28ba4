-- The roles' privileges on settled_engine.run_key_ranges (the engine's
-- migration 20261202000001): workers cut a run's key ranges and take them;
-- serve reopens runs (a released hold, a retry), which frees them.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'settled_worker') THEN
        RETURN;
    END IF;
    GRANT SELECT, INSERT, UPDATE ON settled_engine.run_key_ranges TO settled_worker;
    GRANT SELECT, UPDATE ON settled_engine.run_key_ranges TO settled_api;
    GRANT SELECT ON settled_engine.run_key_ranges TO settled_readonly;
END
$$;
