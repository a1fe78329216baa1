"""The HTTP API's contract beyond test_api.py: the JSON traps (README, *Input limits*) are
refused with 400/422 and write nothing, the body-size limit holds before a body is read, the
OpenAPI document is served and says what the models say, and the bugs the schemathesis run
(test_openapi.py, which also holds the connection test that needs a separate process) found
stay fixed.

Like test_api.py, only the ingest role runs, on one database shared by the module; every
refusal compares row counts before and after.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator, Iterator

import h11
import httpx
import pytest
import trio

from notifier.ingest.api import docs
from notifier.ingest.jsonguard import MAX_DEPTH
from notifier.ingest.models import EVENT_TYPE_RE
from tests.integration.conftest import PG_BASE, _pg
from tests.integration.test_api import EVENT, JSON, Api, assert_error, open_api, refused

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def contract_db(pg_template: str) -> Iterator[str]:
    name = f"notifier_contract_{uuid.uuid4().hex[:12]}"
    _pg(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    yield f"{PG_BASE}/{name}"
    _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def api(contract_db: str) -> AsyncIterator[Api]:
    async with open_api(contract_db) as running:
        yield running


# -- JSON traps ---------------------------------------------------------------------------------


def nest(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


HOOK = b'"url": "https://hooks.example.com/in"'
# route: (method, path, body with @ where the trap goes, the path of that place in messages)
ROUTES: dict[str, tuple[str, str, bytes, str]] = {
    "event": ("POST", "/v1/events", b'{"type": "order.created", "payload": {"x": @}}',
              "payload.x"),
    "batch": ("POST", "/v1/events/batch",
              b'{"events": [{"type": "a", "payload": {}}, {"type": "a", "payload": {"x": @}}]}',
              "events[1].payload.x"),
    "channel": ("POST", "/v1/channels",
                b'{"type": "webhook", "config": {' + HOOK + b', "headers": {"x": @}}}',
                "config.headers.x"),
    "patch": ("PATCH", "/v1/channels/{id}", b'{"config": {' + HOOK + b', "headers": {"x": @}}}',
              "config.headers.x"),
    "replay": ("POST", "/v1/deliveries/retry", b'{"status": "DEAD", "event_type": @}',
               "event_type"),
}  # fmt: skip
# trap: (the JSON put in the body, status, code, the message after the path: with {path} when
# the message names it)
TRAPS: dict[str, tuple[bytes, int, str, str]] = {
    "nan": (b"NaN", 400, "invalid_json", "not valid JSON"),
    "infinity": (b"Infinity", 400, "invalid_json", "not valid JSON"),
    "minus-infinity": (b"-Infinity", 400, "invalid_json", "not valid JSON"),
    "duplicate-key": (b'{"y": 1, "y": 2}', 422, "validation_error", '{path}.y: duplicate key "y"'),
    "10000-nested-arrays": (nest(10_000), 422, "validation_error", "body: nested deeper than 64"),
    "65-levels": (nest(MAX_DEPTH), 422, "validation_error", "body: nested deeper than 64"),
    "5000-digit-integer": (b"9" * 5000, 422, "validation_error", "{path}: number 999"),
    "int64-overflow": (b"9223372036854775808", 422, "validation_error",
                       "{path}: integer 9223372036854775808 does not fit a signed 64-bit"),
    "float-overflow": (b"-1e400", 422, "validation_error", "{path}: number -1e400 does not fit"),
    "lone-surrogate": (b'"a\\ud800"', 422, "validation_error",
                       "{path}: text must not contain a lone UTF-16 surrogate"),
    "lone-surrogate-in-a-key": (b'{"\\udc00": 1}', 422, "validation_error",
                                "lone UTF-16 surrogate"),
    "nul": (b'"a\\u0000"', 422, "validation_error",
            "{path}: text must not contain the NUL character (\\u0000)"),
    "nul-in-a-key": (b'{"k\\u0000": 1}', 422, "validation_error", "NUL character"),
}  # fmt: skip


async def test_json_traps_are_refused_and_write_nothing(
    api: Api, subtests: pytest.Subtests
) -> None:
    channel = f"/v1/channels/{api.a_channel['id']}"
    before = (await api.a.get(channel)).json()
    for route, (method, path, template, where) in ROUTES.items():
        path = path.replace("{id}", str(api.a_channel["id"]))
        for name, (trap, status, code, mention) in TRAPS.items():
            with subtests.test(trap=name, route=route):
                await refused(
                    api, status, code, mention.format(path=where), method=method, path=path,
                    content=template.replace(b"@", trap), headers=JSON,
                )  # fmt: skip
        with subtests.test(trap="duplicate-field", route=route):
            await refused(
                api, 422, "validation_error", 'dup: duplicate key "dup"', method=method,
                path=path, content=b'{"dup": 1, "dup": 2, ' + template[1:].replace(b"@", b'"v"'),
                headers=JSON,
            )  # fmt: skip
    assert (await api.a.get(channel)).json() == before, "no patch went through"


async def test_the_rules_leave_good_bodies_alone(api: Api) -> None:
    """The same shapes within the limits are accepted."""
    payload = (
        b'{"deep": ' + nest(MAX_DEPTH - 2) + b', "big": 9223372036854775807, "small": 1e-400, '
        b'"pair": "\\ud83d\\ude00", "text": "\\\\u0000", "same": {"x": {"x": 1}}}'
    )
    body = b'{"type": "order.created", "payload": ' + payload + b"}"
    resp = await api.a.post("/v1/events", content=body, headers=JSON)
    assert resp.status_code == 202, resp.text
    stored = (await api.a.get(f"/v1/events/{resp.json()['id']}")).json()["payload"]
    assert stored["pair"] == "\U0001f600"
    assert stored["text"] == "\\u0000"
    assert stored["big"] == 2**63 - 1


# -- the body-size limit, and connections that are not kept alive -------------------------------


class Conn:
    """One raw HTTP/1.1 connection, so a test controls when each byte is sent."""

    def __init__(self, stream: trio.SocketStream, host: str) -> None:
        self.stream, self.host = stream, host
        self.h11 = h11.Connection(h11.CLIENT)

    async def send_head(self, method: str, path: str, headers: dict[str, str]) -> None:
        request = h11.Request(
            method=method, target=path, headers=[("Host", self.host), *headers.items()]
        )
        await self.stream.send_all(self.h11.send(request) or b"")

    async def send_body(self, data: bytes, *, end: bool = True) -> None:
        await self.stream.send_all(self.h11.send(h11.Data(data=data)) or b"")
        if end:
            await self.stream.send_all(self.h11.send(h11.EndOfMessage()) or b"")

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        status, headers, body = 0, {}, b""
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, headers, body
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def closed_by_server(self) -> bool:
        """Whether the server closes the connection (what is left to read is only the EOF)."""
        return await self.stream.receive_some(65536) == b""


async def connect(api: Api) -> Conn:
    url = httpx.URL(api.running.base_url)
    assert url.port is not None
    return Conn(await trio.open_tcp_stream(url.host, url.port), f"{url.host}:{url.port}")


def bearer(api: Api) -> dict[str, str]:
    return {"Authorization": api.a.headers["Authorization"]}


async def send_until_refused(conn: Conn) -> None:
    """Stream chunks of a body until the server hangs up."""
    while True:
        try:
            await conn.send_body(b"x" * 512, end=False)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        await trio.lowlevel.checkpoint()


async def test_a_body_over_the_limit_is_refused_before_it_is_read(
    contract_db: str, subtests: pytest.Subtests
) -> None:
    """413 as soon as the body is known to be too long (a Content-Length over the limit: before
    a byte of it is sent; chunked: once it grows past the limit), nothing written, and the
    connection closed by the server."""
    async with open_api(contract_db, ingest={"max_body_bytes": 1024}) as api:
        for chunked in [False, True]:
            with subtests.test(chunked=chunked):
                before = await api.rows()
                conn = await connect(api)
                async with conn.stream:
                    length = {"Transfer-Encoding": "chunked"} if chunked else {
                        "Content-Length": str(10**9)
                    }  # fmt: skip
                    await conn.send_head(
                        "POST", "/v1/events",
                        {"Content-Type": "application/json", **bearer(api), **length},
                    )  # fmt: skip
                    with trio.fail_after(10):
                        if chunked:
                            await conn.send_body(b'{"type": "a", "payload": {"x": "', end=False)
                            async with trio.open_nursery() as nursery:
                                nursery.start_soon(send_until_refused, conn)
                                status, headers, body = await conn.response()
                                nursery.cancel_scope.cancel()
                        else:
                            status, headers, body = await conn.response()
                        assert status == 413, body
                        assert headers.get("connection") == "close"
                        assert b"request_entity_too_large" in body
                        if not chunked:
                            assert await conn.closed_by_server()
                assert await api.rows() == before


async def test_a_connection_that_is_not_kept_alive_is_closed_by_the_server(
    api: Api, subtests: pytest.Subtests
) -> None:
    """HTTP/1.0, or ``Connection: close``: the server closes the connection after answering
    (it used to leave it open, the close being cancelled along with the request)."""
    url = httpx.URL(api.running.base_url)
    assert url.port is not None
    for name, request in [
        ("http-1.0", b"GET /healthz HTTP/1.0\r\n\r\n"),
        ("connection-close", b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    ]:
        with subtests.test(request=name):
            stream = await trio.open_tcp_stream(url.host, url.port)
            async with stream:
                await stream.send_all(request)
                received = b""
                with trio.fail_after(5):
                    while chunk := await stream.receive_some(65536):
                        received += chunk
                assert received.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200")), received


# -- the OpenAPI document -----------------------------------------------------------------------


async def test_the_openapi_document_is_served_without_a_key(api: Api) -> None:
    async with api.client() as anonymous:
        first = await anonymous.get("/openapi.json")
        second = await anonymous.get("/openapi.json")
    assert first.status_code == 200, first.text
    assert first.headers["content-type"] == "application/json"
    assert first.content == second.content, "built once per app"
    doc = first.json()
    assert doc["openapi"] == "3.1.0"
    schemas = doc["components"]["schemas"]
    event_type = schemas["EventIn"]["properties"]["type"]
    assert (event_type["pattern"], event_type["maxLength"]) == (EVENT_TYPE_RE, 200)
    assert schemas["BatchIn"]["properties"]["events"]["maxItems"] == 100
    assert doc["paths"]["/v1/channels"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]["discriminator"]["mapping"] == {
        "webhook": "#/components/schemas/WebhookChannelIn"
    }  # fmt: skip


# -- regressions from the schemathesis run ------------------------------------------------------


def cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


async def test_times_that_overflow_in_utc_are_422_not_500(
    api: Api, subtests: pytest.Subtests
) -> None:
    """A cursor or replay filter at the edge of the calendar overflowed when asyncpg converted
    it to UTC (500); a time without an offset is refused rather than read in some zone."""
    some_id = uuid.uuid4()
    for text in [
        f"0001-01-01T00:00:00+14:00|{some_id}", f"9999-12-31T23:59:59-14:00|{some_id}",
        f"2024-01-01T00:00:00|{some_id}",
    ]:  # fmt: skip
        for path in ["/v1/channels", "/v1/deliveries"]:
            with subtests.test(cursor=text[:25], path=path):
                await refused(
                    api, 422, "invalid_cursor", "cursor", method="GET",
                    path=f"{path}?cursor={cursor(text)}",
                )  # fmt: skip
    for field, value, mention in [
        ("created_after", "0001-01-01T00:00:00+14:00", "created_after: out of range in UTC"),
        ("created_before", "9999-12-31T23:59:59-14:00", "created_before: out of range in UTC"),
        ("created_after", "2024-01-01T00:00:00", "created_after: Expected `datetime` with a "
         "timezone component"),
    ]:  # fmt: skip
        with subtests.test(field=field, value=value):
            await refused(
                api, 422, "validation_error", mention, method="POST",
                path="/v1/deliveries/retry", json={field: value},
            )  # fmt: skip


async def test_answers_have_the_documented_fields(api: Api) -> None:
    """Answers are built from the structs the document is generated from; spot-check one of
    each kind (schemathesis checks them all against the document)."""
    assert_error(await api.a.post("/v1/events", json=EVENT | {"payload": [1]}), 422,
                 "validation_error", "payload")  # fmt: skip
    event = (await api.a.post("/v1/events", json=EVENT)).json()
    assert set(event) == {"id", "type", "recipient", "created_at", "deliveries"}
    (delivery,) = event["deliveries"]
    assert set(delivery) == {"id", "channel_id", "channel_type", "status"}
    channel = (await api.a.get("/v1/channels")).json()["items"][0]
    assert set(channel["health"]) == {
        "consecutive_failures", "failing_since", "last_success_at", "circuit"
    }  # fmt: skip
    assert set(channel["health"]["circuit"]) == {
        "destination", "state", "consecutive_failures", "opened_at", "next_probe_at"
    }  # fmt: skip
    listed = (await api.a.get(f"/v1/deliveries?event_id={event['id']}")).json()["items"]
    assert [d["id"] for d in listed] == [delivery["id"]]
    assert "attempts" not in listed[0], "list items leave the attempts out"
    read = (await api.a.get(f"/v1/deliveries/{delivery['id']}")).json()
    assert read == listed[0] | {"attempts": []}


# -- the document and the server agree (schemathesis, all checks: test_openapi.py) -------------


async def test_an_integer_written_with_a_zero_fraction_is_taken(
    api: Api, subtests: pytest.Subtests
) -> None:
    """JSON Schema counts 229.0 an integer: the document's integers take it, in a query and in
    a body; 229.5 is still refused."""
    for path in ["/v1/channels", "/v1/deliveries"]:
        with subtests.test(path=path):
            resp = await api.a.get(f"{path}?limit=229.0")
            assert resp.status_code == 200, resp.text
            await refused(
                api, 422, "invalid_parameter", "limit must be an integer", method="GET",
                path=f"{path}?limit=229.5",
            )  # fmt: skip
    resp = await api.a.post("/v1/deliveries/retry", content=b'{"limit": 229.0}', headers=JSON)
    assert resp.status_code == 202, resp.text
    channel = f"/v1/channels/{api.a_channel['id']}"
    resp = await api.a.patch(channel, content=b'{"max_attempts": 7.0}', headers=JSON)
    assert resp.status_code == 200, resp.text
    assert resp.json()["max_attempts"] == 7
    await refused(
        api, 422, "validation_error", "max_attempts", method="PATCH", path=channel,
        content=b'{"max_attempts": 7.5}', headers=JSON,
    )  # fmt: skip


async def test_what_the_document_refuses_of_a_webhook_config_the_server_refuses(
    api: Api, subtests: pytest.Subtests
) -> None:
    """A PATCH's secret may not be null (the document's PATCH config has no null), a secret
    must have the documented form, and so must a header."""
    channel = f"/v1/channels/{api.a_channel['id']}"
    hook = "https://hooks.example.com/in"
    for name, config, mention in [
        ("null-secret", {"url": hook, "secret": None}, "config.secret: a PATCH must give"),
        ("short-secret", {"url": hook, "secret": "whsec_" + base64.b64encode(b"x" * 23).decode()},
         "config.secret: must be whsec_"),
        ("unpadded-secret", {"url": hook, "secret": "whsec_" + "A" * 43},
         "config.secret: must be whsec_"),
        ("reserved-header", {"url": hook, "headers": {"HOST": "x"}}, "config.headers.HOST"),
    ]:  # fmt: skip
        with subtests.test(case=name):
            await refused(
                api, 422, "validation_error", mention, method="PATCH", path=channel,
                json={"config": config},
            )  # fmt: skip


async def test_the_api_reference_is_served_from_the_service(api: Api) -> None:
    """/docs needs no key, holds no inline script and loads Redoc from this service."""
    async with api.client() as anonymous:
        page = await anonymous.get("/docs")
        bundle = await anonymous.get("/docs/redoc.standalone.js")
    assert page.status_code == 200, page.text
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"].startswith(
        "default-src 'none'; script-src 'self';"
    )
    assert '<script src="/docs/redoc.standalone.js"></script>' in page.text
    assert page.text.count("<script") == 1
    assert '<redoc spec-url="/openapi.json">' in page.text
    assert bundle.status_code == 200
    assert bundle.headers["content-type"] == "text/javascript; charset=utf-8"
    assert bundle.content == docs.bundle()  # the vendored file, as the package ships it
