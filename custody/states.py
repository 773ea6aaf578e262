"""State machines of custody's operational rows, declared once as data.

Every state change of a deposit observation, withdrawal, batch, chain transaction, sweep (bitcoin
or ethereum, and an ethereum sweep's gas funding) or rebalance goes through `advance()`, which
refuses any transition not listed here, so an illegal transition is impossible rather than merely
untested. The SQL that moves a row also names the
state it expects to leave (`WHERE state = :from`), so two workers can never both move the same row.

Containment is a second, smaller machine on the same rows (`CONTAINMENT_TRANSITIONS`, column
`containment`): a withdrawal batch, sweep or rebalance whose signing or booking failed is
`set_aside`, every job skips it, and only an operator's retry makes it `active` again
(custody.containment). It is orthogonal to `state`, which keeps saying where the transaction is,
so reconciliation keeps explaining a set-aside row's money exactly as before.
"""
from __future__ import annotations

from typing import Mapping

from sqlalchemy import Connection, text

DEPOSIT_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "seen": frozenset({"confirming", "final", "orphaned"}),
    "confirming": frozenset({"final", "orphaned"}),
    "final": frozenset({"credited", "quarantined", "dust", "orphaned"}),
    "orphaned": frozenset({"seen"}),  # the same output re-mined in the new chain
    "quarantined": frozenset({"released", "returned"}),
    "credited": frozenset(),
    "released": frozenset(),
    "returned": frozenset({"quarantined"}),  # its return withdrawal ended unpaid (custody.deposits.reopen_returns)
    "dust": frozenset(),
}

# A withdrawal reaches `signed` only from `approved` via `batched`. `requested` exists only inside
# the creating database transaction (the hold is placed in it). Terminal: final, rejected,
# cancelled, released.
WITHDRAWAL_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "requested": frozenset({"held", "rejected"}),
    "held": frozenset({"pending_approval", "approved", "rejected"}),
    "pending_approval": frozenset({"approved", "rejected", "cancelled"}),
    "approved": frozenset({"batched", "rejected", "cancelled", "pending_approval"}),  # re-decided: expired, approvals lapsed
    "batched": frozenset({"signed", "approved", "rejected"}),  # back to approved: dropped from a batch
    "signed": frozenset({"broadcast", "failed"}),
    "broadcast": frozenset({"confirmed", "failed"}),
    "confirmed": frozenset({"final", "broadcast"}),  # back to broadcast: its block was reorged out
    "failed": frozenset({"released"}),
    "final": frozenset(),
    "rejected": frozenset(),
    "cancelled": frozenset(),
    "released": frozenset(),
}

BATCH_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "open": frozenset({"signed", "abandoned"}),
    "signed": frozenset({"broadcast", "failed"}),
    "broadcast": frozenset({"confirmed", "failed"}),
    "confirmed": frozenset({"final", "broadcast"}),
    "final": frozenset(),
    "failed": frozenset(),
    "abandoned": frozenset(),
}

# One row per signed version of a batch's transaction; a fee bump adds a row that `replaces` one.
CHAIN_TX_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "signed": frozenset({"broadcast", "replaced"}),
    "broadcast": frozenset({"confirmed", "replaced", "dropped"}),
    "confirmed": frozenset({"final", "broadcast"}),
    "final": frozenset(),
    "replaced": frozenset({"broadcast"}),  # an earlier version mined after all: it is followed again
    "dropped": frozenset(),
}

# A sweep moves booked deposit coins into the hot wallet; it is booked once final. `dropped`: it can
# never be mined (a coin it spends was reorged out after booking and is gone, custody.sweeps), its
# coins freed; from `signed` too, as the node refuses it before it was ever sent.
SWEEP_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "open": frozenset({"signed", "abandoned"}),
    "signed": frozenset({"broadcast", "dropped"}),
    "broadcast": frozenset({"confirmed", "dropped"}),
    "confirmed": frozenset({"final", "broadcast"}),
    "final": frozenset(),
    "dropped": frozenset(),
    "abandoned": frozenset(),
}

# A rebalance moves value between the firm's wallet tiers (bitcoin: hot -> cold); booked once final.
# The same shape as a sweep, so one piece of code broadcasts and tracks both (custody.firm_moves);
# a signed rebalance is not dropped (only a sweep is, custody.sweeps `drop_stranded`).
# `expired`: a warm -> hot refill that waited longer than the policy's `refill_ttl` for its operator
# quorum (custody.rebalances `expire_refill`); nothing was signed, its warm coins are free again.
REBALANCE_TRANSITIONS: Mapping[str, frozenset[str]] = {**SWEEP_TRANSITIONS, "open": frozenset({"signed", "abandoned", "expired"}),
                                                       "signed": frozenset({"broadcast"}), "expired": frozenset()}

# A CPFP child of a stuck rebalance into hot (custody.cpfp): signed and stored, sent, mined, booked
# once final (its fee); `dropped` when its parent is final without it and it is neither mined nor in
# the mempool (nothing booked). Back to broadcast: its block was reorged out.
CPFP_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "signed": frozenset({"broadcast"}),
    "broadcast": frozenset({"confirmed", "dropped"}),
    "confirmed": frozenset({"final", "broadcast"}),
    "final": frozenset(),
    "dropped": frozenset(),
}

