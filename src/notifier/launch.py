"""``notifier run --processes N``: a small parent that supervises N processes of notifier.

The parent is plain blocking Python, not trio: it does no network I/O of its own, only starts
processes, waits for them and forwards signals, and a child must never inherit an event loop
(each child is a fresh interpreter, ``python -m notifier run --processes 1``, with its own trio
loop). Before the first child starts, the parent has loaded and validated the config and bound
the ingest port, so a bad config or a taken port fails the launch once, not N times.

What the children share, the parent made:

- the ingest port: the listening sockets, inherited (``$NOTIFIER_LISTEN_FDS``); every child
  accepts on them, so clients see one address and a busy child simply accepts less; the same
  for ``ingest.metrics_bind`` when set (``$NOTIFIER_METRICS_LISTEN_FDS``);
- the metrics directory (``$PROMETHEUS_MULTIPROC_DIR``), a temporary directory removed at the
  end, so ``/metrics`` reports the whole launch (``notifier.metrics``); named after the parent,
  so the next launch removes it when this one could not (killed: ``notifier.metrics_dirs``);
- a readiness pipe per child (``$NOTIFIER_READY_FD``): the child writes one byte once every role
  has started; and the parent's pid (``$NOTIFIER_LAUNCH_PID``): a child whose parent is already
  gone exits at once (``notifier.launch_child``).

A child that exits is started again after a backoff (``RestartPolicy``), and logged with its exit
code. A child that exits before it was ready failed to start; when one slot fails to start
``max_start_failures`` times in a row, the launch stops every child and exits 1 — at once, and with
2, when the child refused the config (what only a child checks, such as the secrets of the
``workers`` role). A child the parent cannot start again (no process, no pipe, no interpreter)
counts as a failed start too, and so does a child not ready within ``start_timeout_seconds``
(it is killed); should the parent itself fail, it still stops every child gracefully
before it kills what is left. SIGTERM or SIGINT is passed on to every child (a second one too, even
when both came together: the children stop at once); the parent waits ``shutdown_grace_seconds``
plus a margin, kills what is left, and exits 0 when every child stopped by itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import FrameType

from prometheus_client.multiprocess import mark_process_dead

from notifier.console.session import share_session_secret
from notifier.ingest.metrics_access import METRICS_LISTEN_FDS_ENV
from notifier.ingest.serve import LISTEN_FDS_ENV, Listeners, open_listeners
from notifier.launch_child import LAUNCH_PID_ENV, READY_FD_ENV, die_with_parent
from notifier.launch_policy import RestartPolicy as RestartPolicy  # as it always was
from notifier.launch_policy import describe_exit
from notifier.metrics import MULTIPROC_DIR_ENV
from notifier.metrics_dirs import metrics_directory

log = logging.getLogger("notifier.launch")

EXIT_USAGE = 2  # a child's exit code for a config it refuses (as notifier.cli)
# What the parent waits for beyond the grace period: a child's own bound (grace + 1 s) plus
# closing its pools and connections.
SHUTDOWN_MARGIN_SECONDS = 5.0
# Between two SIGTERMs to a child: two sent closer together may reach it as one.
SIGNAL_GAP_SECONDS = 0.2
START_TIMEOUT_SECONDS = 60.0  # service.start_timeout_seconds
DEFAULT_POLICY = RestartPolicy()


@dataclass
class Slot:
    """One of the N places of the launch, and the child that fills it now."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None  # the parent's end of the child's readiness pipe
    ready: bool = False
    started_at: float = 0.0
    exits_in_a_row: int = 0
    start_failures_in_a_row: int = 0
    start_due: float = 0.0  # when the next child starts (while ``proc`` is None)


