"""custody/api/errors.py documents the codes the API invents in one table: every code a route
raises as an ApiError is either there, with the same status, or a ledger / custody code with its
own status; and the codes the error handlers answer themselves are there too."""
from __future__ import annotations

import re
from pathlib import Path

import custody.api.errors as api_errors
from custody.errors import CustodyErrorCode
from ledger.errors import ErrorCode

API = Path(api_errors.__file__).parent


def documented() -> dict[str, int]:
    rows = re.findall(r"^\| (\w+) \| (\d{3}) \| (.+?) \|$", api_errors.__doc__, re.M)
    return {name: int(status) for name, status, _ in rows}


def test_every_code_a_route_raises_is_documented_with_its_status():
    known = {**{c.value: c.http_status for c in ErrorCode}, **{c.value: c.http_status for c in CustodyErrorCode},
             **documented()}
    raised = set()
    for source in API.glob("*.py"):
        raised |= {(code, int(status)) for status, code in
                   re.findall(r'ApiError\(\s*(\d{3}),\s*"(\w+)"', source.read_text())}
    assert raised, "no ApiError found: has the pattern changed?"
    assert {(code, known.get(code)) for code, _ in raised} == raised


def test_the_handlers_own_codes_are_documented():
    table = documented()
    for code, status in (("invalid_request", 422), ("conflict", 409), ("temporarily_unavailable", 503),
                         ("internal_error", 500), ("not_found", 404), ("method_not_allowed", 405),
                         ("node_unavailable", 503), ("wrong_network", 503)):
        assert table.get(code) == status, code
