"""custody_api opens only the service's own accounts with their kind's limits, and names only a real
principal as the actor of a price or an API key change (the lead's brief H2, items 1 and 3).

Revision ID: 0052_trust_gaps
Revises: 0051_adjustment_signatures

Why:
- custody_api INSERTs `account` (0049 left it: `POST /v1/accounts`, matching's market and customer
  accounts, convert's, the asset's firm accounts, reconciliation's location accounts) and so chose a
  new account's kind, flags and owner freely: a customer account with `may_go_negative` (post from an
  empty account: money from nothing), or an equity or location account under a name of its own.
  Every account the service opens has its kind's default limits (`ledger.model.DEFAULT_LIMITS`:
  nothing passes others) and a name the kind's opener derives from the asset.
- `convert_price_set(by, ...)` (0040, SECURITY DEFINER) wrote whatever `by` its caller passed into the
  price's `set_by` and its audit row: a custody_api session could set a price in the name of anyone,
  of nobody, or of the service itself (`custody`). The route passes its principal's name, but the
  database took the api's word. `custody_revoke_api_key` / `custody_rotate_api_key` (0031) check the
  calling key (`p_caller`) but wrote a free `p_by` as the audit actor.

What changes:
- BEFORE INSERT on `account`, for custody_api only (`WHEN current_user = 'custody_api'`;
  `custody_api_account_opening()`, SECURITY INVOKER): a new account is refused
  (insufficient_privilege, 42501) unless its `may_go_negative` / `may_go_positive` are its kind's
  defaults and its name is the one the service opens for that kind:
  customer `customer:<owner>:<asset>` or `customer:<owner>:<asset>:<suffix>` with an owner of
  1-100 `[A-Za-z0-9._@+-]` (custody.money_rules); equity, suspense, quarantine, in-flight and
  network fees `<role>:<asset>` (custody.wallets.FIRM_ACCOUNTS); fee income `fees:<asset>` or a
  market's `matching:<symbol>:fees` owned by `matching:<symbol>`; dust `dust:<asset>` or
  `convert:rounding:<asset>`; liquidity `convert:liquidity:<asset>`; asset location
  `location:<chain>:<tier>:<asset>` where the chain is the asset's (`chain_asset`) and the tier one
  of deposit, hot, warm, cold. Firm accounts have no owner. A name that exists already passes (the
  INSERT's ON CONFLICT answers the existing row; a plain INSERT fails on the unique name), so
  re-opening is idempotent as before. The worker and the owner are not restricted.
- `convert_price_set`: called by a service role (`custody_called_by_service_role()`, 0031), `by` must
  be `api:<name>` of a live operator or admin API key (not revoked, or in a rotation's grace period)
  or of an active operator or admin console credential, else 42501. The route now passes
  `api:<principal name>`, as every other route names its actor. The owner's sessions may name
  anyone (they are the administrators).
- `custody_revoke_api_key` / `custody_rotate_api_key` with a caller: `by` must be `api:<the calling
  key's name>` (42501 otherwise).
- `CALL custody_apply_role_grants()`: the new trigger function is executable by no process role
  (0049).

Who can forge what (honest): custody_api still opens each firm account the service would open for
an existing asset and chain (once: names are unique), and it may still debit existing firm accounts
through the ledger's functions (SECURITY INVOKER) and write `account_balance` (INSERT, UPDATE: the
functions need both), which this migration does not change. It can still name any live operator's
key as a price's actor: the database cannot check an API key (its hash needs the api's pepper).
"""
import importlib.util
import re
from pathlib import Path

from alembic import op

revision = "0052_trust_gaps"
down_revision = "0051_adjustment_signatures"
branch_labels = None
depends_on = None