class Launch:
    """The parent of ``count`` children, each started with ``argv`` (plus the environment the
    launch adds); ``run()`` returns the parent's exit code."""

    def __init__(
        self,
        argv: Sequence[str],
        count: int,
        *,
        listeners: Listeners | None,
        grace_seconds: float,
        policy: RestartPolicy = DEFAULT_POLICY,
        shutdown_margin_seconds: float = SHUTDOWN_MARGIN_SECONDS,
        start_timeout_seconds: float = START_TIMEOUT_SECONDS,
        metrics_listeners: Listeners | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._argv = list(argv)
        self._listeners = listeners
        self._metrics_listeners = metrics_listeners
        self._start_timeout = start_timeout_seconds
        self._grace_seconds = grace_seconds
        self._margin_seconds = shutdown_margin_seconds
        self._policy = policy
        self._clock = clock
        self._slots = [Slot(i) for i in range(count)]
        self._signals: list[int] = []
        self._metrics_dir = ""
        self._all_ready_logged = False

    # -- the loop --

    def run(self) -> int:
        with self._signal_wakeup() as wakeup, metrics_directory() as self._metrics_dir:
            selector = selectors.DefaultSelector()
            selector.register(wakeup, selectors.EVENT_READ)
            try:
                for slot in self._slots:
                    self._start(slot, selector)
                return self._supervise(selector, wakeup)
            except Exception:
                # The parent itself failed: the children still stop gracefully, each draining
                # what it holds, before what is left is killed.
                log.exception("launch failed: stopping every process")
                self._stop_all(selector)
                raise
            finally:
                self._kill_all()
                selector.close()

    def _supervise(self, selector: selectors.BaseSelector, wakeup: int) -> int:
        while True:
            for key, _ in selector.select(timeout=0.1):
                if key.fd == wakeup:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wakeup, 512)
                else:
                    self._on_ready(key.fd, selector)
            if self._signals:
                return self._shutdown(selector)
            for slot in self._slots:
                self._kill_if_late(slot)
                if slot.proc is not None and slot.proc.poll() is not None:
                    if (code := self._on_exit(slot, selector)) is not None:
                        self._stop_all(selector)
                        return code
                elif slot.proc is None and self._clock() >= slot.start_due:
                    code = self._start_again(slot, selector)
                    if code is not None:
                        self._stop_all(selector)
                        return code

    def _start_again(self, slot: Slot, selector: selectors.BaseSelector) -> int | None:
        """Start ``slot``'s child again. When the parent cannot (no pipe, no process, no
        interpreter: EAGAIN, ENOMEM, EMFILE, ENOENT), that is a failed start, with its
        backoff; or, when it is time to give up, the launch's exit code."""
        try:
            self._start(slot, selector)
        except (OSError, subprocess.SubprocessError) as exc:
            slot.start_failures_in_a_row += 1
            slot.exits_in_a_row += 1
            if slot.start_failures_in_a_row >= self._policy.max_start_failures:
                log.error("process %d could not be started: %r", slot.index, exc)
                log.error("process %d failed to start %d times in a row: stopping the launch",
                          slot.index, slot.start_failures_in_a_row)  # fmt: skip
                return 1
            delay = self._policy.delay(slot.exits_in_a_row)
            log.error("process %d could not be started: %r; trying again in %.1f s",
                      slot.index, exc, delay)  # fmt: skip
            slot.start_due = self._clock() + delay
        return None

    def _start(self, slot: Slot, selector: selectors.BaseSelector) -> None:
        read_fd, write_fd = os.pipe()
        fds = [write_fd]
        env = dict(os.environ)
        env[MULTIPROC_DIR_ENV] = self._metrics_dir
        env[READY_FD_ENV] = str(write_fd)
        env[LAUNCH_PID_ENV] = str(os.getpid())
        for listeners, var in ((self._listeners, LISTEN_FDS_ENV),
                               (self._metrics_listeners, METRICS_LISTEN_FDS_ENV)):  # fmt: skip
            if listeners is not None:
                fds += listeners.filenos()
                env[var] = ",".join(map(str, listeners.filenos()))
        try:
            slot.proc = subprocess.Popen(
                self._argv, env=env, pass_fds=fds, stdin=subprocess.DEVNULL,
                # Its own process group: a Ctrl-C in a terminal reaches the parent only, which
                # passes it on once (a second signal would stop a child at once).
                process_group=0, preexec_fn=die_with_parent(os.getpid()),
            )  # fmt: skip
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        selector.register(read_fd, selectors.EVENT_READ)
        slot.ready_fd, slot.ready, slot.started_at = read_fd, False, self._clock()
        log.info("process %d started (pid %d)", slot.index, slot.proc.pid)

    def _on_ready(self, fd: int, selector: selectors.BaseSelector) -> None:
        slot = next(s for s in self._slots if s.ready_fd == fd)
        try:
            said = os.read(fd, 16)  # one byte when ready; end of file when it exited before
        except BlockingIOError:
            return
        self._close_ready(slot, selector)
        if said and slot.proc is not None:
            slot.ready, slot.start_failures_in_a_row = True, 0
            log.info("process %d ready (pid %d)", slot.index, slot.proc.pid)
            if not self._all_ready_logged and all(s.ready for s in self._slots):
                self._all_ready_logged = True
                log.info("launch running: %d processes", len(self._slots))

    def _kill_if_late(self, slot: Slot) -> None:
        """Kill ``slot``'s child when it is not ready within the start timeout: its exit is
        then a failed start, as any exit before it was ready."""
        proc = slot.proc
        if proc is None or slot.ready or self._clock() - slot.started_at < self._start_timeout:
            return
        if proc.poll() is None:
            log.error("process %d (pid %d) not ready within %.1f s: killing it", slot.index,
                      proc.pid, self._start_timeout)  # fmt: skip
            proc.kill()
            proc.wait()

    def _on_exit(self, slot: Slot, selector: selectors.BaseSelector) -> int | None:
        """Note the exit of ``slot``'s child and plan its restart; or, when it is time to give
        up, the launch's exit code."""
        assert slot.proc is not None
        code, pid, ran = slot.proc.returncode, slot.proc.pid, self._clock() - slot.started_at
        if slot.ready_fd is not None:
            self._on_ready(slot.ready_fd, selector)  # a byte it wrote just before it exited
        self._close_ready(slot, selector)
        mark_process_dead(pid, self._metrics_dir)  # type: ignore[no-untyped-call]
        slot.proc = None
        if slot.ready:
            slot.start_failures_in_a_row = 0
        else:
            slot.start_failures_in_a_row += 1
        healthy = slot.ready and ran >= self._policy.healthy_after_seconds
        slot.exits_in_a_row = 1 if healthy else slot.exits_in_a_row + 1
        if not slot.ready and code == EXIT_USAGE:
            # The child refused the config (a secret its workers need, say): no retry mends it.
            log.error("process %d (pid %d) refused the config: stopping the launch", slot.index,
                      pid)  # fmt: skip
            return EXIT_USAGE
        if slot.start_failures_in_a_row >= self._policy.max_start_failures:
            log.error("process %d (pid %d) exited %s before it was ready", slot.index, pid,
                      describe_exit(code))  # fmt: skip
            log.error("process %d failed to start %d times in a row: stopping the launch",
                      slot.index, slot.start_failures_in_a_row)  # fmt: skip
            return 1
        delay = self._policy.delay(slot.exits_in_a_row)
        log.error(
            "process %d (pid %d) exited %s %s; starting it again in %.1f s", slot.index, pid,
            describe_exit(code), f"after {ran:.1f} s" if slot.ready else "before it was ready",
            delay,
        )  # fmt: skip
        slot.start_due = self._clock() + delay
        return None

    def _close_ready(self, slot: Slot, selector: selectors.BaseSelector) -> None:
        if slot.ready_fd is not None:
            selector.unregister(slot.ready_fd)
            os.close(slot.ready_fd)
            slot.ready_fd = None

    # -- stopping --

    def _shutdown(self, selector: selectors.BaseSelector) -> int:
        name = signal.Signals(self._signals[0]).name
        log.info("%s: stopping %d processes (grace %.1f s)", name,
                 sum(s.proc is not None for s in self._slots), self._grace_seconds)  # fmt: skip
        return 0 if self._stop_all(selector) else 1

    def _stop_all(self, selector: selectors.BaseSelector) -> bool:
        """SIGTERM every child, wait for them (passing on a second signal), kill the rest.
        True when every child stopped by itself (exited 0, or on the SIGTERM itself)."""
        # The first signal is passed on now; a second one noted with it, in the loop (soon).
        forwarded = min(len(self._signals), 1)
        self._signal_children(signal.SIGTERM)
        signalled_at = self._clock()
        for listeners in (self._listeners, self._metrics_listeners):
            # The children close their copies as they stop taking requests; with the parent's
            # gone too, new connections are refused, as by a single process that stops.
            if listeners is not None:
                listeners.close()
        deadline = self._clock() + self._grace_seconds + self._margin_seconds
        clean = True
        while any(s.proc is not None for s in self._slots):
            if self._clock() >= deadline:
                log.error("processes still running after the grace period: killing them")
                self._kill_all()
                return False
            # Not closer to the previous SIGTERM than the gap: a child that has not taken that
            # one yet would take both as one.
            gap_over = self._clock() - signalled_at >= SIGNAL_GAP_SECONDS
            if len(self._signals) > forwarded and gap_over:
                forwarded, signalled_at = len(self._signals), self._clock()
                log.warning("second signal: stopping the processes now")
                self._signal_children(signal.SIGTERM)
            time.sleep(0.05)
            for slot in self._slots:
                if slot.proc is not None and slot.proc.poll() is not None:
                    code = slot.proc.returncode
                    # A child still starting (no signal handler yet) ends on the signal itself.
                    if code not in (0, -signal.SIGTERM):
                        clean = False
                        log.error("process %d (pid %d) exited %s while stopping", slot.index,
                                  slot.proc.pid, describe_exit(code))  # fmt: skip
                    self._close_ready(slot, selector)
                    slot.proc = None
        return clean

    def _signal_children(self, signum: int) -> None:
        for slot in self._slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signum)

    def _kill_all(self) -> None:
        for slot in self._slots:
            if slot.proc is not None:
                if slot.proc.poll() is None:
                    slot.proc.kill()
                slot.proc.wait()
                slot.proc = None
            if slot.ready_fd is not None:
                os.close(slot.ready_fd)
                slot.ready_fd = None

    # -- resources of the parent --

    @contextlib.contextmanager
    def _signal_wakeup(self) -> Iterator[int]:
        """Note SIGTERM/SIGINT in ``self._signals``; the yielded fd becomes readable on one."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)

        def note(signum: int, frame: FrameType | None) -> None:
            self._signals.append(signum)

        previous = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
        old_wakeup = signal.set_wakeup_fd(write_fd)
        try:
            yield read_fd
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for s, handler in previous.items():
                signal.signal(s, handler)
            os.close(read_fd)
            os.close(write_fd)


def child_argv(config_path: str | None, roles: Sequence[str]) -> list[str]:
    """How the parent starts a child: this interpreter, the same config and roles, one process."""
    argv = [sys.executable, "-m", "notifier", "run", "--role", ",".join(roles), "--processes", "1"]
    if config_path is not None:
        argv += ["--config", config_path]
    return argv


def launch(
    config_path: str | None,
    roles: Sequence[str],
    count: int,
    *,
    bind: str | None,
    grace_seconds: float,
    metrics_bind: str | None = None,
    start_timeout_seconds: float = START_TIMEOUT_SECONDS,
    session_secret_env: str = "",
) -> int:
    """Run ``count`` processes of ``roles`` (the config already loaded and checked by the
    caller); ``bind`` is the ingest address when a role serves it, ``metrics_bind`` the
    address of ``/metrics`` when it has one of its own. The exit code."""
    argv = child_argv(config_path, roles)
    if bind is not None:  # the console's: one for all processes, which inherit it
        share_session_secret(session_secret_env, os.environ)
    with contextlib.ExitStack() as owned:
        listeners = owned.enter_context(open_listeners(bind, {})) if bind else None
        metrics = owned.enter_context(open_listeners(metrics_bind, {})) if metrics_bind else None
        where = [*(listeners.binds if listeners else []), *(metrics.binds if metrics else [])]
        log.info("launch: %d processes%s", count,
                 f", listening on {' '.join(where)}" if where else "")  # fmt: skip
        return Launch(
            argv, count, listeners=listeners, metrics_listeners=metrics,
            grace_seconds=grace_seconds, start_timeout_seconds=start_timeout_seconds,
        ).run()  # fmt: skip
