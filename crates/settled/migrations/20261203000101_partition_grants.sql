-- A partition has the privileges of its parent. PostgreSQL checks a
-- statement against the relation it names: through the parent, the
-- parent's grants; naming a partition itself, the partition's. The engine's
-- chunk statement names the period's partition (settled_engine's
-- queue/statement.rs), and the partitions that
-- settlement.ensure_period_partitions created carried no grants, so a
-- least-privilege worker was refused every chunk ("permission denied for
-- table token_trade_volume_p..."). From here one function decides what a
-- partition lets each role do: it copies the parent's ACL, table-wide and
-- per column. New partitions get it as they are created; the present ones,
-- and the ledger partitions the archive keeps in settlement_archive, get it
-- below. A migration that changes a grant on either parent ends with
-- `SELECT settlement.sync_partition_grants()`.

-- A grantee of an ACL item as GRANT and REVOKE name it (0 is PUBLIC).
CREATE FUNCTION settlement.grantee_sql(grantee oid) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$ SELECT CASE WHEN grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(grantee)) END $$;

-- Gives `child` exactly the privileges `parent` grants (table-wide and per
-- column, with their grant options), and no others; the owners' own
-- privileges are left alone.
CREATE FUNCTION settlement.copy_grants(parent regclass, child regclass) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    g record;
BEGIN
    -- Revoking a table-wide privilege revokes the column ones with it.
    FOR g IN
        SELECT a.grantee
        FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
        WHERE c.oid = child AND a.grantee <> c.relowner
        UNION
        SELECT a.grantee
        FROM pg_attribute att CROSS JOIN LATERAL aclexplode(att.attacl) a
        WHERE att.attrelid = child
    LOOP
        EXECUTE format('REVOKE ALL ON TABLE %s FROM %s', child, settlement.grantee_sql(g.grantee));
    END LOOP;
    FOR g IN
        SELECT a.grantee, a.is_grantable, string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type) AS privileges
        FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
        WHERE c.oid = parent AND a.grantee <> c.relowner
        GROUP BY a.grantee, a.is_grantable
    LOOP
        EXECUTE format('GRANT %s ON TABLE %s TO %s%s', g.privileges, child, settlement.grantee_sql(g.grantee),
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
    FOR g IN
        SELECT a.grantee, a.is_grantable, a.privilege_type,
               string_agg(quote_ident(att.attname), ', ' ORDER BY att.attnum) AS columns
        FROM pg_attribute att CROSS JOIN LATERAL aclexplode(att.attacl) a
        WHERE att.attrelid = parent AND NOT att.attisdropped
        GROUP BY a.grantee, a.is_grantable, a.privilege_type
    LOOP
        EXECUTE format('GRANT %s (%s) ON TABLE %s TO %s%s', g.privilege_type, g.columns, child,
                       settlement.grantee_sql(g.grantee),
                       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;

-- Every partition of the work table and the ledger, and every ledger
-- partition the archive keeps, gets its parent's privileges again. Returns
-- how many relations it visited.
CREATE FUNCTION settlement.sync_partition_grants() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p record;
    visited integer := 0;
BEGIN
    FOR p IN
        SELECT i.inhparent::regclass AS parent, i.inhrelid::regclass AS child
        FROM pg_inherits i
        WHERE i.inhparent IN ('settlement.token_trade_volume'::regclass, 'settlement.reward_ledger'::regclass)
        UNION ALL
        SELECT 'settlement.reward_ledger'::regclass, c.oid::regclass
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'settlement_archive' AND c.relkind = 'r' AND c.relname ~ '^reward_ledger_p[0-9]{8}$'
    LOOP
        PERFORM settlement.copy_grants(p.parent, p.child);
        visited := visited + 1;
    END LOOP;
    RETURN visited;
END
$$;

REVOKE ALL ON FUNCTION settlement.copy_grants(regclass, regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION settlement.sync_partition_grants() FROM PUBLIC;

-- As in migration 20261201000105, and each new partition gets its parent's
-- privileges before it is attached.
CREATE OR REPLACE FUNCTION settlement.ensure_period_partitions(p date) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    work   text := 'token_trade_volume_p' || to_char(p, 'YYYYMMDD');
    ledger text := 'reward_ledger_p' || to_char(p, 'YYYYMMDD');
    made   boolean := false;
BEGIN
    IF p IS NULL THEN
        RAISE EXCEPTION 'a period is required' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF to_regclass(format('settlement.%I', work)) IS NOT NULL
       AND to_regclass(format('settlement.%I', ledger)) IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('settlement.ensure_period_partitions'), p - date '2000-01-01');
    IF EXISTS (SELECT 1 FROM settlement.archived_periods WHERE period = p) THEN
        RAISE EXCEPTION 'period % is archived: it can take no new items', p
            USING ERRCODE = 'integrity_constraint_violation', CONSTRAINT = 'period_archived',
                  HINT = 'its ledger was exported and left the database; a correction goes in a later period';
    END IF;
    -- CREATE TABLE then ATTACH (SHARE UPDATE EXCLUSIVE on the parent), not
    -- PARTITION OF (ACCESS EXCLUSIVE until the caller commits).
    IF to_regclass(format('settlement.%I', work)) IS NULL THEN
        EXECUTE format('CREATE TABLE settlement.%I (LIKE settlement.token_trade_volume
                        INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', work);
        PERFORM settlement.copy_grants('settlement.token_trade_volume', format('settlement.%I', work)::regclass);
        EXECUTE format('ALTER TABLE settlement.token_trade_volume ATTACH PARTITION settlement.%I
                        FOR VALUES FROM (%L) TO (%L)', work, p, p + 1);
        made := true;
    END IF;
    IF to_regclass(format('settlement.%I', ledger)) IS NULL THEN
        EXECUTE format('CREATE TABLE settlement.%I (LIKE settlement.reward_ledger
                        INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', ledger);
        PERFORM settlement.copy_grants('settlement.reward_ledger', format('settlement.%I', ledger)::regclass);
        EXECUTE format('CREATE TRIGGER reward_ledger_no_truncate BEFORE TRUNCATE ON settlement.%I
                        FOR EACH STATEMENT EXECUTE FUNCTION settlement.refuse_ledger_change()', ledger);
        EXECUTE format('CREATE TRIGGER reward_ledger_rows_have_items AFTER INSERT ON settlement.%I
                        REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
                        EXECUTE FUNCTION settlement.refuse_ledger_rows_without_items()', ledger);
        EXECUTE format('ALTER TABLE settlement.reward_ledger ATTACH PARTITION settlement.%I
                        FOR VALUES FROM (%L) TO (%L)', ledger, p, p + 1);
        made := true;
    END IF;
    RETURN made;
END
$$;

-- The partitions made before this migration, and the archive's.
SELECT settlement.sync_partition_grants();
