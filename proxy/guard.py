"""Where a request comes from: Host and Origin checks, our own CORS answers, JSON-only API POSTs.

A browser is the one client that can be made to call the proxy by someone else's page:
- **DNS rebinding.** A page on attacker.example whose name then resolves to 127.0.0.1 is
  same-origin with the proxy, so the browser lets it read every answer. Only the `Host` header
  gives it away. With no `admin.token` configured (the proxy's own, for local use) the admin API,
  /ui and /metrics check it: there the Host must be localhost, a loopback address or one named in
  `server.allowed_hosts`; while the proxy listens on loopback only, that holds for every route
  (no client can reach it under another name then, short of a local reverse proxy: name it).
- **Cross-site requests.** A page may send "simple" requests (a text/plain POST) to any origin
  without asking first. Any request with an `Origin` that is neither ours (the Host it was sent
  to) nor in `server.cors_origins` is refused before it is read, stored or forwarded with
  `upstream.api_key`; the API's POSTs must also say `Content-Type: application/json` (415).
- **CORS is ours.** Preflights (`OPTIONS` with `Access-Control-Request-Method`), and any
  `OPTIONS` of our own routes, are answered here, never by the upstream; CORS headers are only
  ever given to `server.cors_origins`, and an upstream's own are dropped.

Also here: header values that are not UTF-8 (they would fail later, hashed as a key or encoded
for the upstream) are a clean 400 (401 for `Authorization`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

from aiohttp import web

from .config import Settings
from .errors import Forbidden, InvalidRequest, NotFound, Unauthorized, UnsupportedMediaType

# The routes that are the proxy's own (the same decoded path the router matches on).
ADMIN_PATH = re.compile(r"/v1/conversations(?:/.*)?|/v1/knowledge(?:/.*)?|/ui(?:/.*)?|/metrics")
# The managed wire formats' POSTs, with or without the /c/<id> prefix and /v1.
MANAGED_PATH = re.compile(r"(?:/c/[^/]+)?(?:/v1)?/(?:chat/completions|responses|messages(?:/count_tokens)?)")
OWN_PATH = re.compile(rf"{ADMIN_PATH.pattern}|{MANAGED_PATH.pattern}|/healthz")
JSON_METHODS = frozenset({"POST", "PUT", "PATCH"})
ALLOW_METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
PREFLIGHT_MAX_AGE_S = 600
LOOPBACK_NAMES = frozenset({"localhost", "localhost."})
# A Host header as browsers send it: a name or an address, a bracketed IPv6 address, an optional
# port. Anything else ('localhost:80@evil.com', a path, spaces) names no host of ours.
AUTHORITY = re.compile(r"(?:\[[0-9a-f:.]+\]|[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?)(?::\d{1,5})?")


@dataclass(frozen=True, slots=True)
class GuardPolicy:
    allowed_hosts: frozenset[str]  # lower-case, without port
    cors_origins: frozenset[str]  # lower-case scheme://host[:port]
    any_host: bool
    any_origin: bool
    hosts_everywhere: bool  # listening on loopback: every route checks the Host
    hosts_on_admin: bool  # no admin.token configured: the admin API, /ui and /metrics check the Host

    @classmethod
    def from_settings(cls, settings: Settings) -> GuardPolicy:
        hosts = frozenset(h.strip().lower().strip("[]") for h in settings.server.allowed_hosts)
        origins = frozenset(o.strip().lower().rstrip("/") for o in settings.server.cors_origins)
        return cls(
            allowed_hosts=hosts - {"*"},
            cors_origins=origins - {"*"},
            any_host="*" in hosts,
            any_origin="*" in origins,
            hosts_everywhere=is_loopback_name(settings.server.host),
            hosts_on_admin=settings.admin.token is None,
        )

    def host_allowed(self, host: str) -> bool:
        name, loopback = _host_facts(host)
        return self.any_host or loopback or name in self.allowed_hosts

    def cors_allowed(self, origin: str) -> bool:
        return self.any_origin or origin.lower().rstrip("/") in self.cors_origins


POLICY = web.AppKey("guard_policy", GuardPolicy)


def install(app: web.Application, settings: Settings) -> None:
    """Set the policy and the CORS response hook. `middleware` must be in the app's list."""
    app[POLICY] = GuardPolicy.from_settings(settings)
    app.on_response_prepare.append(_cors_headers)


