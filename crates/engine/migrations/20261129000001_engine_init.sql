-- settled-engine: runs and workers. The engine's own tables live in schema
-- settled_engine; work tables belong to the applications.
CREATE SCHEMA IF NOT EXISTS settled_engine;

-- One execution of a job for one period.
CREATE TABLE settled_engine.runs (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job         text        NOT NULL CHECK (job <> '' AND length(job) <= 100),
    period      text        NOT NULL CHECK (period <> '' AND length(period) <= 100),
    state       text        NOT NULL DEFAULT 'running'
                            CHECK (state IN ('running', 'finished', 'cancelled')),
    started_by  uuid,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_by uuid,
    finished_at timestamptz,
    report      jsonb,
    -- At most one run per (job, period), whatever the number of servers.
    CONSTRAINT runs_one_per_job_period UNIQUE (job, period),
    CHECK ((state = 'running') = (finished_at IS NULL))
);

-- At most one running run per job.
CREATE UNIQUE INDEX runs_one_running_per_job ON settled_engine.runs (job) WHERE state = 'running';

-- Worker processes, for operators: who is (or was) working, and since when.
CREATE TABLE settled_engine.workers (
    id           uuid        PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    version      text        NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    stopped_at   timestamptz,
    -- Counters the worker reports with each heartbeat and when it stops.
    items_settled    bigint NOT NULL DEFAULT 0,
    items_failed     bigint NOT NULL DEFAULT 0,
    fence_rejections bigint NOT NULL DEFAULT 0,
    leases_rescued   bigint NOT NULL DEFAULT 0
);
