"""Who may read ``/metrics``: ``ingest.metrics_token_env`` (a bearer token) and
``ingest.metrics_bind`` (an address of its own), on the app over the in-memory store."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from quart_trio import QuartTrio
from trio.testing import MockClock
from werkzeug.datastructures import Headers

from notifier.config import parse_config
from notifier.errors import ConfigError
from notifier.ingest.app import create_app
from notifier.ingest.metrics_access import (
    READINESS_MAX_AGE_SECONDS,
    CachedReadiness,
    create_metrics_app,
    metrics_endpoint,
)
from notifier.metrics import CONTENT_TYPE
from notifier.testing import RecordingAdapter
from notifier.testing.api import MemoryApiStore

TOKEN = "t0ken-of-the-scraper-0123456789"
ENV = {"NOTIFIER_METRICS_TOKEN": TOKEN}


def app(ingest: dict[str, Any], environ: dict[str, str] | None = None) -> QuartTrio:
    env = ENV if environ is None else environ
    config = parse_config({"ingest": ingest, "workers": {"webhook": {}}}, env=env)
    return create_app(
        MemoryApiStore(), config, {"webhook": RecordingAdapter("webhook")}, environ=env
    )


async def get(served: QuartTrio, *authorization: str, path: str = "/metrics") -> Any:
    headers = Headers([("Authorization", value) for value in authorization])
    return await served.test_client().get(path, headers=headers)


async def refused(resp: Any, status: int, code: str) -> None:
    assert resp.status_code == status
    assert resp.mimetype == "application/json"
    body = await resp.get_json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert TOKEN not in await resp.get_data(as_text=True)


@pytest.mark.parametrize(
    ("environ", "found"),
    [({}, "is not set or empty"), ({"NOTIFIER_METRICS_TOKEN": ""}, "is not set or empty"),
     ({"NOTIFIER_METRICS_TOKEN": "short-secret-15"}, "has 15 characters")],
)  # fmt: skip
def test_a_token_variable_that_is_unset_or_short_is_a_config_error(
    environ: dict[str, str], found: str
) -> None:
    with pytest.raises(ConfigError, match=r"^ingest\.metrics_token_env: ") as exc:
        parse_config({"ingest": {"metrics_token_env": "NOTIFIER_METRICS_TOKEN"}}, env=environ)
    assert found in str(exc.value)
    assert "NOTIFIER_METRICS_TOKEN" in str(exc.value)
    assert "short-secret-15" not in str(exc.value)


@pytest.mark.parametrize("bind", ["9464", "localhost", "127.0.0.1:", "127.0.0.1:8080"])
def test_a_metrics_bind_that_is_not_host_port_or_is_the_ingest_port_is_a_config_error(
    bind: str,
) -> None:
    with pytest.raises(ConfigError, match=r"^ingest\.metrics_bind: "):
        parse_config({"ingest": {"bind": "127.0.0.1:8080", "metrics_bind": bind}}, env={})


async def test_without_a_token_metrics_are_open_as_before() -> None:
    resp = await get(app({}))
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == CONTENT_TYPE


async def test_with_a_token_a_scrape_without_it_is_401_with_www_authenticate() -> None:
    served = app({"metrics_token_env": "NOTIFIER_METRICS_TOKEN"})
    resp = await get(served)
    await refused(resp, 401, "unauthorized")
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "authorization",
    ["Bearer wrong-token-of-the-same-size-0", f"Bearer {TOKEN}x", f"Basic {TOKEN}", "Bearer ",
     TOKEN],
)  # fmt: skip
async def test_with_a_token_a_wrong_one_is_401(authorization: str) -> None:
    resp = await get(app({"metrics_token_env": "NOTIFIER_METRICS_TOKEN"}), authorization)
    await refused(resp, 401, "unauthorized")
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")


async def test_with_a_token_the_right_one_is_served() -> None:
    resp = await get(app({"metrics_token_env": "NOTIFIER_METRICS_TOKEN"}), f"Bearer {TOKEN}")
    assert resp.status_code == 200, await resp.get_data(as_text=True)
    assert b"notifier_events_ingested_total" in await resp.get_data()


async def test_two_authorization_headers_are_400_even_with_the_right_token() -> None:
    served = app({"metrics_token_env": "NOTIFIER_METRICS_TOKEN"})
    resp = await get(served, f"Bearer {TOKEN}", f"Bearer {TOKEN}")
    await refused(resp, 400, "invalid_authorization")


async def test_with_a_metrics_bind_the_ingest_app_answers_404_and_the_metrics_app_serves() -> None:
    ingest = app({"metrics_bind": "127.0.0.1:9464", "metrics_token_env": "NOTIFIER_METRICS_TOKEN"})
    await refused(await get(ingest, f"Bearer {TOKEN}"), 404, "not_found")
    metrics = create_metrics_app(metrics_endpoint(ingest))
    resp = await get(metrics, f"Bearer {TOKEN}")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"] == CONTENT_TYPE
    await refused(await get(metrics), 401, "unauthorized")  # the token holds there too
    await refused(await get(metrics, f"Bearer {TOKEN}", path="/healthz"), 404, "not_found")


async def test_readiness_is_checked_again_only_once_its_answer_is_old(
    mock_clock: MockClock,
) -> None:
    answers = [True, False]
    calls = 0

    async def check() -> bool:
        nonlocal calls
        calls += 1
        await trio.sleep(0.1)  # a check takes a while: a scrape beside it shares its answer
        return answers[calls - 1]

    ready = CachedReadiness(check)
    results: list[bool] = []
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(lambda: _append(results, ready()))
    assert (results, calls) == ([True, True, True], 1)
    mock_clock.jump(READINESS_MAX_AGE_SECONDS - 1)
    assert await ready() is True
    assert calls == 1
    mock_clock.jump(1)
    assert await ready() is False
    assert calls == 2


async def _append(into: list[bool], answer: Any) -> None:
    into.append(await answer)
