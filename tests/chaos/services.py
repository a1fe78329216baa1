"""The machine's own Postgres and RabbitMQ, stopped, killed and restarted by the scenarios that
need it. Each call is bounded; ``ensure_services`` (the same script ``just test`` runs) brings
back whatever is down, and every scenario that touches a service calls it in ``finally``.

Only the broker's own process is ever killed, by the PID the broker reports for itself.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
from pathlib import Path

from tests.integration.conftest import rabbitmqctl

ROOT = Path(__file__).resolve().parents[2]
PG_VERSION = sorted(os.listdir("/etc/postgresql"))[0] if Path("/etc/postgresql").is_dir() else ""


def _run(*command: str, timeout: float = 120) -> str:
    return subprocess.run(
        command, check=True, capture_output=True, text=True, timeout=timeout
    ).stdout.strip()


def ensure_services() -> None:
    """Start Postgres and RabbitMQ if they are down and wait until both answer."""
    _run(str(ROOT / "scripts" / "ensure-services"), timeout=180)


def pg_ctl(*args: str) -> None:
    """``pg_ctlcluster <version> main <args>`` (it waits for the operation to finish)."""
    _run("pg_ctlcluster", "--skip-systemctl-redirect", PG_VERSION, "main", *args)


def rabbitmq_kill() -> None:
    """``kill -9`` the broker's Erlang VM (by the PID it reports) and wait, up to 30 s, until it
    has exited (its pidfd becomes readable). ``ensure_services`` starts it again."""
    pid = int(rabbitmqctl("eval", "list_to_integer(os:getpid())."))
    pidfd = os.pidfd_open(pid)
    try:
        os.kill(pid, signal.SIGKILL)
        readable, _, _ = select.select([pidfd], [], [], 30)
        if not readable:
            raise TimeoutError(f"RabbitMQ (pid {pid}) still runs 30 s after SIGKILL")
    finally:
        os.close(pidfd)


# RabbitMQ's default memory high watermark (a fraction of the machine's memory)
DEFAULT_MEMORY_WATERMARK = "0.4"


def _watermark() -> str:
    return rabbitmqctl("eval", "vm_memory_monitor:get_vm_memory_high_watermark().").strip()


def _alarm_watermark(value: str) -> bool:
    return value in ("0", "0.0")


def rabbitmq_memory_watermark() -> str:
    """The memory high watermark as the broker reports it: ``0.4``, ``{absolute,N}`` or
    ``{absolute,"2GB"}``. A watermark of 0 can only be the leftover of an aborted alarm
    scenario: the default is reported instead, so that it is what gets restored."""
    value = _watermark()
    return DEFAULT_MEMORY_WATERMARK if _alarm_watermark(value) else value


def rabbitmq_set_memory_watermark(value: str) -> None:
    """``value`` as ``rabbitmq_memory_watermark`` gives it; ``"0"`` raises the memory alarm
    at once (every publishing connection is blocked)."""
    if value.startswith("{absolute,"):
        limit = value.removeprefix("{absolute,").rstrip("}").strip('"')
        rabbitmqctl("set_vm_memory_high_watermark", "absolute", limit)
    else:
        rabbitmqctl("set_vm_memory_high_watermark", value)


def rabbitmq_clear_memory_alarm() -> None:
    """If a memory alarm is on while the watermark is 0 (an alarm scenario that could not
    restore it), put the default back."""
    if "memory" in rabbitmq_alarms() and _alarm_watermark(_watermark()):
        rabbitmq_set_memory_watermark(DEFAULT_MEMORY_WATERMARK)


def rabbitmq_alarms() -> str:
    return rabbitmqctl("eval", "rabbit_alarm:get_alarms().")
