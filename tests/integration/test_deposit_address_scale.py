"""Deposit addresses at scale (issue 13): issuing one address reads O(1) rows whatever the wallet
holds. The wallet here has 100,000 issued addresses; every statement `Wallets.issue_address` runs
is explained with ANALYZE (in a transaction rolled back) and no plan node may read more than one
row of `deposit_address`, nor scan it sequentially. Before migration 0023 the gap-limit check
counted the wallet's unused addresses with a subquery on every issue (100,000 rows read here).

Runs on a database of its own (own_database): it forges 100,000 addresses.
"""
from __future__ import annotations

from sqlalchemy import event, text

from custody.wallets import Wallets
from ledger.model import AccountKind
from ledger.service import Ledger
from regtest.util import assert_equal
from signer.keys import Secret, SignerKeys, seed_from_text
from tests.integration.own_database import own_database

KEYS = SignerKeys(seed_from_text(Secret("abandon " * 11 + "about")), "regtest")
ISSUED = 100_000


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_issuing_an_address_reads_o1_rows_at_100k_addresses(database_url):
    with own_database(database_url, "address_scale") as eng:
        ledger = Ledger(eng)
        wallets = Wallets(eng, ledger)
        wallets.configure_asset("BTC", 8, "bitcoin", finality=2)
        wallet_id = wallets.register_wallet("bitcoin", "deposit", "regtest", KEYS.account_xpub("bitcoin", "deposit"), gap_limit=20)
        account = ledger.open_account("BTC", AccountKind.customer, "customer:bulk:BTC", owner="bulk").id
        with eng.begin() as c:  # 100,000 issued addresses; the one at 49,999 has received a deposit
            # the forge sets next_index in one statement: triggers (migration 0028's one step per
            # update) are set aside for this transaction, as a restore would
            c.execute(text("SET LOCAL session_replication_role = replica"))
            c.execute(text("INSERT INTO deposit_address (wallet_id, chain, address, derivation_index, account_id, owner, "
                           "idempotency_key, first_seen_at) SELECT :w, 'bitcoin', 'bulk-' || i, i, :a, 'bulk', 'bulk:' || i, "
                           "CASE WHEN i = 49999 THEN now() END FROM generate_series(0, :n - 1) i"),
                      {"w": wallet_id, "a": account, "n": ISSUED})
            c.execute(text("UPDATE wallet SET next_index = :n, last_used_index = 49999 WHERE id = :w"), {"n": ISSUED, "w": wallet_id})
            c.execute(text("ANALYZE deposit_address"))

        statements: list[tuple[str, object]] = []

        def record(_conn, _cursor, statement, parameters, _context, _many):
            statements.append((statement, parameters))

        event.listen(eng, "before_cursor_execute", record)
        try:
            issued = wallets.issue_address("bulk:new", account)
        finally:
            event.remove(eng, "before_cursor_execute", record)
        assert_equal(issued.derivation_index, ISSUED)

        read = {}
        with eng.connect() as c:
            for statement, parameters in statements:
                if not statement.lstrip().upper().startswith(("SELECT", "UPDATE", "WITH")):
                    continue
                tx = c.begin()
                try:
                    [[plan]] = c.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters).one()
                finally:
                    tx.rollback()
                for node in _nodes(plan["Plan"]):
                    if node.get("Relation Name") == "deposit_address":
                        assert node["Node Type"] != "Seq Scan", statement
                        read[statement] = read.get(statement, 0) + node["Actual Rows"] * node["Actual Loops"]
        assert read, "issue_address looked up deposit_address (its idempotency key) and that was explained"
        assert all(rows <= 1 for rows in read.values()), read
        with eng.connect() as c:  # the gap is still counted exactly: 100,000 - 1 - 49,999 unused after the last used
            unused = c.execute(text("SELECT max((detail->>'unused')::int) FROM incident WHERE kind = 'gap_limit'")).scalar_one()
        assert_equal(unused, ISSUED - 49_999)
        ledger.assert_verified()
