"""The customer portal in Postgres (``portal_links``, ``portal_sessions``, ``channels.customer``:
migrations/0013) and ``PortalStore``, the interface the portal and ``/v1/portal-links`` are
written against. A link is kept by the SHA-256 of its token only; a session by the SHA-256 of
its id. Every read of the portal names the tenant and the link's scope, which the SQL applies
(queries_portal.sql): a channel or delivery outside it is not found."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Protocol, runtime_checkable

import msgspec

from notifier.store.base import Q, Row, crossing, transaction
from notifier.store.channels import _channel
from notifier.store.console import FoundDelivery
from notifier.store.deliveries import _delivery
from notifier.store.errors import UnknownChannels
from notifier.store.pool import Queries
from notifier.store.rows import Channel

# An expired or revoked link is listed (GET /v1/portal-links) this long, then deleted by
# maintenance with the sessions it opened.
PORTAL_LINKS_KEPT_DAYS = 30
# The sessions a link keeps open: opening it once more ends the oldest beyond these.
MAX_SESSIONS_PER_LINK = 20


class PortalScope(msgspec.Struct, frozen=True, kw_only=True):
    """What a portal session reaches: tenant ``tenant_id``'s channels labelled ``customer``, or
    those of ``channel_ids`` (exactly one of the two is set)."""

    tenant_id: uuid.UUID
    customer: str | None = None
    channel_ids: tuple[uuid.UUID, ...] | None = None

    def __post_init__(self) -> None:
        if (self.customer is None) == (self.channel_ids is None):
            raise ValueError("a portal scope is a customer or channel ids, exactly one")

    def args(self) -> tuple[object, ...]:
        """The scope's parameters of the portal's queries: tenant, customer, channel ids."""
        ids = list(self.channel_ids) if self.channel_ids is not None else None
        return (self.tenant_id, self.customer, ids)


class PortalLink(msgspec.Struct, frozen=True, kw_only=True):
    id: uuid.UUID
    tenant_id: uuid.UUID
    customer: str | None
    channel_ids: list[uuid.UUID] | None
    state: str  # active, expired or revoked (as Postgres's clock says)
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None

    def scope(self) -> PortalScope:
        ids = tuple(self.channel_ids) if self.channel_ids is not None else None
        return PortalScope(tenant_id=self.tenant_id, customer=self.customer, channel_ids=ids)


class PortalSession(msgspec.Struct, frozen=True, kw_only=True):
    link_id: uuid.UUID
    scope: PortalScope
    expires_at: datetime


def _link(row: Row) -> PortalLink:
    ids = row["channel_ids"]
    return PortalLink(
        id=row["id"], tenant_id=row["tenant_id"], customer=row["customer"],
        channel_ids=list(ids) if ids is not None else None, state=row["state"],
        created_at=row["created_at"], expires_at=row["expires_at"], revoked_at=row["revoked_at"],
    )  # fmt: skip


@runtime_checkable
class PortalStore(Protocol):
    async def create_portal_link(
        self, tenant_id: uuid.UUID, token_hash: str, *, customer: str | None,
        channel_ids: list[uuid.UUID] | None, expires_in_seconds: float,
    ) -> PortalLink:  # fmt: skip
        """A new link; ``UnknownChannels`` (writing nothing) if a channel id is not the
        tenant's."""
        ...

    async def list_portal_links(
        self, tenant_id: uuid.UUID, *, before: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[PortalLink]: ...

    async def revoke_portal_link(
        self, tenant_id: uuid.UUID, link_id: uuid.UUID
    ) -> PortalLink | None: ...

    async def portal_link_by_token(self, token_hash: str) -> PortalLink | None: ...

    async def create_portal_session(
        self, id_hash: str, link_id: uuid.UUID, *, max_age_seconds: float
    ) -> datetime | None:
        """A session of the link, ending with it; its end, or None if the link ended. The link's
        sessions beyond its newest ``MAX_SESSIONS_PER_LINK`` end."""
        ...

    async def portal_session(self, id_hash: str) -> PortalSession | None: ...

    async def end_portal_session(self, id_hash: str) -> None: ...

    async def portal_channels(self, scope: PortalScope, *, limit: int) -> list[Channel]: ...

    async def portal_channel(self, scope: PortalScope, channel_id: uuid.UUID) -> Channel | None: ...

    async def portal_deliveries(
        self, scope: PortalScope, *, status: str | None, channel_id: uuid.UUID | None,
        before: tuple[datetime, uuid.UUID] | None, limit: int,
    ) -> list[FoundDelivery]: ...  # fmt: skip

    async def portal_delivery_in_scope(
        self, scope: PortalScope, delivery_id: uuid.UUID
    ) -> bool: ...


class PortalQueries(Queries):
    """``PortalStore`` on Postgres."""

    @transaction
    async def create_portal_link(
        self, tenant_id: uuid.UUID, token_hash: str, *, customer: str | None,
        channel_ids: list[uuid.UUID] | None, expires_in_seconds: float,
    ) -> PortalLink:  # fmt: skip
        async with self._pool.acquire() as conn, conn.transaction():
            if channel_ids is not None:
                unknown = await conn.fetch(Q["portal_unknown_channels"], tenant_id, channel_ids)
                if unknown:
                    raise UnknownChannels(sorted(r["channel_id"] for r in unknown))
            row = await conn.fetchrow(
                Q["portal_link_create"], uuid.uuid4(), tenant_id, token_hash, customer,
                channel_ids, float(expires_in_seconds),
            )  # fmt: skip
            return _link(row)

    @crossing
    async def list_portal_links(
        self, tenant_id: uuid.UUID, *, before: tuple[datetime, uuid.UUID] | None, limit: int
    ) -> list[PortalLink]:
        at, last_id = before if before else (None, None)
        rows = await self._pool.fetch(Q["portal_link_list"], tenant_id, at, last_id, limit)
        return [_link(r) for r in rows]

    @transaction
    async def revoke_portal_link(
        self, tenant_id: uuid.UUID, link_id: uuid.UUID
    ) -> PortalLink | None:
        row = await self._pool.fetchrow(Q["portal_link_revoke"], tenant_id, link_id)
        return _link(row) if row else None

    @crossing
    async def portal_link_by_token(self, token_hash: str) -> PortalLink | None:
        row = await self._pool.fetchrow(Q["portal_link_by_token"], token_hash)
        return _link(row) if row else None

    @transaction
    async def create_portal_session(
        self, id_hash: str, link_id: uuid.UUID, *, max_age_seconds: float
    ) -> datetime | None:
        ends: datetime | None = await self._pool.fetchval(
            Q["portal_session_create"], id_hash, link_id, float(max_age_seconds),
            MAX_SESSIONS_PER_LINK,
        )  # fmt: skip
        return ends

    @transaction
    async def portal_session(self, id_hash: str) -> PortalSession | None:
        row = await self._pool.fetchrow(Q["portal_session_touch"], id_hash)
        if row is None:
            return None
        ids = row["channel_ids"]
        scope = PortalScope(
            tenant_id=row["tenant_id"], customer=row["customer"],
            channel_ids=tuple(ids) if ids is not None else None,
        )  # fmt: skip
        return PortalSession(link_id=row["link_id"], scope=scope, expires_at=row["expires_at"])

    @transaction
    async def end_portal_session(self, id_hash: str) -> None:
        await self._pool.fetch(Q["portal_session_end"], id_hash)

    @crossing
    async def portal_channels(self, scope: PortalScope, *, limit: int) -> list[Channel]:
        rows = await self._pool.fetch(Q["portal_channels"], *scope.args(), limit)
        return [_channel(r) for r in rows]

    @crossing
    async def portal_channel(self, scope: PortalScope, channel_id: uuid.UUID) -> Channel | None:
        row = await self._pool.fetchrow(Q["portal_channel"], *scope.args(), channel_id)
        return _channel(row) if row else None

    @crossing
    async def portal_deliveries(
        self, scope: PortalScope, *, status: str | None, channel_id: uuid.UUID | None,
        before: tuple[datetime, uuid.UUID] | None, limit: int,
    ) -> list[FoundDelivery]:  # fmt: skip
        at, last_id = before if before else (None, None)
        rows = await self._pool.fetch(
            Q["portal_deliveries"], *scope.args(), status, channel_id, at, last_id, limit
        )
        return [FoundDelivery(delivery=_delivery(r), event_type=r["event_type"]) for r in rows]

    @crossing
    async def portal_delivery_in_scope(self, scope: PortalScope, delivery_id: uuid.UUID) -> bool:
        return bool(
            await self._pool.fetchval(Q["portal_delivery_in_scope"], *scope.args(), delivery_id)
        )
