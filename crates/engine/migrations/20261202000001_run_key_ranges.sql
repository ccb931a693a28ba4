-- A run's key ranges (settled_engine::ranges): the scope's keys cut once
-- per run, from the planner's histogram, into ranges that claim loops of
-- every process take one at a time with SKIP LOCKED, so that no two loops
-- work the same range and no loop visits a range another one finished. A
-- hint for speed only: the items' own row locks still decide who claims
-- what, and a loop that finds no range left claims from the start of the
-- scope, which finds whatever the ranges left behind.
CREATE TABLE settled_engine.run_key_ranges (
    run_id    bigint      NOT NULL,
    range_no  integer     NOT NULL CHECK (range_no >= 0),
    -- Keys after this one (NULL: from the first key) ...
    after_key text,
    -- ... up to and including this one (NULL: to the last key).
    upto_key  text,
    -- When a claim loop took the range (NULL: free).
    taken_at  timestamptz,
    PRIMARY KEY (run_id, range_no)
);
