"""The floor: a bare aiohttp forwarder with no logic, and the same with the contract's two writes.

`python -m bench.forwarder --port P --upstream http://127.0.0.1:M/v1 [--store DIR]`

Any request goes to the upstream as it came (body read whole, headers minus hop-by-hop ones) and
the reply comes back streamed, each read forwarded as it arrives. No JSON, no storage, no logging:
whatever context-proxy spends beyond this is the price of its logic.

With `--store` (the bench's `floor` target) it also does the least DESIGN.md's storage asks of a
turn, with context-proxy's own diskcache store and nothing else of it: a request's new messages
written before it is forwarded, the reply written once it is whole, before the client's response
ends (Storage: "written before forwarding", "the reply is written when it completes"), each
write on the store's thread (nothing blocking on the loop). What is new is found the cheapest way
there is: a conversation's first request is parsed and all its transcript items stored; a later
one stores the bytes past the previous request's length as one item (no parsing, no checking, no
token counting, no window). What context-proxy spends beyond this target is the price of its
logic beyond what the contract's storage costs at the least.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

HOP_BY_HOP = frozenset(
    h.lower()
    for h in ("Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Content-Encoding", "Accept-Encoding", "TE", "Trailer")
)
SESSION = web.AppKey("session", aiohttp.ClientSession)
GC_YOUNG_THRESHOLD = 20_000  # as `serve` sets it (proxy/cli.py): the floor gets the proxy's collector
CONVERSATION_HEADERS = ("X-Conversation-ID", "X-Claude-Code-Session-Id")  # what the bench's clients name theirs by
TRANSCRIPT_KEYS = ("messages", "input", "contents")  # chat and Messages; Responses; Gemini


class Writes:
    """The contract's two writes of a turn, at the least (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        # Imported here: the bare forwarder's figures (its resident set above all) carry none of context-proxy.
        from proxy.identity import ConversationKey
        from proxy.request_limits import off_loop
        from proxy.store.disk import DiskStore

        self.key_of, self.off_loop = ConversationKey, off_loop
        self.store = DiskStore(path)
        self.sizes: dict[Any, int] = {}  # the previous request's length, per conversation

    async def before(self, key: Any, data: bytes) -> list[int]:
        """The request's new items, stored pending: all of a first request's, else its new bytes."""
        previous = self.sizes.get(key)
        self.sizes[key] = len(data)
        if previous is None or previous >= len(data):  # parsed and hashed off the loop past 256 KB, as the proxy does
            items, hashes = await self.off_loop(len(data), _transcript, data)
        else:
            items = [{"role": "tool", "content": data[previous:].decode(errors="replace")}]
            hashes = [_digest(data[previous:])]
        return await self.store.append(key, items, hashes, "pending") if items else []

    async def after(self, key: Any, seqs: list[int], reply: bytes) -> None:
        """The items live, the reply kept with a turn record: one write, as context-proxy's turn end."""
        message = {"role": "assistant", "content": reply.decode(errors="replace")}
        record = {"created_at": time.time(), "sent": len(seqs)}
        await self.store.finish_turn(
            key, dict.fromkeys(seqs, "live"), [(message, _digest(reply))], "live", record,
        )


def _transcript(data: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    body = orjson.loads(data)
    found = next((body[k] for k in TRANSCRIPT_KEYS if isinstance(body, dict) and isinstance(body.get(k), list)), [])
    items = [i if isinstance(i, dict) else {"content": i} for i in found]
    return items, [_digest(orjson.dumps(i)) for i in items]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def _headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


def build_app(upstream: str, store: Path | None = None) -> web.Application:
    base = upstream.rstrip("/")
    writes = Writes(store) if store is not None else None

    async def forward(request: web.Request) -> web.StreamResponse:
        path = request.path_qs
        if path.startswith("/v1/") or path == "/v1":  # the upstream base URL carries /v1 already
            path = path[3:]
        data = await request.read()
        name = next((request.headers[h] for h in CONVERSATION_HEADERS if h in request.headers), None)
        if writes is None or name is None or request.method != "POST" or not data:
            return await relay(request, path, data)
        key = writes.key_of("floor", name)
        async with writes.store.lock(key):  # one turn at a time per conversation, as the contract has it
            seqs = await writes.before(key, data)
            return await relay(request, path, data, lambda reply: writes.after(key, seqs, reply))

    async def relay(
        request: web.Request, path: str, data: bytes, kept: Callable[[bytes], Awaitable[None]] | None = None
    ) -> web.StreamResponse:
        async with request.app[SESSION].request(
            request.method, base + path, headers=_headers(request.headers), data=data or None, allow_redirects=False
        ) as reply:
            response = web.StreamResponse(status=reply.status, headers=_headers(reply.headers))
            await response.prepare(request)
            parts: list[bytes] = []
            async for chunk in reply.content.iter_any():
                await response.write(chunk)
                if kept is not None:
                    parts.append(chunk)
            if kept is not None:
                await kept(b"".join(parts))
            await response.write_eof()
            return response

    async def session(app: web.Application) -> AsyncIterator[None]:
        app[SESSION] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=100), timeout=aiohttp.ClientTimeout(total=None)
        )
        yield
        await app[SESSION].close()
        if writes is not None:
            await writes.store.close()

    async def collector(app: web.Application) -> None:
        # As `serve` does: what start-up made is frozen, young collections come every 20,000
        # allocations, not 700 (with the store's records held, the default walks them every turn).
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.cleanup_ctx.append(session)
    if writes is not None:
        app.on_startup.append(collector)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="bare aiohttp forwarder (the bench's floor)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="upstream base URL, e.g. http://127.0.0.1:9000/v1")
    parser.add_argument("--store", type=Path, help="the contract's two writes a turn, in a diskcache store here")
    args = parser.parse_args()
    web.run_app(build_app(args.upstream, args.store), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
