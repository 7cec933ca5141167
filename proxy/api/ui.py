"""The /ui web page: static files from the package, no data in them.

Auth, by design: the shell (index.html, app.js, style.css) is served to anyone, because it holds
nothing but code; every datum the page shows comes from the admin JSON API (proxy/api/admin.py)
under that API's own auth (`caller_scope`), which always wants a Bearer: the URL printed at
start-up carries the admin token as `?token=` (the page keeps it and drops it from the address
bar); else the page asks for a token (the admin token, or the user's own API key, which then
shows only that key's conversations), keeps it in the tab's sessionStorage and sends it as
`Authorization: Bearer`. No cookie is ever set, so another site
cannot make the browser call the API with it (no CSRF). The Content-Security-Policy below allows
only this origin's own script, style and fetches: no inline script, no other host.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from ..errors import NotFound

FILES = {"index.html": "text/html", "app.js": "text/javascript", "style.css": "text/css"}

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _load() -> dict[str, bytes]:
    folder = resources.files("proxy.ui")
    return {name: folder.joinpath(name).read_bytes() for name in FILES}


def add_routes(app: web.Application) -> None:
    """`/ui` (redirects to `/ui/`, so the page's relative URLs work behind a path prefix too),
    `/ui/` and its files. Must be added before the catch-all passthrough route."""
    files = _load()

    async def redirect(request: web.Request) -> web.Response:
        # Returned, not raised: the request log middleware then logs it like any other answer.
        # Relative ("ui/" from "/ui" is "/ui/"), so it holds behind a path prefix too.
        query = f"?{request.query_string}" if request.query_string else ""
        return web.Response(status=302, headers={"Location": "ui/" + query})

    async def serve(request: web.Request) -> web.Response:
        name = request.match_info.get("name") or "index.html"
        if name not in files:
            raise NotFound(f"No file '{name}' in /ui")
        return web.Response(body=files[name], content_type=FILES[name], charset="utf-8", headers=HEADERS)

    app.router.add_get("/ui", redirect)
    app.router.add_get("/ui/", serve)
    app.router.add_get("/ui/{name:.*}", serve)  # every /ui path is ours: none goes upstream
