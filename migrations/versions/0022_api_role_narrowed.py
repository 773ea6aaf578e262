"""custody_api narrowed to what the api process writes (issue 12, least privilege per process).

Revision ID: 0022_api_role_narrowed
Revises: 0021_signer_signatures

Why: 0020 gave custody_api the worker's privileges (every table's INSERT, UPDATE, DELETE), so a
compromised api, the internet-facing process, was as strong as the worker: it could rewrite the
deposit wallet's xpub (new deposit addresses would pay an attacker's key while customers are
credited), record or rewrite chain transactions, coins, nonces, cursors and deposits, plant API
keys that outlive the compromise, or delete audit events and incidents. Reference data (wallets,
chain assets, cursors) is written by the worker only (custody.roots.common) and every job runs in
the worker (custody.jobs), so the api needs none of that.

What the api writes was read from its routes and the services they call, and run: every API test
of the suite sends its requests as custody_api (tests/api_role.py). Two lists, SQL functions
like `custody_signer_tables()`, say what custody_api may write; `custody_apply_role_grants()`
(redefined here: 0020's body plus the last section) applies them after the defaults, so calling
it again never re-grants what they take away:

- `custody_api_read_only_tables()`: SELECT only (their sequences: SELECT only).
- `custody_api_limited_tables()`: (relation, privileges) - custody_api's INSERT/UPDATE/DELETE on
  the relation are exactly `privileges`, in GRANT's syntax, column lists included (their
  sequences: USAGE and SELECT when the privileges include INSERT, else SELECT only).
- any other table (none today; a table a later migration creates): every write, as before.

| table | custody_api writes | why (the route or service) |
| --- | --- | --- |
| chain_asset, chain_cursor, chain_transaction, eth_nonce, matching_snapshot | nothing | reference data, the deposit scanner, payouts and the snapshot job are the worker's |
| api_key, denylist_address | nothing | written by the owner's maintenance CLI (`create-api-key`) and by hand; no process writes them |
| wallet | UPDATE (next_index) | issuing a deposit address (`Wallets.issue_address`) and `POST /v1/rebalances/run` take the next index under the row lock; the key, network and tier stay the worker's |
| wallet_utxo | UPDATE (reserved_by, rebalance_id) | `POST /v1/rebalances/run` reserves hot coins, abandoning a rebalance and retrying an unsigned set-aside batch free them; no coin recorded, spent or valued by the api |
| deposit_address | INSERT | issuing a deposit address; `first_seen_at` is the scanner's |
| deposit_observation | UPDATE (state, updated_at, journal_transaction_id, return_withdrawal_id) | an operator's release or return of a quarantined deposit, and a return that ended unpaid (`reopen_returns`); no deposit recorded by the api, nor its amount, account or block changed |
| withdrawal_batch | UPDATE (state, containment, updated_at) | `POST /v1/withdrawal-batches/{id}/retry` (active again; an unsigned one abandoned) |
| batch_output | DELETE | the same retry empties the abandoned batch |
| sweep | UPDATE (containment, updated_at) | `POST /v1/sweeps/{id}/retry` |
| rebalance | INSERT, UPDATE (state, containment, updated_at) | `POST /v1/rebalances/run` opens one (the signer checks its destination against its own cold key); abandon and retry |
| reserve_report, reserve_leaf | INSERT | `POST /v1/reserves/reports` |
| reconciliation_line | INSERT, UPDATE | `POST /v1/reconciliation`: each line keeps its previous pass (an upsert, under the row lock) |
| audit_event, approval, outbox, policy_decision, treasury_adjustment_vote, market, matching_command, fill, asset, journal_transaction, journal_entry | INSERT | append-only records of the api's own actions and the ledger's journal (its functions run as the caller) |
| account, account_balance, hold | INSERT, UPDATE | the ledger's accounts, balances and holds (postings, holds, closing an account) |
| withdrawal_request, allowlist_change, allowlist_policy, treasury_adjustment, incident, control_flag, trade_order | INSERT, UPDATE | requests, decisions, incidents, the kill switch, the order book's rows (SELECT ... FOR UPDATE needs UPDATE too) |
| allowlist_entry | INSERT, UPDATE, DELETE | a backend removes a destination (the entries are locked FOR UPDATE first) |

No table keeps DELETE for custody_api but allowlist_entry and batch_output, and the api may no
longer change the journal at all (it was the triggers that refused it; now its privileges do).

The api's `POST /v1/reconciliation` no longer runs the bitcoin hot-wallet sync first (that
records coins: the worker's payouts job does it every 3 s), see custody.roots.common.

A later migration that adds a table custody_api must not write (or writes only in part) adds it
to the right list and calls the procedure:

    CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE
        AS $$ SELECT ARRAY[..., 'the_new_table']::text[] $$;
    CALL custody_apply_role_grants();

The procedure refuses a name that is not a table, a table in both lists or among the signer's,
and privileges that are not INSERT / UPDATE [(columns)] / DELETE.
"""
from alembic import op

