-- The timeline of this primary's current WAL, for leased claims' fences:
-- promoting a standby starts a new timeline, so a claim granted after a
-- failover never has the fence of a claim the failover lost. Read from the
-- WAL insert position (not pg_control_checkpoint(), which lags until the
-- first checkpoint after a promotion).
CREATE FUNCTION settled_engine.fence_epoch() RETURNS integer
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer
$$;
