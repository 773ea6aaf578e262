"""The event catalogue: every event type the service can emit, its version, its aggregate, when it
is emitted and its fields. `custody.controls.emit` refuses a type that is not here, the database
triggers of migration 0026_event_stream emit only types that are here (a test reads their source),
and the README's "Event catalogue" section is `render_catalogue()` verbatim (a test compares them).

Every event is delivered as one envelope (JSON), on NATS JetStream under the subject
`custody.<type>` with the header `Nats-Msg-Id: <event_key>`, and to any other sink:

    {"type": "order.filled", "version": 1, "event_key": "order:5d0c...#3",
     "aggregate": "order:5d0c...", "aggregate_seq": 3, "outbox_id": 812,
     "occurred_at": "2026-01-02T03:04:05.678901+00:00", "data": {...the type's fields...}}

Amounts and quantities are JSON integers in the asset's minor unit (lots and ticks for order
quantities and prices); wei amounts exceed 2**53, so parse them as arbitrary-precision integers.

Guarantees (see custody.jobs.OutboxDispatcher and migration 0026 for why they hold):
- an event exists exactly when the change that caused it committed (same database transaction);
- at least once: a consumer may see an event again (a redelivery after a crash between the
  broker's ack and the outbox update, beyond the stream's duplicate window);
- per aggregate, in commit order: `aggregate_seq` is 1, 2, 3, ... without gaps, in the order the
  changes committed, and events are published in that order. Across aggregates there is no order.

What a consumer must do to be idempotent: remember the `event_key`s it has applied (in the same
transaction as the effect) and skip one it has seen; for state events (orders, holds,
withdrawals) apply one only if its `aggregate_seq` is greater than the last applied for its
aggregate, so a late duplicate never rolls a state back.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EventType:
    name: str
    version: int
    aggregate: str  # the aggregate's form, e.g. `order:<order_id>`
    when: str
    fields: tuple[tuple[str, str, str], ...]  # (name, JSON type, meaning)


_WITHDRAWAL_ID = ("withdrawal_id", "integer", "the withdrawal request")
_DEPOSIT_FIELDS = (
    ("observation_id", "integer", "the deposit observation"),
    ("account_id", "integer", "the customer account"),
    ("asset", "string", "asset code"),
    ("amount", "integer", "minor units"),
    ("txid", "string", "chain transaction id"),
    ("index", "integer", "output index (bitcoin) or log index (ethereum)"),
    ("transaction_id", "integer", "the journal transaction that booked it"),
)
_ORDER_FIELDS = (
    ("order_id", "string", "the order"),
    ("market", "string", "market symbol"),
    ("account", "string", "the owner"),
    ("client_order_id", "string", "the owner's id"),
    ("side", "string", "buy or sell"),
    ("order_type", "string", "limit, market, stop or stop_limit"),
    ("price_ticks", "integer or null", "limit price in ticks"),
    ("qty_lots", "integer or null", "quantity in lots"),
    ("budget", "integer or null", "a market bid's quote budget, minor units"),
    ("state", "string", "one of the ten order states"),
    ("filled_lots", "integer", "lots filled so far"),
    ("remaining_lots", "integer or null", "lots still open"),
    ("quote_traded", "integer", "quote minor units traded so far"),
    ("fees_paid", "integer", "quote minor units paid in fees so far"),
    ("hold_id", "integer or null", "the order's ledger hold"),
    ("reject_code", "string or null", "why it was rejected"),
    ("close_reason", "string or null", "why it closed"),
    ("last_seq", "integer or null", "the market's command sequence that last changed it"),
)
_ORDER_AGGREGATE = "order:<order_id>"

EVENT_TYPES: dict[str, EventType] = {e.name: e for e in (
    EventType("deposit.credited", 2, "deposit:<observation_id>",
              "a final, screened deposit was credited to its customer account (or released from quarantine)",
              _DEPOSIT_FIELDS),
    EventType("deposit.quarantined", 2, "deposit:<observation_id>",
              "a final deposit failed screening and was booked to quarantine", _DEPOSIT_FIELDS),
    EventType("deposit.dust", 2, "deposit:<observation_id>",
              "a final deposit below the dust minimum was booked to the dust account", _DEPOSIT_FIELDS),
    EventType("withdrawal.requested", 1, "withdrawal:<withdrawal_id>",
              "a withdrawal was requested, held and decided by policy",
              (_WITHDRAWAL_ID, ("account_id", "integer", "the customer account"),
               ("outcome", "string", "the policy outcome")) ),
    EventType("withdrawal.approved", 1, "withdrawal:<withdrawal_id>",
              "operators' approvals reached the quorum", (_WITHDRAWAL_ID,)),
    EventType("withdrawal.rejected", 1, "withdrawal:<withdrawal_id>",
              "policy, an operator or custody rejected it (its hold released)",
              (_WITHDRAWAL_ID, ("reason", "string (optional)", "why"), ("by", "string (optional)", "the operator"))),
    EventType("withdrawal.final", 1, "withdrawal:<withdrawal_id>",
              "its transaction reached finality", (_WITHDRAWAL_ID, ("batch_id", "integer", "the batch"))),
    EventType("withdrawal.released", 1, "withdrawal:<withdrawal_id>",
              "its transaction failed or was dropped; the amount is back on the account",
              (_WITHDRAWAL_ID, ("reason", "string", "why"))),
    EventType("withdrawal.state_changed", 1, "withdrawal:<withdrawal_id>",
              "a withdrawal request was created or changed state (every state, database trigger)",
              (_WITHDRAWAL_ID, ("client_withdrawal_id", "string", "the backend's id"),
               ("account_id", "integer", "the customer account"), ("asset", "string", "asset code"),
               ("chain", "string", "bitcoin or ethereum"), ("amount", "integer", "minor units paid out"),
               ("fee_quoted", "integer", "minor units of fee held"), ("destination", "string", "address"),
               ("priority", "string", "normal or fast"), ("state", "string", "the new state"),
               ("previous_state", "string or null", "null when created"),
               ("hold_id", "integer or null", "the ledger hold"), ("batch_id", "integer or null", "the batch"))),
    EventType("batch.signed", 1, "batch:<batch_id>", "a withdrawal batch was signed (before broadcast)",
              (("batch_id", "integer", "the batch"), ("txid", "string", "its transaction id"))),
    EventType("incident.opened", 1, "incident:<incident_id>", "an incident was opened (critical ones engage the kill switch)",
              (("incident_id", "integer", "the incident"), ("kind", "string", "what happened"),
               ("severity", "string", "critical or warning"))),
    EventType("kill_switch.engaged", 1, "control:withdrawals_halted", "the withdrawal kill switch was engaged",
              (("reason", "string", "why"), ("changed_by", "string", "operator or system"))),
    EventType("kill_switch.released", 1, "control:withdrawals_halted", "the withdrawal kill switch was released",
              (("reason", "string", "why"), ("changed_by", "string", "operator or system"),
               ("drain", "boolean", "approved withdrawals were waiting: they leave slowly"))),
    EventType("treasury.adjustment_posted", 1, "adjustment:<adjustment_id>", "an approved treasury adjustment was posted",
              (("adjustment_id", "integer", "the adjustment"), ("transaction_id", "integer", "its journal transaction"))),
    EventType("ledger.transaction_posted", 1, "journal_transaction:<transaction_id>",
              "every journal transaction, whoever posted it (database trigger, at commit)",
              (("transaction_id", "integer", "the journal transaction"), ("idempotency_key", "string", "its key"),
               ("kind", "string", "deposit, fill, withdrawal_capture, ..."),
               ("reverses_id", "integer or null", "the transaction it reverses"),
               ("metadata", "object", "the poster's metadata"), ("posted_at", "string", "timestamp"),
               ("legs", "array", "entries: {entry_id, account_id, asset, amount (signed integer, + credits), hold_id}"))),
    EventType("ledger.hold_changed", 1, "hold:<hold_id>",
              "a hold was placed, captured (in part), released or expired (database trigger)",
              (("hold_id", "integer", "the hold"), ("account_id", "integer", "the held account"),
               ("asset", "string", "asset code"), ("amount", "integer", "minor units placed"),
               ("captured", "integer", "minor units captured so far"), ("released", "integer", "minor units released"),
               ("held", "integer", "minor units still held (0 once resolved)"),
               ("state", "string", "pending, captured, released or expired"), ("owner", "string", "the subsystem"),
               ("reference", "string", "what it holds for"))),
    EventType("order.accepted", 1, _ORDER_AGGREGATE,
              "an order was accepted (pending_new, working, untriggered) or a stop was activated", _ORDER_FIELDS),
    EventType("order.amended", 1, _ORDER_AGGREGATE, "an open order's price or quantity changed", _ORDER_FIELDS),
    EventType("order.partially_filled", 1, _ORDER_AGGREGATE, "an order filled in part", _ORDER_FIELDS),
    EventType("order.filled", 1, _ORDER_AGGREGATE, "an order filled completely", _ORDER_FIELDS),
    EventType("order.cancelled", 1, _ORDER_AGGREGATE, "an order was cancelled (its hold's rest released)", _ORDER_FIELDS),
    EventType("order.expired", 1, _ORDER_AGGREGATE, "an order expired (IOC/FOK rest)", _ORDER_FIELDS),
    EventType("order.rejected", 1, _ORDER_AGGREGATE, "an order was rejected", _ORDER_FIELDS),
    EventType("fill.executed", 1, "market:<market>",
              "two orders traded (one per fill row; the legs are in its ledger.transaction_posted)",
              (("fill_id", "integer", "the fill"), ("market", "string", "market symbol"),
               ("seq", "integer", "the command's sequence"), ("match_no", "integer", "the match within it"),
               ("maker_order_id", "string", "maker order"), ("taker_order_id", "string", "taker order"),
               ("maker_account", "string", "maker owner"), ("taker_account", "string", "taker owner"),
               ("taker_side", "string", "buy or sell"), ("price_ticks", "integer", "price"),
               ("qty_lots", "integer", "quantity"), ("base_amount", "integer", "base minor units"),
               ("quote_amount", "integer", "quote minor units"),
               ("maker_fee", "integer", "quote minor units"), ("taker_fee", "integer", "quote minor units"),
               ("journal_transaction_id", "integer", "its journal transaction"))),
)}


def event_type(name: str) -> EventType:
    """The registered type, or ValueError (a programming error: register it here first)."""
    try:
        return EVENT_TYPES[name]
    except KeyError:
        raise ValueError(f"event type {name!r} is not in custody.events.EVENT_TYPES") from None


CATALOGUE_BEGIN = "<!-- event-catalogue:begin (custody.events.render_catalogue) -->"
CATALOGUE_END = "<!-- event-catalogue:end -->"


def render_catalogue() -> str:
    """The README's event catalogue: one table of types, then each type's fields."""
    lines = [CATALOGUE_BEGIN, "", "| type | version | aggregate | emitted when |", "| --- | --- | --- | --- |"]
    lines += [f"| `{e.name}` | {e.version} | `{e.aggregate}` | {e.when} |" for e in EVENT_TYPES.values()]
    for e in EVENT_TYPES.values():
        lines += ["", f"`{e.name}` v{e.version} fields: " + "; ".join(f"`{n}` ({t}): {m}" for n, t, m in e.fields)]
    return "\n".join(lines + ["", CATALOGUE_END])
