"""Stop and supervise: the graceful stop signal and restart-with-backoff, on a mock clock."""

from __future__ import annotations

from functools import partial

import pytest
import trio
import trio.testing

from notifier.lifecycle import Stop, supervise
from notifier.testing import RecordingReporter

# -- Stop ---------------------------------------------------------------------------------------


async def test_set_cancels_open_intake_scopes(mock_clock: trio.testing.MockClock) -> None:
    stop = Stop()
    ended_at: list[float] = []

    async def take_work() -> None:
        with stop.intake() as scope:
            await trio.sleep_forever()
        assert scope.cancelled_caught
        ended_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take_work)
        nursery.start_soon(take_work)
        await trio.sleep(3)
        assert not stop.is_set()
        stop.set()
    assert stop.is_set()
    assert ended_at == [3, 3]


async def test_an_intake_opened_after_set_is_cancelled_at_once(
    mock_clock: trio.testing.MockClock,
) -> None:
    stop = Stop()
    stop.set()
    with stop.intake() as scope:
        await trio.sleep(10)
    assert scope.cancelled_caught
    assert trio.current_time() == 0


async def test_work_outside_intake_goes_on_after_set(mock_clock: trio.testing.MockClock) -> None:
    stop = Stop()
    finished_at: list[float] = []

    async def in_flight() -> None:
        await trio.sleep(5)  # work already taken: not inside intake()
        finished_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(in_flight)
        await trio.sleep(1)
        stop.set()
    assert finished_at == [5]


async def test_an_intake_that_ended_is_not_cancelled_later(
    mock_clock: trio.testing.MockClock,
) -> None:
    stop = Stop()
    with stop.intake() as scope:
        await trio.sleep(1)
    stop.set()
    assert not scope.cancel_called
    assert not stop._scopes


async def test_wait_returns_when_set(mock_clock: trio.testing.MockClock) -> None:
    stop = Stop()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop.wait)
        await trio.sleep(2)
        stop.set()
    assert trio.current_time() == 2


# -- supervise ----------------------------------------------------------------------------------


class Component:
    """A supervised component that notes the time of each run and does what ``script`` says
    for that run: "fail early" (before started), "fail" (after started), "return", or "hang"."""

    def __init__(self, *script: str, then: str = "fail") -> None:
        self.script = list(script)
        self.then = then
        self.runs: list[float] = []

    async def __call__(self, *, task_status: trio.TaskStatus[None]) -> None:
        self.runs.append(trio.current_time())
        step = self.script.pop(0) if self.script else self.then
        if step == "fail early":
            raise RuntimeError("cannot start")
        task_status.started()
        await trio.lowlevel.checkpoint()
        if step == "fail":
            raise RuntimeError("lost it")
        if step == "hang":
            await trio.sleep_forever()


async def test_a_failure_before_started_propagates(mock_clock: trio.testing.MockClock) -> None:
    component = Component("fail early")
    with pytest.raises(RuntimeError, match="cannot start"):
        await supervise("c", component, Stop())
    assert component.runs == [0]
    assert trio.current_time() == 0  # no retry


async def test_a_failure_before_started_reaches_the_starter(
    mock_clock: trio.testing.MockClock,
) -> None:
    component = Component("fail early")
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="cannot start")):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervise, "c", component, Stop())
            pytest.fail("started although the component never was")  # pragma: no cover
    assert component.runs == [0]


async def test_failures_after_started_restart_with_doubling_backoff(
    mock_clock: trio.testing.MockClock,
) -> None:
    component = Component("fail", "fail", "fail", "fail", "return")
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, "c", component, Stop())
    # backoffs 0.5, 1, 2, 4 between the runs
    assert component.runs == [0, 0.5, 1.5, 3.5, 7.5]
    assert trio.current_time() == 7.5


