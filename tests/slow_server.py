"""A small HTTP server on 127.0.0.1 for the async client tests, run in a process of its own.

    python tests/slow_server.py      # prints its port, serves until stdin closes

GET /          answers "ok" at once
GET /slow?s=N  answers "late" after N seconds (at most 30)
GET /stats     {"hits": requests answered or begun on / and /slow, "open": connections open
               besides this one}: what the server saw, so a test knows whether a request was sent

In a process of its own, so that the tests count only their own threads and descriptors.
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web

LONGEST = 30.0


async def main() -> None:
    hits = 0

    async def ok(request: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        return web.Response(text="ok")

    async def slow(request: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        await asyncio.sleep(min(float(request.query.get("s", "5")), LONGEST))
        return web.Response(text="late")

    async def stats(request: web.Request) -> web.Response:
        assert runner.server is not None
        return web.json_response({"hits": hits, "open": len(runner.server.connections) - 1})

    app = web.Application()
    app.router.add_get("/", ok)
    app.router.add_get("/slow", slow)
    app.router.add_get("/stats", stats)
    # At the end, requests still open (a /slow a test gave up on) are cut at once, not awaited.
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None and server.sockets
    print(server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the test closes our stdin (or ends)
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
