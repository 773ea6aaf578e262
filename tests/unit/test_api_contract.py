"""The served OpenAPI document's conventions (custody.api.errors.responses / document), checked on
the document itself: every operation's error answers use the one error schema with an enum of
codes that their tables put under that status; routes that take a key carry the ApiKey security
requirement and document 401 and 403; FastAPI's own 422 shape is gone; a 405 carries Allow."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.api.errors import CODE_STATUS, responses
from custody.container import Container


@pytest.fixture(scope="module")
def app():
    # The document and a 405 need no service: nothing here reaches the container.
    return create_app(Container.__new__(Container))


def test_every_error_answer_is_the_error_schema_with_the_codes_of_its_status(app):
    doc = app.openapi()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert doc["components"]["securitySchemes"]["ApiKey"] == {
        "type": "apiKey", "in": "header", "name": "X-API-Key",
        "description": doc["components"]["securitySchemes"]["ApiKey"]["description"]}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            answers = op["responses"]
            assert {"422", "500", "503"} <= set(answers), (method, path)
            if path.startswith("/v1/"):
                assert op["security"] == [{"ApiKey": []}], (method, path)
                assert {"401", "403"} <= set(answers), (method, path)
            for status, answer in answers.items():
                if int(status) < 400:
                    continue
                codes = answer["content"]["application/json"]["schema"]["properties"]["error"]["properties"]["code"]["enum"]
                assert codes and all(CODE_STATUS[c] == int(status) for c in codes), (method, path, status, codes)


def test_a_code_in_no_table_is_refused():
    assert responses("account_not_found", "insufficient_funds") == {
        404: {"x-error-codes": ["account_not_found"]}, 409: {"x-error-codes": ["insufficient_funds"]}}
    with pytest.raises(KeyError):
        responses("no_such_code")


def test_a_405_names_the_allowed_methods(app):
    r = TestClient(app).patch("/v1/assets")
    assert (r.status_code, r.json()["error"]["code"]) == (405, "method_not_allowed")
    assert set(r.headers["allow"].replace(" ", "").split(",")) == {"GET", "POST"}
