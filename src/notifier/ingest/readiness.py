"""Readiness: every dependency checked at once, and none allowed to hold the answer.

A load balancer or orchestrator asks ``/readyz`` with a short timeout of its own; a dependency
that stalls (a blackholed network path answers nothing, not even an error) must turn into a
prompt "unavailable", not into a probe that times out and says nothing about why.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import trio

# Each check is given this long (the database ping bounds itself to it on its side)...
CHECK_SECONDS = 1.0
# ...and is abandoned after this long, whatever it is doing.
READY_TIMEOUT_SECONDS = 1.5

Check = Callable[[], Awaitable[None]]


async def run_checks(
    checks: Mapping[str, Check], *, timeout_seconds: float = READY_TIMEOUT_SECONDS
) -> dict[str, str]:
    """Trio-flavoured. Run ``checks`` concurrently; return, by name, ``"ok"`` or
    ``"unavailable: <why>"``. A check that raises is unavailable with its error; one still
    running after ``timeout_seconds`` is cancelled and unavailable for not answering."""
    results = {name: f"unavailable: no answer within {timeout_seconds:g} s" for name in checks}

    async def run(name: str, check: Check) -> None:
        try:
            await check()
        except Exception as exc:
            results[name] = f"unavailable: {exc}"
        else:
            results[name] = "ok"

    with trio.move_on_after(timeout_seconds):
        async with trio.open_nursery() as nursery:
            for name, check in checks.items():
                nursery.start_soon(run, name, check)
    return results
