"""The API's input rules, without a database: text PostgreSQL cannot store is found wherever it
hides in a request (custody.api.text_guard), and every id the API accepts is declared as a bigint
(custody.api.params), on every route the app has."""
from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.api.params import MAX_ID
from custody.api.text_guard import (
    RefuseUnstorableText,
    first_unstorable,
    storable,
    unstorable_in_body,
    unstorable_in_target,
)


@pytest.mark.parametrize("text, ok", [
    ("", True), ("plain", True), ("é ü ß", True), ("emoji \U0001F600", True), ("\ufffd", True),
    ("nul \x00 inside", False), ("\x00", False), ("lone \ud800", False), ("\udfff", False),
])
def test_storable_refuses_nul_and_lone_surrogates(text, ok):
    assert storable(text) is ok


def test_first_unstorable_names_the_place_in_nested_json():
    body = {"idempotency_key": "k", "metadata": {"note": "fine", "deep": [{"x": "ok"}, {"y": "bad\x00"}]}}
    assert first_unstorable(body, "body") == "body.metadata.deep[1].y"
    assert first_unstorable({"metadata": {"bad\x00key": 1}}, "body") == "body.metadata (a key)"
    assert first_unstorable({"a": ["x", 1, None, True, 2.5, {"b": "y"}]}, "body") is None
    assert first_unstorable("\ud800", "body") == "body"


def test_a_deeply_nested_body_does_not_exhaust_the_stack():
    value: object = "\x00"
    for _ in range(5_000):
        value = [value]
    assert first_unstorable(value, "body").startswith("body[0][0]")
    assert unstorable_in_body(b"[" * 200_000 + b"]" * 200_000) is None  # not JSON we can read: FastAPI refuses it


@pytest.mark.parametrize("raw, where", [
    (b'{"metadata": {"a": "\\u0000"}}', "body.metadata.a"),
    (b'{"reference": "x\\ud800y"}', "body.reference"),
    (b'{"reference": "pair \\ud83d\\ude00 is fine"}', None),
    (b'{"reference": "an escaped backslash: \\\\u0000"}', None),
    (b'{"reference": "no escapes at all"}', None),
    (b'not json \\u0000', None),
])
def test_unstorable_in_body_reads_json_escapes(raw, where):
    assert unstorable_in_body(raw) == where


@pytest.mark.parametrize("scope, where", [
    ({"path": "/v1/markets/BTC\x00/depth"}, "path"),
    ({"path": "/v1/deposits", "query_string": b"state=%00"}, "query.state"),
    ({"path": "/v1/deposits", "query_string": b"st%00ate=x"}, "query (a parameter name)"),
    ({"path": "/v1/deposits", "query_string": b"state=%ED%A0%80"}, None),  # not UTF-8: read as U+FFFD
    ({"path": "/v1/deposits", "headers": [(b"x-api-key", b"k\x00")]}, "header.x-api-key"),
    ({"path": "/v1/deposits", "query_string": b"state=quarantined&limit=5", "headers": [(b"x-api-key", b"k")]}, None),
])
def test_unstorable_in_target_checks_path_query_and_headers(scope, where):
    assert unstorable_in_target(scope) == where


@pytest.fixture()
def echo() -> TestClient:
    app = FastAPI()
    app.add_middleware(RefuseUnstorableText)

    @app.post("/echo/{anything}")
    async def echo_body(anything: str, request: Request) -> dict:
        return {"anything": anything, "body": (await request.body()).decode()}

    return TestClient(app)


def test_the_middleware_refuses_before_the_app_and_replays_other_bodies_unchanged(echo):
    raw = '{"metadata": {"note": "caf\\u00e9 \\\\u0000"}, "n": 1}'
    ok = echo.post("/echo/x", content=raw, headers={"content-type": "application/json"})
    assert ok.status_code == 200 and ok.json() == {"anything": "x", "body": raw}
    for path, content in (("/echo/x", '{"metadata": {"note": "\\u0000"}}'), ("/echo/x%00", "{}"),
                          ("/echo/x?state=%00", "{}")):
        refused = echo.post(path, content=content, headers={"content-type": "application/json"})
        assert refused.status_code == 422, (path, refused.text)
        assert refused.json()["error"]["code"] == "invalid_request"
        assert "\x00" not in refused.text and "\\u0000" not in refused.text


def _integer_parameters(doc: dict) -> list[tuple[str, str, dict]]:
    """(operation, parameter, schema) of every integer path parameter, query id or cursor, and
    every integer body property named like an id, across the whole OpenAPI document."""
    found = []
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            for p in op.get("parameters", []):
                schema = p["schema"].get("anyOf", [p["schema"]])[0]
                named_id = p["name"].endswith("_id") or p["name"] == "after"
                if schema.get("type") == "integer" and (p["in"] == "path" or named_id):
                    found.append((f"{method.upper()} {path}", p["name"], schema))
    for model, schema in doc.get("components", {}).get("schemas", {}).items():
        if model.endswith("Out") or model == "Money":
            continue
        for name, prop in schema.get("properties", {}).items():
            prop = prop.get("anyOf", [prop])[0]
            if name.endswith("_id") and prop.get("type") == "integer":
                found.append((model, name, prop))
    return found


def test_every_id_the_api_accepts_is_a_bigint():
    """One rule on every route: an id outside 1..2^63-1 (a cursor: 0..2^63-1) is `invalid_request`,
    refused by its declared type (custody.api.params) before any database work."""
    ids = _integer_parameters(create_app(None).openapi())
    assert len(ids) > 20
    # FastAPI's OpenAPI model writes a body field's bounds as floats: 2^63-1 becomes 2.0^63
    unbounded = [(where, name, schema) for where, name, schema in ids
                 if schema.get("maximum") not in (MAX_ID, float(MAX_ID)) or schema.get("minimum") not in (0, 1)]
    assert not unbounded, "use custody.api.params (IdPath, IdQuery, Id) for these ids:\n" + "\n".join(
        f"  {where}: {name} {schema}" for where, name, schema in unbounded)