@web.middleware
async def middleware(request: web.Request, handler: web.Handler) -> web.StreamResponse:
    """Refuse what no browser page of ours would send; answer preflights. Headers only: runs
    before the body is read."""
    policy = request.app[POLICY]
    path = request.path
    _check_header_encoding(request)
    if not policy.any_host and (policy.hosts_everywhere or (policy.hosts_on_admin and ADMIN_PATH.fullmatch(path))):
        if not policy.host_allowed(request.host):
            raise Forbidden(
                f"Host {request.host!r} is not served here: use localhost, or add the name to server.allowed_hosts",
                code="host_not_allowed",
            )
    origin = request.headers.get("Origin")
    if origin is not None and not (policy.cors_allowed(origin) or same_origin(origin, request.host)):
        raise Forbidden(
            f"Requests from origin {origin!r} are refused: add it to server.cors_origins to allow its pages",
            code="cross_origin_refused",
        )
    if request.method == "OPTIONS" and ("Access-Control-Request-Method" in request.headers or OWN_PATH.fullmatch(path)):
        return _options(request, origin, policy)
    if request.method in JSON_METHODS and (MANAGED_PATH.fullmatch(path) or ADMIN_PATH.fullmatch(path)):
        if request.content_type != "application/json":
            raise UnsupportedMediaType(
                f"Content-Type must be application/json, not {request.headers.get('Content-Type', 'none')!r}",
                param="Content-Type",
            )
    return await handler(request)


def _options(request: web.Request, origin: str | None, policy: GuardPolicy) -> web.Response:
    headers = {"Allow": ALLOW_METHODS}
    if origin is not None and policy.cors_allowed(origin):
        headers |= {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": ALLOW_METHODS,
            "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers", "*"),
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
            "Vary": "Origin",
        }
    return _OptionsAnswer(status=204, headers=headers)


class _OptionsAnswer(web.Response):
    """An OPTIONS answer built here: its CORS headers are already the right ones."""


async def _cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """CORS headers for the configured origins only; an upstream's own never reach a browser."""
    if isinstance(response, _OptionsAnswer):
        return
    for name in [n for n in response.headers if n.lower().startswith("access-control-")]:
        response.headers.popall(name)
    origin = request.headers.get("Origin")
    if origin is not None and request.app[POLICY].cors_allowed(origin):
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = "*"
        response.headers.add("Vary", "Origin")


def _check_header_encoding(request: web.Request) -> None:
    """aiohttp keeps undecodable header bytes as surrogates; they must not reach a hash or the upstream."""
    raw = request.raw_headers
    if b"".join(value for _, value in raw).isascii():  # the common case: one C call
        return
    for name, value in raw:
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            header = name.decode("latin-1")
            if header.lower() == "authorization":
                raise Unauthorized("The Authorization header is not valid UTF-8") from None
            raise InvalidRequest(f"Header {header} is not valid UTF-8", param=header, code="invalid_header") from None


def split_host(host: str) -> tuple[str, int | None]:
    """'Example.COM:8080' -> ('example.com', 8080); '[::1]' -> ('::1', None)."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif host.count(":") == 1:
        name, _, port = host.partition(":")
    else:  # a bare name, or an IPv6 address without brackets
        name, port = host, ""
    return name, int(port) if port.isdigit() else None


def hostname(host: str) -> str:
    return split_host(host)[0]


@lru_cache(maxsize=1024)  # Host values come from clients: bounded; parsing an address is slow
def _host_facts(host: str) -> tuple[str, bool]:
    """(the host name of a Host value, whether it names this machine's loopback); ("", False) for
    a value that is no authority at all."""
    if not AUTHORITY.fullmatch(host.strip().lower()):
        return "", False
    return hostname(host), is_loopback_name(host)


def is_loopback_name(name: str) -> bool:
    name = hostname(name)
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def same_origin(origin: str, host: str) -> bool:
    """Whether `origin` names the host:port the request was sent to (default ports implied)."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False  # 'null' (sandboxed frames, file: pages) and other schemes are never ours
    default = 443 if parts.scheme == "https" else 80
    name, host_port = split_host(host)
    return (parts.hostname, port or default) == (name, host_port or default)


async def not_ours(request: web.Request) -> web.Response:
    """Any method or path under one of our own prefixes that no route of ours serves: answered
    here, never passed upstream (it would carry the caller's admin token or key there)."""
    raise NotFound(f"No such endpoint: {request.method} {request.path}")


def add_fallback_routes(app: web.Application) -> None:
    """Our prefixes end here: add after our routes and before the passthrough catch-all."""
    for path in ("/v1/conversations", "/v1/conversations/{tail:.*}", "/v1/knowledge", "/v1/knowledge/{tail:.*}",
                 "/healthz", "/metrics"):
        app.router.add_route("*", path, not_ours)