# An ethereum sweep (deposit address -> hot address) or its gas funding (hot -> deposit address):
# one transaction each, its nonce reserved when the row is made, never dropped (a gap would block
# every later transaction of its sender), booked once final (custody.eth_sweeps). `reverted`: mined
# but its execution failed (a token's transfer refused); only its gas moved, booked as it ends.
ETH_SWEEP_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "open": frozenset({"signed"}),
    "signed": frozenset({"broadcast"}),
    "broadcast": frozenset({"confirmed"}),
    "confirmed": frozenset({"final", "reverted", "broadcast"}),  # back to broadcast: its block was reorged out
    "final": frozenset(),
    "reverted": frozenset(),
}
# An ethereum rebalance: the same shape, and a refill can expire unsigned (as a bitcoin one).
ETH_REBALANCE_TRANSITIONS: Mapping[str, frozenset[str]] = {**ETH_SWEEP_TRANSITIONS, "open": frozenset({"signed", "expired"}),
                                                           "expired": frozenset()}

# Whether the jobs work on a batch, sweep or rebalance (column `containment`, beside `state`).
CONTAINMENT_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "active": frozenset({"set_aside"}),  # the jobs work on it: sign, broadcast, track, bump, book
    "set_aside": frozenset({"active"}),  # its signing or booking failed: every job skips it until an operator retries it
}

# A treasury adjustment (custody.adjustments): approved (api) once a quorum of operators other
# than its proposer signed it, posted by the worker after it verified those signatures again (back
# to proposed when they no longer make the quorum), or rejected by any operator before it is
# posted. posted and rejected are terminal.
ADJUSTMENT_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "proposed": frozenset({"approved", "rejected"}),
    "approved": frozenset({"posted", "rejected", "proposed"}),
    "posted": frozenset(),
    "rejected": frozenset(),
}

# A convert price change (custody.convert.prices): proposed over the API; signed by an operator
# (the api verified it); applied by the worker (verified again) or refused (expired, superseded by
# a later change of the pair, or a signature that does not verify against the worker's keys).
PRICE_CHANGE_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "proposed": frozenset({"signed", "refused"}),
    "signed": frozenset({"applied", "refused"}),
    "applied": frozenset(),
    "refused": frozenset(),
}

MACHINES: Mapping[str, tuple[str, Mapping[str, frozenset[str]]]] = {
    "deposit_observation": ("deposit_observation", DEPOSIT_TRANSITIONS),
    "withdrawal": ("withdrawal_request", WITHDRAWAL_TRANSITIONS),
    "batch": ("withdrawal_batch", BATCH_TRANSITIONS),
    "chain_transaction": ("chain_transaction", CHAIN_TX_TRANSITIONS),
    "sweep": ("sweep", SWEEP_TRANSITIONS),
    "rebalance": ("rebalance", REBALANCE_TRANSITIONS),
    "cpfp": ("rebalance_cpfp", CPFP_TRANSITIONS),
    "adjustment": ("treasury_adjustment", ADJUSTMENT_TRANSITIONS),
    "price_change": ("convert_price_change", PRICE_CHANGE_TRANSITIONS),
    "eth_sweep": ("eth_sweep", ETH_SWEEP_TRANSITIONS),
    "eth_gas_funding": ("eth_gas_funding", ETH_SWEEP_TRANSITIONS),
    "eth_rebalance": ("eth_rebalance", ETH_REBALANCE_TRANSITIONS),  # custody.eth_rebalances
    "batch_containment": ("withdrawal_batch", CONTAINMENT_TRANSITIONS),
    "sweep_containment": ("sweep", CONTAINMENT_TRANSITIONS),
    "rebalance_containment": ("rebalance", CONTAINMENT_TRANSITIONS),
    "cpfp_containment": ("rebalance_cpfp", CONTAINMENT_TRANSITIONS),
}
# The column a machine moves, where it is not `state`.
COLUMNS: Mapping[str, str] = {f"{m}_containment": "containment" for m in ("batch", "sweep", "rebalance", "cpfp")}


class IllegalTransition(Exception):
    """A state change the machine does not allow, or a row that was not in the expected state."""


def check(machine: str, from_state: str, to_state: str) -> None:
    _, transitions = MACHINES[machine]
    if to_state not in transitions.get(from_state, frozenset()):
        raise IllegalTransition(f"{machine}: {from_state} -> {to_state} is not allowed")


def advance(conn: Connection, machine: str, row_id: int, from_state: str, to_state: str, **columns: object) -> None:
    """Move one row from `from_state` to `to_state`, setting `columns` too, or raise."""
    check(machine, from_state, to_state)
    table, _ = MACHINES[machine]
    column = COLUMNS.get(machine, "state")
    sets = "".join(f", {name} = :{name}" for name in columns)
    moved = conn.execute(
        text(f"UPDATE {table} SET {column} = :to, updated_at = now(){sets} WHERE id = :id AND {column} = :from"),
        {"to": to_state, "from": from_state, "id": row_id, **columns},
    ).rowcount
    if moved != 1:
        raise IllegalTransition(f"{machine} {row_id} was not in state {from_state}")


def advance_many(conn: Connection, machine: str, row_ids: list[int], from_state: str, to_state: str, **columns: object) -> None:
    """`advance` for many rows in one statement: all move, or IllegalTransition and none does
    (the caller's transaction rolls back)."""
    if not row_ids:
        return
    check(machine, from_state, to_state)
    table, _ = MACHINES[machine]
    column = COLUMNS.get(machine, "state")
    sets = "".join(f", {name} = :{name}" for name in columns)
    moved = conn.execute(
        text(f"UPDATE {table} SET {column} = :to, updated_at = now(){sets} WHERE id = ANY(:ids) AND {column} = :from"),
        {"to": to_state, "from": from_state, "ids": list(row_ids), **columns},
    ).rowcount
    if moved != len(set(row_ids)):
        raise IllegalTransition(f"{machine}: {len(set(row_ids)) - moved} of {len(set(row_ids))} rows were not in state {from_state}")
