"""Least-privilege database roles for the three processes: custody_api, custody_worker, custody_signer.

Revision ID: 0020_process_roles
Revises: 0018_reconciliation_lines (relinked to 0019_signed_approvals at merge)

Why: every process connected as the database owner, so a compromised API process (or anything
that could write the database) could rewrite a withdrawal, forge an approval row, or change the
signer's audit. Each process now connects as its own role (`DeploymentConfig`'s database URLs):

| role | tables | sequences | functions |
| --- | --- | --- | --- |
| custody_api, custody_worker | SELECT, INSERT, UPDATE, DELETE on every table except the signer's own tables and `alembic_version` (SELECT only) | USAGE, SELECT, UPDATE (SELECT only on the signer's) | EXECUTE (the ledger's plpgsql functions) |
| custody_signer | SELECT on every table; INSERT on the signer's own tables | USAGE on the signer's tables' own sequences | none |

All three get CONNECT on the database and USAGE on schema `public`; nobody but the owner may CREATE
in `public`, and PUBLIC loses EXECUTE on our functions (triggers still fire for every role: a
trigger's function is not checked for EXECUTE). The ledger's functions are SECURITY INVOKER, so
custody_api and custody_worker need (and have) the DML they perform; the append-only triggers
refuse UPDATE/DELETE of the journal for them as for the owner.

The signer's own tables are listed in ONE place: the SQL function `custody_signer_tables()`
created here (today `{signer_audit}`). `CALL custody_apply_role_grants()` (re)applies the whole
table above from that list to every table, sequence and function in `public`, idempotently, and
sets the default privileges of the role that calls it (the migration owner), so a table created by
a later migration gets api/worker DML and signer SELECT without anything written for it.

A later migration that adds a table the SIGNER writes must, after creating it:

    CREATE OR REPLACE FUNCTION custody_signer_tables() RETURNS text[] LANGUAGE sql IMMUTABLE
        AS $$ SELECT ARRAY['signer_audit', 'the_new_table']::text[] $$;
    CALL custody_apply_role_grants();

which revokes custody_api/custody_worker writes on it and grants the signer INSERT (and its
sequence). tests/integration/test_db_roles.py checks every table against the list.

Roles are cluster-wide: they are created only if missing (several databases on one server are
migrated by the test suite, possibly at once: a concurrent CREATE ROLE surfaces as
unique_violation, caught like duplicate_object). They are LOGIN roles without a password;
deployments set one (`ALTER ROLE custody_api PASSWORD '...'`) and require it in pg_hba.conf
(scram-sha-256). The embedded PostgreSQL trusts its Unix socket, so there every role connects
without one. Running this migration needs CREATEROLE (or superuser) for the first database on a
server, and migrations must always run as the same owner role (default privileges are per role).
"""
from alembic import op

revision = "0020_process_roles"
down_revision = "0019_signed_approvals"
branch_labels = None
depends_on = None

ROLES = ("custody_api", "custody_worker", "custody_signer")

CREATE_ROLES = """
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['custody_api', 'custody_worker', 'custody_signer'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I LOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created meanwhile by a migration of another database on this server
            END;
        END IF;
    END LOOP;
END $$;
"""

GRANTS = """
-- The signer's own tables: the one list (see the module docstring for how to extend it).
CREATE FUNCTION custody_signer_tables() RETURNS text[] LANGUAGE sql IMMUTABLE
    AS $$ SELECT ARRAY['signer_audit']::text[] $$;

CREATE PROCEDURE custody_apply_role_grants() LANGUAGE plpgsql AS $$
DECLARE
    v_signer text[] := custody_signer_tables();
    v_missing text;
    t record;
BEGIN
    SELECT min(s) INTO v_missing FROM unnest(v_signer) s
     WHERE to_regclass(format('public.%I', s)) IS NULL;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'custody_signer_tables() names %, which is not a table in public', v_missing;
    END IF;

    EXECUTE format('GRANT CONNECT ON DATABASE %I TO custody_api, custody_worker, custody_signer', current_database());
    REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    GRANT USAGE ON SCHEMA public TO custody_api, custody_worker, custody_signer;

    -- From nothing, so that running it again converges whatever was granted before.
    REVOKE ALL ON ALL TABLES IN SCHEMA public FROM custody_api, custody_worker, custody_signer;
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM custody_api, custody_worker, custody_signer;
    REVOKE ALL ON ALL ROUTINES IN SCHEMA public FROM PUBLIC, custody_api, custody_worker, custody_signer;

    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO custody_api, custody_worker;
    GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO custody_api, custody_worker;
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO custody_api, custody_worker;
    GRANT SELECT ON ALL TABLES IN SCHEMA public TO custody_signer;
    REVOKE EXECUTE ON PROCEDURE custody_apply_role_grants() FROM PUBLIC, custody_api, custody_worker;

    -- Written by migrations only.
    REVOKE INSERT, UPDATE, DELETE ON alembic_version FROM custody_api, custody_worker;

    -- The signer's own tables: only the signer writes them (INSERT: they are append-only).
    FOR t IN SELECT c.oid, c.relname FROM pg_class c
              WHERE c.relnamespace = 'public'::regnamespace AND c.relname = ANY (v_signer) LOOP
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE ON public.%I FROM custody_api, custody_worker', t.relname);
        EXECUTE format('GRANT INSERT ON public.%I TO custody_signer', t.relname);
    END LOOP;
    -- ... and their own sequences (serial / identity columns): nextval for the signer only.
    FOR t IN SELECT s.relname FROM pg_depend d
               JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
               JOIN pg_class c ON c.oid = d.refobjid
              WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
                AND d.deptype IN ('a', 'i') AND c.relnamespace = 'public'::regnamespace
                AND c.relname = ANY (v_signer) LOOP
        EXECUTE format('REVOKE USAGE, UPDATE ON SEQUENCE public.%I FROM custody_api, custody_worker', t.relname);
        EXECUTE format('GRANT USAGE ON SEQUENCE public.%I TO custody_signer', t.relname);
    END LOOP;

    -- Objects the calling role (the migration owner) creates from now on.
    ALTER DEFAULT PRIVILEGES IN SCHEMA public
        GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO custody_api, custody_worker;
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO custody_signer;
    ALTER DEFAULT PRIVILEGES IN SCHEMA public
        GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO custody_api, custody_worker;
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT EXECUTE ON FUNCTIONS TO custody_api, custody_worker;
    ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
END $$;

CALL custody_apply_role_grants();
"""


def upgrade() -> None:
    op.execute(CREATE_ROLES)
    op.execute(GRANTS)


def downgrade() -> None:
    # The roles are cluster-wide (other databases may use them): only this database's privileges
    # and default privileges for them go (DROP OWNED BY: they own nothing here).
    op.execute("""
DROP PROCEDURE custody_apply_role_grants();
DROP FUNCTION custody_signer_tables();
DROP OWNED BY custody_api, custody_worker, custody_signer;
ALTER DEFAULT PRIVILEGES GRANT EXECUTE ON FUNCTIONS TO PUBLIC;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO PUBLIC;
""")
