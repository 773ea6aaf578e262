"""The console's read models: what an operator needs on one screen to decide, read straight from
the tables (read-only SQL; every change still goes through the /v1 routes and their services).

- `approval_queue(engine, me)`: withdrawals pending approval with who asked, the customer (the
  account's owner), the amount in units with the asset's code, the destination with its allowlist
  status (on the account's allowlist since when, or not) and when an earlier withdrawal first named
  it (and how many did; none: the first time it is seen), the policy reasons, k-of-n progress with the approvers' names, the age
  and the decision's expiry, and whether `me` may approve it (`mine`: they requested it; `acted`:
  they approved or rejected this decision already).
- `audit_trail(engine, q, before_id, limit)`: the audit log newest first, searched by actor,
  action or subject (substring, case-insensitive) and paged by id.
- `balances(engine)`: the books' balance of every asset-location account (chain, tier, asset) in
  units. `reconciliation(engine)`: each reconciliation line in units, with the differences passes
  recorded for it (its incidents).
- `quarantine(engine)`: quarantined deposits and their returns (the return withdrawal's state).
- `payouts(engine)`: recent withdrawal batches (their transactions with state, confirmations and
  fee, and the withdrawals they pay), sweeps and rebalances (their transaction ids).
- `kill_switch_backlog(engine)`: what the kill switch holds back (withdrawals approved or pending,
  per asset, in units) - the backlog that drains when it is released.

Amounts leave as decimal strings in units (`ledger.amounts.format_amount`) beside their minor units;
never a float.
"""
from __future__ import annotations

import datetime as dt

from sqlalchemy import Engine, text

from ledger.amounts import format_amount
from signer.approvals import operator_identity

_QUEUE_SQL = """
SELECT w.id, w.created_at, w.requested_by, w.account_id, a.owner, a.name AS account_name, w.asset, s.decimals, w.chain,
       w.amount, w.fee_quoted, w.destination, w.decision_id, w.return_of_deposit,
       d.reasons, d.required_approvals, d.expires_at, d.policy_version,
       e.added_at AS allowlisted_at,
       (SELECT EXISTS (SELECT 1 FROM allowlist_policy p WHERE p.account_id = w.account_id)) AS has_allowlist,
       (SELECT min(o.created_at) FROM withdrawal_request o WHERE o.destination = w.destination AND o.id < w.id) AS first_seen,
       (SELECT count(*) FROM withdrawal_request o WHERE o.destination = w.destination AND o.id < w.id) AS seen_before
  FROM withdrawal_request w
  JOIN account a ON a.id = w.account_id
  JOIN asset s ON s.code = w.asset
  LEFT JOIN policy_decision d ON d.id = w.decision_id
  LEFT JOIN allowlist_entry e ON e.account_id = w.account_id AND e.address = w.destination
 WHERE w.state = 'pending_approval'
 ORDER BY w.id
 LIMIT :l
"""


def _iso(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.timezone.utc).isoformat() if value is not None else None


def approval_queue(engine: Engine, me: str, *, limit: int = 200) -> list[dict]:
    now = dt.datetime.now(dt.timezone.utc)
    with engine.connect() as c:
        rows = c.execute(text(_QUEUE_SQL), {"l": limit}).all()
        acts = c.execute(text("SELECT decision_id, operator, action, at, comment FROM approval WHERE decision_id = ANY(:d) "
                              "ORDER BY id"), {"d": [r.decision_id for r in rows if r.decision_id]}).all()
    me_id = operator_identity(me)
    out = []
    for r in rows:
        mine_acts = [a for a in acts if a.decision_id == r.decision_id]
        approvers = [operator_identity(a.operator) for a in mine_acts if a.action == "approve"]
        out.append({
            "id": r.id, "requested_by": r.requested_by, "requested_at": _iso(r.created_at),
            "age_seconds": int((now - r.created_at).total_seconds()),
            "account_id": r.account_id, "customer": r.owner or r.account_name,
            "return_of_deposit": r.return_of_deposit,
            "asset": r.asset, "chain": r.chain, "amount": format_amount(int(r.amount), r.decimals),
            "amount_minor": str(int(r.amount)), "fee": format_amount(int(r.fee_quoted), r.decimals),
            "destination": r.destination,
            "allowlist": ("allowlisted" if r.allowlisted_at is not None else
                          "not on the account's allowlist" if r.has_allowlist else "account has no allowlist"),
            "allowlisted_at": _iso(r.allowlisted_at),
            "destination_first_seen": _iso(r.first_seen), "destination_seen_before": int(r.seen_before),
            "policy_reasons": list(r.reasons or ()), "policy_version": r.policy_version,
            "required_approvals": r.required_approvals, "approvals": approvers,
            "decisions": [{"operator": a.operator, "action": a.action, "at": _iso(a.at), "comment": a.comment}
                          for a in mine_acts],
            "expires_at": _iso(r.expires_at),
            "expires_in_seconds": int((r.expires_at - now).total_seconds()) if r.expires_at else None,
            "mine": operator_identity(r.requested_by) == me_id,
            "acted": any(operator_identity(a.operator) == me_id for a in mine_acts),
        })
    return out


