"""The ledger's functions plan without disabled node types, and never JIT-compile (issue 20).

Revision ID: 0029_no_planner_trap
Revises: 0025_api_key_ops

Why: migrations 0001, 0008, 0009 and 0010 declared the ledger's PL/pgSQL functions (`ledger_post`,
`ledger_apply`, `ledger_place_hold`, `ledger_resolve_hold`, `ledger_entries_references`) with
`SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off`, so that a generic
plan made while the tables were small would not keep a sequential scan as they grew. Before
PostgreSQL 18 a disabled node type is not removed from the search, it is priced at `disable_cost`
(10^10) more; where no other path exists (a one-row sequence relation, a scan of a function's
result) the statement's plan then costs about 10 billion, far above `jit_above_cost` (100,000),
and PostgreSQL 15 JIT-compiled that statement on every call: 10-49 ms per hold instead of 0.24 ms.
PostgreSQL 18 counts disabled nodes apart from the cost and was not affected.

What changes (ALTER FUNCTION: the bodies stay those of their migrations):
- `enable_seqscan`, `enable_hashjoin` and `enable_mergejoin` are reset on the five functions, so
  every statement inside them is priced at a finite cost on PostgreSQL 14-18.
- The plans stay index-based another way: `seq_page_cost = 100` inside the five (4 is
  `random_page_cost`'s default), so a generic plan made while a table is one page still reads it
  through its key's index, and a hash join (which needs a scan of its inside) loses to a nested
  loop of index lookups; yet a relation that can only be scanned (a sequence's one row, ~1 page)
  costs about 100, not 10^10. Every statement inside looks rows up by a primary or unique key.
- `jit = off` on the five: nothing in a one-row OLTP statement gains from compiling it, and a
  statement that a large table made expensive must not start paying compile time on every call.
- `plan_cache_mode = force_generic_plan` stays: planning once per session is what made them fast.

tests/integration/test_ledger_plans.py runs every function under auto_explain (nested statements)
on the configured server and on the embedded PostgreSQL 18, and requires every plan's total cost
to stay below `jit_above_cost`, and no plan to be JIT-compiled.
"""
from alembic import op

revision = "0029_no_planner_trap"
down_revision = "0025_api_key_ops"
branch_labels = None
depends_on = None

FUNCTIONS = (
    "ledger_post(text, text, text, jsonb, bigint[], bigint[], numeric[], bigint[], text, bigint)",
    "ledger_apply(text[], text[], text[], bigint[], numeric[], text[], text[], bigint[], bigint[], jsonb, integer[], "
    "integer[], bigint[], bigint[], numeric[], bigint[])",
    "ledger_place_hold(text, text, bigint, numeric, text, text, timestamp with time zone, bigint)",
    "ledger_resolve_hold(bigint, text, text, timestamp with time zone)",
    "ledger_entries_references()",
)


def upgrade() -> None:
    for function in FUNCTIONS:
        op.execute(f"ALTER FUNCTION {function} RESET enable_seqscan RESET enable_hashjoin RESET enable_mergejoin "
                   "SET seq_page_cost = 100 SET jit = off")


def downgrade() -> None:
    for function in FUNCTIONS:
        op.execute(f"ALTER FUNCTION {function} RESET jit RESET seq_page_cost SET enable_seqscan = off SET enable_hashjoin = off "
                   "SET enable_mergejoin = off")
