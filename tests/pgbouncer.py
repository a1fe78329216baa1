"""A real PgBouncer for the tests: Debian's ``pgbouncer`` on a spare port, in transaction
pooling mode, with deploy/pgbouncer.ini as its config (the port, the databases, the auth file
and the paths overridden), its own auth file, and its log in a temporary directory. Only the
process started here is ever signalled, by its PID; it can be killed and started again on the
same port while clients keep trying (the chaos scenario).
"""

from __future__ import annotations

import configparser
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

from tests.chaos.harness import free_port
from tests.integration.conftest import poll

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "deploy" / "pgbouncer.ini"
USER = "postgres"
PASSWORD = "pgbouncer-test-secret"
# PgBouncer refuses to run as root; started by root it switches to this user.
RUN_AS = "postgres"
START_TIMEOUT_SECONDS = 15.0
# Debian installs it in /usr/sbin, which is not on every user's PATH.
PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def render(
    template: str, *, port: int, workdir: Path, target: tuple[str, int], pool_size: int
) -> str:
    """Pure: the template with this test's listener, databases (every database name passed on
    to ``target``), auth file and paths."""
    ini = configparser.ConfigParser(interpolation=None)
    ini.read_string(template)
    host, target_port = target
    ini["databases"] = {"*": f"host={host} port={target_port}"}
    settings = ini["pgbouncer"]
    settings.update({
        "listen_addr": "127.0.0.1", "listen_port": str(port),
        "auth_file": str(workdir / "userlist.txt"), "logfile": str(workdir / "pgbouncer.log"),
        "pidfile": str(workdir / "pgbouncer.pid"), "unix_socket_dir": "",
        "default_pool_size": str(pool_size), "reserve_pool_size": "0",
        "admin_users": "",
    })  # fmt: skip
    if os.geteuid() == 0:
        settings["user"] = RUN_AS
    lines: list[str] = []
    for section in ini.sections():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {value}" for key, value in ini[section].items())
        lines.append("")
    return "\n".join(lines)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class PgBouncer:
    """One PgBouncer process (started again on the same port after a kill)."""

    def __init__(self, workdir: Path, *, port: int, pool_size: int) -> None:
        self.workdir = workdir
        self.port = port
        self.config_path = workdir / "pgbouncer.ini"
        self.config_path.write_text(
            render(
                TEMPLATE.read_text(encoding="utf-8"), port=port, workdir=workdir,
                target=("127.0.0.1", 5432), pool_size=pool_size,
            ),
            encoding="utf-8",
        )  # fmt: skip
        (workdir / "userlist.txt").write_text(f'"{USER}" "{PASSWORD}"\n', encoding="utf-8")
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def url(self, database: str) -> str:
        return f"postgresql://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def _spawn(self) -> subprocess.Popen[bytes]:
        with (self.workdir / "stderr.log").open("ab") as stderr:  # the child keeps its copy
            return subprocess.Popen(
                [PGBOUNCER, str(self.config_path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
            )  # fmt: skip

    async def start(self) -> None:
        """Start PgBouncer and wait until it accepts connections."""
        assert self.process is None or self.process.poll() is not None
        self.process = self._spawn()
        self.starts += 1
        process = self.process

        async def accepting() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited at start:\n{self.log()[-2000:]}")
            return await trio.to_thread.run_sync(_accepts, self.port)

        with trio.fail_after(START_TIMEOUT_SECONDS):
            await poll(accepting)

    async def kill(self) -> None:
        """SIGKILL it (every client connection breaks at once) and wait for it to be gone."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await trio.to_thread.run_sync(self.process.wait)

    def stop(self) -> None:
        """SIGTERM (PgBouncer's immediate shutdown), then SIGKILL after a bound."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def pgbouncer_dir() -> Iterator[Path]:
    """A temporary directory PgBouncer can write its log to after switching users."""
    workdir = Path(tempfile.mkdtemp(prefix="notifier-pgbouncer-"))
    try:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(RUN_AS)
            os.chown(workdir, entry.pw_uid, entry.pw_gid)
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def pgbouncer_instance(pool_size: int = 4) -> Iterator[PgBouncer]:
    """A PgBouncer (not started yet) on a spare port; stopped and removed on exit."""
    with pgbouncer_dir() as workdir:
        bouncer = PgBouncer(workdir, port=free_port(), pool_size=pool_size)
        try:
            yield bouncer
        finally:
            bouncer.stop()