def _sibling(filename: str):
    """A migration module of this directory, loaded by path (their names start with a digit)."""
    spec = importlib.util.spec_from_file_location(f"_migration_{filename[:4]}", Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ACCOUNT_OPENING = r"""
CREATE FUNCTION custody_api_account_opening() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_parts text[] := string_to_array(NEW.name, ':');
    v_customer text := 'customer:' || NEW.owner || ':' || NEW.asset;
    v_limits boolean;
    v_named boolean;
BEGIN
    IF EXISTS (SELECT 1 FROM account WHERE name = NEW.name) THEN
        RETURN NEW;  -- a re-opening: ON CONFLICT (name) answers the existing row, a plain INSERT fails
    END IF;
    -- ledger.model.DEFAULT_LIMITS: (may_go_negative, may_go_positive) per kind
    SELECT NEW.may_go_negative = l.neg AND NEW.may_go_positive = l.pos INTO v_limits
      FROM (VALUES ('customer', false, true), ('fee_income', false, true), ('liquidity', false, true),
                   ('in_flight', false, true), ('asset_location', true, false),
                   ('network_fee_expense', true, false), ('suspense', true, true), ('quarantine', false, true),
                   ('dust', false, true), ('equity', true, true)) AS l(kind, neg, pos)
     WHERE l.kind = NEW.kind;
    v_named := CASE NEW.kind
        WHEN 'customer' THEN
            NEW.owner ~ '^[A-Za-z0-9._@+-]{1,100}$'
            AND (NEW.name = v_customer
                 OR (starts_with(NEW.name, v_customer || ':') AND length(NEW.name) > length(v_customer) + 1))
        WHEN 'equity' THEN NEW.owner IS NULL AND NEW.name = 'equity:' || NEW.asset
        WHEN 'suspense' THEN NEW.owner IS NULL AND NEW.name = 'suspense:' || NEW.asset
        WHEN 'quarantine' THEN NEW.owner IS NULL AND NEW.name = 'quarantine:' || NEW.asset
        WHEN 'in_flight' THEN NEW.owner IS NULL AND NEW.name = 'in_flight:' || NEW.asset
        WHEN 'network_fee_expense' THEN NEW.owner IS NULL AND NEW.name = 'network_fees:' || NEW.asset
        WHEN 'dust' THEN NEW.owner IS NULL AND NEW.name IN ('dust:' || NEW.asset, 'convert:rounding:' || NEW.asset)
        WHEN 'liquidity' THEN NEW.owner IS NULL AND NEW.name = 'convert:liquidity:' || NEW.asset
        WHEN 'fee_income' THEN
            (NEW.owner IS NULL AND NEW.name = 'fees:' || NEW.asset)
            OR (cardinality(v_parts) = 3 AND v_parts[1] = 'matching' AND v_parts[2] ~ '^[A-Za-z0-9_.-]{1,40}$'
                AND v_parts[3] = 'fees' AND NEW.owner = 'matching:' || v_parts[2])
        WHEN 'asset_location' THEN
            NEW.owner IS NULL AND cardinality(v_parts) = 4 AND v_parts[1] = 'location'
            AND v_parts[2] = (SELECT ca.chain FROM chain_asset ca WHERE ca.asset = NEW.asset)
            AND v_parts[3] IN ('deposit', 'hot', 'warm', 'cold') AND v_parts[4] = NEW.asset
        ELSE false
    END;
    IF NOT coalesce(v_limits AND v_named, false) THEN
        RAISE EXCEPTION 'ledger: % may open only the service''s own accounts with their kind''s limits, not % account % '
                        '(may_go_negative %, may_go_positive %, owner %)',
            current_user, NEW.kind, NEW.name, NEW.may_go_negative, NEW.may_go_positive, NEW.owner
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER account_api_opening BEFORE INSERT ON account
    FOR EACH ROW WHEN (current_user = 'custody_api') EXECUTE FUNCTION custody_api_account_opening();
"""

ACCOUNT_OPENING_DOWN = """
DROP TRIGGER account_api_opening ON account;
DROP FUNCTION custody_api_account_opening();
"""

# Is `p_by` the route's actor name (`api:<name>`) of a principal that may set a price now?
PRICE_ACTOR = """
    IF custody_called_by_service_role() AND NOT (
           left(p_by, 4) = 'api:'
           AND (EXISTS (SELECT 1 FROM api_key k WHERE k.name = substr(p_by, 5) AND k.role IN ('operator', 'admin')
                           AND (k.revoked_at IS NULL OR k.revoked_at > now()))
                OR EXISTS (SELECT 1 FROM console_credential cc WHERE cc.username = substr(p_by, 5)
                              AND cc.state = 'active' AND cc.role IN ('operator', 'admin')))) THEN
        RAISE EXCEPTION 'convert: % is not a live operator''s or admin''s actor name (api:<key or console user>)', p_by
            USING ERRCODE = 'insufficient_privilege';
    END IF;
"""

# The audit actor of a key change made through the api is the calling key's own name.
KEY_ACTOR = """
    IF p_caller IS NOT NULL AND p_by IS DISTINCT FROM 'api:' || (SELECT name FROM api_key WHERE id = p_caller) THEN
        RAISE EXCEPTION 'the actor % is not the calling key''s (api:<its name>)', p_by USING ERRCODE = 'insufficient_privilege';
    END IF;
"""
_LOOKUP = "    SELECT * INTO k FROM api_key WHERE id = p_id FOR UPDATE;\n"
_PRICE_BEGIN = "BEGIN\n    IF p_by IS NULL OR length(p_by) = 0 THEN"


def _function(source: str, head: str) -> str:
    """The CREATE FUNCTION statement starting with `head` in migration text `source`, as CREATE OR REPLACE."""
    found = re.search(re.escape(head) + r".*?END \$\$;", source, re.S)
    assert found is not None, head
    return found.group(0).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def _inserted(function: str, before: str, check: str) -> str:
    assert function.count(before) == 1, before
    return function.replace(before, check.lstrip("\n") + before)


_0031 = _sibling("0031_key_grace.py").SQL
_0040 = _sibling("0040_convert_fixes.py").UPGRADE
REVOKE_0031 = _function(_0031, "CREATE FUNCTION custody_revoke_api_key(p_id bigint, p_by text, p_caller bigint)")
ROTATE_0031 = _function(_0031, "CREATE FUNCTION custody_rotate_api_key(p_id bigint, p_prefix text, p_hash text, "
                               "p_grace_seconds integer, p_by text,")
PRICE_0040 = _function(_0040, "CREATE FUNCTION convert_price_set(p_by text, p_base text, p_quote text, p_price numeric)")
PRICE_0052 = PRICE_0040.replace(_PRICE_BEGIN, _PRICE_BEGIN.replace("BEGIN\n", "BEGIN\n" + PRICE_ACTOR.lstrip("\n"), 1), 1)
assert PRICE_0052 != PRICE_0040


def upgrade() -> None:
    op.execute(ACCOUNT_OPENING)
    op.execute(PRICE_0052)
    op.execute(_inserted(REVOKE_0031, _LOOKUP, KEY_ACTOR))
    op.execute(_inserted(ROTATE_0031, _LOOKUP, KEY_ACTOR))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(REVOKE_0031)
    op.execute(ROTATE_0031)
    op.execute(PRICE_0040)
    op.execute(ACCOUNT_OPENING_DOWN)
    op.execute("CALL custody_apply_role_grants()")
