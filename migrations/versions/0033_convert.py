"""Convert: quotes booked through the convert subsystem's liquidity accounts; fills' settlement version (issue 17).

Revision ID: 0033_convert
Revises: 0032_event_guards

Why: a backend could only build a cross-asset exchange by hand from raw postings, which debits a
firm liquidity account (forbidden: README "Who may move money"). Convert quotes a price, and its
acceptance books ONE linked transaction through liquidity accounts the convert subsystem owns. The
api process serves the quote routes, so what it could forge is bounded in the database, not only
in Python:

- `convert_quote` (operational): a quote's exact figures. custody_api may only READ it
  (`custody_api_read_only_tables()` gains it): quotes are written by two SECURITY DEFINER
  functions (owner, `search_path` pinned), which the api may call:
  - `convert_quote_create(...)` answers a request replayed under its idempotency key with the
    quote it made (another request under that key: `idempotency_conflict`), and re-derives what it
    can: the customer and receiving accounts are customer accounts of one owner in the quote's two
    assets; the liquidity accounts (`convert:liquidity:<asset>`, kind liquidity), the fee account
    (`fees:<from asset>`, kind fee_income) and the rounding account (`convert:rounding:<from
    asset>`, kind dust) are looked up BY NAME here, never taken from the caller; the fee is exactly
    ceil(from_amount * fee_ppm / 10^6) and the payout exactly floor((from_amount - fee) * rate);
    the expiry is 1 to 60 seconds from the database's clock; for an operator-priced pair the rate is
    at most the operator's price (`convert_price`) less the spread.
  - `convert_accept(quote_id, caller, key)` locks the quote row, refuses an expired or used one,
    answers a replay of the same key with the original transaction, and posts the one linked
    transaction from the ROW's figures (key `convert:<quote id>`, kind `convert`) through
    `ledger_post`: customer -> liquidity (from asset: the payout's cost at the rate, rounded up),
    liquidity -> customer (to asset), customer -> fee income, and customer ->
    `convert:rounding:<from asset>` (kind dust) for whole minor units the payout's rounding left,
    when there are any. A refusal books nothing and answers its own code
    (`insufficient_funds` for the customer, `insufficient_liquidity` for the house).
- `journal_entry_liquidity_guard`: a debit of a liquidity account written by custody_api or
  custody_worker (their own rights, i.e. not inside a SECURITY DEFINER function such as
  `convert_accept`) is refused unless it is a leg of a treasury adjustment that is proposed with
  its quorum of approvals by operators other than its proposer (the posting of
  `custody.adjustments`, key `treasury-adjustment:<id>`). So the api cannot drain the house's
  liquidity by calling `ledger_post` itself; it funds and drains it only by adjustments.
- `convert_price` (reference): operator-set prices for pairs without a market, in quote minor
  units per whole base unit; custody_api may INSERT and UPDATE it (an operator's route, audited),
  so `custody_api_limited_tables()` gains it.
- `fill.settlement_version`: the posting format a fill was settled with (1: buyer pays the seller
  the price less the seller's fee and both fees to fee income; 2: each party pays its own fee).
  Rows written before this migration are 1; re-settling a fill (a market rebuilt from its journal)
  posts the format its row records, so its journal key answers `exists`, never a conflict.

Limits (honest): the api process is trusted to price book-sourced quotes (the book lives in its
memory); the database binds the payout to the stated rate, the fee, the expiry, single use and the
house's liquidity never going negative, not the rate itself. A compromised api that writes
adjustment votes (it serves the operators' routes) can still pass the guard: the votes and the
audit log name who did it.
"""
from alembic import op

revision = "0033_convert"
down_revision = "0032_event_guards"
branch_labels = None
depends_on = None

# 0032's lists, written out in full, plus this migration's tables (the lead merges lists).
LIMITED_0032 = """
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
        ('allowlist_entry', 'INSERT, UPDATE, DELETE'),
        ('webhook_endpoint', 'INSERT, UPDATE (description, event_types, enabled, secret_enc, previous_secret_enc, previous_secret_expires_at, updated_at, deleted_at)'),
        ('webhook_delivery', 'UPDATE (state, attempts, next_attempt_at, updated_at)')"""
LIMITED_0033 = LIMITED_0032 + """,
        ('convert_price', 'INSERT, UPDATE')"""

