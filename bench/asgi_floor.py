"""The HTTP stack's floor for bench/http_api.py: the smallest ASGI app, served by uvicorn exactly as
the api process serves (uvloop, httptools, no access log), answering every request with a small
JSON body. What a request costs here is what uvicorn and the event loop cost before any framework,
middleware, authentication or database work: the lower bound of the api's CPU per request.

    .venv/bin/python bench/asgi_floor.py PORT
"""
from __future__ import annotations

import sys

import uvicorn

BODY = b'{"status":"ok"}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":  # lifespan: nothing to start
        while (await receive())["type"] != "lifespan.shutdown":
            pass
        return
    more = True
    while more:  # read the body, as a route would
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", http="httptools",
                log_level="warning", access_log=False, lifespan="off")
