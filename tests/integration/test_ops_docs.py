"""ops_docs: /docs and /redoc render with no network: every asset they reference is served by the
service itself.

Each page is parsed (script src, link href, img src) and the OpenAPI URL is read from its inline
script; each reference must be a path on this service (no scheme, no host) and answer 200 with the
content type its kind needs (JavaScript, CSS, an image, JSON). The test client reaches nothing but
the app, so a CDN reference would fail here as in an offline browser.
"""
from __future__ import annotations

import logging
import re
from html.parser import HTMLParser

import pytest
from fastapi.testclient import TestClient

from custody.api.app import create_app
from custody.container import Container
from custody.settings import Settings
from ledger.service import Ledger
from regtest.util import assert_equal

log = logging.getLogger(__name__)
EXPECTED_TYPE = {"script": "javascript", "stylesheet": "text/css", "icon": "image/", "openapi": "application/json"}


class References(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []  # (kind, url)
        self.inline: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script":
            self._in_script = "src" not in a
            if a.get("src"):
                self.found.append(("script", a["src"]))
        elif tag == "link" and a.get("href"):
            rel = (a.get("rel") or "").lower()
            self.found.append(("stylesheet" if "stylesheet" in rel else "icon", a["href"]))
        elif tag == "img" and a.get("src"):
            self.found.append(("icon", a["src"]))
        elif tag == "redoc" and a.get("spec-url"):
            self.found.append(("openapi", a["spec-url"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.inline.append(data)


@pytest.fixture(scope="module")
def client(engine) -> TestClient:
    container = Container(settings=Settings(environment="test"), engine=engine, ledger=Ledger(engine))
    return TestClient(create_app(container), base_url="http://custody.invalid")


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_page_and_everything_it_references_come_from_the_service(client, page):
    r = client.get(page)
    assert_equal(r.status_code, 200)
    assert r.headers["content-type"].startswith("text/html")
    parser = References()
    parser.feed(r.text)
    for url in re.findall(r"""\burl:\s*['"]([^'"]+)['"]""", "".join(parser.inline)):
        parser.found.append(("openapi", url))
    kinds = {kind for kind, _ in parser.found}
    assert {"script", "openapi"} <= kinds, parser.found
    assert not re.search(r"(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", r.text), "the page names another host"
    for kind, url in parser.found:
        assert url.startswith("/") and not url.startswith("//"), f"{page} references {url}, not a path on this service"
        asset = client.get(url)
        log.info("%s: %s %s -> %d %s (%d bytes)", page, kind, url, asset.status_code,
                 asset.headers.get("content-type"), len(asset.content))
        assert_equal(asset.status_code, 200)
        assert EXPECTED_TYPE[kind] in asset.headers["content-type"], (url, asset.headers["content-type"])
        assert len(asset.content) > 100, url
    assert client.get("/openapi.json").json()["info"]["title"] == "Custody service"
