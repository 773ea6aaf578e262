"""Convert fixes (review 15, R15-C1..C4): every quote's rate bounded by a reference the api cannot write.

Revision ID: 0040_convert_fixes
Revises: 0038_treasury_tiers

Why: `convert_quote_create` (0033) took any rate under a source named `book:<anything>`, even for a
pair without a market (C1); it checked the fee and spread against the rates its caller passed
(C2); a book's price was trusted whatever it was, so a customer's own ask on an empty side priced a
quote against the house (C3, the Python side is `custody.convert.service`); and two concurrent
requests under one key raised a unique violation instead of answering one quote (C4).

What changes:
- `convert_config` (one row, `id = 1`): the convert fee, spread and price band in parts per
  million. Written by the owner (this migration's defaults: 2500, 0, 50,000 = 5 %) and by the
  worker at start-up from its settings (`CONVERT_FEE_PPM`, `CONVERT_SPREAD_PPM`,
  `CONVERT_PRICE_BAND_PPM`; `custody.convert.service.write_config`). Read-only for custody_api.
- `convert_price` becomes read-only for custody_api (0033 let it INSERT and UPDATE). An operator's
  price is written only through `convert_price_set(by, base, quote, price)` (SECURITY DEFINER,
  `search_path` pinned), which writes the price and its `audit_event` row in one statement: the api
  can no longer change a price without the audit log saying so (and who it says did it).
- `convert_quote_create` (same signature, replaced):
  - the fee and spread rates must be `convert_config`'s (`p_fee_ppm`, `p_spread_ppm` are checked
    against the row, never trusted): a quote with another rate is refused (42501);
  - a source `book:<symbol>` must name a `market` row of the quote's two assets (else 42501);
  - every rate is bounded by a reference the api cannot write or move at will: for `operator`,
    the operator's price less the spread (as before); for a book, both the market's last fill (its
    `quote_amount / base_amount`; `fill` is append-only) and the operator's price of the pair,
    each that exists, times (10^6 + band) / 10^6 and less the spread. A book-priced pair with
    neither reference is refused (42501): the api refuses it first with `convert_book_unreliable`;
  - the insert is `ON CONFLICT (request_key) DO NOTHING`: a concurrent request under the same key
    waits for the first, then answers its quote (`exists`, or `idempotency_conflict` for another
    request).

Who can forge what now (honest): a compromised api can still call `convert_price_set` (it serves
the operators' route) naming any operator, but each change is in the audit log; it can write a
`fill` row backed by a journal transaction of its own (the matching engine lives in the api), which
moves a book's reference: the liquidity guard (0033) and the band bound what one forged fill can
take, not to zero.

The custody_api role lists are rewritten from the database's own (0038's at this point of the
chain, plus anything a migration chained before this one added): `convert_price` moves from the
limited list to the read-only one and `convert_config` joins it (`TO_0040`; `FROM_0040` undoes it).
"""
import importlib.util
import re
from pathlib import Path

from alembic import op

revision = "0040_convert_fixes"
down_revision = "0042_eth_rebalances"
branch_labels = None
depends_on = None


