"""The floor: a bare aiohttp forwarder with no logic.

`python -m bench.forwarder --port P --upstream http://127.0.0.1:M/v1`

Any request goes to the upstream as it came (body read whole, headers minus hop-by-hop ones) and
the reply comes back streamed, each read forwarded as it arrives. No JSON, no storage, no logging:
whatever context-proxy spends beyond this is the price of its logic.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Mapping

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset(
    h.lower()
    for h in ("Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Content-Encoding", "Accept-Encoding", "TE", "Trailer")
)
SESSION = web.AppKey("session", aiohttp.ClientSession)


def _headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


def build_app(upstream: str) -> web.Application:
    base = upstream.rstrip("/")

    async def forward(request: web.Request) -> web.StreamResponse:
        path = request.path_qs
        if path.startswith("/v1/") or path == "/v1":  # the upstream base URL carries /v1 already
            path = path[3:]
        data = await request.read()
        async with request.app[SESSION].request(
            request.method, base + path, headers=_headers(request.headers), data=data or None, allow_redirects=False
        ) as reply:
            response = web.StreamResponse(status=reply.status, headers=_headers(reply.headers))
            await response.prepare(request)
            async for chunk in reply.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def session(app: web.Application) -> AsyncIterator[None]:
        app[SESSION] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=100), timeout=aiohttp.ClientTimeout(total=None)
        )
        yield
        await app[SESSION].close()

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="bare aiohttp forwarder (the bench's floor)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="upstream base URL, e.g. http://127.0.0.1:9000/v1")
    args = parser.parse_args()
    web.run_app(build_app(args.upstream), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
