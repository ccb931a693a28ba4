-- Wake idle workers at once when a run starts, reopens, finishes or is
-- cancelled (they also poll, so a lost notification costs a few seconds).
CREATE FUNCTION settled_engine.notify_run_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('settled_engine_runs', NEW.job || ' ' || NEW.period || ' ' || NEW.state);
    RETURN NULL;
END
$$;

CREATE TRIGGER runs_notify
    AFTER INSERT OR UPDATE OF state ON settled_engine.runs
    FOR EACH ROW EXECUTE FUNCTION settled_engine.notify_run_change();

-- How a worker ended: 'stopped' on its own, or 'dead' (no heartbeat for too
-- long; marked by any other worker). NULL while alive.
ALTER TABLE settled_engine.workers
    ADD COLUMN ended text CHECK (ended IN ('stopped', 'dead'));

CREATE INDEX workers_heartbeat ON settled_engine.workers (heartbeat_at) WHERE stopped_at IS NULL;
