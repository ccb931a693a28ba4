-- One home for a continuous queue's table: settled_engine.create_queue
-- creates it (its key, the engine's columns and their defaults, the three
-- partial indexes, the wake-up trigger) and registers the queue, in the
-- caller's transaction. `Queue::create_table` calls it, `Queue::table_sql`
-- writes the call for a migration, and a test ties the one table an
-- earlier migration wrote by hand (settled's `settlement.payout_jobs`) to
-- what it creates. Names follow the engine's rule for identifiers
-- (lowercase, digits, `_`; a table may name its schema), checked here too,
-- since the function may be called from any client.
CREATE FUNCTION settled_engine.create_queue(
    p_name text, p_table text, p_key text DEFAULT 'key', p_key_type text DEFAULT 'text')
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    ident constant text := '^[a-z_][a-z0-9_]{0,62}$';
    base text := split_part(p_table, '.', -1);
BEGIN
    IF p_name IS NULL OR p_name !~ ident THEN
        RAISE EXCEPTION 'create_queue: name % is not an identifier (lowercase, digits, _)', quote_nullable(p_name)
            USING ERRCODE = '22023';
    END IF;
    IF p_table IS NULL OR p_table !~ '^[a-z_][a-z0-9_]{0,62}(\.[a-z_][a-z0-9_]{0,62})?$' THEN
        RAISE EXCEPTION 'create_queue: table % is not an identifier (schema.table or table)', quote_nullable(p_table)
            USING ERRCODE = '22023';
    END IF;
    IF p_key IS NULL OR p_key !~ ident THEN
        RAISE EXCEPTION 'create_queue: key % is not an identifier', quote_nullable(p_key) USING ERRCODE = '22023';
    END IF;
    IF p_key_type IS NULL OR p_key_type !~ ident THEN
        RAISE EXCEPTION 'create_queue: key type % is not a type name', quote_nullable(p_key_type)
            USING ERRCODE = '22023';
    END IF;
    EXECUTE format($ddl$
        CREATE TABLE %s (
            %s %s PRIMARY KEY,
            payload      jsonb       NOT NULL DEFAULT '{}',
            priority     smallint    NOT NULL DEFAULT 0,
            seq          bigint      GENERATED ALWAYS AS IDENTITY,
            enqueued_at  timestamptz NOT NULL DEFAULT now(),
            not_before   timestamptz NOT NULL DEFAULT now(),
            status       text        NOT NULL DEFAULT 'eligible'
                         CHECK (status IN ('eligible', 'processing', 'settled', 'failed', 'cancelled')),
            attempt      integer     NOT NULL DEFAULT 0,
            attempt_base integer     NOT NULL DEFAULT 0,
            fence_epoch  integer     NOT NULL DEFAULT 0,
            lease_owner  uuid,
            lease_until  timestamptz,
            last_error   text,
            errors       jsonb       NOT NULL DEFAULT '[]',
            traceparent  text,
            updated_at   timestamptz NOT NULL DEFAULT now()
        ) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
                autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000,
                autovacuum_vacuum_cost_delay = 0)$ddl$, p_table, p_key, p_key_type);
    EXECUTE format('CREATE INDEX %s ON %s (priority, not_before, seq) WHERE status = ''eligible''',
                   base || '_eligible', p_table);
    EXECUTE format('CREATE INDEX %s ON %s (lease_until) WHERE status = ''processing''',
                   base || '_processing', p_table);
    EXECUTE format('CREATE INDEX %s ON %s (updated_at) WHERE status IN (''settled'', ''failed'', ''cancelled'')',
                   base || '_finished', p_table);
    EXECUTE format('CREATE TRIGGER %s AFTER INSERT ON %s FOR EACH STATEMENT EXECUTE FUNCTION settled_engine.queue_wake(%L)',
                   base || '_wake', p_table, p_name);
    INSERT INTO settled_engine.queues (name, table_name) VALUES (p_name, p_table)
        ON CONFLICT (name) DO NOTHING;
END
$$;
