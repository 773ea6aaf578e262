"""Suite-wide pytest wiring.

Tests are layered by speed (STYLE.md 10): the directory a test lives in sets its marker, so
`scripts/test -m unit`, `-m integration` or `-m "not e2e"` select layers without per-test markers.
"""
from __future__ import annotations

from pathlib import Path

import pytest

_LAYERS = ("unit", "integration", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        for layer in _LAYERS:
            if layer in parts:
                item.add_marker(getattr(pytest.mark, layer))
