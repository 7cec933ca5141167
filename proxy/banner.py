"""What `serve` tells a person at start, on a terminal: where to point each client, where `/ui` is.

Printed once, after the socket is bound (the port may have been 0), only when the log lines are
text (`logging.format`: a terminal, or `text`); a log collector reading JSON gets the `started`
and `listening` lines instead. The admin token is shown in the `/ui` address because this goes to
the person who started the proxy, never into a log line.
"""

from __future__ import annotations

from .config import Settings
from .upstream.http import redacted

# Client families and the variable each one reads, with the path its base URL takes.
CLIENT_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("OpenAI SDK, Agents SDK, LangChain, Codex CLI", "OPENAI_BASE_URL", "/v1"),
    ("Claude Code, Anthropic SDK", "ANTHROPIC_BASE_URL", ""),
    ("Gemini CLI", "GOOGLE_GEMINI_BASE_URL", ""),
)
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def client_address(host: str, port: int) -> str:
    """The base address a client on this machine uses: a wildcard bind is reached on loopback."""
    if host in WILDCARD_HOSTS:
        host = "127.0.0.1"
    elif ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"http://{host}:{port}"


def ui_address(base: str, admin_token: str | None) -> str:
    """The `/ui` page's address, carrying the admin token (the page keeps it for its tab)."""
    return f"{base}/ui/" if admin_token is None else f"{base}/ui/?token={admin_token}"


def render(settings: Settings, host: str, port: int, *, admin_token: str | None, pipeline: list[str]) -> str:
    """The banner's text: a few lines, no secret but the admin token the proxy made (in the `/ui`
    address; None: the token is the configured `admin.token`, the admin's own, never printed)."""
    base = client_address(host, port)
    bound = f"http://[{host}]:{port}" if ":" in host else f"http://{host or '0.0.0.0'}:{port}"
    lines = [f"context-proxy listening on {bound}", ""]
    width = max(len(family) for family, _, _ in CLIENT_FAMILIES)
    for family, variable, path in CLIENT_FAMILIES:
        lines.append(f"  {family:<{width}}   {variable}={base}{path}")
    lines.append("")
    ui = ui_address(base, admin_token)
    if admin_token is None:
        ui += "   (sign in with your admin.token)"
    rows = [("conversations", ui), ("store", _store(settings)), ("upstream", _upstream(settings))]
    routes = sorted(name for name, model in settings.models.items() if model.litellm_model)
    if routes:
        rows.append(("via litellm", ", ".join(routes)))
    rows.append(("pipeline", ", ".join(pipeline)))
    lines += [f"  {label:<15} {value}" for label, value in rows]
    return "\n".join(lines) + "\n"


def _store(settings: Settings) -> str:
    storage = settings.storage
    if storage.backend == "redis":
        return f"redis at {redacted(storage.redis_url)}"
    return f"diskcache in {storage.path.resolve()}"


def _upstream(settings: Settings) -> str:
    upstream = settings.upstream
    return f"{redacted(upstream.base_url)}; Anthropic: {redacted(upstream.anthropic_base_url)}"