def _sibling(filename: str):
    """A migration module of this directory, loaded by path (their names start with a digit)."""
    spec = importlib.util.spec_from_file_location(f"_migration_{filename[:4]}", Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# custody_api's lists are rewritten from what the database holds at this point of the chain (0038's
# LIMITED_0038 / READ_ONLY_0038, plus whatever a migration chained before this one added), so a
# re-chaining keeps every other migration's rows: `convert_price` leaves the limited list and joins
# the read-only one with `convert_config`; downgrade does the reverse.
LIMITED_NOW = ("SELECT relation, privileges, n FROM custody_api_limited_tables() "
               "WITH ORDINALITY AS l(relation, privileges, n)")


def _set_limited(rows: str) -> str:
    """Redefine custody_api_limited_tables() as the rows (relation, privileges, n) of `rows`, by n."""
    return f"""
DO $do$
DECLARE v_rows text;
BEGIN
    SELECT string_agg(format('(%L, %L)', t.relation, t.privileges), ', ' ORDER BY t.n) INTO v_rows FROM ({rows}) t;
    EXECUTE format('CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, '
                   'privileges text) LANGUAGE sql IMMUTABLE AS $f$ VALUES %s $f$', v_rows);
END $do$;
"""


def _set_read_only(tables: str) -> str:
    """Redefine custody_api_read_only_tables() as the text[] expression `tables`."""
    return f"""
DO $do$
DECLARE v_tables text;
BEGIN
    SELECT string_agg(quote_literal(r.t), ', ' ORDER BY r.n) INTO v_tables FROM unnest({tables}) WITH ORDINALITY AS r(t, n);
    EXECUTE format('CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE '
                   'AS $f$ SELECT ARRAY[%s]::text[] $f$', v_tables);
END $do$;
"""


TO_0040 = f"""
DO $do$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM custody_api_limited_tables() WHERE relation = 'convert_price') THEN
        RAISE EXCEPTION 'migration 0040: convert_price is not in custody_api_limited_tables()';
    END IF;
END $do$;
{_set_limited(LIMITED_NOW + " WHERE relation <> 'convert_price'")}
{_set_read_only("custody_api_read_only_tables() || ARRAY['convert_price', 'convert_config']")}
CALL custody_apply_role_grants();
"""
FROM_0040 = f"""
{_set_limited(LIMITED_NOW + " UNION ALL SELECT 'convert_price', 'INSERT, UPDATE', 1000000")}
{_set_read_only("array_remove(array_remove(custody_api_read_only_tables(), 'convert_price'), 'convert_config')")}
CALL custody_apply_role_grants();
"""

UPGRADE = r"""
CREATE TABLE convert_config (
    id          smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    fee_ppm     integer NOT NULL CHECK (fee_ppm BETWEEN 0 AND 999999),
    spread_ppm  integer NOT NULL CHECK (spread_ppm BETWEEN 0 AND 999999),
    band_ppm    integer NOT NULL CHECK (band_ppm BETWEEN 0 AND 999999),
    updated_by  text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO convert_config (fee_ppm, spread_ppm, band_ppm, updated_by) VALUES (2500, 0, 50000, 'migration 0040');

CREATE FUNCTION convert_price_set(p_by text, p_base text, p_quote text, p_price numeric)
RETURNS SETOF convert_price
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF p_by IS NULL OR length(p_by) = 0 THEN
        RAISE EXCEPTION 'convert: a price names who set it' USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO audit_event (actor, action, subject, detail)
    VALUES (p_by, 'convert.price', 'convert-price:' || p_base || '/' || p_quote,
            jsonb_build_object('quote_minor_per_base_unit', p_price::text));
    RETURN QUERY
    INSERT INTO convert_price AS p (base_asset, quote_asset, quote_minor_per_base_unit, set_by)
    VALUES (p_base, p_quote, p_price, p_by)
    ON CONFLICT (base_asset, quote_asset) DO UPDATE
        SET quote_minor_per_base_unit = EXCLUDED.quote_minor_per_base_unit, set_by = EXCLUDED.set_by,
            updated_at = now()
    RETURNING p.*;
END $$;

CREATE OR REPLACE FUNCTION convert_quote_create(
    p_created_by text, p_customer bigint, p_receive bigint, p_from_amount numeric, p_fee numeric,
    p_to_amount numeric, p_rate_num numeric, p_rate_den numeric, p_fee_ppm integer, p_spread_ppm integer,
    p_source text, p_ttl_seconds integer, p_request_key text, p_request_hash text
) RETURNS TABLE (quote_id bigint, status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_existing convert_quote;
    v_config convert_config;
    v_from account;
    v_to account;
    v_in bigint;
    v_out bigint;
    v_fees bigint;
    v_rounding bigint;
    v_price numeric;
    v_base text;
    v_symbol text;
    v_ref_num numeric;  -- the reference rate, to-asset minor units per from-asset minor unit
    v_ref_den numeric;
    v_band integer;
    v_fill_base numeric;
    v_fill_quote numeric;
    v_id bigint;
BEGIN
    -- A request replayed under its key answers the quote it made (same request) or a conflict.
    SELECT * INTO v_existing FROM convert_quote c WHERE c.request_key = p_request_key;
    IF FOUND THEN
        RETURN QUERY SELECT v_existing.id, CASE WHEN v_existing.request_hash = p_request_hash
                                               THEN 'exists' ELSE 'idempotency_conflict' END;
        RETURN;
    END IF;
    SELECT * INTO v_from FROM account WHERE id = p_customer;
    SELECT * INTO v_to FROM account WHERE id = p_receive;
    IF v_from.kind IS DISTINCT FROM 'customer' OR v_to.kind IS DISTINCT FROM 'customer'
       OR v_from.owner IS NULL OR v_from.owner IS DISTINCT FROM v_to.owner OR v_from.asset = v_to.asset THEN
        RAISE EXCEPTION 'convert: a quote pays from and to customer accounts of one owner in two assets'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    SELECT id INTO v_in FROM account WHERE name = 'convert:liquidity:' || v_from.asset AND kind = 'liquidity';
    SELECT id INTO v_out FROM account WHERE name = 'convert:liquidity:' || v_to.asset AND kind = 'liquidity';
    SELECT id INTO v_fees FROM account WHERE name = 'fees:' || v_from.asset AND kind = 'fee_income';
    SELECT id INTO v_rounding FROM account WHERE name = 'convert:rounding:' || v_from.asset AND kind = 'dust';
    IF v_in IS NULL OR v_out IS NULL OR v_fees IS NULL OR v_rounding IS NULL THEN
        RAISE EXCEPTION 'convert: the liquidity or fee account of % / % is not open', v_from.asset, v_to.asset
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- The fee and spread rates are the service's (convert_config), not the caller's (R15-C2).
    SELECT * INTO v_config FROM convert_config WHERE id = 1;
    IF p_fee_ppm IS DISTINCT FROM v_config.fee_ppm OR p_spread_ppm IS DISTINCT FROM v_config.spread_ppm THEN
        RAISE EXCEPTION 'convert: the quote''s fee or spread rate (% / % ppm) is not the service''s (% / % ppm)',
            p_fee_ppm, p_spread_ppm, v_config.fee_ppm, v_config.spread_ppm USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_from_amount <= 0 OR p_rate_num <= 0 OR p_rate_den <= 0
       OR p_fee <> div(p_from_amount * p_fee_ppm + 999999, 1000000)
       OR p_to_amount <> div((p_from_amount - p_fee) * p_rate_num, p_rate_den) OR p_to_amount <= 0
       OR p_ttl_seconds NOT BETWEEN 1 AND 60 THEN
        RAISE EXCEPTION 'convert: the quote''s fee, payout or expiry does not follow its own figures'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- The operator's price of the pair, if any, as a reference rate.
    SELECT quote_minor_per_base_unit, base_asset INTO v_price, v_base FROM convert_price
     WHERE (base_asset, quote_asset) IN ((v_from.asset, v_to.asset), (v_to.asset, v_from.asset));
    IF v_price IS NOT NULL THEN
        IF v_base = v_from.asset THEN  -- selling base: to = from * price / 10^base decimals
            v_ref_num := v_price;
            v_ref_den := power(10::numeric, (SELECT decimals FROM asset WHERE code = v_base));
        ELSE
            v_ref_num := power(10::numeric, (SELECT decimals FROM asset WHERE code = v_base));
            v_ref_den := v_price;
        END IF;
    END IF;
    IF p_source = 'operator' THEN
        v_band := 0;  -- the rate may not beat the operator's price less the spread
    ELSIF p_source LIKE 'book:%' THEN
        -- A book source names a market of the pair (R15-C1) and is bounded, within the band, by its
        -- last trade and by the operator's price of the pair, each that exists (R15-C3).
        v_band := v_config.band_ppm;
        v_symbol := substr(p_source, 6);
        SELECT m.base_asset INTO v_base FROM market m
         WHERE m.symbol = v_symbol
           AND (m.base_asset, m.quote_asset) IN ((v_from.asset, v_to.asset), (v_to.asset, v_from.asset));
        IF NOT FOUND THEN
            RAISE EXCEPTION 'convert: % is not a market of % / %', p_source, v_from.asset, v_to.asset
                USING ERRCODE = 'insufficient_privilege';
        END IF;
        SELECT f.base_amount, f.quote_amount INTO v_fill_base, v_fill_quote FROM fill f
         WHERE f.market = v_symbol AND f.base_amount > 0 AND f.quote_amount > 0
         ORDER BY f.seq DESC, f.match_no DESC LIMIT 1;
        IF FOUND THEN  -- else (never traded) the operator's price alone, if there is one
            IF v_ref_num IS NOT NULL AND p_rate_num * v_ref_den * 1000000000000
                   > v_ref_num * p_rate_den * (1000000 + v_band) * (1000000 - p_spread_ppm) THEN
                RAISE EXCEPTION 'convert: the rate beats the operator''s price of % / % (source %)', v_from.asset,
                    v_to.asset, p_source USING ERRCODE = 'insufficient_privilege';
            END IF;
            v_ref_num := CASE WHEN v_base = v_from.asset THEN v_fill_quote ELSE v_fill_base END;
            v_ref_den := CASE WHEN v_base = v_from.asset THEN v_fill_base ELSE v_fill_quote END;
        END IF;
    ELSE
        RAISE EXCEPTION 'convert: unknown price source %', p_source USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF v_ref_num IS NULL OR v_ref_den IS NULL OR v_ref_num <= 0 OR v_ref_den <= 0 THEN
        RAISE EXCEPTION 'convert: no reference price bounds a quote of % / %', v_from.asset, v_to.asset
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- rate <= reference * (10^6 + band) / 10^6 * (10^6 - spread) / 10^6
    IF p_rate_num * v_ref_den * 1000000000000
       > v_ref_num * p_rate_den * (1000000 + v_band) * (1000000 - p_spread_ppm) THEN
        RAISE EXCEPTION 'convert: the rate beats the reference price of % / % (source %)', v_from.asset, v_to.asset,
            p_source USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO convert_quote (created_by, customer_account_id, receive_account_id, from_asset, to_asset, from_amount,
                               fee_amount, to_amount, rate_num, rate_den, fee_ppm, spread_ppm, source,
                               liquidity_in_account_id, liquidity_out_account_id, fee_account_id,
                               rounding_account_id, expires_at, request_key, request_hash)
    VALUES (p_created_by, p_customer, p_receive, v_from.asset, v_to.asset, p_from_amount, p_fee, p_to_amount,
            p_rate_num, p_rate_den, p_fee_ppm, p_spread_ppm, p_source, v_in, v_out, v_fees, v_rounding,
            now() + make_interval(secs => p_ttl_seconds), p_request_key, p_request_hash)
    ON CONFLICT (request_key) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NULL THEN
        -- A concurrent request under the key committed first (R15-C4): answer its quote.
        SELECT * INTO v_existing FROM convert_quote c WHERE c.request_key = p_request_key;
        RETURN QUERY SELECT v_existing.id, CASE WHEN v_existing.request_hash = p_request_hash
                                               THEN 'exists' ELSE 'idempotency_conflict' END;
        RETURN;
    END IF;
    RETURN QUERY SELECT v_id, 'created'::text;
END $$;
"""

DOWNGRADE = r"""
DROP FUNCTION convert_price_set(text, text, text, numeric);
DROP TABLE convert_config;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(TO_0040)


def downgrade() -> None:
    # 0033's convert_quote_create again (the weak one this migration replaced), then the api's lists.
    body = _sibling("0033_convert.py").UPGRADE
    found = re.search(r"CREATE FUNCTION convert_quote_create\(.*?END \$\$;", body, re.S)
    assert found is not None
    op.execute(found.group(0).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute(FROM_0040)
    op.execute(DOWNGRADE)
