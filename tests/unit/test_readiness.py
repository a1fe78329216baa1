"""Readiness checks: run at once, and bounded whatever a dependency does (virtual time)."""

from __future__ import annotations

import trio
import trio.testing

from notifier.errors import StoreUnavailable
from notifier.ingest.readiness import READY_TIMEOUT_SECONDS, run_checks


async def answers() -> None:
    pass


async def answers_after_half_a_second() -> None:
    await trio.sleep(0.5)


async def refuses() -> None:
    raise StoreUnavailable("Postgres unavailable: ConnectionRefusedError()")


async def stalls() -> None:
    await trio.sleep_forever()  # a blackholed path: no answer, not even an error


async def test_every_check_ok_answers_at_once(mock_clock: trio.testing.MockClock) -> None:
    checks = await run_checks({"database": answers, "broker": answers})
    assert checks == {"database": "ok", "broker": "ok"}
    assert trio.current_time() == 0


async def test_checks_run_at_the_same_time(mock_clock: trio.testing.MockClock) -> None:
    checks = await run_checks(
        {"database": answers_after_half_a_second, "broker": answers_after_half_a_second}
    )
    assert checks == {"database": "ok", "broker": "ok"}
    assert trio.current_time() == 0.5  # not 1.0: one after the other would add up


async def test_a_failing_check_says_why(mock_clock: trio.testing.MockClock) -> None:
    checks = await run_checks({"database": refuses, "broker": answers})
    assert checks == {
        "database": "unavailable: Postgres unavailable: ConnectionRefusedError()",
        "broker": "ok",
    }
    assert trio.current_time() == 0


async def test_a_stalled_check_is_unavailable_at_the_timeout(
    mock_clock: trio.testing.MockClock,
) -> None:
    checks = await run_checks({"database": stalls, "broker": answers})
    assert checks == {
        "database": f"unavailable: no answer within {READY_TIMEOUT_SECONDS:g} s",
        "broker": "ok",
    }
    assert trio.current_time() == READY_TIMEOUT_SECONDS


async def test_the_timeout_is_the_callers(mock_clock: trio.testing.MockClock) -> None:
    checks = await run_checks({"database": stalls, "broker": stalls}, timeout_seconds=0.25)
    assert checks == {
        "database": "unavailable: no answer within 0.25 s",
        "broker": "unavailable: no answer within 0.25 s",
    }
    assert trio.current_time() == 0.25
