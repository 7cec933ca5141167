"""The long-term knowledge documents in the admin API: show, edit, and compare versions.

    GET  /v1/knowledge[/{namespace}]                     the newest version (and the tenant's namespaces)
    PUT  /v1/knowledge[/{namespace}]                     {"text", "base_version"?}: a new version
    GET  /v1/knowledge[/{namespace}]/versions            every version, newest first (`before`, `limit`)
    GET  /v1/knowledge[/{namespace}]/versions/{version}  one version, its text included
    GET  /v1/knowledge[/{namespace}]/diff?from=&to=      a unified diff (to: the newest; from: the one before)

Whose: a client key's own tenant; the admin names one with `?tenant=` (a tenant id, or the start
of the tenant of a document, as conversations show it). A document nobody wrote yet reads as its
template, version 0: it is stored (as version 1) when first used or written.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..config import is_knowledge_namespace
from ..errors import InvalidRequest, NotFound, ProxyError
from ..knowledge import CAS_TRIES, MAX_DOCUMENT_CHARS, diff, template
from ..state import STORE
from ..store import KnowledgeStore, KnowledgeVersion
from .admin import ALL_TENANTS, _limit, _page, caller_scope
from .writes import json_body

FULL_TENANT = 24  # characters of a tenant id (identity.tenant_of)


class VersionConflict(ProxyError):
    status = 409
    code = "version_conflict"


async def _document(request: web.Request) -> tuple[str, str]:
    """(tenant, namespace) the request names, as the caller may see them."""
    namespace = request.match_info.get("namespace", "")
    if namespace and not is_knowledge_namespace(namespace):
        raise InvalidRequest("A namespace is 1-64 characters of A-Z a-z 0-9 . _ : -", param="namespace")
    scope = caller_scope(request)
    if scope is not ALL_TENANTS:
        return scope, namespace
    wanted = request.query.get("tenant", "")
    if not wanted:
        raise InvalidRequest("Name the tenant whose knowledge this is: ?tenant=<tenant>", param="tenant")
    tenants = {d.tenant for d in await request.app[STORE].knowledge_documents(None)}
    matches = sorted(t for t in tenants if t.startswith(wanted))
    if len(matches) > 1:
        raise InvalidRequest("Several tenants start with this: give more of it", param="tenant")
    if matches:
        return matches[0], namespace
    if len(wanted) == FULL_TENANT or wanted in ("anonymous", "shared"):  # a tenant that has no document yet
        return wanted, namespace
    raise NotFound(f"No tenant starting with '{wanted}' has a knowledge document")


def _version_api(version: KnowledgeVersion, *, with_text: bool = True) -> dict[str, Any]:
    return {**version.to_api(with_text=with_text), "tenant": version.tenant[:12]}


def _template(tenant: str, namespace: str) -> KnowledgeVersion:
    return KnowledgeVersion(tenant, namespace, 0, template(), 0.0, "template")


def _int_query(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    if not raw.isdigit():
        raise InvalidRequest(f"{name} must be a version number (an integer)", param=name)
    return int(raw)


async def _version(store: KnowledgeStore, tenant: str, namespace: str, number: int) -> KnowledgeVersion:
    found = await store.knowledge(tenant, namespace, number) if number > 0 else _template(tenant, namespace)
    if found is None:
        raise NotFound(f"The knowledge document has no version {number}")
    return found


async def get_document(request: web.Request) -> web.Response:
    tenant, namespace = await _document(request)
    store = request.app[STORE]
    newest = await store.knowledge(tenant, namespace) or _template(tenant, namespace)
    namespaces = sorted(d.namespace for d in await store.knowledge_documents(tenant) if d.namespace)
    return web.json_response({**_version_api(newest), "object": "knowledge.document", "namespaces": namespaces})


async def put_document(request: web.Request) -> web.Response:
    tenant, namespace = await _document(request)
    body = await json_body(request, {"text": str, "base_version": int}, {"text"})
    text = body["text"]
    if len(text) > MAX_DOCUMENT_CHARS:
        raise InvalidRequest(f"'text' is longer than {MAX_DOCUMENT_CHARS} characters", param="text")
    store = request.app[STORE]
    source = "admin" if caller_scope(request) is ALL_TENANTS else "api"
    base = body.get("base_version")
    for _ in range(1 if base is not None else CAS_TRIES):
        known = base if base is not None else getattr(await store.knowledge(tenant, namespace), "version", 0)
        written = await store.put_knowledge(tenant, namespace, text, source, base_version=known)
        if written is not None:
            return web.json_response({**_version_api(written), "object": "knowledge.document"})
    newest = await store.knowledge(tenant, namespace)
    raise VersionConflict(
        f"The document is at version {newest.version if newest else 0}, not {base}: read it again and redo the edit",
        param="base_version",
    )


async def list_versions(request: web.Request) -> web.Response:
    tenant, namespace = await _document(request)
    limit = _limit(request, 20, 100)
    rows = await request.app[STORE].knowledge_versions(
        tenant, namespace, before=_int_query(request, "before"), limit=limit + 1
    )
    data = [_version_api(v, with_text=False) for v in rows[:limit]]
    return web.json_response(_page(data, len(rows) > limit, "version"))


async def get_version(request: web.Request) -> web.Response:
    tenant, namespace = await _document(request)
    raw = request.match_info["version"]
    if not raw.isdigit():
        raise InvalidRequest("A version is a number", param="version")
    return web.json_response(_version_api(await _version(request.app[STORE], tenant, namespace, int(raw))))


async def get_diff(request: web.Request) -> web.Response:
    tenant, namespace = await _document(request)
    store = request.app[STORE]
    to_number = _int_query(request, "to")
    if to_number is None:
        newest = await store.knowledge(tenant, namespace)
        to_number = newest.version if newest else 0
    from_number = _int_query(request, "from")
    if from_number is None:
        from_number = max(to_number - 1, 0)
    old = await _version(store, tenant, namespace, from_number) if from_number else None
    new = await _version(store, tenant, namespace, to_number)
    return web.json_response(
        {"object": "knowledge.diff", "namespace": namespace or None, "from": from_number, "to": to_number,
         "diff": diff(old, new)}
    )


def add_routes(app: web.Application) -> None:
    """Before the passthrough catch-all. The fixed paths first: "versions" and "diff" are no namespaces."""
    for base in ("/v1/knowledge", "/v1/knowledge/{namespace}"):
        app.router.add_get(base + "/versions", list_versions)
        app.router.add_get(base + "/versions/{version}", get_version)
        app.router.add_get(base + "/diff", get_diff)
    for base in ("/v1/knowledge", "/v1/knowledge/{namespace}"):
        app.router.add_get(base, get_document)
        app.router.add_put(base, put_document)