READ_ONLY_0032 = ("'api_key', 'chain_asset', 'chain_cursor', 'chain_transaction', 'denylist_address', 'eth_nonce', "
                  "'job_stat', 'matching_snapshot', 'btc_wallet_output', 'deposit_address_check', 'node_view_health', "
                  "'outbox', 'outbox_aggregate'")
READ_ONLY_0033 = READ_ONLY_0032 + ", 'convert_quote'"


def _read_only(tables: str) -> str:
    return ("CREATE OR REPLACE FUNCTION custody_api_read_only_tables() RETURNS text[] LANGUAGE sql IMMUTABLE "
            f"AS $$ SELECT ARRAY[{tables}]::text[] $$;")


def _limited(rows: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION custody_api_limited_tables() RETURNS TABLE (relation text, privileges text) LANGUAGE sql IMMUTABLE
    AS $$ VALUES {rows}
    $$;
"""


UPGRADE = r"""
ALTER TABLE fill ADD COLUMN settlement_version smallint NOT NULL DEFAULT 1
    CONSTRAINT fill_settlement_version CHECK (settlement_version IN (1, 2));

CREATE TABLE convert_price (
    base_asset                 text NOT NULL REFERENCES asset(code),
    quote_asset                text NOT NULL REFERENCES asset(code),
    quote_minor_per_base_unit  numeric(78,0) NOT NULL CHECK (quote_minor_per_base_unit > 0),
    set_by                     text NOT NULL,
    updated_at                 timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (base_asset, quote_asset),
    CHECK (base_asset <> quote_asset)
);

CREATE TABLE convert_quote (
    id                        bigserial PRIMARY KEY,
    created_by                text NOT NULL,
    customer_account_id       bigint NOT NULL REFERENCES account(id),
    receive_account_id        bigint NOT NULL REFERENCES account(id),
    from_asset                text NOT NULL REFERENCES asset(code),
    to_asset                  text NOT NULL REFERENCES asset(code),
    from_amount               numeric(78,0) NOT NULL CHECK (from_amount > 0),
    fee_amount                numeric(78,0) NOT NULL CHECK (fee_amount >= 0 AND fee_amount < from_amount),
    to_amount                 numeric(78,0) NOT NULL CHECK (to_amount > 0),
    rate_num                  numeric(78,0) NOT NULL CHECK (rate_num > 0),
    rate_den                  numeric(78,0) NOT NULL CHECK (rate_den > 0),
    fee_ppm                   integer NOT NULL CHECK (fee_ppm BETWEEN 0 AND 999999),
    spread_ppm                integer NOT NULL CHECK (spread_ppm BETWEEN 0 AND 999999),
    source                    text NOT NULL CHECK (source = 'operator' OR source LIKE 'book:%'),
    liquidity_in_account_id   bigint NOT NULL REFERENCES account(id),
    liquidity_out_account_id  bigint NOT NULL REFERENCES account(id),
    fee_account_id            bigint NOT NULL REFERENCES account(id),
    rounding_account_id       bigint NOT NULL REFERENCES account(id),
    expires_at                timestamptz NOT NULL,
    state                     text NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'accepted')),
    accept_key                text UNIQUE,
    transaction_id            bigint UNIQUE REFERENCES journal_transaction(id),
    accepted_at               timestamptz,
    request_key               text NOT NULL UNIQUE CHECK (length(request_key) BETWEEN 1 AND 300),
    request_hash              text NOT NULL,
    created_at                timestamptz NOT NULL DEFAULT now(),
    CHECK (from_asset <> to_asset),
    CHECK ((state = 'accepted') = (accept_key IS NOT NULL AND transaction_id IS NOT NULL AND accepted_at IS NOT NULL))
);

