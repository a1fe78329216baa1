"""At-least-once through PgBouncer in transaction pooling mode: the no-fault baseline (the
doorbell on a direct ``database.listen_url``), and PgBouncer killed and started again on the
same port mid-stream (no ``listen_url``: the relay polls) — nothing accepted is lost, and while
PgBouncer is down every request is answered 503 with Retry-After.

The README's *Reliability* section holds the rows these produce.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.chaos import test_scenarios
from tests.chaos.harness import Context, Scenario
from tests.chaos.test_scenarios import FAULT_DUPLICATES, run
from tests.pgbouncer import PgBouncer, pgbouncer_instance

# the same client-side warnings let through as in test_scenarios
pytestmark = [pytest.mark.slow, *test_scenarios.pytestmark]

# How long PgBouncer stays down: several requests are answered meanwhile.
DOWN_SECONDS = 3.0


@pytest.fixture
async def pgbouncer() -> AsyncIterator[PgBouncer]:
    # Fewer server connections than the 10 the service's pool may open: clients share them.
    with pgbouncer_instance(pool_size=5) as bouncer:
        await bouncer.start()
        yield bouncer


def _through(bouncer: PgBouncer, database_url: str, *, listen: bool) -> dict[str, Any]:
    database: dict[str, Any] = {
        "url": bouncer.url(database_url.rsplit("/", 1)[1]), "pooler": "pgbouncer",
    }  # fmt: skip
    if listen:
        database["listen_url"] = database_url
    return {"database": database}


async def test_baseline_through_pgbouncer(
    pgbouncer: PgBouncer, database_url: str, broker_url: str, vhost: str, tmp_path: Path
) -> None:
    scenario = Scenario(
        "pgbouncer baseline", config=_through(pgbouncer, database_url, listen=True),
        log_lacks=("no LISTEN through a transaction pooler",),
    )  # fmt: skip
    await run(scenario, database_url, broker_url, vhost, tmp_path)


async def test_pgbouncer_killed_and_restarted_mid_stream(
    pgbouncer: PgBouncer, database_url: str, broker_url: str, vhost: str, tmp_path: Path
) -> None:
    async def restart_pgbouncer(ctx: Context) -> None:
        await pgbouncer.kill()  # every connection through it breaks, mid-transaction or not
        down_from = trio.current_time()
        await trio.sleep(DOWN_SECONDS)  # the fault itself: PgBouncer is gone while load goes on
        ctx.outages.append((down_from, trio.current_time()))
        await pgbouncer.start()  # the same port and config

    scenario = Scenario(
        "pgbouncer kill -9, restarted on its port", restart_pgbouncer,
        max_duplicates=FAULT_DUPLICATES, config=_through(pgbouncer, database_url, listen=False),
        log_has=("no LISTEN through a transaction pooler",),
    )  # fmt: skip
    outcome = await run(scenario, database_url, broker_url, vhost, tmp_path)
    assert pgbouncer.starts == 2
    assert outcome.report.lost == 0
