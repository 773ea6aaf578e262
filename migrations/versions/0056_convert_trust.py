"""An operator's convert price counts only once the worker verified its signature; a book quote is
always banded by an operator price; no process role writes a treasury adjustment already approved
(review R1: convert price, book fill, worker adjustment).

Revision ID: 0056_convert_trust
Revises: 0055_ledger_fn_hardening

Why (each reproduced by tests/integration/test_review_r1_*.py):
- custody_api held EXECUTE on `convert_price_set` (0040/0052): 0052 checks that `by` names a live
  operator's or admin's key, but key names are readable, so the api set any price under an
  operator's name, quoted at it and accepted: `convert_accept` pays its checked quote past the
  liquidity guard (0054), so the house's liquidity was sold for cents.
- a `book:<symbol>` quote of a pair without an operator price was bounded only by the market's last
  `fill`, and custody_api INSERTs `market`, `matching_command`, `trade_order` and `fill`: a fill of
  its own making set the reference.
- custody_worker (and custody_api) could INSERT a `treasury_adjustment` already `approved` with legs
  of its choice and no vote; the liquidity guard (0051) checks only the row's state and legs, so the
  worker alone posted a liquidity debit to an account of its choosing.

What changes:
- `convert_price_change` (new): a proposed price of a pair (`POST /v1/convert/prices`, the api),
  the proposer's or another operator's signature over its canonical payload
  (signer.approvals.convert_price_payload: id, pair, price, proposer, expiry), stored by the api
  (`proposed -> signed`), and its outcome, written by the worker (`signed -> applied | refused`,
  `proposed -> refused` once expired). A BEFORE trigger (`convert_price_change_guard`, for
  custody_api and custody_worker) makes every INSERT a fresh proposal (state `proposed`, no
  signature, `created_at` now, `expires_at` at most 15 minutes ahead) and allows only those moves
  per role; custody_api may INSERT and UPDATE only the signature columns, `state` and
  `updated_at`; custody_worker UPDATEs only `state`, `refusal` and `updated_at`.
- `convert_price_set` (0040/0052, unchanged body) is no longer executable by custody_api (nor
  custody_signer, nor PUBLIC): the worker's `convert-prices` job (custody.convert.prices) calls it
  after verifying the change's signature against ITS approver keys, the key being the signer's own
  and live. `custody_apply_role_grants()` revokes it each time it runs (a section appended to the
  procedure as the database holds it, so whatever 0055 added stays).
- `convert_quote_create` (0040's, replaced): a `book:` quote needs an operator price of the pair
  (else 42501): every book quote is banded by it (and by the last fill when there is one), so a
  forged fill cannot move a quote beyond the operator's band.
- `treasury_adjustment`: a BEFORE trigger (`treasury_adjustment_guard`, process roles only) makes
  an INSERT `proposed` with no posting, and allows custody_worker only `approved -> posted |
  proposed` and custody_api only `proposed -> approved | rejected`, `approved -> rejected`.
  custody_worker loses INSERT and DELETE on `treasury_adjustment` and every write on
  `treasury_adjustment_vote` (it writes neither: custody.adjustments.post_approved only moves
  states and records the posting); it UPDATEs only `state`, `updated_at`, `transaction_id`.

Who can still do what (honest): a compromised api together with a compromised worker still posts
any legs (the api proposes and marks approved, the worker posts): the database cannot verify a
signature. A compromised worker alone sets any price under a live operator's name (it holds
`convert_price_set`), as it was trusted to verify; the api alone can withhold or refuse-by-garbage a
change (a denial), and can still write fills, which now only tighten a book quote within the
operator's band (each quote is still bounded by the operator price plus the band, 5 % by default).
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0056_convert_trust"
down_revision = "0055_ledger_fn_hardening"
branch_labels = None
depends_on = None


def _sibling(filename: str):
    """A migration module of this directory, loaded by path (their names start with a digit)."""
    spec = importlib.util.spec_from_file_location(f"_migration_{filename[:4]}", Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_0040 = _sibling("0040_convert_fixes.py")


def _replaced(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


# ---- convert_quote_create: a book quote needs the operator's price ---------------------------------

_QUOTE_0040 = re.search(r"CREATE OR REPLACE FUNCTION convert_quote_create\(.*?END \$\$;", _0040.UPGRADE, re.S)
assert _QUOTE_0040 is not None
QUOTE_0040 = _QUOTE_0040.group(0)
QUOTE = _replaced(
    QUOTE_0040,
    "        SELECT f.base_amount, f.quote_amount INTO v_fill_base, v_fill_quote FROM fill f\n",
    "        IF v_ref_num IS NULL THEN  -- 0056: the api writes fills; only the operator's price bands a book\n"
    "            RAISE EXCEPTION 'convert: % has no operator price of % / % to band its book quote', p_source,\n"
    "                v_from.asset, v_to.asset USING ERRCODE = 'insufficient_privilege';\n"
    "        END IF;\n"
    "        SELECT f.base_amount, f.quote_amount INTO v_fill_base, v_fill_quote FROM fill f\n")

# ---- proposed prices -------------------------------------------------------------------------------

PRICE_CHANGES = r"""
CREATE TABLE convert_price_change (
    id                          bigserial PRIMARY KEY,
    request_key                 text NOT NULL UNIQUE,
    base_asset                  text NOT NULL REFERENCES asset(code),
    quote_asset                 text NOT NULL REFERENCES asset(code),
    quote_minor_per_base_unit   numeric(78,0) NOT NULL CHECK (quote_minor_per_base_unit > 0),
    proposed_by                 text NOT NULL,
    expires_at                  timestamptz NOT NULL,
    state                       text NOT NULL DEFAULT 'proposed'
                                CHECK (state IN ('proposed', 'signed', 'applied', 'refused')),
    signed_by                   text,
    key_id                      text,
    scheme                      text CHECK (scheme IN ('ed25519', 'webauthn')),
    signature                   bytea,
    authenticator_data          bytea,
    client_data_json            bytea,
    refusal                     text,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now(),
    CHECK (base_asset <> quote_asset)
);
CREATE INDEX convert_price_change_open ON convert_price_change (id) WHERE state IN ('proposed', 'signed');

