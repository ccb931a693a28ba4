-- The engine's word for what one run covers is "scope" (an application calls
-- it a period, a week, a region); the column says so.
ALTER TABLE settled_engine.runs RENAME COLUMN period TO scope;
ALTER TABLE settled_engine.runs RENAME CONSTRAINT runs_one_per_job_period TO runs_one_per_job_scope;
ALTER TABLE settled_engine.runs RENAME CONSTRAINT runs_period_check TO runs_scope_check;

CREATE OR REPLACE FUNCTION settled_engine.notify_run_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('settled_engine_runs', NEW.job || ' ' || NEW.scope || ' ' || NEW.state);
    RETURN NULL;
END
$$;