def audit_trail(engine: Engine, *, q: str | None, before_id: int | None, limit: int) -> tuple[list[dict], int | None]:
    """(rows newest first, the `before` id of the next page or None)."""
    pattern = None if not q else "%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    with engine.connect() as c:
        rows = c.execute(text(
            "SELECT id, at, actor, action, subject, detail FROM audit_event "
            "WHERE (CAST(:p AS text) IS NULL OR actor ILIKE :p OR action ILIKE :p OR subject ILIKE :p "
            "       OR detail ->> 'comment' ILIKE :p) "
            "AND (CAST(:b AS bigint) IS NULL OR id < :b) ORDER BY id DESC LIMIT :l"),
            {"p": pattern, "b": before_id, "l": limit + 1}).all()
    more = len(rows) > limit
    rows = rows[:limit]
    out = [{"id": r.id, "at": _iso(r.at), "actor": r.actor, "action": r.action, "subject": r.subject,
            "comment": (r.detail or {}).get("comment") or (r.detail or {}).get("note") or (r.detail or {}).get("reason"),
            "detail": r.detail} for r in rows]
    return out, (rows[-1].id if more else None)


def balances(engine: Engine) -> list[dict]:
    """Every asset-location account (`location:<chain>:<tier>:<asset>`) with its posted and held
    balance in units."""
    with engine.connect() as c:
        rows = c.execute(text(
            "SELECT a.id, a.name, a.asset, s.decimals, coalesce(sum(b.posted), 0) AS posted, coalesce(sum(b.held), 0) AS held "
            "FROM account a JOIN asset s ON s.code = a.asset LEFT JOIN account_balance b ON b.account_id = a.id "
            "WHERE a.kind = 'asset_location' GROUP BY a.id, a.name, a.asset, s.decimals ORDER BY a.name")).all()
    out = []
    for r in rows:
        parts = r.name.split(":")
        chain, tier = (parts[1], parts[2]) if len(parts) >= 4 else ("?", "?")
        out.append({"account_id": r.id, "chain": chain, "tier": tier, "asset": r.asset,
                    "posted": format_amount(int(r.posted), r.decimals), "held": format_amount(int(r.held), r.decimals),
                    "posted_minor": str(int(r.posted))})
    return out


def reconciliation(engine: Engine) -> list[dict]:
    """Each line in units, with its history: the differences a pass recorded for it
    (`reconciliation_difference` incidents: difference, the one before, the block height, when
    resolved), newest first, at most 20 per line."""
    with engine.connect() as c:
        rows = c.execute(text(
            "SELECT l.chain, l.tier, l.asset, s.decimals, l.difference, l.booked_off_chain, l.height, l.updated_at "
            "FROM reconciliation_line l JOIN asset s ON s.code = l.asset ORDER BY l.chain, l.tier, l.asset")).all()
        history = c.execute(text(
            "SELECT i.id, i.severity, i.opened_at, i.resolved_at, i.resolved_by, i.detail ->> 'chain' AS chain, "
            "i.detail ->> 'tier' AS tier, i.detail ->> 'asset' AS asset, i.detail ->> 'difference' AS difference, "
            "i.detail ->> 'previous_difference' AS previous, i.detail ->> 'height' AS height FROM incident i "
            "WHERE i.kind = 'reconciliation_difference' ORDER BY i.id DESC LIMIT 1000")).all()
    lines = []
    for r in rows:
        mine = [h for h in history if (h.chain, h.tier, h.asset) == (r.chain, r.tier, r.asset)][:20]
        units = (lambda v: None if v is None else format_amount(int(v), r.decimals))
        lines.append({"chain": r.chain, "tier": r.tier, "asset": r.asset,
                      "difference": format_amount(int(r.difference), r.decimals), "difference_minor": str(int(r.difference)),
                      "booked_off_chain": format_amount(int(r.booked_off_chain), r.decimals), "height": r.height,
                      "updated_at": _iso(r.updated_at),
                      "history": [{"incident_id": h.id, "severity": h.severity, "at": _iso(h.opened_at),
                                   "difference": units(h.difference), "previous_difference": units(h.previous),
                                   "height": h.height, "resolved_at": _iso(h.resolved_at), "resolved_by": h.resolved_by}
                                  for h in mine]})
    return lines


