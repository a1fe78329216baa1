"""`just run` / `just demo` (``python -m notifier.demo``): each run delivers its event, and runs
after the first reuse the one demo tenant instead of leaving a new one behind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

from notifier.demo import DEMO_TENANT
from tests.chaos.harness import base_config, free_port, write_config
from tests.integration.conftest import sql


async def test_demo_runs_reuse_one_tenant_and_leave_one_channel(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    config = write_config(
        tmp_path / "demo.toml", base_config(database_url, broker_url, free_port())
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    keys = []
    for _ in range(2):
        with trio.fail_after(90):
            done = await trio.run_process(
                [sys.executable, "-m", "notifier.demo", "--config", str(config), "--exit"],
                env=env, capture_stdout=True, capture_stderr=True, check=False,
            )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        assert b'"status": "DELIVERED"' in done.stdout
        rows = await sql(database_url, "SELECT name, enabled, api_key_hash FROM tenants")
        assert [(r["name"], r["enabled"]) for r in rows] == [(DEMO_TENANT, True)]
        keys.append(rows[0]["api_key_hash"])
        channels = await sql(database_url, "SELECT count(*) FROM channels")
        assert channels[0][0] == 1  # the earlier run's channel is gone
    assert keys[0] != keys[1]  # each run gives the tenant a new key