CREATE FUNCTION convert_price_change_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN  -- always a fresh, unsigned proposal that expires soon
        NEW.state := 'proposed';
        NEW.signed_by := NULL;
        NEW.key_id := NULL;
        NEW.scheme := NULL;
        NEW.signature := NULL;
        NEW.authenticator_data := NULL;
        NEW.client_data_json := NULL;
        NEW.refusal := NULL;
        NEW.created_at := now();
        NEW.updated_at := now();
        NEW.expires_at := least(NEW.expires_at, now() + interval '15 minutes');
        RETURN NEW;
    END IF;
    IF (current_user = 'custody_api' AND OLD.state = 'proposed' AND NEW.state IN ('proposed', 'signed'))
       OR (current_user = 'custody_worker' AND OLD.state IN ('proposed', 'signed') AND NEW.state IN ('applied', 'refused')
           AND (OLD.state = 'signed' OR NEW.state = 'refused')) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'convert: % may not move a price change from % to %', current_user, OLD.state, NEW.state
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER convert_price_change_guard BEFORE INSERT OR UPDATE ON convert_price_change
    FOR EACH ROW WHEN (current_user IN ('custody_api', 'custody_worker')) EXECUTE FUNCTION convert_price_change_guard();

CREATE FUNCTION treasury_adjustment_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN  -- a proposal; only verified signatures approve it (custody.adjustments)
        NEW.state := 'proposed';
        NEW.transaction_id := NULL;
        RETURN NEW;
    END IF;
    IF NEW.state IS NOT DISTINCT FROM OLD.state
       OR (current_user = 'custody_worker' AND OLD.state = 'approved' AND NEW.state IN ('posted', 'proposed'))
       OR (current_user = 'custody_api' AND ((OLD.state = 'proposed' AND NEW.state IN ('approved', 'rejected'))
                                             OR (OLD.state = 'approved' AND NEW.state = 'rejected'))) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'treasury adjustment: % may not move an adjustment from % to %', current_user, OLD.state, NEW.state
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER treasury_adjustment_guard BEFORE INSERT OR UPDATE ON treasury_adjustment
    FOR EACH ROW WHEN (current_user IN ('custody_api', 'custody_worker')) EXECUTE FUNCTION treasury_adjustment_guard();
