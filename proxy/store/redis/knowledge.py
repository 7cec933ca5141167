"""The Redis store's long-term knowledge (a tenant's documents, every version kept): a part of
RedisStore. Per tenant and namespace a hash of versions and a sorted set of their times, an index
of the newest per namespace, and the set of tenants that have any (lua/put_knowledge.lua)."""

from __future__ import annotations

import json
from typing import Any

from ..base import KnowledgeVersion, now
from .area import RedisArea
from .calls import dumps, guarded


class RedisKnowledge(RedisArea):
    _put_knowledge: Any  # its script, registered by the store

    def _knowledge_keys(self, tenant: str, namespace: str) -> tuple[str, str]:
        tag = f"{self._prefix}kn:{{{tenant}/{namespace}}}"
        return tag + ":v", tag + ":t"

    def _knowledge_index(self, tenant: str) -> str:
        return f"{self._prefix}kn-index:{tenant}"

    @guarded
    async def knowledge(self, tenant: str, namespace: str, version: int | None = None) -> KnowledgeVersion | None:
        if version is None:
            version = int(await self._redis.hget(self._knowledge_index(tenant), namespace) or 0)
        return await self._knowledge_version(tenant, namespace, version)

    async def _knowledge_version(self, tenant: str, namespace: str, version: int) -> KnowledgeVersion | None:
        if version <= 0:
            return None
        raw = await self._redis.hget(self._knowledge_keys(tenant, namespace)[0], str(version))
        return None if raw is None else KnowledgeVersion(tenant, namespace, version, **json.loads(raw))

    @guarded
    async def knowledge_at(self, tenant: str, namespace: str, cutoff: float) -> KnowledgeVersion | None:
        times = self._knowledge_keys(tenant, namespace)[1]
        found = await self._redis.zrevrangebyscore(times, repr(cutoff), "-inf", start=0, num=1)
        return await self._knowledge_version(tenant, namespace, int(found[0]) if found else 1)

    @guarded
    async def knowledge_versions(
        self, tenant: str, namespace: str, *, before: int | None = None, limit: int = 20
    ) -> list[KnowledgeVersion]:
        newest = int(await self._redis.hget(self._knowledge_index(tenant), namespace) or 0)
        top = newest if before is None else min(newest, before - 1)
        numbers = list(range(top, max(top - limit, 0), -1))
        if not numbers:
            return []
        found = await self._redis.hmget(self._knowledge_keys(tenant, namespace)[0], [str(n) for n in numbers])
        return [KnowledgeVersion(tenant, namespace, n, **json.loads(raw)) for n, raw in zip(numbers, found) if raw]

    @guarded
    async def put_knowledge(
        self, tenant: str, namespace: str, text: str, source: str, base_version: int
    ) -> KnowledgeVersion | None:
        stamp = now()
        keys = [*self._knowledge_keys(tenant, namespace), self._knowledge_index(tenant), self._global("kn-tenants")]
        body = dumps({"text": text, "created_at": stamp, "source": source})
        version = int(await self._put_knowledge(keys=keys, args=[namespace, base_version, tenant, body, repr(stamp)]))
        return KnowledgeVersion(tenant, namespace, version, text, stamp, source) if version else None

    @guarded
    async def knowledge_documents(self, tenant: str | None) -> list[KnowledgeVersion]:
        tenants = [tenant] if tenant is not None else sorted(await self._redis.smembers(self._global("kn-tenants")))
        out = []
        for t in tenants:
            index = await self._redis.hgetall(self._knowledge_index(t))
            for namespace in sorted(index):
                found = await self._knowledge_version(t, namespace, int(index[namespace]))
                if found is not None:
                    out.append(found)
        return out
