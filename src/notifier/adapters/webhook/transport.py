"""The pinned transport of webhooks: a request carries the addresses the SSRF guard checked,
and new connections for it go to those addresses only (fail closed, no second resolution that
could answer differently). Its response bodies end at a size limit (``BoundedTransport``)."""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from notifier.adapters.http import BoundedTransport, CuttableBackend


@dataclass(frozen=True)
class Pin:
    """The checked addresses a request to ``host`` may be dialed at."""

    host: str
    addresses: tuple[str, ...]


PIN_EXTENSION = "notifier.pin"
_current_pin: ContextVar[Pin | None] = ContextVar("notifier_webhook_pin", default=None)


class PinnedBackend(CuttableBackend):
    """A network backend that dials only the addresses pinned for the request being sent, in
    order, and refuses to connect anywhere else (fail closed). It never resolves names."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        pin = _current_pin.get()
        if pin is None or pin.host != host or not pin.addresses:
            raise httpcore.ConnectError(f"refusing to connect to {host}: no checked address")
        error: Exception | None = None
        for address in pin.addresses:
            try:
                return await super().connect_tcp(
                    address, port, timeout=timeout, local_address=local_address,
                    socket_options=socket_options,
                )  # fmt: skip
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not used for webhooks")


class PinnedTransport(BoundedTransport):
    """``BoundedTransport`` whose backend is ``PinnedBackend``. A request carries its ``Pin`` in
    the ``notifier.pin`` extension; new connections for it go to those addresses only. The URL
    is untouched: ``Host``, SNI and certificate checks are for the hostname."""

    def __init__(
        self,
        *,
        network_backend: httpcore.AsyncNetworkBackend | None = None,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = 4,
        max_body_bytes: int | None = None,
    ) -> None:
        """``max_body_bytes``: response bodies end there; the rest is never read."""
        super().__init__(
            network_backend=PinnedBackend(network_backend), ssl_context=ssl_context,
            max_connections=max_connections, max_body_bytes=max_body_bytes,
        )  # fmt: skip

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        extensions = dict(request.extensions)
        pin = extensions.pop(PIN_EXTENSION, None)
        token = _current_pin.set(pin if isinstance(pin, Pin) else None)
        try:
            return await self.send(request, extensions)
        finally:
            _current_pin.reset(token)
