"""custody.api.paging without a database: cursors round-trip, every edit is refused, keys keep
their shape, and an in-memory list pages in its order past the cursor."""
from __future__ import annotations

import pytest
from starlette.requests import Request
from starlette.responses import Response

from custody.api.errors import ApiError
from custody.api.paging import Page, decode, encode, _key_type


def test_a_cursor_round_trips_and_names_its_list():
    for key in (1, 2**63 - 1, "BTC-USDT", ("rebalance", 7)):
        assert decode("things", encode("things", key)) == key
    with pytest.raises(ApiError) as refused:
        decode("other", encode("things", 5))
    assert (refused.value.status, refused.value.code) == (422, "invalid_cursor")


def test_every_single_character_edit_is_refused():
    cursor = encode("things", 123456)
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i in range(len(cursor)):
        for other in alphabet[::7]:
            if other == cursor[i]:
                continue
            edited = cursor[:i] + other + cursor[i + 1:]
            try:
                key = decode("things", edited)
            except ApiError as exc:
                assert exc.code == "invalid_cursor"
            else:  # only base64's unused low bits of the last character may change nothing
                assert i == len(cursor) - 1 and key == 123456


def test_a_key_of_the_wrong_shape_is_refused():
    assert _key_type(5, int) == 5
    for key, kind in ((True, int), (-1, int), (2**63, int), ("5", int), (5, str), (("a", "b"), tuple), (5, tuple)):
        with pytest.raises(ApiError):
            _key_type(key, kind)


def _page(key, limit, newest_first=False):
    request = Request({"type": "http", "method": "GET", "path": "/v1/things", "query_string": b"limit=2",
                       "headers": [], "server": ("testserver", 80), "scheme": "http", "root_path": ""})
    return Page("things", newest_first, key, limit, request, Response())


def test_an_in_memory_list_pages_in_its_order():
    page = _page(None, 2)
    assert page.slice(["c", "a", "d", "b"], key=lambda x: x) == ["a", "b"]
    assert decode("things", page.next_cursor) == "b"
    assert page.response.headers["X-Next-Cursor"] == page.next_cursor
    assert page.response.headers["Link"] == f'</v1/things?limit=2&cursor={page.next_cursor}>; rel="next"'
    last = _page("b", 2)
    assert last.slice(["c", "a", "d", "b"], key=lambda x: x) == ["c", "d"] and last.next_cursor is None
    assert "X-Next-Cursor" not in last.response.headers
    newest = _page(3, 5, newest_first=True)
    assert newest.slice([1, 2, 3, 4], key=lambda x: x) == [2, 1]


def test_a_cursor_with_its_unused_bits_changed_is_refused():
    """Unpadded base64's last character carries bits the decoder drops: a cursor whose last
    character is changed within them decodes to the same bytes, and was accepted (a flaky
    test_a_bad_cursor_is_a_4xx_never_a_500 found it). Only the spelling `encode` wrote is a cursor."""
    import base64

    from custody.api.errors import ApiError
    from custody.api.paging import decode, encode

    for key in range(1, 200):
        cursor = encode("firm-accounts", key)
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        twins = [cursor[:-1] + ch for ch in alphabet if ch != cursor[-1]
                 and base64.urlsafe_b64decode(cursor[:-1] + ch + "=" * (-len(cursor) % 4)) == raw]
        for twin in twins:
            try:
                decode("firm-accounts", twin)
            except ApiError as exc:
                assert exc.code == "invalid_cursor"
            else:
                raise AssertionError(f"{twin!r} (a twin of {cursor!r}) was accepted")
        assert decode("firm-accounts", cursor) == key
