"""What every stage of the benchmark runs on: the scratch database and vhost, the nginx sink,
the measured process (notifier with its config, or a baseline), wrk, and the CPU readings.
``run.Bench`` adds the stages."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.otlp_sink import OtlpSink
from bench.procs import (
    CpuGroups,
    Processes,
    Sampler,
    Unit,
    Usage,
    alive,
    children,
    cmdline,
    cores,
    machine_busy,
    pids_named,
    postgres_role,
    thread_usage,
    usage,
    wait_for,
)
from bench.scratch import Scratch
from bench.sink import Sink, WrkResult, free_port, listening, start_wrk
from bench.stage import Stage, Window

HERE = Path(__file__).resolve().parent


def notifier_config(path: Path, s: Scratch, port: int, level: str, extra: str = "") -> None:
    """notifier's config for a stage; ``extra`` is appended (more sections, such as
    ``[tracing]``)."""
    path.write_text(f"""
[service]
shutdown_grace_seconds = 5
[database]
url = "{s.db_url}"
pool_max_size = 20
[broker]
url = "{s.amqp_url}"
[ingest]
bind = "127.0.0.1:{port}"
[relay]
batch_size = 500
poll_interval_seconds = 0.5
[workers.webhook]
concurrency = 16
prefetch = 64
allow_private_networks = true
[logging]
level = "{level}"
{extra}""")


class Harness:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.procs = Processes(tmp)
        self.scratch = Scratch()
        self.sink: Sink | None = None
        self.otlp: OtlpSink | None = None  # the OTLP sink of --tracing (bench/otlp_sink.py)
        self.subject: subprocess.Popen[bytes] | None = None  # the measured server process
        self.wrk_cpu = 0.0
        self.wrk_pid: int | None = None  # while wrk runs
        self.sampler: Sampler | None = None  # while a stage is measured
        self.port = free_port()
        self.stages: list[Stage] = []
        self.samples: dict[str, Any] = {}
        self.beam = pids_named("beam.smp")
        self._pg_roles: dict[int, tuple[str, str]] = {}
        self.cpu = CpuGroups({
            # notifier, and with --processes the launch's processes under it
            "server": self.server_pids,
            "postgres": lambda: pids_named("postgres"),
            "pg_own": lambda: self.scratch.backend_pids() if self.scratch.created else [],
            # the postmaster and its auxiliary processes (checkpointer, walwriter…): not backends
            "pg_server": lambda: [p for p in pids_named("postgres")
                                  if self.postgres_role(p)[0] == "server"],
            "rabbitmq": lambda: self.beam,
            "sink": lambda: self.sink.pids() if self.sink else [],
            "otlp_sink": lambda: self.otlp.pids() if self.otlp else [],
            "bench": lambda: [os.getpid()],  # this process: the harness's Python, the sampler
        })  # fmt: skip

    # -- helpers --

    def server_pids(self) -> list[int]:
        return alive([self.subject.pid, *children(self.subject.pid)]) if self.subject else []

    def postgres_role(self, pid: int) -> tuple[str, str]:
        """What a postgres process is ("own", "other" or "server" and a name), from its title;
        a PID's answer is kept (a backend stays on its database)."""
        if (role := self._pg_roles.get(pid)) is None:
            role = postgres_role(cmdline(pid), self.scratch.name if self.scratch.created else "")
            self._pg_roles[pid] = role
        return role

    def units(self) -> dict[Unit, Usage]:
        """The counters now of every process of the stage, by unit (the sampler's reading):
        notifier's processes, each postgres process, RabbitMQ (and each of its threads), the
        sink's processes, wrk (and its threads), and this process."""
        found: list[tuple[str, str, int]] = []  # group, name, pid
        subject = self.subject.pid if self.subject else None
        for pid in self.server_pids():
            what = "notifier launch (parent)" if pid == subject and children(pid) else "notifier"
            found.append(("server", what, pid))
        for pid in pids_named("postgres"):
            kind, what = self.postgres_role(pid)
            found.append(({"own": "pg_own", "other": "pg_other", "server": "pg_server"}[kind],
                          f"postgres {what}", pid))  # fmt: skip
        found += [("rabbitmq", "beam.smp", pid) for pid in self.beam]
        if (sink := self.sink) is not None:
            found += [("sink", "nginx " + ("master" if pid == sink.proc.pid else "worker"), pid)
                      for pid in sink.pids()]  # fmt: skip
        if (otlp := self.otlp) is not None:
            found += [("otlp_sink", "otlp sink", pid) for pid in otlp.pids()]
        if self.wrk_pid is not None:
            found.append(("wrk", "wrk", self.wrk_pid))
        found.append(("bench", "bench", os.getpid()))
        out: dict[Unit, Usage] = {}
        for group, what, pid in found:
            if (now := usage(pid)) is not None:
                out[Unit(group, f"{what} {pid}")] = now
            if group in ("rabbitmq", "wrk"):  # multi-threaded: a thread is what saturates
                for thread, counters in thread_usage(pid).items():
                    out[Unit(group, f"{what} thread {thread}", thread=True)] = counters
        return out

    def say(self, text: str) -> None:
        print(text, flush=True)

    def start_notifier(
        self,
        roles: str,
        level: str = "INFO",
        traced_every: float | None = None,
        traced_frames: int = 1,
        wait: bool = True,
        processes: int = 1,
        tag: str = "",
        config_extra: str = "",
        pythonpath: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start notifier with ``roles`` (in ``processes`` processes); with ``wait``, return once
        it logged that it runs (an INFO line: below INFO a caller has its own sign, such as the
        first webhook). ``config_extra`` is appended to its config (named with ``tag``), and
        ``pythonpath`` put first on its PYTHONPATH (another checkout's ``src``)."""
        suffix = f"-{tag}" if tag else ""
        config = self.tmp / f"notifier-{level}{suffix}.toml"
        notifier_config(config, self.scratch, self.port, level, config_extra)
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
        if pythonpath is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
        name = f"notifier-{roles.replace(',', '+')}-{level}{suffix}"
        if processes > 1:
            name += f"-x{processes}"
        log = self.tmp / f"{name}.log"
        offset = log.stat().st_size if log.exists() else 0
        argv = [sys.executable, "-m", "notifier"]
        if traced_every is not None:
            argv = [sys.executable, str(HERE / "traced.py"), str(self.tmp / "trace.txt"),
                    str(traced_every), str(traced_frames)]  # fmt: skip
        argv += ["run", "--role", roles, "--config", str(config)]
        if processes > 1:
            argv += ["--processes", str(processes)]
        running = b"notifier running" if processes == 1 else b"launch running"
        proc = self.procs.start(name, argv, env)

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"notifier exited {proc.returncode}; see {log}")
            with log.open("rb") as f:
                f.seek(offset)
                return running in f.read()

        self.subject = proc
        if wait:
            wait_for(ready, 60, f"notifier {roles} to start")
        return proc

    def stop_subject(self) -> None:
        if self.subject is not None:
            code = self.procs.stop(self.subject)
            if code not in (0, -15):
                self.say(f"warning: the measured process exited {code}")
            self.subject = None

    def run_wrk(self, url: str, *, path: str, batch: int, event_type: str, seconds: float,
                connections: int, delay_ms: float = 0.0,
                payload: str = "") -> WrkResult:  # fmt: skip
        proc, out = start_wrk(
            self.procs, self.tmp, url, key=self.scratch.key, path=path, batch=batch,
            event_type=event_type, seconds=seconds, connections=connections, delay_ms=delay_ms,
            payload=payload,
        )  # fmt: skip
        # reap it ourselves: its CPU time comes with it (its /proc entry is gone afterwards)
        self.wrk_pid = proc.pid
        try:
            _, status, rusage = os.wait4(proc.pid, 0)
        finally:
            self.wrk_pid = None
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.wrk_cpu += rusage.ru_utime + rusage.ru_stime
        if not out.exists():
            raise RuntimeError(f"wrk exited {proc.returncode} without figures; see {self.tmp}")
        from bench.sink import wrk_result

        return wrk_result(proc, out, 5)

    def measure(self) -> Callable[[], tuple[dict[str, float], Window]]:
        """Start measuring CPU; the returned function ends it: CPU seconds per group, the wall
        seconds and the machine's busy seconds in between, and each process's busy fraction
        sampled every half second."""
        before = self.cpu.read()
        wrk0 = self.wrk_cpu
        machine0 = machine_busy()
        t0 = time.monotonic()
        sampler = self.sampler = Sampler(self.units).start()

        def stop() -> tuple[dict[str, float], Window]:
            self.sampler = None
            tracker = sampler.stop()
            spent = CpuGroups.spent(before, self.cpu.read())
            wall = time.monotonic() - t0
            spent["wrk"] = self.wrk_cpu - wrk0
            spent["harness"] = spent["sink"] + spent["wrk"]  # the load generator and the sink
            summary = tracker.summary(["server"])
            return spent, Window(wall, machine_busy() - machine0, cores(), summary)

        return stop

    # -- stages --

    # -- baselines --

    def baseline_asyncio(self, loop: str, http: str) -> subprocess.Popen[bytes]:
        # a module of the bench package (as ``python -m bench`` is run: from the repository)
        argv = [sys.executable, "-m", "bench.baseline_asyncio", "--pg", self.scratch.db_url,
                "--amqp", self.scratch.amqp_url, "--loop", loop, "--http", http]  # fmt: skip
        self.subject = self.procs.start(f"baseline-{loop}-{http}", argv)
        return self.subject

    def baseline_quart(self) -> None:
        argv = [sys.executable, str(HERE / "baseline_quart.py"), "--bind",
                f"127.0.0.1:{self.port}"]  # fmt: skip
        self.subject = self.procs.start("baseline-quart", argv)
        wait_for(lambda: listening(self.port), 30, "the quart-trio baseline")

    # -- the whole run --

    def close(self) -> None:
        try:
            if self.sampler is not None:  # a stage failed while measured
                self.sampler.stop()
            self.stop_subject()
        finally:
            self.procs.close()
            self.scratch.drop()
