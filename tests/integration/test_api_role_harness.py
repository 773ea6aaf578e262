"""tests/api_role.py, the harness that runs every in-process API request as custody_api: a request
is custody_api (sync and async routes, every connection it checks out), the test's own code
around it stays the owner, a connection goes back to the pool as the owner, a write the api may
not make fails inside the request, and `api_as_owner` turns it off."""
from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError


def _app(engine) -> FastAPI:
    app = FastAPI()

    @app.get("/who")
    def who() -> dict:  # a sync route: Starlette's thread pool
        with engine.connect() as a, engine.connect() as b:  # two checkouts of one request
            return {"a": a.execute(text("SELECT current_user")).scalar_one(),
                    "b": b.execute(text("SELECT current_user")).scalar_one()}

    @app.get("/who-async")
    async def who_async() -> dict:
        with engine.connect() as c:
            return {"a": c.execute(text("SELECT current_user")).scalar_one()}

    @app.post("/register-wallet")
    def register_wallet() -> dict:  # the worker's write (migration 0022)
        try:
            with engine.begin() as c:
                c.execute(text("INSERT INTO wallet SELECT * FROM wallet WHERE false"))
        except DBAPIError as exc:
            return {"sqlstate": exc.orig.sqlstate}
        return {"sqlstate": None}

    return app


def _owner(engine) -> str:
    with engine.connect() as c:
        return c.execute(text("SELECT current_user")).scalar_one()


def test_requests_run_as_the_api_role_and_the_test_stays_the_owner(engine):
    owner = _owner(engine)
    assert owner != "custody_api"
    client = TestClient(_app(engine))
    assert client.get("/who").json() == {"a": "custody_api", "b": "custody_api"}
    assert client.get("/who-async").json() == {"a": "custody_api"}
    assert client.post("/register-wallet").json() == {"sqlstate": "42501"}
    # every pooled connection came back as the owner
    conns = [engine.connect() for _ in range(engine.pool.size())]
    try:
        assert {c.execute(text("SELECT current_user")).scalar_one() for c in conns} == {owner}
    finally:
        for c in conns:
            c.close()


@pytest.mark.api_as_owner("the harness's own off switch")
def test_api_as_owner_turns_it_off(engine):
    assert TestClient(_app(engine)).get("/who").json() == {"a": _owner(engine), "b": _owner(engine)}