"""

PRICE_CHANGES_DOWN = """
DROP TRIGGER treasury_adjustment_guard ON treasury_adjustment;
DROP FUNCTION treasury_adjustment_guard();
DROP TABLE convert_price_change;
DROP FUNCTION convert_price_change_guard();
"""

# ---- grants ----------------------------------------------------------------------------------------

API_PRICE_CHANGE = "INSERT, UPDATE (state, signed_by, key_id, scheme, signature, authenticator_data, client_data_json, updated_at)"
API_LIST = _0040._set_limited(
    "SELECT relation, privileges, n FROM custody_api_limited_tables() WITH ORDINALITY AS l(relation, privileges, n) "
    f"UNION ALL SELECT 'convert_price_change', '{API_PRICE_CHANGE}', 1000000")
API_LIST_DOWN = _0040._set_limited(
    "SELECT relation, privileges, n FROM custody_api_limited_tables() WITH ORDINALITY AS l(relation, privileges, n) "
    "WHERE relation <> 'convert_price_change'")

MARK = "    -- 0056:"
SECTION = f"""{MARK} convert's price is set by the worker only (it verifies the operator's signature), and the
    -- worker writes no treasury adjustment nor vote, only an approved one's outcome.
    IF to_regprocedure('convert_price_set(text, text, text, numeric)') IS NOT NULL THEN
        REVOKE EXECUTE ON FUNCTION convert_price_set(text, text, text, numeric) FROM PUBLIC, custody_api, custody_signer;
    END IF;
    IF to_regclass('public.treasury_adjustment') IS NOT NULL THEN
        REVOKE INSERT, UPDATE, DELETE ON treasury_adjustment, treasury_adjustment_vote FROM custody_worker;
        GRANT UPDATE (state, updated_at, transaction_id) ON treasury_adjustment TO custody_worker;
        REVOKE USAGE, UPDATE ON SEQUENCE treasury_adjustment_id_seq FROM custody_worker;
    END IF;
    IF to_regclass('public.convert_price_change') IS NOT NULL THEN
        REVOKE INSERT, UPDATE, DELETE ON convert_price_change FROM custody_worker;
        GRANT UPDATE (state, refusal, updated_at) ON convert_price_change TO custody_worker;
        REVOKE USAGE, UPDATE ON SEQUENCE convert_price_change_id_seq FROM custody_worker;
    END IF;
"""
_PROC = "custody_apply_role_grants()"


def _procedure_now() -> str:
    return op.get_bind().execute(sa.text(f"SELECT pg_get_functiondef('{_PROC}'::regprocedure)")).scalar_one()


def _with_section(definition: str) -> str:
    """The procedure as the database holds it, with SECTION before its body's last END."""
    assert MARK not in definition, "custody_apply_role_grants() already has 0056's section"
    found = re.search(r"END\s*;?\s*\$(\w*)\$\s*$", definition)
    assert found is not None, definition[-200:]
    return definition[: found.start()] + SECTION + definition[found.start():]


def _without_section(definition: str) -> str:
    assert definition.count(SECTION) == 1, "custody_apply_role_grants() lacks 0056's section"
    return definition.replace(SECTION, "")


def upgrade() -> None:
    op.execute(QUOTE)
    op.execute(PRICE_CHANGES)
    op.execute(API_LIST)
    op.execute(_with_section(_procedure_now()))
    op.execute(f"CALL {_PROC}")


def downgrade() -> None:
    op.execute(_without_section(_procedure_now()))
    op.execute(API_LIST_DOWN)
    op.execute(PRICE_CHANGES_DOWN)
    op.execute(QUOTE_0040)
    op.execute(f"CALL {_PROC}")
