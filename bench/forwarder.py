"""The references: a bare aiohttp forwarder with no logic, and the same with a minimal durable append.

`python -m bench.forwarder --port P --upstream http://127.0.0.1:M/v1 [--store DIR [--count-tokens BUDGET]]`

Any request goes to the upstream as it came (body read whole, headers minus hop-by-hop ones) and
the reply comes back streamed, each read forwarded as it arrives. No JSON, no storage, no logging:
whatever context-proxy spends beyond this is the price of its logic and its storage.

With `--store` (the bench's `floor` target) it also keeps every turn durably the least way a real
server would, built outside context-proxy's code (none of it is imported): one SQLite file (raw
sqlite3, WAL, `synchronous=NORMAL`), one INSERT of the request's new bytes before it is forwarded
and one of the reply once it is whole, before the client's response ends; each on one writer
thread (nothing blocking on the event loop), each its own transaction. A run is named by its
`X-Conversation-ID` (or Claude Code's session header) if it names one, else by its bytes up to the
first reply, as context-proxy derives an unnamed run's key. Its new bytes are those past the
previous request's length (the first request: all of it): no parsing, no checking, no tokens, no
window. What context-proxy spends beyond this target is the price of what it does beyond keeping
a turn's bytes.

With `--count-tokens BUDGET` too (the bench's `floor-count` target) it also counts, exactly, the
tokens of what is new, as a token-budgeted window must before it can place anything: tiktoken's
`cl100k_base` (loaded directly, from the files litellm's wheel carries: offline), the request's new
bytes as text, newest first in pieces of COUNT_PIECE characters until BUDGET tokens are counted (a
first turn's 200 messages: the newest ~BUDGET tokens of them, as a window would; a later turn's
new bytes: all of them). The count is kept in the request's row, on the writer thread. Nothing
else: no parsing, no hashing, no window, no reply counted (it is counted next turn, resent).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
from aiohttp import web

HOP_BY_HOP = frozenset(
    h.lower()
    for h in ("Connection", "Keep-Alive", "Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Content-Encoding", "Accept-Encoding", "TE", "Trailer")
)
SESSION = web.AppKey("session", aiohttp.ClientSession)
CONVERSATION_HEADERS = ("X-Conversation-ID", "X-Claude-Code-Session-Id")  # what the bench's clients name theirs by
# What a reply echoed in a request's transcript starts with (a role's value, a Responses call's
# type): the bytes before the first of them name an unnamed run.
CHAT_REPLY = (b'"assistant"',)  # chat completions, Messages
RESPONSES_REPLY = (b'"function_call"', b'"custom_tool_call"', b'"assistant"')
GEMINI_REPLY = (b'"model"',)  # a model content's role
REQUEST, REPLY = 0, 1  # the journal's row kinds
COUNT_PIECE = 4096  # characters counted at a time, newest first (--count-tokens)


def cl100k_counter() -> Callable[[str], int]:
    """tiktoken's exact count for cl100k_base, from the encoding file litellm's wheel ships (no network)."""
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        import importlib.util

        spec = importlib.util.find_spec("litellm")
        if spec is not None and spec.origin is not None:
            os.environ["TIKTOKEN_CACHE_DIR"] = str(Path(spec.origin).parent / "litellm_core_utils" / "tokenizers")
    import tiktoken

    encoding = tiktoken.get_encoding("cl100k_base")
    encoding._mergeable_ranks = {}  # its Python copy of the vocabulary (~20 MB): counting uses the Rust core's
    encode = encoding.encode_ordinary
    return lambda text: len(encode(text))


def newest_tokens(count: Callable[[str], int], text: str, budget: int) -> int:
    """The tokens of `text` counted from its end, COUNT_PIECE characters at a time, until `budget`
    are counted (all of it if it holds fewer)."""
    tokens, end = 0, len(text)
    while end > 0 and tokens < budget:
        start = max(0, end - COUNT_PIECE)
        tokens += count(text[start:end])
        end = start
    return tokens


class Journal:
    """The minimal durable append (see the module docstring): one row per write, one writer thread."""

    def __init__(self, path: Path, count_budget: int | None = None) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path / "journal.sqlite3", isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS appended "
                        "(id INTEGER PRIMARY KEY, run BLOB NOT NULL, kind INTEGER NOT NULL, data BLOB NOT NULL, tokens INTEGER)")
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal")
        self.count_budget = count_budget
        self.count = cl100k_counter() if count_budget is not None else None  # loaded before the first request
        self.sizes: dict[bytes, int] = {}  # the previous request's length, per run (the bench's runs: bounded by them)

    def _insert(self, run: bytes, kind: int, data: bytes) -> None:
        tokens = None
        if kind == REQUEST and self.count is not None and self.count_budget is not None:
            tokens = newest_tokens(self.count, data.decode(errors="replace"), self.count_budget)
        self.db.execute("INSERT INTO appended (run, kind, data, tokens) VALUES (?, ?, ?, ?)", (run, kind, data, tokens))  # one transaction

    async def append(self, run: bytes, kind: int, data: bytes) -> None:
        await asyncio.get_running_loop().run_in_executor(self.writer, self._insert, run, kind, data)

    async def request(self, run: bytes, data: bytes) -> None:
        """The request's new bytes, durable before it is forwarded."""
        previous = self.sizes.get(run, 0)
        self.sizes[run] = len(data)
        await self.append(run, REQUEST, data[previous:] if 0 < previous < len(data) else data)

    def close(self) -> None:
        self.writer.shutdown(wait=True)
        self.db.close()


