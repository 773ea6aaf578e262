"""custody/errors.py documents every custody code in one table (STYLE 6): the table, the enum and
the status map must say the same, in the same order."""
from __future__ import annotations

import re

import custody.errors as errors_module
from custody.errors import CustodyErrorCode


def test_the_documented_table_matches_the_enum():
    rows = re.findall(r"^\| (\w+) \| (\d{3}) \| (.+?) \|$", errors_module.__doc__, re.M)
    documented = {name: int(status) for name, status, _ in rows}
    assert documented == {code.value: code.http_status for code in CustodyErrorCode}
    assert [name for name, _, _ in rows] == [code.value for code in CustodyErrorCode]  # same order
    assert all(code.value == code.name for code in CustodyErrorCode)
