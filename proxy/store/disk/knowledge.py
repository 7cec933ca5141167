"""The diskcache store's long-term knowledge (a tenant's documents, every version kept): a part of
DiskStore, which runs these on its thread. Rows: each version, an index of the newest per
namespace per tenant, and the tenants that have any.
"""

from __future__ import annotations

from ..base import KnowledgeVersion, now
from .area import DiskArea
from .keys import KNOWLEDGE_TENANTS, knowledge_index, knowledge_key


class DiskKnowledge(DiskArea):
    async def knowledge(self, tenant: str, namespace: str, version: int | None = None) -> KnowledgeVersion | None:
        return await self._run(self._knowledge, tenant, namespace, version)

    def _knowledge(self, tenant: str, namespace: str, version: int | None) -> KnowledgeVersion | None:
        if version is None:
            version = self._rows.get(knowledge_index(tenant), {}).get(namespace, 0)
        raw = self._rows.get(knowledge_key(tenant, namespace, version)) if version > 0 else None
        return None if raw is None else KnowledgeVersion(tenant, namespace, version, **raw)

    async def knowledge_at(self, tenant: str, namespace: str, cutoff: float) -> KnowledgeVersion | None:
        return await self._run(self._knowledge_at, tenant, namespace, cutoff)

    def _knowledge_at(self, tenant: str, namespace: str, cutoff: float) -> KnowledgeVersion | None:
        # Versions are written in order, so their times rise with their numbers: a binary search.
        low, high = 1, self._rows.get(knowledge_index(tenant), {}).get(namespace, 0)
        if high == 0:
            return None
        found = 1
        while low <= high:
            middle = (low + high) // 2
            if self._rows.get(knowledge_key(tenant, namespace, middle))["created_at"] <= cutoff:
                found, low = middle, middle + 1
            else:
                high = middle - 1
        return self._knowledge(tenant, namespace, found)

    async def knowledge_versions(
        self, tenant: str, namespace: str, *, before: int | None = None, limit: int = 20
    ) -> list[KnowledgeVersion]:
        return await self._run(self._knowledge_versions, tenant, namespace, before, limit)

    def _knowledge_versions(
        self, tenant: str, namespace: str, before: int | None, limit: int
    ) -> list[KnowledgeVersion]:
        newest = self._rows.get(knowledge_index(tenant), {}).get(namespace, 0)
        top = newest if before is None else min(newest, before - 1)
        numbers = range(top, max(top - limit, 0), -1)
        return [v for n in numbers if (v := self._knowledge(tenant, namespace, n)) is not None]

    async def put_knowledge(
        self, tenant: str, namespace: str, text: str, source: str, base_version: int
    ) -> KnowledgeVersion | None:
        return await self._write(self._put_knowledge, tenant, namespace, text, source, base_version)

    def _put_knowledge(
        self, tenant: str, namespace: str, text: str, source: str, base_version: int
    ) -> KnowledgeVersion | None:
        with self._rows.transact():
            index = self._rows.get(knowledge_index(tenant), {})
            if index.get(namespace, 0) != base_version:
                return None
            version = KnowledgeVersion(tenant, namespace, base_version + 1, text, now(), source)
            self._rows.set(knowledge_key(tenant, namespace, version.version),
                            {"text": text, "created_at": version.created_at, "source": source})
            self._rows.set(knowledge_index(tenant), {**index, namespace: version.version})
            tenants = self._rows.get(KNOWLEDGE_TENANTS, set())
            if tenant not in tenants:
                self._rows.set(KNOWLEDGE_TENANTS, tenants | {tenant})
            return version

    async def knowledge_documents(self, tenant: str | None) -> list[KnowledgeVersion]:
        return await self._run(self._knowledge_documents, tenant)

    def _knowledge_documents(self, tenant: str | None) -> list[KnowledgeVersion]:
        tenants = [tenant] if tenant is not None else sorted(self._rows.get(KNOWLEDGE_TENANTS, set()))
        out = []
        for t in tenants:
            for namespace in sorted(self._rows.get(knowledge_index(t), {})):
                found = self._knowledge(t, namespace, None)
                if found is not None:
                    out.append(found)
        return out
