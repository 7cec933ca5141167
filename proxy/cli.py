"""`context-proxy serve [--config config.yaml] [--host H] [--port P]`, and moving a conversation
between stores: `context-proxy export [--config F] [--tenant T] ID > FILE`,
`context-proxy import [--config F] [--replace] FILE`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from . import banner
from .admin_token import ui_url
from .app import build_app, runner_options
from .config import ConfigError, Settings, load_settings
from .connections import start_site
from .errors import ProxyError
from .logs import configure_logging
from .memory import tune_malloc
from .refs import RefSigner
from .settings_doc import reference
from .state import ADMIN_TOKEN, PIPELINE
from .store import ConversationExists, open_store
from .transfer import InvalidExport, OwnedElsewhere, check_owners, dump_from_json, dump_to_json, read_dump, with_refs_of

log = logging.getLogger("proxy")
GC_YOUNG_THRESHOLD = 20_000  # allocations between young collections (CPython's default: 700)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="context-proxy", description="OpenAI-compatible context proxy")
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=None, help="YAML settings file (default: ./config.yaml if present)")
    serve = commands.add_parser("serve", parents=[common], help="run the proxy")
    serve.add_argument("--host", default=None, help="override server.host")
    serve.add_argument("--port", type=int, default=None, help="override server.port")
    export = commands.add_parser("export", parents=[common], help="write one conversation as JSON to stdout")
    export.add_argument("--tenant", default=None, help="the tenant (or its prefix) when several have this id")
    export.add_argument("id", help="the conversation id")
    import_ = commands.add_parser("import", parents=[common], help="write an exported conversation into the store")
    import_.add_argument(
        "--replace", action="store_true",
        help="overwrite the conversation if the store has it (diskcache: stop the proxy serving that store first)",
    )
    import_.add_argument("file", help="the export file ('-' = stdin)")
    commands.add_parser("settings", help="print every setting, its default and what it does (markdown)")
    args = parser.parse_args(argv)
    if args.command == "settings":
        print(reference())
        return 0

    config = args.config if args.config is not None else ("config.yaml" if Path("config.yaml").is_file() else None)
    server_overrides = {k: v for k in ("host", "port") if (v := getattr(args, k, None)) is not None}
    try:
        settings = load_settings(config)
        if server_overrides:
            settings = load_settings(config, server=settings.server.model_copy(update=server_overrides))
    except ConfigError as exc:
        print(f"context-proxy: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        log_format = configure_logging(settings.logging.level, settings.logging.format)
        # Before any thread starts (the store's, the executor's): arenas made before it stay.
        tuned = tune_malloc(settings.server.malloc_arena_max, settings.server.malloc_mmap_threshold_kb)
        log.info("malloc", extra=tuned)
        try:
            app = build_app(settings)
        except ConfigError as exc:
            print(f"context-proxy: {exc}", file=sys.stderr)
            return 2
        try:
            asyncio.run(serve_forever(settings, app, show_banner=log_format == "text"))
        except ConfigError as exc:  # found only once resources open (e.g. a store that cannot be opened)
            print(f"context-proxy: {exc}", file=sys.stderr)
            return 2
        return 0
    configure_logging("WARNING")  # stdout is the export: logs go to stderr, and only problems
    try:
        if args.command == "export":
            sys.stdout.buffer.write(asyncio.run(export_conversation(settings, args.id, args.tenant)))
        else:
            done = asyncio.run(import_conversation(settings, _read_export(args.file), replace=args.replace))
            print(done, file=sys.stderr)
    except CommandFailed as exc:
        print(f"context-proxy {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


async def serve_forever(settings: Settings, app: web.Application, *, show_banner: bool = False) -> None:
    """Serve until SIGINT/SIGTERM, then close every resource cleanly. With `show_banner` (the log
    is text: a person reads it), say first where it listens and where to point each client."""
    runner = web.AppRunner(app, handle_signals=False, **runner_options(settings))
    await runner.setup()
    await start_site(runner, settings.server.host, settings.server.port)
    host, port = runner.addresses[0][:2]
    # A turn allocates (and frees) tens of thousands of small objects parsing its body: with
    # CPython's default threshold (700) the young generation is collected dozens of times a
    # turn. What start-up made lives for the process: frozen, no collection walks it again.
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)
    # Before "listening": whoever waits for that line may stop the proxy at once, cleanly.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    token = app[ADMIN_TOKEN]
    if show_banner:  # on a terminal: the token the proxy made is in the banner's /ui address
        shown = token.value if token.generated else None  # a configured token is the admin's own: never printed
        text = banner.render(settings, host, port, admin_token=shown, pipeline=app[PIPELINE].describe())
        print("\n" + text, file=sys.stderr, flush=True)
    else:
        _print_ui_url(app, host, port)  # whoever waits for "listening" has the URL too
    log.info("listening", extra={"host": host, "port": port})
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        await runner.cleanup()


def _print_ui_url(app: web.Application, host: str, port: int) -> None:
    """The /ui address with the token the proxy made (as Jupyter does): on the terminal only, not in
    the log lines (a configured token is the admin's own: never printed)."""
    token = app[ADMIN_TOKEN]
    if not token.generated:
        return
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else (f"[{host}]" if ":" in host else host)
    print(
        f"context-proxy: open {ui_url(f'http://{shown}:{port}', token)} (the admin token is kept in {token.file})",
        file=sys.stderr, flush=True,
    )


class CommandFailed(Exception):
    """What `export` or `import` could not do, in one line for the admin."""


async def export_conversation(settings: Settings, conversation_id: str, tenant: str | None) -> bytes:
    """The conversation's export document, read under its lock (a turn never half in it)."""
    store = open_store(settings.storage)
    try:
        candidates = [c for c in await store.find(conversation_id) if tenant is None or c.key.tenant.startswith(tenant)]
        if not candidates:
            whose = f" for tenant {tenant!r}" if tenant else ""
            raise CommandFailed(f"no conversation {conversation_id!r} in this store{whose}")
        if len(candidates) > 1:
            tenants = ", ".join(c.key.tenant[:12] for c in candidates)
            raise CommandFailed(
                f"several tenants have conversation {conversation_id!r} ({tenants}): name one with --tenant"
            )
        key = candidates[0].key
        async with store.lock(key):
            dump = await read_dump(store, key)
        if dump is None:
            raise CommandFailed(f"conversation {conversation_id!r} was deleted while being exported")
        return json.dumps(dump_to_json(dump), ensure_ascii=False).encode() + b"\n"
    except ProxyError as exc:  # e.g. Redis unreachable
        raise CommandFailed(exc.message) from None
    finally:
        await store.close()


async def import_conversation(settings: Settings, document: Any, *, replace: bool) -> str:
    """Write an export into the store; returns what was imported, in one line."""
    try:
        dump = dump_from_json(document, settings)
    except InvalidExport as exc:
        raise CommandFailed(f"not a valid export: {exc}") from None
    key = dump.conversation.key
    store = open_store(settings.storage)
    try:
        dump = with_refs_of(dump, RefSigner(await store.secret()))
        async with store.lock(key):
            await check_owners(store, dump)
            await store.import_conversation(dump, replace=replace)
    except OwnedElsewhere as exc:
        raise CommandFailed(f"not imported: {exc}") from None
    except ConversationExists:
        raise CommandFailed(
            f"conversation {key.id!r} of tenant {key.tenant[:12]} is already in this store: "
            "pass --replace to overwrite it"
        ) from None
    except ProxyError as exc:
        raise CommandFailed(exc.message) from None
    finally:
        await store.close()
    return (
        f"imported conversation {key.id!r} of tenant {key.tenant[:12]}: {len(dump.messages)} messages, "
        f"{len(dump.summaries)} summaries, {len(dump.turns)} turns"
    )


def _read_export(name: str) -> Any:
    try:
        raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        return json.loads(raw)
    except OSError as exc:
        raise CommandFailed(f"cannot read {name}: {exc.strerror}") from None
    except ValueError as exc:
        raise CommandFailed(f"{name} is not JSON: {exc}") from None
    except RecursionError:  # the json module's own bound on nesting
        raise CommandFailed(f"{name} is nested too deeply to be an export") from None
