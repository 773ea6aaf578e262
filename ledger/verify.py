"""Self-verification: recompute what the ledger derives and compare it with what it stored.

`verify(engine)` returns one `Check` per invariant, by name:
- `transactions_balanced`: every journal transaction has entries summing to zero per asset;
- `projection_matches_journal`: each account has exactly its balance_shards projection rows
  (shards 0..n-1); their posted sum equals the sum of its entries, and their held sum equals what
  its pending holds still reserve; no projection row names a missing account;
- `running_balances`: each entry of a one-shard account has a balance_after equal to the running
  sum of the account's entries; entries of a sharded account store none (computed at read time);
- `holds_consistent`: captured equals the entries captured through the hold; a resolved hold has
  captured + released = amount, a pending one has captured + released < amount;
- `limits_respected`: no account that may not go negative has available < 0; none that may not go
  positive has a positive balance;
- `totals_zero`: every asset's balances sum to zero;
- `entries_match_accounts`: each entry names an existing account and journal transaction (and
  hold, for a capture), and carries its account's asset.
- `limits_respected` and `totals_zero` work on the sum over an account's shards.
`verify_in(conn)` runs the same checks in a snapshot the caller holds.
`assert_verified(engine)` raises LedgerError(verification_failed) listing the failed checks.
Reads run in one REPEATABLE READ snapshot so concurrent postings cannot produce false alarms.
"""
from __future__ import annotations

from sqlalchemy import Connection, Engine, text

from ledger.errors import ErrorCode, LedgerError
from ledger.model import Check

_CHECKS: list[tuple[str, str]] = [
    (
        "transactions_balanced",
        """SELECT t.id FROM journal_transaction t LEFT JOIN journal_entry e ON e.transaction_id = t.id
           GROUP BY t.id HAVING count(e.id) < 2
        UNION
        SELECT transaction_id FROM journal_entry GROUP BY transaction_id, asset HAVING sum(amount) <> 0""",
    ),
    (
        "projection_matches_journal",
        """SELECT a.id, b.posted, b.held, coalesce(e.total, 0) AS journal_posted,
                  coalesce(h.held, 0) AS holds_held, b.shards, a.balance_shards
           FROM account a
           LEFT JOIN (SELECT account_id, sum(posted) AS posted, sum(held) AS held, count(*) AS shards,
                             max(shard) AS top FROM account_balance GROUP BY account_id) b
                  ON b.account_id = a.id
           LEFT JOIN (SELECT account_id, sum(amount) AS total FROM journal_entry GROUP BY account_id) e
                  ON e.account_id = a.id
           LEFT JOIN (SELECT account_id, sum(amount - captured - released) AS held FROM hold
                      WHERE state = 'pending' GROUP BY account_id) h ON h.account_id = a.id
           WHERE b.account_id IS NULL OR b.shards <> a.balance_shards OR b.top <> a.balance_shards - 1
              OR b.posted <> coalesce(e.total, 0) OR b.held <> coalesce(h.held, 0)
        UNION ALL
        SELECT b.account_id, b.posted, b.held, NULL, NULL, NULL, NULL
           FROM account_balance b LEFT JOIN account a ON a.id = b.account_id WHERE a.id IS NULL""",
    ),
    (
        "running_balances",
        """SELECT r.id, r.account_id FROM (
             SELECT id, account_id, balance_after,
                    sum(amount) OVER (PARTITION BY account_id ORDER BY id) AS running
             FROM journal_entry) r
           JOIN account a ON a.id = r.account_id
           WHERE CASE WHEN a.balance_shards = 1 THEN r.balance_after IS DISTINCT FROM r.running
                      ELSE r.balance_after IS NOT NULL END""",
    ),
    (
        "holds_consistent",
        """SELECT h.id, h.state, h.amount, h.captured, h.released, coalesce(-c.total, 0) AS journal_captured
           FROM hold h
           LEFT JOIN (SELECT hold_id, sum(amount) AS total FROM journal_entry
                      WHERE hold_id IS NOT NULL GROUP BY hold_id) c ON c.hold_id = h.id
           WHERE h.captured <> coalesce(-c.total, 0)
              OR (h.state <> 'pending' AND h.captured + h.released <> h.amount)
              OR (h.state = 'pending' AND h.captured + h.released >= h.amount)""",
    ),
    (
        "limits_respected",
        """SELECT b.account_id, b.posted, b.held
           FROM (SELECT account_id, sum(posted) AS posted, sum(held) AS held FROM account_balance
                 GROUP BY account_id) b JOIN account a ON a.id = b.account_id
           WHERE (NOT a.may_go_negative AND b.posted - b.held < 0)
              OR (NOT a.may_go_positive AND b.posted > 0)""",
    ),
    (
        "totals_zero",
        """SELECT asset, sum(amount) AS total FROM journal_entry GROUP BY asset HAVING sum(amount) <> 0""",
    ),
    (
        "entries_match_accounts",
        """SELECT e.id FROM journal_entry e LEFT JOIN account a ON a.id = e.account_id
           WHERE a.id IS NULL OR e.asset <> a.asset
        UNION ALL
        SELECT e.id FROM journal_entry e LEFT JOIN journal_transaction t ON t.id = e.transaction_id
           WHERE t.id IS NULL
        UNION ALL
        SELECT e.id FROM journal_entry e LEFT JOIN hold h ON h.id = e.hold_id
           WHERE e.hold_id IS NOT NULL AND h.id IS NULL""",
    ),
]


def verify(engine: Engine) -> list[Check]:
    """Run every check in one consistent snapshot; return them all (failures carry up to 20 rows)."""
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        with conn.begin():
            conn.execute(text("SET TRANSACTION READ ONLY"))
            return verify_in(conn)


def verify_in(conn: Connection) -> list[Check]:
    """The checks on `conn`'s snapshot: the caller opened it (REPEATABLE READ) to read figures the
    checks then vouch for in the same snapshot (custody.reserves reads liabilities so)."""
    results = []
    for name, sql in _CHECKS:
        rows = conn.execute(text(f"SELECT * FROM ({sql}) bad LIMIT 20")).all()
        problems = [tuple(r) for r in rows]
        results.append(Check(name, not problems, f"{len(problems)} problem(s)" if problems else "", problems))
    return results


def assert_verified(engine: Engine) -> None:
    failed = [c for c in verify(engine) if not c.ok]
    if failed:
        summary = "; ".join(f"{c.name}: {c.problems[:3]}" for c in failed)
        raise LedgerError(ErrorCode.verification_failed, f"ledger verification failed: {summary}")
