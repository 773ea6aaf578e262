"""A refill's and its approvals' time stamps are the database's, and stay (review 16, R2-5/R2-6).

Revision ID: 0050_refill_times
Revises: 0049_role_hardening

Why: a refill expires `refill_ttl` after `created_at` (custody.rebalances `refuse_late_approval`,
`expire_refill`), and the worker now counts towards a refill's quorum only the approvals stamped
before `created_at + refill_ttl` (`counted_refill_approvals`). Both stamps were whatever the
inserter wrote: custody_api may INSERT `rebalance` (any column, `POST /v1/rebalances/run`),
`rebalance_approval` and `eth_rebalance_approval` (0038, 0044), so it could store a late approval
stamped early, or open a refill stamped in the future; the worker's role may UPDATE every column of
`rebalance` and `eth_rebalance`, so a process role could also move a refill's `created_at` later.

What changes:
- BEFORE INSERT on `rebalance_approval` and `eth_rebalance_approval`: `at` := now(), whatever the
  inserter wrote. The api's own INSERT (custody.rebalances `store_refill_approval`) never names
  `at` (its default was now() already), in the same transaction as the door's check, so the stamp
  and the door's clock are the same `now()`. UPDATE of an approval stays refused for every role
  (0038/0042's append-only triggers).
- BEFORE INSERT on `rebalance` and `eth_rebalance`: `created_at` := now(), whatever was written
  (no code writes it; the default was now()).
- BEFORE UPDATE OF created_at on `rebalance` and `eth_rebalance`: a change of `created_at` is
  refused (restrict_violation) unless the writer is a member of the table's owner role (the
  migrations, an administrator's session; superusers are members of every role). custody_api has
  no UPDATE grant on the column anyway (0038: state, containment, updated_at, txid, raw, fee);
  custody_worker and custody_signer never move it. The owner's exception is for repair and for the
  tests' clock (they age a row by moving its stamps back, as waiting would).
No grant changes and no table is added.
"""
from alembic import op

revision = "0050_refill_times"
down_revision = "0049_role_hardening"
branch_labels = None
depends_on = None

UPGRADE = """
CREATE FUNCTION custody_refill_created_now() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.created_at := now();  -- a refill's age is the database's clock, never the inserter's word
    RETURN NEW;
END $$;

CREATE FUNCTION custody_refill_approval_at_now() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.at := now();  -- when an approval was given is the database's clock, never the inserter's word
    RETURN NEW;
END $$;

-- SECURITY INVOKER on purpose: current_user is the writer whose right to move the stamp is checked.
CREATE FUNCTION custody_refill_created_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'MEMBER') THEN
        RAISE EXCEPTION 'refill: % may not change %.created_at (a refill''s expiry counts from it)',
            current_user, TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER rebalance_created_now BEFORE INSERT ON rebalance
    FOR EACH ROW EXECUTE FUNCTION custody_refill_created_now();
CREATE TRIGGER eth_rebalance_created_now BEFORE INSERT ON eth_rebalance
    FOR EACH ROW EXECUTE FUNCTION custody_refill_created_now();
CREATE TRIGGER rebalance_approval_at_now BEFORE INSERT ON rebalance_approval
    FOR EACH ROW EXECUTE FUNCTION custody_refill_approval_at_now();
CREATE TRIGGER eth_rebalance_approval_at_now BEFORE INSERT ON eth_rebalance_approval
    FOR EACH ROW EXECUTE FUNCTION custody_refill_approval_at_now();
CREATE TRIGGER rebalance_created_fixed BEFORE UPDATE OF created_at ON rebalance
    FOR EACH ROW WHEN (NEW.created_at IS DISTINCT FROM OLD.created_at) EXECUTE FUNCTION custody_refill_created_fixed();
CREATE TRIGGER eth_rebalance_created_fixed BEFORE UPDATE OF created_at ON eth_rebalance
    FOR EACH ROW WHEN (NEW.created_at IS DISTINCT FROM OLD.created_at) EXECUTE FUNCTION custody_refill_created_fixed();
"""
DOWNGRADE = """
DROP TRIGGER eth_rebalance_created_fixed ON eth_rebalance;
DROP TRIGGER rebalance_created_fixed ON rebalance;
DROP TRIGGER eth_rebalance_approval_at_now ON eth_rebalance_approval;
DROP TRIGGER rebalance_approval_at_now ON rebalance_approval;
DROP TRIGGER eth_rebalance_created_now ON eth_rebalance;
DROP TRIGGER rebalance_created_now ON rebalance;
DROP FUNCTION custody_refill_created_fixed();
DROP FUNCTION custody_refill_approval_at_now();
DROP FUNCTION custody_refill_created_now();
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    # the procedure (0049) takes EXECUTE on the new trigger functions away from the process roles
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(DOWNGRADE)
