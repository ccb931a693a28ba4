-- Who did what: one row per mutating request of the API and the dashboard
-- and per operator command of the CLI, written in the same transaction as
-- its effect (a request refused or failed writes its row on its own, with
-- nothing to commit beside it). Refusals (401, 403) are bounded: one row
-- per actor, action and outcome per minute, whose `count` grows, so a
-- flood cannot fill the table. Rows are appended, never changed: the roles
-- may INSERT and SELECT; only `settlement.audit_refused` (below) adds to a
-- refusal's count.
CREATE TABLE settlement.audit_log (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    actor   text NOT NULL CHECK (length(actor) BETWEEN 1 AND 200),
    action  text NOT NULL CHECK (length(action) BETWEEN 1 AND 200),
    target  text NOT NULL DEFAULT '' CHECK (length(target) <= 500),
    outcome text NOT NULL CHECK (length(outcome) BETWEEN 1 AND 200),
    -- How many refusals this row stands for (1 for anything else).
    count   bigint NOT NULL DEFAULT 1 CHECK (count >= 1),
    -- The minute a refusal row counts (NULL for anything else).
    minute  timestamptz CHECK (minute = date_trunc('minute', minute))
);
CREATE UNIQUE INDEX audit_log_refusal_per_minute ON settlement.audit_log (actor, action, outcome, minute)
    WHERE minute IS NOT NULL;
-- `settled audit` and `/audit` read newest first, by actor or not.
CREATE INDEX audit_log_newest ON settlement.audit_log (id DESC);
CREATE INDEX audit_log_actor_newest ON settlement.audit_log (actor, id DESC);

-- Records refusals: a new row for this actor, action and outcome in the
-- current minute (of the database's clock), or `p_count` more on its count.
-- (A server counts refusals in memory and writes each key at most once a
-- second, so a flood neither contends on the row nor takes connections.)
CREATE FUNCTION settlement.audit_refused(p_actor text, p_action text, p_target text, p_outcome text,
                                         p_count bigint DEFAULT 1)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    INSERT INTO settlement.audit_log (actor, action, target, outcome, count, minute)
    VALUES (left(p_actor, 200), left(p_action, 200), left(p_target, 500), left(p_outcome, 200),
            greatest(p_count, 1), date_trunc('minute', now()))
    ON CONFLICT (actor, action, outcome, minute) WHERE minute IS NOT NULL
    DO UPDATE SET count = settlement.audit_log.count + greatest(p_count, 1)
$$;
REVOKE ALL ON FUNCTION settlement.audit_refused(text, text, text, text, bigint) FROM PUBLIC;

GRANT SELECT, INSERT ON settlement.audit_log TO settled_api, settled_worker, settled_readonly;
GRANT EXECUTE ON FUNCTION settlement.audit_refused(text, text, text, text, bigint)
    TO settled_api, settled_worker, settled_readonly;
