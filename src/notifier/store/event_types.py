"""The store's queries for the event-type catalog (``notifier.catalog``): a tenant's event
types with their schemas, its ``strict_event_types`` switch, and the catalog as ingest reads it
(one statement)."""

from __future__ import annotations

import uuid
from typing import Any

from notifier.catalog import MAX_CATALOG_BYTES, StoredCatalog
from notifier.store.base import Q, Row, crossing, transaction
from notifier.store.errors import CatalogTooLarge, TooManyEventTypes
from notifier.store.pool import Queries
from notifier.store.rows import EventType


def _event_type(row: Row) -> EventType:
    return EventType(
        name=row["name"], description=row["description"], schema=row["schema"],
        created_at=row["created_at"], updated_at=row["updated_at"],
    )  # fmt: skip


class EventTypeQueries(Queries):
    """A tenant's catalog; every query names the tenant, so one never sees another's."""

    @transaction
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
        """Create or replace the type; the type and whether it is new. ``TooManyEventTypes``
        for a new one when the tenant has ``max_types`` already, ``CatalogTooLarge`` when the
        tenant's schemas would take over ``max_bytes`` in all."""
        row = await self._pool.fetchrow(
            Q["event_type_put"], tenant_id, name, description, schema, max_types, max_bytes
        )
        if row is None:
            usage = await self._pool.fetchrow(Q["event_catalog_usage"], tenant_id, name, schema)
            assert usage is not None  # an aggregate: always a row
            if usage["bytes"] + usage["new_bytes"] > max_bytes:
                raise CatalogTooLarge(
                    f"the tenant's schemas would take {usage['bytes'] + usage['new_bytes']} "
                    f"bytes; at most {max_bytes} in all"
                )
            raise TooManyEventTypes(f"at most {max_types} event types per tenant")
        return _event_type(row), bool(row["created"])

    @crossing
    async def get_event_type(self, tenant_id: uuid.UUID, name: str) -> EventType | None:
        row = await self._pool.fetchrow(Q["event_type_get"], tenant_id, name)
        return _event_type(row) if row else None

    @crossing
    async def list_event_types(self, tenant_id: uuid.UUID) -> list[EventType]:
        return [_event_type(r) for r in await self._pool.fetch(Q["event_type_list"], tenant_id)]

    @transaction
    async def delete_event_type(self, tenant_id: uuid.UUID, name: str) -> bool:
        return await self._pool.fetchval(Q["event_type_delete"], tenant_id, name) is not None

    @crossing
    async def event_catalog(self, tenant_id: uuid.UUID) -> StoredCatalog:
        """The tenant's catalog (empty for no such tenant)."""
        rows = await self._pool.fetch(Q["event_catalog"], tenant_id)
        if not rows:
            return StoredCatalog(False, {})
        named = [r for r in rows if r["name"] is not None]
        return StoredCatalog(
            bool(rows[0]["strict_event_types"]),
            {r["name"]: r["schema"] for r in named},
            {r["name"]: r["digest"] for r in named},
        )

    @crossing
    async def stored_idempotency_keys(self, tenant_id: uuid.UUID, keys: list[str]) -> set[str]:
        """Those of ``keys`` that an event of the tenant's is stored with."""
        rows = await self._pool.fetch(Q["stored_idempotency_keys"], tenant_id, keys)
        return {r["idempotency_key"] for r in rows}

    @crossing
    async def strict_event_types(self, tenant_id: uuid.UUID) -> bool:
        return bool(await self._pool.fetchval(Q["tenant_strict_get"], tenant_id))

    @transaction
    async def set_strict_event_types(self, tenant_id: uuid.UUID, strict: bool) -> bool:
        return bool(await self._pool.fetchval(Q["tenant_strict_set"], tenant_id, strict))

    @transaction
    async def set_tenant_strict_event_types(self, name: str, strict: bool) -> bool:
        """The CLI's switch, by tenant name; False when there is no such tenant."""
        found = await self._pool.fetchval(Q["tenant_strict_set_by_name"], name, strict)
        return found is not None
