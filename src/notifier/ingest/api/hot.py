"""The ingest routes, ``POST /v1/events`` and ``POST /v1/events/batch``, answered straight from
the ASGI scope, in front of quart's request machinery; every other request (other routes, other
methods on these paths, the console, ``/metrics``, the docs) goes on to the quart app unchanged.

Under load these two routes are nearly all the work of an ingest process, and quart's part of
each request (its Request and Response objects, werkzeug's headers and routing, the request
context, a nursery of two tasks per request) cost as much as the rest together. Here a request
is one task, reading only the headers it needs. What it decides is what the quart handlers
decide, through the same functions: ``auth.authenticate`` (two ``Authorization`` headers,
the 401 limit per address, the tenant cache), ``http.check_json_type`` and ``decode_body``,
``events.store_event`` and ``events.store_batch`` (the idempotency header rules, the rate
limit, the group commit, the ``traceparent`` and the ingest span), ``errors.error_parts``
(every error in the one shape, with its status and headers). What quart did around them is kept:

- the body is bounded by ``MAX_CONTENT_LENGTH`` (``ingest.max_body_bytes``): over it by its
  ``Content-Length``, refused without reading it; growing past it, refused at once (``413``);
  a body that does not arrive within ``BODY_TIMEOUT`` is refused with ``408``;
- what an answer left unread of a body is read before the answer goes, and a body too large or
  too slow closes the connection instead (``Connection: close``), as
  ``errors.finish_reading_the_body`` does;
- a client that disconnects before its answer is ready gets none (quart cancels the handler);
  a request whose body was read in full is carried on to its end meanwhile: its event may be
  in a group commit that the others of the batch wait for anyway;
- the answer's headers are quart's (``Content-Type: application/json``, ``Content-Length``,
  then ``Retry-After``, ``Connection``); hypercorn adds ``Date`` and ``Server`` as before.

Each answer is timed, from its headers read to its answer ready, in
``notifier_ingest_request_duration_seconds{route,status}`` (one histogram observation; the
series of a route and status is looked up once per process).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import msgspec
import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope
from quart import Quart
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from notifier.errors import NotifierError
from notifier.ingest.api.auth import authenticate
from notifier.ingest.api.context import ApiContext, context_of
from notifier.ingest.api.errors import error_parts
from notifier.ingest.api.events import request_traceparent, store_batch, store_event
from notifier.ingest.api.http import check_json_type, decode_body, error_body
from notifier.ingest.models import BatchIn, EventIn

ASGIApp = Callable[[Scope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]

BATCH_PATH = "/v1/events/batch"
EVENT_PATH = "/v1/events"
_JSON = (b"content-type", b"application/json")


class _Timer(Protocol):
    def observe(self, amount: float) -> None: ...


class _ClientGone(NotifierError):
    """The client disconnected before its body was read: nothing is answered."""


class _Body:
    """A request's body, read from the ASGI ``receive`` as quart reads it (bounded in size and
    in time), at most once: ``read`` for the handler, ``finish`` for what it left unread."""

    def __init__(
        self,
        receive: ASGIReceiveCallable,
        declared_length: int | None,
        max_bytes: int | None,
        timeout: float | None,
    ) -> None:
        self._receive = receive
        self._max = max_bytes
        self._timeout = float("inf") if timeout is None else timeout
        self._complete = False
        self.refused: HTTPException | None = None
        if declared_length is not None and max_bytes is not None and declared_length > max_bytes:
            self.refused = RequestEntityTooLarge()

    async def read(self) -> bytes:
        """The whole body; raises ``413``/``408`` (werkzeug's, as quart) or ``_ClientGone``."""
        if self.refused is not None:
            raise self.refused
        chunks: list[bytes] = []
        size = 0
        with trio.move_on_after(self._timeout) as timer:
            while not self._complete:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    raise _ClientGone()
                if message["type"] != "http.request":
                    continue
                chunk = message.get("body", b"")
                self._complete = not message.get("more_body", False)
                if chunk:
                    size += len(chunk)
                    if self._max is not None and size > self._max:
                        self.refused = RequestEntityTooLarge()
                        raise self.refused
                    chunks.append(chunk)
        if timer.cancelled_caught:
            self.refused = RequestTimeout()
            raise self.refused
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def finish(self) -> bool:
        """Read what is left of the body, so the connection can carry the next request; False
        when the body is too large or too slow (the answer then closes the connection)."""
        if self.refused is None and not self._complete:
            with contextlib.suppress(HTTPException):
                await self.read()
        return self.refused is None


class IngestRoutes:
    """The ASGI app handed to the server: the two ingest routes here, the rest to ``app``."""

    def __init__(self, app: Quart, ctx: ApiContext) -> None:
        self._app = app
        self._ctx = ctx
        self._max_body = app.config["MAX_CONTENT_LENGTH"]
        self._body_timeout = app.config["BODY_TIMEOUT"]
        self._timers: dict[tuple[str, int], _Timer] = {}  # (route, status) → its series

    def _timer(self, route: str, status: int) -> _Timer:
        timer = self._timers.get((route, status))
        if timer is None:
            histogram = self._ctx.metrics.ingest_request_duration
            timer = self._timers[route, status] = histogram.labels(route, str(status))
        return timer

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            if path in (EVENT_PATH, BATCH_PATH):
                await self._serve(scope, receive, send, batch=path == BATCH_PATH)
                return
        await self._app(scope, receive, send)

    async def _serve(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable, *, batch: bool
    ) -> None:
        assert scope["type"] == "http"
        started = trio.current_time()
        authorization: list[str] = []
        content_type = idempotency = length = None
        traceparents: list[bytes] = []
        for raw_name, raw_value in scope["headers"]:
            name = raw_name.lower()
            if name == b"authorization":
                authorization.append(raw_value.decode("latin1"))
            elif name == b"content-type" and content_type is None:
                content_type = raw_value.decode("latin1")
            elif name == b"idempotency-key" and idempotency is None:
                idempotency = raw_value.decode("latin1")
            elif name == b"traceparent":
                traceparents.append(raw_value)
            elif name == b"content-length" and length is None:
                length = int(raw_value) if raw_value.isdigit() else None
        body = _Body(receive, length, self._max_body, self._body_timeout)
        address = (scope.get("client") or ("<local>",))[0]
        headers: Mapping[str, str] = {}
        try:
            try:
                tenant_id = await authenticate(self._ctx, authorization, address)
                check_json_type(content_type or "")
                answer: Any
                traceparent = request_traceparent(traceparents) if traceparents else None
                if batch:
                    answer, status = await store_batch(
                        self._ctx, tenant_id, decode_body(await body.read(), BatchIn), traceparent
                    )
                else:
                    data = decode_body(await body.read(), EventIn)
                    answer, status = await store_event(
                        self._ctx, tenant_id, data, idempotency, traceparent
                    )
                payload = msgspec.json.encode(answer)
            except _ClientGone:
                raise
            except Exception as exc:
                status, code, message, headers = error_parts(exc)
                payload = error_body(code, message)
            keep_alive = await body.finish()
        except _ClientGone:
            return
        response_headers = [
            *((name.lower().encode(), value.encode()) for name, value in headers.items()),
            _JSON,
            (b"content-length", str(len(payload)).encode()),
        ]
        if not keep_alive:
            response_headers.append((b"connection", b"close"))
        route = BATCH_PATH if batch else EVENT_PATH
        self._timer(route, status).observe(trio.current_time() - started)
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": payload, "more_body": False})


def ingest_routes(app: Quart) -> ASGIApp:
    """``app`` with the ingest routes answered in front of it (``app`` itself when it is not
    the API's: the app of ``ingest.metrics_bind``)."""
    ctx = context_of(app)
    if ctx is None:
        return app
    return IngestRoutes(app, ctx)