revision = "0022_api_role_narrowed"
down_revision = "0021_signer_signatures"
branch_labels = None
depends_on = None

LISTS = """
CREATE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE
    AS $$ SELECT ARRAY['api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address',
                       'eth_nonce', 'matching_snapshot']::text[] $$;

CREATE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text) LANGUAGE sql IMMUTABLE
    AS $$ VALUES
        ('wallet', 'UPDATE (next_index)'),
        ('wallet_utxo', 'UPDATE (reserved_by, rebalance_id)'),
        ('deposit_address', 'INSERT'),
        ('deposit_observation', 'UPDATE (state, updated_at, journal_transaction_id, return_withdrawal_id)'),
        ('withdrawal_batch', 'UPDATE (state, containment, updated_at)'),
        ('batch_output', 'DELETE'),
        ('sweep', 'UPDATE (containment, updated_at)'),
        ('rebalance', 'INSERT, UPDATE (state, containment, updated_at)'),
        ('reconciliation_line', 'INSERT, UPDATE'),
        ('reserve_report', 'INSERT'),
        ('reserve_leaf', 'INSERT'),
        ('audit_event', 'INSERT'),
        ('approval', 'INSERT'),
        ('outbox', 'INSERT'),
        ('policy_decision', 'INSERT'),
        ('treasury_adjustment_vote', 'INSERT'),
        ('market', 'INSERT'),
        ('matching_command', 'INSERT'),
        ('fill', 'INSERT'),
        ('account', 'INSERT, UPDATE'),
        ('account_balance', 'INSERT, UPDATE'),
        ('asset', 'INSERT'),
        ('hold', 'INSERT, UPDATE'),
        ('journal_transaction', 'INSERT'),
        ('journal_entry', 'INSERT'),
        ('withdrawal_request', 'INSERT, UPDATE'),
        ('allowlist_change', 'INSERT, UPDATE'),
        ('allowlist_policy', 'INSERT, UPDATE'),
        ('treasury_adjustment', 'INSERT, UPDATE'),
        ('incident', 'INSERT, UPDATE'),
        ('control_flag', 'INSERT, UPDATE'),
        ('trade_order', 'INSERT, UPDATE'),
        ('allowlist_entry', 'INSERT, UPDATE, DELETE')
    $$;
"""

