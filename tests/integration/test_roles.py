"""What each role needs from its environment: ``notifier run`` in a subprocess, as an operator
starts it. The adapters' secrets (the SMTP password, the bot token) are read only where the
``workers`` role runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from tests.integration.conftest import create_tenant
from tests.integration.test_cli import notifier
from tests.integration.test_shutdown import free_port, read_log, wait_ready

SECRET_VARS = ("NOTIFIER_SMTP_PASSWORD", "NOTIFIER_TELEGRAM_TOKEN")


def write_config(path: Path, database_url: str, broker_url: str, port: int) -> Path:
    """Email (with a login, so the workers need a password) and Telegram worker groups."""
    path.write_text(
        f"""
[database]
url = "{database_url}"

[broker]
url = "{broker_url}"

[ingest]
bind = "127.0.0.1:{port}"

[workers.email]
smtp_host = "127.0.0.1"
smtp_username = "notifier"
from = "notifier@example.com"

[workers.telegram]
api_base_url = "http://127.0.0.1:9"
"""
    )
    return path


def environment() -> dict[str, str]:
    """This process's environment without any NOTIFIER_ variable (so without either secret)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    assert not set(SECRET_VARS) & set(env)
    return env


async def test_the_ingest_role_starts_without_the_adapters_secrets(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    port = free_port()
    cfg = write_config(tmp_path / "notifier.toml", database_url, broker_url, port)
    base = f"http://127.0.0.1:{port}"
    key = await create_tenant(database_url)
    log = tmp_path / "notifier.log"
    with log.open("ab") as out:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "notifier", "run", "--role", "ingest", "--config", str(cfg)],
            stdout=out, stderr=subprocess.STDOUT, env=environment(),
        )  # fmt: skip
    try:
        await wait_ready(base, process, log)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=10) as api:
            event = await api.post("/v1/events", json={"type": "order.created", "payload": {}})
            assert event.status_code == 202, event.text
            for channel_type, good, bad, field in [
                ("email", {"to": "ops@example.com"}, {"to": "nobody"}, "config.to"),
                ("telegram", {"chat_id": 123456789}, {"chat_id": "nobody"}, "config.chat_id"),
            ]:
                created = await api.post(
                    "/v1/channels", json={"type": channel_type, "config": good}
                )
                assert created.status_code == 201, created.text
                assert created.json()["config"] == good
                refused = await api.post("/v1/channels", json={"type": channel_type, "config": bad})
                assert refused.status_code == 422, refused.text
                assert refused.json()["error"]["message"].startswith(f"{field}: ")
    finally:
        process.terminate()  # SIGTERM: a graceful stop
        with trio.fail_after(30):
            await process.wait()
    assert process.returncode == 0, read_log(log)


def test_the_workers_role_without_a_secret_fails_the_start_naming_key_and_variable(
    tmp_path: Path, database_url: str, broker_url: str
) -> None:
    cfg = write_config(tmp_path / "notifier.toml", database_url, broker_url, free_port())
    done = notifier("run", "--role", "workers", "--config", str(cfg))
    assert done.returncode == 2, done.stderr
    assert "workers.email.smtp_password_env" in done.stderr
    assert "NOTIFIER_SMTP_PASSWORD" in done.stderr

    with_password = {"NOTIFIER_SMTP_PASSWORD": "s3cret-Passw0rd"}
    done = notifier("run", "--role", "workers", "--config", str(cfg), env=with_password)
    assert done.returncode == 2, done.stderr
    assert "workers.telegram.bot_token_env" in done.stderr
    assert "NOTIFIER_TELEGRAM_TOKEN" in done.stderr
    assert "s3cret-Passw0rd" not in done.stderr
