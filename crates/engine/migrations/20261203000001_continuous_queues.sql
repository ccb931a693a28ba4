-- Continuous queues: work tables with no scope and no run, fed by enqueues
-- inside applications' own transactions and served until stopped.

-- One row per queue (one work table each): its name, its table, and the
-- switch that pauses its claims (checked by every claim statement).
CREATE TABLE settled_engine.queues (
    name        text        PRIMARY KEY
                            CHECK (name ~ '^[a-z_][a-z0-9_]*$' AND length(name) <= 63),
    table_name  text        NOT NULL UNIQUE CHECK (table_name <> '' AND length(table_name) <= 127),
    paused_at   timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The wake-up: a statement that adds jobs notifies channel
-- `settled_engine_queue` with the queue's name. PostgreSQL delivers a
-- notification at commit, and never for a transaction that rolled back, so
-- an idle worker wakes exactly when there is something it can claim. Any
-- INSERT fires it, from any language.
CREATE FUNCTION settled_engine.queue_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('settled_engine_queue', TG_ARGV[0]);
    RETURN NULL;
END
$$;
