"""Run the HTTP API with uvicorn; optionally run the demo against it once it answers."""
from __future__ import annotations

import logging
import threading
import time

import httpx
import uvicorn

from custody.api.app import create_app
from custody.container import Container

log = logging.getLogger(__name__)


def serve(container: Container, *, host: str, port: int, demo: bool = False, exit_after_demo: bool = False) -> int:
    from custody.jobs import build_scheduler
    from custody.trading import attach

    chains = None
    if demo:
        from custody.devchains import start_dev_chains

        chains = start_dev_chains(container)
    attach(container)
    scheduler = build_scheduler(container, scale=0.5 if demo else 1.0)
    scheduler.start()
    try:
        return _serve(container, host=host, port=port, demo=demo, exit_after_demo=exit_after_demo, chains=chains)
    finally:
        scheduler.shutdown(wait=True)  # let a running job finish before the nodes it talks to stop
        if chains is not None:
            chains.stop()


def _serve(container: Container, *, host: str, port: int, demo: bool, exit_after_demo: bool, chains) -> int:
    app = create_app(container)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    if not demo:
        log.info("serving on http://%s:%d (OpenAPI at /docs)", host, port)
        server.run()
        return 0
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://{host}:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            log.error("the API did not come up on %s", base)
            return 1
        time.sleep(0.2)
    from custody.demo import run_demo

    ok = run_demo(container, base, chains)
    if exit_after_demo:
        server.should_exit = True
        thread.join(10)
        return 0 if ok else 1
    log.info("demo %s; still serving on %s (OpenAPI at %s/docs); Ctrl-C stops", "passed" if ok else "FAILED", base, base)
    try:
        while thread.is_alive():
            thread.join(1)
    except KeyboardInterrupt:
        server.should_exit = True
        thread.join(10)
    return 0 if ok else 1
