"""The event-type catalog's part of ``testing.api.MemoryApiStore``: a tenant's event types and
its ``strict_event_types`` switch, as ``store.event_types`` keeps them."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from notifier.catalog import MAX_CATALOG_BYTES, StoredCatalog
from notifier.store.errors import CatalogTooLarge, TooManyEventTypes
from notifier.store.rows import EventType
from notifier.testing.api_state import MemoryApiState


class MemoryApiCatalog(MemoryApiState):
    """Event types by (tenant id, name); the tenants whose ``strict_event_types`` is on."""

    def __init__(self) -> None:
        super().__init__()
        self.event_types: dict[tuple[uuid.UUID, str], EventType] = {}
        self.strict_tenants: set[uuid.UUID] = set()

    async def put_event_type(
        self,
        tenant_id: uuid.UUID,
        name: str,
        *,
        description: str,
        schema: dict[str, Any],
        max_types: int,
        max_bytes: int = MAX_CATALOG_BYTES,
    ) -> tuple[EventType, bool]:
        await self._call()
        now = self._now()
        old = self.event_types.get((tenant_id, name))
        if old is None and sum(1 for t, _ in self.event_types if t == tenant_id) >= max_types:
            raise TooManyEventTypes(f"at most {max_types} event types per tenant")
        total = len(msgspec.json.encode(schema)) + sum(
            len(msgspec.json.encode(e.schema))
            for (t, n), e in self.event_types.items()
            if t == tenant_id and n != name
        )
        if total > max_bytes:
            raise CatalogTooLarge(
                f"the tenant's schemas would take {total} bytes; at most {max_bytes} in all"
            )
        made = EventType(
            name=name, description=description, schema=schema,
            created_at=now if old is None else old.created_at, updated_at=now,
        )  # fmt: skip
        self.event_types[(tenant_id, name)] = made
        return made, old is None

    async def get_event_type(self, tenant_id: uuid.UUID, name: str) -> EventType | None:
        await self._call()
        return self.event_types.get((tenant_id, name))

    async def list_event_types(self, tenant_id: uuid.UUID) -> list[EventType]:
        await self._call()
        return sorted(
            (e for (t, _), e in self.event_types.items() if t == tenant_id), key=lambda e: e.name
        )

    async def delete_event_type(self, tenant_id: uuid.UUID, name: str) -> bool:
        await self._call()
        return self.event_types.pop((tenant_id, name), None) is not None

    async def event_catalog(self, tenant_id: uuid.UUID) -> StoredCatalog:
        await self._call()
        schemas = {n: e.schema for (t, n), e in self.event_types.items() if t == tenant_id}
        return StoredCatalog(tenant_id in self.strict_tenants, schemas)

    async def strict_event_types(self, tenant_id: uuid.UUID) -> bool:
        await self._call()
        return tenant_id in self.strict_tenants

    async def set_strict_event_types(self, tenant_id: uuid.UUID, strict: bool) -> bool:
        await self._call()
        if strict:
            self.strict_tenants.add(tenant_id)
        else:
            self.strict_tenants.discard(tenant_id)
        return strict