def quarantine(engine: Engine, *, limit: int = 200) -> list[dict]:
    """Quarantined deposits and those on their way back (a return withdrawal, through the operators'
    quorum), newest first: amount in units, senders, the screening verdict, the return's state."""
    with engine.connect() as c:
        rows = c.execute(text(
            "SELECT o.id, o.chain, o.asset, s.decimals, o.txid, o.output_index, o.address, o.senders, o.amount, o.state, "
            "o.screening, o.account_id, o.created_at, o.return_withdrawal_id, w.state AS return_state, "
            "w.destination AS return_destination FROM deposit_observation o JOIN asset s ON s.code = o.asset "
            "LEFT JOIN withdrawal_request w ON w.id = o.return_withdrawal_id "
            "WHERE o.state = 'quarantined' OR o.return_withdrawal_id IS NOT NULL ORDER BY o.id DESC LIMIT :l"),
            {"l": limit}).all()
    return [{"id": r.id, "chain": r.chain, "asset": r.asset, "txid": r.txid, "output_index": r.output_index,
             "address": r.address, "senders": list(r.senders or ()), "amount": format_amount(int(r.amount), r.decimals),
             "state": r.state, "screening": r.screening, "account_id": r.account_id, "seen_at": _iso(r.created_at),
             "return_withdrawal_id": r.return_withdrawal_id, "return_state": r.return_state,
             "return_destination": r.return_destination} for r in rows]


def payouts(engine: Engine, *, limit: int = 50) -> dict:
    with engine.connect() as c:
        batches = c.execute(text(
            "SELECT b.id, b.chain, b.asset, b.state, b.created_at, s.decimals, "
            "(SELECT coalesce(sum(o.amount), 0) FROM batch_output o WHERE o.batch_id = b.id) AS total, "
            "(SELECT count(*) FROM batch_output o WHERE o.batch_id = b.id) AS outputs, "
            "(SELECT array_agg(t.txid ORDER BY t.id) FROM chain_transaction t WHERE t.batch_id = b.id) AS txids "
            "FROM withdrawal_batch b JOIN asset s ON s.code = b.asset ORDER BY b.id DESC LIMIT :l"), {"l": limit}).all()
        ids = [b.id for b in batches]
        txs = c.execute(text(
            "SELECT batch_id, txid, state, confirmations, fee, block_height, replaces_id IS NOT NULL AS replacement "
            "FROM chain_transaction WHERE batch_id = ANY(:b) ORDER BY id"), {"b": ids}).all()
        outs = c.execute(text(
            "SELECT o.batch_id, o.withdrawal_id, o.amount, w.destination, w.state FROM batch_output o "
            "JOIN withdrawal_request w ON w.id = o.withdrawal_id WHERE o.batch_id = ANY(:b) ORDER BY o.withdrawal_id"),
            {"b": ids}).all()
        sweeps = c.execute(text(
            "SELECT w.id, w.chain, w.asset, w.state, w.amount, w.txid, w.created_at, s.decimals FROM sweep w "
            "JOIN asset s ON s.code = w.asset ORDER BY w.id DESC LIMIT :l"), {"l": limit}).all()
        rebalances = c.execute(text(
            "SELECT r.id, r.chain, r.asset, r.state, r.amount, r.txid, r.source_tier, r.destination_tier, r.created_at, "
            "s.decimals FROM rebalance r JOIN asset s ON s.code = r.asset ORDER BY r.id DESC LIMIT :l"), {"l": limit}).all()
    return {
        "batches": [{"id": b.id, "chain": b.chain, "asset": b.asset, "state": b.state, "created_at": _iso(b.created_at),
                     "outputs": b.outputs, "total": format_amount(int(b.total), b.decimals), "txids": list(b.txids or ()),
                     "transactions": [{"txid": t.txid, "state": t.state, "confirmations": t.confirmations,
                                       "block_height": t.block_height, "replacement": t.replacement,
                                       "fee": format_amount(int(t.fee), b.decimals)} for t in txs if t.batch_id == b.id],
                     "withdrawals": [{"id": o.withdrawal_id, "amount": format_amount(int(o.amount), b.decimals),
                                      "destination": o.destination, "state": o.state} for o in outs if o.batch_id == b.id]}
                    for b in batches],
        "sweeps": [{"id": s.id, "chain": s.chain, "asset": s.asset, "state": s.state, "created_at": _iso(s.created_at),
                    "amount": format_amount(int(s.amount), s.decimals), "txids": [s.txid] if s.txid else []} for s in sweeps],
        "rebalances": [{"id": r.id, "chain": r.chain, "asset": r.asset, "state": r.state, "created_at": _iso(r.created_at),
                        "from": r.source_tier, "to": r.destination_tier, "amount": format_amount(int(r.amount), r.decimals),
                        "txids": [r.txid] if r.txid else []} for r in rebalances],
    }


def kill_switch_backlog(engine: Engine) -> list[dict]:
    with engine.connect() as c:
        rows = c.execute(text(
            "SELECT w.asset, s.decimals, w.state, count(*) AS n, sum(w.amount) AS total FROM withdrawal_request w "
            "JOIN asset s ON s.code = w.asset WHERE w.state IN ('pending_approval', 'approved') "
            "GROUP BY w.asset, s.decimals, w.state ORDER BY w.asset, w.state")).all()
    return [{"asset": r.asset, "state": r.state, "count": r.n, "total": format_amount(int(r.total), r.decimals)} for r in rows]
