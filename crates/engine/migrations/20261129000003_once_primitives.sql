-- Once-only primitives for request handling: one-time tokens, idempotency
-- keys, and named leases with fencing tokens. All timed by the database clock.

-- A token that can be reserved once: issued -> reserved -> completed
-- (or back to issued by release). Expired tokens cannot be reserved.
CREATE TABLE settled_engine.once_tokens (
    id           uuid        PRIMARY KEY,
    purpose      text        NOT NULL CHECK (purpose <> '' AND length(purpose) <= 100),
    subject      text        NOT NULL CHECK (length(subject) <= 255),
    status       text        NOT NULL DEFAULT 'issued'
                             CHECK (status IN ('issued', 'reserved', 'completed')),
    expires_at   timestamptz NOT NULL,
    reserved_at  timestamptz,
    completed_at timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX once_tokens_expires ON settled_engine.once_tokens (expires_at);

-- Idempotency keys (Stripe / IETF Idempotency-Key semantics): the first
-- request's fingerprint and final response; repeats get the stored response.
CREATE TABLE settled_engine.idempotency_keys (
    scope           text        NOT NULL CHECK (scope <> '' AND length(scope) <= 100),
    key             text        NOT NULL CHECK (key <> '' AND length(key) <= 255),
    fingerprint     text        NOT NULL,
    status          text        NOT NULL DEFAULT 'in_progress'
                                CHECK (status IN ('in_progress', 'completed')),
    -- While in progress, the attempt owns the key until then; a crashed
    -- attempt's key can be taken over after it.
    locked_until    timestamptz,
    response_status integer,
    response_body   jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (scope, key),
    CHECK ((status = 'completed') = (response_status IS NOT NULL))
);
CREATE INDEX idempotency_keys_expires ON settled_engine.idempotency_keys (expires_at);

-- Named leases with a fencing token that grows with every acquisition.
CREATE TABLE settled_engine.leases (
    name        text        PRIMARY KEY CHECK (name <> '' AND length(name) <= 200),
    holder      text        NOT NULL,
    fence       bigint      NOT NULL CHECK (fence >= 1),
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
