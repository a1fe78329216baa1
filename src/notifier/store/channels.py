"""The store's queries for channels (the API's channel routes): create, read, list, change
and delete a tenant's channels."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec

from notifier import filters
from notifier.store.base import Q, Row, crossing, transaction
from notifier.store.errors import ConfigChanged
from notifier.store.pool import Queries
from notifier.store.rows import Channel, ChannelChanges, FifoLine


def _channel(row: Row) -> Channel:
    return Channel(
        id=row["id"],
        tenant_id=row["tenant_id"],
        type=row["type"],
        name=row["name"],
        config=row["config"],
        recipient=row["recipient"],
        event_types=list(row["event_types"]),
        enabled=row["enabled"],
        disabled_reason=row["disabled_reason"],
        disabled_at=row["disabled_at"],
        consecutive_failures=row["consecutive_failures"],
        failing_since=row["failing_since"],
        last_success_at=row["last_success_at"],
        max_attempts=row["max_attempts"],
        rate_limit_per_second=row["rate_limit_per_second"],
        filter=row["filter"],
        customer=row["customer"],
        ordering=row["ordering"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )


def _jsonpath(flt: dict[str, Any] | None) -> str | None:
    """The jsonpath predicate the fan-out evaluates for ``flt`` (None: no filter)."""
    return None if flt is None else filters.to_jsonpath(flt)


class ChannelQueries(Queries):
    """A tenant's channels; every query names the tenant, so one never sees another's."""

    @transaction
    async def create_channel(
        self,
        tenant_id: uuid.UUID,
        *,
        type: str,
        name: str,
        config: dict[str, Any],
        recipient: str | None,
        event_types: list[str],
        enabled: bool,
        max_attempts: int | None,
        rate_limit_per_second: float | None = None,
        filter: dict[str, Any] | None = None,
        customer: str | None = None,
        ordering: str = "none",
    ) -> Channel:
        """A new channel; ``filter`` is one ``notifier.filters.parse`` accepted."""
        row = await self._pool.fetchrow(
            Q["channel_insert"], uuid.uuid4(), tenant_id, type, name, config, recipient,
            event_types, enabled, max_attempts, rate_limit_per_second, filter,
            _jsonpath(filter), customer, ordering,
        )  # fmt: skip
        assert row is not None
        return _channel(row)

    @crossing
    async def get_channel(self, tenant_id: uuid.UUID, channel_id: uuid.UUID) -> Channel | None:
        row = await self._pool.fetchrow(Q["channel_get"], tenant_id, channel_id)
        return _channel(row) if row else None

    @crossing
    async def list_channels(
        self,
        tenant_id: uuid.UUID,
        *,
        type: str | None,
        recipient: str | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        customer: str | None = None,
    ) -> list[Channel]:
        at, last_id = after if after else (None, None)
        rows = await self._pool.fetch(
            Q["channel_list"], tenant_id, type, recipient, at, last_id, limit, customer
        )
        return [_channel(r) for r in rows]

    @transaction
    async def update_channel(
        self,
        tenant_id: uuid.UUID,
        channel_id: uuid.UUID,
        changes: ChannelChanges,
        *,
        config_read: dict[str, Any] | None = None,
    ) -> Channel | None:
        """Change the fields ``changes`` names and only those; None if there is no such
        channel. A new config must come with ``config_read``, the stored config it was made
        from: it is written only over that one, else ``ConfigChanged`` is raised (read the
        channel again and make the new config anew)."""
        named = changes.named()
        if "config" in named and config_read is None:
            raise ValueError("a new config needs the config it was made from")

        def value(field: str) -> Any:
            got = getattr(changes, field)
            return None if got is msgspec.UNSET else got

        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                Q["channel_update"], tenant_id, channel_id, named, value("name"),
                value("config"), value("recipient"), value("event_types"), value("enabled"),
                value("max_attempts"), config_read if "config" in named else None,
                value("rate_limit_per_second"), value("filter"), _jsonpath(value("filter")),
                value("customer"), value("ordering"),
            )  # fmt: skip
            if row is not None:
                return _channel(row)
            if "config" in named and await conn.fetchrow(Q["channel_get"], tenant_id, channel_id):
                raise ConfigChanged("the channel's config changed while the new one was made")
            return None

    @crossing
    async def fifo_lines(
        self, tenant_id: uuid.UUID, channel_ids: list[uuid.UUID]
    ) -> dict[uuid.UUID, FifoLine]:
        """The lines of the tenant's FIFO channels among ``channel_ids`` that have unfinished
        deliveries (the others are caught up)."""
        rows = await self._pool.fetch(Q["fifo_lines"], tenant_id, channel_ids)
        return {
            r["channel_id"]: FifoLine(
                backlog=r["backlog"], lag_seconds=r["lag_seconds"], retrying=r["retrying"]
            )
            for r in rows
        }

    @transaction
    async def delete_channel(self, tenant_id: uuid.UUID, channel_id: uuid.UUID) -> bool:
        return await self._pool.fetchval(Q["channel_delete"], tenant_id, channel_id) is not None