def reply_markers(path: str) -> tuple[bytes, ...]:
    """How a reply starts in the transcript of a request to `path`, by its wire format."""
    if ":generateContent" in path or ":streamGenerateContent" in path:
        return GEMINI_REPLY
    return RESPONSES_REPLY if path.split("?", 1)[0].endswith("/responses") else CHAT_REPLY


def run_key(name: str | None, data: bytes, markers: tuple[bytes, ...] = CHAT_REPLY) -> bytes:
    """The conversation's name, or its bytes up to the first reply (an unnamed run's): the first
    of `markers`, each next one searched only before it."""
    if name is not None:
        return name.encode()
    at = len(data)
    for marker in markers:
        found = data.find(marker, 0, at)
        if found >= 0:
            at = found
    return hashlib.blake2b(data[:at], digest_size=16).digest()


def _headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP}


def build_app(upstream: str, store: Path | None = None, count_budget: int | None = None) -> web.Application:
    base = upstream.rstrip("/")
    journal = Journal(store, count_budget) if store is not None else None

    async def forward(request: web.Request) -> web.StreamResponse:
        path = request.path_qs
        if path.startswith("/v1/") or path == "/v1":  # the upstream base URL carries /v1 already
            path = path[3:]
        data = await request.read()
        if journal is None or request.method != "POST" or not data:
            return await relay(request, path, data)
        name = next((request.headers[h] for h in CONVERSATION_HEADERS if h in request.headers), None)
        run = run_key(name, data, reply_markers(path))
        await journal.request(run, data)
        return await relay(request, path, data, lambda reply: journal.append(run, REPLY, reply))

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
        if journal is not None:
            journal.close()

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="bare aiohttp forwarder (the bench's references)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="upstream base URL, e.g. http://127.0.0.1:9000/v1")
    parser.add_argument("--store", type=Path, help="also append each turn's new bytes and reply durably to a SQLite file here (the floor)")
    parser.add_argument("--count-tokens", type=int, metavar="BUDGET",
                        help="with --store: also count the new bytes' tokens exactly, newest first up to BUDGET (floor-count)")
    args = parser.parse_args()
    if args.count_tokens is not None and args.store is None:
        parser.error("--count-tokens needs --store")
    web.run_app(build_app(args.upstream, args.store, args.count_tokens), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
