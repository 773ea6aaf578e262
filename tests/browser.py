"""The operator console in a real browser, for the browser tests: Playwright (the PyPI package)
driving Debian's Chromium (`/usr/bin/chromium`, installed by scripts/bootstrap.sh; no browser is
downloaded), the app served by uvicorn on a loopback port, and one DevTools virtual authenticator
(CTAP2, user verification on) per person, so `navigator.credentials` works as with a security key.

- `serve(app, port)`: a context manager running the app on 127.0.0.1:port (and `localhost`);
- `free_port()`;
- `Browser(artifacts)`: Chromium launched once; `person(name, origin)` opens a context (its own
  cookies) and a page with its own authenticator; `Person.enrol()`, `.sign_in()`, `.shot(step)`
  (a full-page screenshot into the artifacts directory, numbered in order); `errors()`: every
  page's script and console errors (a Content-Security-Policy violation is one);
- `artifacts_dir(request)`: `test-artifacts/console/<test name>/` (gitignored), emptied first, its
  path printed in the terminal summary.
Tests using it are skipped with a reason when /usr/bin/chromium or the package is missing
(`needs_browser`), never silently passed.
"""
from __future__ import annotations

import itertools
import shutil
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[1]

try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # pragma: no cover - the dev extras install it
    sync_playwright = None

needs_browser = pytest.mark.skipif(sync_playwright is None or not CHROMIUM.exists(),
                                   reason="needs the playwright package and Debian's chromium (scripts/bootstrap.sh)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(app, port: int) -> Iterator[None]:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name=f"console-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the console server did not start")
        time.sleep(0.05)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class _ArtifactsSummary:
    """Names the screenshot directories in pytest's terminal summary (registered on first use)."""

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001 - pytest's reporter
        for path in self.paths:
            terminalreporter.write_line(f"console screenshots: {path}")


def artifacts_dir(request: pytest.FixtureRequest) -> Path:
    path = REPO / "test-artifacts" / "console" / request.node.name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    summary = request.config.pluginmanager.get_plugin("console-artifacts")
    if summary is None:
        summary = _ArtifactsSummary()
        request.config.pluginmanager.register(summary, "console-artifacts")
    summary.paths.append(path)
    return path


class Person:
    def __init__(self, browser: "Browser", name: str, origin: str) -> None:
        self.browser, self.name, self.origin = browser, name, origin
        self.context = browser.chromium.new_context(base_url=origin, viewport={"width": 1400, "height": 900})
        self.page: Page = self.context.new_page()
        self.page.set_default_timeout(30_000)
        self.errors: list[str] = []  # script errors and console errors (a CSP violation is one), not 4xx answers
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error"
                     and "Failed to load resource" not in m.text else None)
        self.cdp = self.context.new_cdp_session(self.page)
        self.cdp.send("WebAuthn.enable")
        self.authenticator = self.cdp.send("WebAuthn.addVirtualAuthenticator", {"options": {
            "protocol": "ctap2", "transport": "usb", "hasResidentKey": True, "hasUserVerification": True,
            "isUserVerified": True, "automaticPresenceSimulation": True}})["authenticatorId"]

    def open(self) -> None:
        self.page.goto("/console")

    def enrol(self) -> str:
        """Enrol a key for this person in the page; the fingerprint the page shows."""
        self.open()
        self.page.fill("#username", self.name)
        self.page.click("#do-enrol")
        message = self.page.get_by_test_id("signin-message")
        message.filter(has_text="fingerprint").wait_for()
        return message.inner_text().rsplit(": ", 1)[1].strip()

    def sign_in(self) -> None:
        self.open()
        self.page.fill("#username", self.name)
        self.page.click("#do-sign-in")
        self.page.get_by_test_id("who").filter(has_text=self.name).wait_for()

    def tab(self, name: str) -> None:
        self.page.click(f"#tabs button[data-tab='{name}']")

    def shot(self, step: str) -> Path:
        path = self.browser.artifacts / f"{next(self.browser.counter):02d}-{self.name.split('-')[0]}-{step}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def credentials(self) -> list[dict]:
        return self.cdp.send("WebAuthn.getCredentials", {"authenticatorId": self.authenticator})["credentials"]


class Browser:
    def __init__(self, artifacts: Path) -> None:
        self.artifacts = artifacts
        self.counter = itertools.count(1)
        self.people: list[Person] = []
        self._playwright = sync_playwright().start()
        self.chromium = self._playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])

    def person(self, name: str, origin: str) -> Person:
        person = Person(self, name, origin)
        self.people.append(person)
        return person

    def errors(self) -> list[str]:
        """Every person's page errors so far (a test ends asserting there are none)."""
        return [f"{p.name}: {e}" for p in self.people for e in p.errors]

    def close(self) -> None:
        self.chromium.close()
        self._playwright.stop()