CREATE FUNCTION convert_quote_create(
    p_created_by text, p_customer bigint, p_receive bigint, p_from_amount numeric, p_fee numeric,
    p_to_amount numeric, p_rate_num numeric, p_rate_den numeric, p_fee_ppm integer, p_spread_ppm integer,
    p_source text, p_ttl_seconds integer, p_request_key text, p_request_hash text
) RETURNS TABLE (quote_id bigint, status text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    v_existing convert_quote;
    v_from account;
    v_to account;
    v_in bigint;
    v_out bigint;
    v_fees bigint;
    v_rounding bigint;
    v_price numeric;
    v_base text;
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
    IF p_fee_ppm NOT BETWEEN 0 AND 999999 OR p_spread_ppm NOT BETWEEN 0 AND 999999
       OR p_from_amount <= 0 OR p_rate_num <= 0 OR p_rate_den <= 0
       OR p_fee <> div(p_from_amount * p_fee_ppm + 999999, 1000000)
       OR p_to_amount <> div((p_from_amount - p_fee) * p_rate_num, p_rate_den) OR p_to_amount <= 0
       OR p_ttl_seconds NOT BETWEEN 1 AND 60 THEN
        RAISE EXCEPTION 'convert: the quote''s fee, payout or expiry does not follow its own figures'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_source = 'operator' THEN
        -- The rate (to minor per from minor) may not beat the operator's price less the spread.
        SELECT quote_minor_per_base_unit, base_asset INTO v_price, v_base FROM convert_price
         WHERE (base_asset, quote_asset) IN ((v_from.asset, v_to.asset), (v_to.asset, v_from.asset));
        IF v_price IS NULL OR (
               CASE WHEN v_base = v_from.asset  -- selling base: to = from * price / 10^base decimals
                    THEN p_rate_num * 1000000 * power(10::numeric, (SELECT decimals FROM asset WHERE code = v_base))
                         > v_price * (1000000 - p_spread_ppm) * p_rate_den
                    ELSE p_rate_num * 1000000 * v_price
                         > power(10::numeric, (SELECT decimals FROM asset WHERE code = v_base)) * (1000000 - p_spread_ppm) * p_rate_den
               END) THEN
            RAISE EXCEPTION 'convert: the rate beats the operator''s price for % / %', v_from.asset, v_to.asset
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    ELSIF p_source NOT LIKE 'book:%' THEN
        RAISE EXCEPTION 'convert: unknown price source %', p_source USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO convert_quote (created_by, customer_account_id, receive_account_id, from_asset, to_asset, from_amount,
                               fee_amount, to_amount, rate_num, rate_den, fee_ppm, spread_ppm, source,
                               liquidity_in_account_id, liquidity_out_account_id, fee_account_id,
                               rounding_account_id, expires_at, request_key, request_hash)
    VALUES (p_created_by, p_customer, p_receive, v_from.asset, v_to.asset, p_from_amount, p_fee, p_to_amount,
            p_rate_num, p_rate_den, p_fee_ppm, p_spread_ppm, p_source, v_in, v_out, v_fees, v_rounding,
            now() + make_interval(secs => p_ttl_seconds), p_request_key, p_request_hash)
    RETURNING id INTO v_id;
    RETURN QUERY SELECT v_id, 'created'::text;
END $$;

CREATE FUNCTION convert_accept(p_quote_id bigint, p_caller text, p_key text)
RETURNS TABLE (status text, transaction_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    q convert_quote;
    r record;
    v_key text;
    v_debits bigint[];
    v_credits bigint[];
    v_amounts numeric[];
    v_roles text[];
    v_cost numeric;
    v_metadata jsonb;
BEGIN
    SELECT * INTO q FROM convert_quote c WHERE c.id = p_quote_id AND c.created_by = p_caller FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'quote_not_found'::text, NULL::bigint;
        RETURN;
    END IF;
    IF q.state = 'accepted' THEN
        IF q.accept_key = p_key THEN
            RETURN QUERY SELECT 'exists'::text, q.transaction_id;
        ELSE
            RETURN QUERY SELECT 'quote_already_used'::text, NULL::bigint;
        END IF;
        RETURN;
    END IF;
    IF q.expires_at <= clock_timestamp() THEN
        RETURN QUERY SELECT 'quote_expired'::text, NULL::bigint;
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM convert_quote c WHERE c.accept_key = p_key) THEN
        RETURN QUERY SELECT 'idempotency_conflict'::text, NULL::bigint;
        RETURN;
    END IF;
    v_key := 'convert:' || q.id;
    -- The payout's cost at the rate, rounded up; what the sale's rounding left is booked apart.
    v_cost := div(q.to_amount * q.rate_den + q.rate_num - 1, q.rate_num);
    -- Leg 0: the customer pays the house the cost; leg 1: the house pays the customer; then the
    -- customer's fee and the rounding, when not zero. Each leg's metadata says what it is.
    v_debits := ARRAY[q.customer_account_id, q.liquidity_out_account_id];
    v_credits := ARRAY[q.liquidity_in_account_id, q.receive_account_id];
    v_amounts := ARRAY[v_cost, q.to_amount];
    v_roles := ARRAY['customer_pays', 'house_pays'];
    IF q.fee_amount > 0 THEN
        v_debits := v_debits || q.customer_account_id;
        v_credits := v_credits || q.fee_account_id;
        v_amounts := v_amounts || q.fee_amount;
        v_roles := v_roles || 'fee'::text;
    END IF;
    IF q.from_amount - q.fee_amount - v_cost > 0 THEN
        v_debits := v_debits || q.customer_account_id;
        v_credits := v_credits || q.rounding_account_id;
        v_amounts := v_amounts || (q.from_amount - q.fee_amount - v_cost);
        v_roles := v_roles || 'rounding'::text;
    END IF;
    v_metadata := jsonb_build_object(
        'quote_id', q.id, 'from_asset', q.from_asset, 'to_asset', q.to_asset,
        'from_amount', q.from_amount::text, 'fee_amount', q.fee_amount::text, 'to_amount', q.to_amount::text,
        'rate', q.rate_num::text || '/' || q.rate_den::text, 'source', q.source,
        'legs', (SELECT jsonb_agg(jsonb_build_object('role', u.role) ORDER BY u.i)
                   FROM unnest(v_roles) WITH ORDINALITY AS u(role, i)));
    SELECT * INTO r FROM ledger_post(v_key, encode(sha256(convert_to(v_key, 'UTF8')), 'hex'), 'convert', v_metadata,
                                     v_debits, v_credits, v_amounts, array_fill(NULL::bigint, ARRAY[cardinality(v_amounts)]),
                                     NULL, NULL);
    IF r.status <> 'created' THEN
        RETURN QUERY SELECT CASE WHEN r.status = 'insufficient_funds' AND r.failed_index = 1
                                 THEN 'insufficient_liquidity' ELSE r.status END, NULL::bigint;
        RETURN;
    END IF;
    UPDATE convert_quote c SET state = 'accepted', accept_key = p_key, transaction_id = r.transaction_id,
                               accepted_at = clock_timestamp()
     WHERE c.id = q.id;
    RETURN QUERY SELECT 'created'::text, r.transaction_id;
END $$;

CREATE FUNCTION convert_guard_liquidity_debit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_key text;
    v_adjustment bigint;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM account WHERE id = NEW.account_id AND kind = 'liquidity') THEN
        RETURN NEW;
    END IF;
    SELECT idempotency_key INTO v_key FROM journal_transaction WHERE id = NEW.transaction_id;
    IF v_key ~ '^treasury-adjustment:[0-9]{1,18}$' THEN
        v_adjustment := split_part(v_key, ':', 2)::bigint;
        IF EXISTS (
            SELECT 1 FROM treasury_adjustment a
             WHERE a.id = v_adjustment AND a.state = 'proposed'
               AND EXISTS (SELECT 1 FROM jsonb_array_elements(a.transfers) t
                            WHERE (t->>'debit_account_id')::bigint = NEW.account_id
                              AND (t->>'amount')::numeric = -NEW.amount)
               AND (SELECT count(DISTINCT v.operator) FROM treasury_adjustment_vote v
                     WHERE v.adjustment_id = a.id AND v.decision = 'approve' AND v.operator <> a.proposed_by)
                   >= a.quorum) THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'ledger: % may debit a liquidity account only through convert_accept or an approved treasury adjustment',
        current_user USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER journal_entry_liquidity_guard BEFORE INSERT ON journal_entry
    FOR EACH ROW WHEN (NEW.amount < 0 AND current_user IN ('custody_api', 'custody_worker'))
    EXECUTE FUNCTION convert_guard_liquidity_debit();
"""

DOWNGRADE = r"""
DROP TRIGGER journal_entry_liquidity_guard ON journal_entry;
DROP FUNCTION convert_guard_liquidity_debit();
DROP FUNCTION convert_accept(bigint, text, text);
DROP FUNCTION convert_quote_create(text, bigint, bigint, numeric, numeric, numeric, numeric, numeric, integer, integer,
                                   text, integer, text, text);
DROP TABLE convert_quote;
DROP TABLE convert_price;
ALTER TABLE fill DROP COLUMN settlement_version;
"""


def upgrade() -> None:
    op.execute(UPGRADE)
    op.execute(_limited(LIMITED_0033))
    op.execute(_read_only(READ_ONLY_0033))
    op.execute("CALL custody_apply_role_grants()")


def downgrade() -> None:
    op.execute(_read_only(READ_ONLY_0032))
    op.execute(_limited(LIMITED_0032))
    op.execute(DOWNGRADE)
    op.execute("CALL custody_apply_role_grants()")
