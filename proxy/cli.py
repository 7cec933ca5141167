"""`context-proxy serve [--config config.yaml] [--host H] [--port P]`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from aiohttp import web

from .app import build_app, runner_options
from .config import ConfigError, Settings, load_settings
from .connections import start_site
from .logs import configure_logging

log = logging.getLogger("proxy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="context-proxy", description="OpenAI-compatible context proxy")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", default=None, help="YAML settings file (default: ./config.yaml if present)")
    serve.add_argument("--host", default=None, help="override server.host")
    serve.add_argument("--port", type=int, default=None, help="override server.port")
    args = parser.parse_args(argv)

    config = args.config if args.config is not None else ("config.yaml" if Path("config.yaml").is_file() else None)
    server_overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    try:
        settings = load_settings(config)
        if server_overrides:
            settings = load_settings(config, server=settings.server.model_copy(update=server_overrides))
    except ConfigError as exc:
        print(f"context-proxy: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.logging.level)
    try:
        app = build_app(settings)
    except ConfigError as exc:
        print(f"context-proxy: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve_forever(settings, app))
    except ConfigError as exc:  # found only once resources open (e.g. a store that cannot be opened)
        print(f"context-proxy: {exc}", file=sys.stderr)
        return 2
    return 0


async def serve_forever(settings: Settings, app: web.Application) -> None:
    """Serve until SIGINT/SIGTERM, then close every resource cleanly."""
    runner = web.AppRunner(app, handle_signals=False, **runner_options(settings))
    await runner.setup()
    await start_site(runner, settings.server.host, settings.server.port)
    host, port = runner.addresses[0][:2]
    log.info("listening", extra={"host": host, "port": port})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        await runner.cleanup()
