"""The README's event catalogue is the registry (custody.events), and the registry is exactly the
set of event types the code can emit: the literal types of `emit(...)` calls in custody/, and the
types the triggers of migration 0026 pass to `custody_emit` (its `'order.' || NEW.state` expanded
over the order states that are not mapped to `order.accepted`; `deposit.{target}` over the
targets custody.deposits books; `"a" if x else "b"` as both)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from custody.controls import emit
from custody.events import CATALOGUE_BEGIN, CATALOGUE_END, EVENT_TYPES, render_catalogue

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.unit


def test_readme_catalogue_is_the_registry():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(CATALOGUE_BEGIN):readme.index(CATALOGUE_END) + len(CATALOGUE_END)]
    assert section == render_catalogue()


def emitted_types() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "custody").rglob("*.py"):
        source = path.read_text()
        found |= set(re.findall(r'\bemit\(\s*\w+,\s*"([a-z_]+\.[a-z_]+)"', source))
        if 'f"deposit.{target}"' in source:
            found |= {f"deposit.{t}" for t in re.findall(r'target, to_account, kind = "([a-z]+)"', source)}
        for pair in re.findall(r'\bemit\(\s*\w+,\s*"([a-z_.]+)" if \w+ else "([a-z_.]+)"', source):
            found |= set(pair)
    sql = (ROOT / "migrations/versions/0026_event_stream.py").read_text()
    found |= set(re.findall(r"custody_emit\('([a-z_]+\.[a-z_]+)'", sql))
    found |= set(re.findall(r"THEN '(order\.[a-z_]+)'", sql))
    states = re.search(r"state IN \(([^)]*)\) THEN 'order\.accepted'", sql).group(1)
    accepted = set(re.findall(r"'([a-z_]+)'", states))
    all_states = ("received", "rejected", "pending_new", "working", "partially_filled", "filled", "pending_cancel",
                  "cancelled", "expired", "untriggered")
    found |= {f"order.{s}" for s in all_states if s not in accepted}
    return found


def test_registry_is_what_the_code_emits():
    assert emitted_types() == set(EVENT_TYPES)


def test_emit_refuses_an_unregistered_type():
    with pytest.raises(ValueError, match="not in custody.events.EVENT_TYPES"):
        emit(None, "order.teleported", "k", {}, aggregate="a")  # type: ignore[arg-type] - refused before any SQL