async def test_the_backoff_is_capped(mock_clock: trio.testing.MockClock) -> None:
    component = Component(*["fail"] * 6, "return")
    async with trio.open_nursery() as nursery:
        await nursery.start(
            partial(supervise, initial_backoff_seconds=1, max_backoff_seconds=4),
            "c",
            component,
            Stop(),
        )
    gaps = [b - a for a, b in zip(component.runs, component.runs[1:], strict=False)]
    assert gaps == [1, 2, 4, 4, 4, 4]


async def test_a_failure_after_a_long_healthy_run_starts_the_backoff_over(
    mock_clock: trio.testing.MockClock,
) -> None:
    runs: list[float] = []

    async def component(*, task_status: trio.TaskStatus[None]) -> None:
        runs.append(trio.current_time())
        task_status.started()
        if len(runs) == 3:
            await trio.sleep(100)  # healthy for a while
        if len(runs) == 5:
            return
        raise RuntimeError("lost it")

    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, "c", component, Stop())
    # 0 fails → 0.5 fails → 1.5 runs 100 s, fails → backoff starts over at 0.5 → 102.0 fails → 1
    assert runs == [0, 0.5, 1.5, 102.0, 103.0]


async def test_started_is_passed_on_once(mock_clock: trio.testing.MockClock) -> None:
    component = Component("fail", "return")
    async with trio.open_nursery() as nursery:
        assert await nursery.start(supervise, "c", component, Stop()) is None
        assert trio.current_time() == 0  # started with the first run, not a later one
    assert component.runs == [0, 0.5]


async def test_a_normal_return_ends_supervision(mock_clock: trio.testing.MockClock) -> None:
    component = Component("return")
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, "c", component, Stop())
    assert component.runs == [0]
    assert trio.current_time() == 0


async def test_stop_during_the_backoff_ends_supervision_without_another_run(
    mock_clock: trio.testing.MockClock,
) -> None:
    component = Component(then="fail")
    stop = Stop()
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, "c", component, stop)
        await trio.sleep(0.2)  # virtual time: inside the first 0.5 s backoff
        stop.set()
    assert trio.current_time() == 0.2
    assert component.runs == [0]  # no restart once stopped


async def test_a_failure_after_stop_is_not_restarted(mock_clock: trio.testing.MockClock) -> None:
    stop = Stop()
    runs: list[float] = []

    async def component(*, task_status: trio.TaskStatus[None]) -> None:
        runs.append(trio.current_time())
        task_status.started()
        await stop.wait()
        raise RuntimeError("failed while stopping")

    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, "c", component, stop)
        await trio.sleep(1)
        stop.set()
    assert runs == [0]
    assert trio.current_time() == 1


async def test_a_hanging_component_is_not_restarted(mock_clock: trio.testing.MockClock) -> None:
    component = Component("fail", "hang")
    async with trio.open_nursery() as nursery:
        await nursery.start(supervise, "c", component, Stop())
        await trio.sleep(100)
        nursery.cancel_scope.cancel()
    assert component.runs == [0, 0.5]


async def test_each_failure_after_started_goes_to_the_reporter_passed_in(
    mock_clock: trio.testing.MockClock,
) -> None:
    component = Component("fail", "fail", "return")
    reporter = RecordingReporter()
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(supervise, reporter=reporter), "relay", component, Stop())
    assert component.runs == [0, 0.5, 1.5]
    assert [(r.summary, r.tags) for r in reporter.reports] == [
        ("relay failed", {"component": "relay"}),
        ("relay failed", {"component": "relay"}),
    ]
    assert all(
        isinstance(r.exc, RuntimeError) and str(r.exc) == "lost it" for r in reporter.reports
    )


async def test_a_failure_before_started_is_not_reported(
    mock_clock: trio.testing.MockClock,
) -> None:
    reporter = RecordingReporter()
    with pytest.raises(RuntimeError, match="cannot start"):
        await supervise("c", Component("fail early"), Stop(), reporter=reporter)
    assert reporter.reports == []  # it fails the start-up instead, which the operator sees