# 0020's procedure, unchanged down to the default privileges, then the api's narrowing.
PROCEDURE = """
CREATE OR REPLACE PROCEDURE custody_apply_role_grants() LANGUAGE plpgsql AS $$
DECLARE
    v_signer text[] := custody_signer_tables();
    v_read_only text[] := custody_api_read_only_tables();
    v_missing text;
    t record;
BEGIN
    SELECT min(s) INTO v_missing FROM unnest(v_signer) s
     WHERE to_regclass(format('public.%I', s)) IS NULL;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'custody_signer_tables() names %, which is not a table in public', v_missing;
    END IF;
    SELECT min(s) INTO v_missing FROM (SELECT unnest(v_read_only) UNION ALL SELECT relation FROM custody_api_limited_tables()) x(s)
     WHERE to_regclass(format('public.%I', s)) IS NULL;
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'custody_api_read_only_tables() or custody_api_limited_tables() names %, which is not a table in public', v_missing;
    END IF;
    SELECT min(s) INTO v_missing FROM (SELECT unnest(v_read_only) UNION ALL SELECT relation FROM custody_api_limited_tables()) x(s)
     GROUP BY s HAVING count(*) > 1 OR s = ANY (v_signer) OR s = 'alembic_version';
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION '% is listed twice for custody_api, or is the signer''s or alembic_version', v_missing;
    END IF;
    SELECT min(relation) INTO v_missing FROM custody_api_limited_tables()
     WHERE privileges !~ '^(INSERT|DELETE|UPDATE( \\([a-z_]+(, [a-z_]+)*\\))?)(, (INSERT|DELETE|UPDATE( \\([a-z_]+(, [a-z_]+)*\\))?))*$';
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'custody_api_limited_tables(): the privileges of % are not INSERT, UPDATE [(columns)], DELETE', v_missing;
    END IF;

    EXECUTE format('GRANT CONNECT ON DATABASE %I TO custody_api, custody_worker, custody_signer', current_database());
    REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    GRANT USAGE ON SCHEMA public TO custody_api, custody_worker, custody_signer;

    -- From nothing, so that running it again converges whatever was granted before (a table's
    -- REVOKE takes its column privileges with it).
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

    -- custody_api (0022): read-only tables, then tables it writes only in part (the lists above).
    FOR t IN SELECT s AS relname, NULL::text AS privileges FROM unnest(v_read_only) s
             UNION ALL SELECT relation, privileges FROM custody_api_limited_tables() LOOP
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE ON public.%I FROM custody_api', t.relname);
        IF t.privileges IS NOT NULL THEN
            EXECUTE format('GRANT %s ON public.%I TO custody_api', t.privileges, t.relname);
        END IF;
    END LOOP;
    FOR t IN SELECT s.relname, l.privileges FROM pg_depend d
               JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
               JOIN pg_class c ON c.oid = d.refobjid
               LEFT JOIN custody_api_limited_tables() l ON l.relation = c.relname
              WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
                AND d.deptype IN ('a', 'i') AND c.relnamespace = 'public'::regnamespace
                AND (c.relname = ANY (v_read_only) OR l.relation IS NOT NULL) LOOP
        EXECUTE format('REVOKE USAGE, UPDATE ON SEQUENCE public.%I FROM custody_api', t.relname);
        IF t.privileges ~ '\\mINSERT\\M' THEN
            EXECUTE format('GRANT USAGE ON SEQUENCE public.%I TO custody_api', t.relname);
        END IF;
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
"""

# 0020's procedure as it was (for the downgrade).
PROCEDURE_0020 = """
CREATE OR REPLACE PROCEDURE custody_apply_role_grants() LANGUAGE plpgsql AS $$
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

    REVOKE ALL ON ALL TABLES IN SCHEMA public FROM custody_api, custody_worker, custody_signer;
    REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM custody_api, custody_worker, custody_signer;
    REVOKE ALL ON ALL ROUTINES IN SCHEMA public FROM PUBLIC, custody_api, custody_worker, custody_signer;

    GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO custody_api, custody_worker;
    GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO custody_api, custody_worker;
    GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO custody_api, custody_worker;
    GRANT SELECT ON ALL TABLES IN SCHEMA public TO custody_signer;
    REVOKE EXECUTE ON PROCEDURE custody_apply_role_grants() FROM PUBLIC, custody_api, custody_worker;

    REVOKE INSERT, UPDATE, DELETE ON alembic_version FROM custody_api, custody_worker;

    FOR t IN SELECT c.oid, c.relname FROM pg_class c
              WHERE c.relnamespace = 'public'::regnamespace AND c.relname = ANY (v_signer) LOOP
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE ON public.%I FROM custody_api, custody_worker', t.relname);
        EXECUTE format('GRANT INSERT ON public.%I TO custody_signer', t.relname);
    END LOOP;
    FOR t IN SELECT s.relname FROM pg_depend d
               JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S'
               JOIN pg_class c ON c.oid = d.refobjid
              WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass
                AND d.deptype IN ('a', 'i') AND c.relnamespace = 'public'::regnamespace
                AND c.relname = ANY (v_signer) LOOP
        EXECUTE format('REVOKE USAGE, UPDATE ON SEQUENCE public.%I FROM custody_api, custody_worker', t.relname);
        EXECUTE format('GRANT USAGE ON SEQUENCE public.%I TO custody_signer', t.relname);
    END LOOP;

    ALTER DEFAULT PRIVILEGES IN SCHEMA public
        GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO custody_api, custody_worker;
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO custody_signer;
    ALTER DEFAULT PRIVILEGES IN SCHEMA public
        GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO custody_api, custody_worker;
    ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT EXECUTE ON FUNCTIONS TO custody_api, custody_worker;
    ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;
END $$;
"""


def upgrade() -> None:
    op.execute(LISTS)
    op.execute(PROCEDURE)
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(PROCEDURE_0020)
    op.execute("DROP FUNCTION custody_api_limited_tables(); DROP FUNCTION custody_api_read_only_tables();")
    op.execute("CALL custody_apply_role_grants()")
