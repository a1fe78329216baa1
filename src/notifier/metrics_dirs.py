"""The metrics directories of launches (``$PROMETHEUS_MULTIPROC_DIR``), in the temp directory.

A launch removes its directory when it ends; one killed with SIGKILL cannot. So each directory
is named after its owner, ``notifier-metrics-<pid>-<start>-<random>`` (``<start>``: the owner's
start time in clock ticks after boot, from ``/proc/<pid>/stat``, so that another process given
the same pid later is not taken for it), and a launch that starts removes the directories of
owners that are gone. Only directories of that shape, of this user, are ever removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("notifier.launch")

PREFIX = "notifier-metrics-"
_NAME = re.compile(re.escape(PREFIX) + r"(\d+)-(\d+)-[A-Za-z0-9_]+")


def process_start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    """When process ``pid`` started, in clock ticks after boot; ``None`` if there is no such
    process (or no ``/proc`` to tell)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # pid (comm) state ppid …: comm may hold spaces and parentheses; the fields after its
    # last ")" start with the state (field 3); the start time is field 22.
    fields = stat.rpartition(")")[2].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def sweep_stale_metrics_dirs(parent: str | None = None, proc: Path = Path("/proc")) -> list[str]:
    """Remove the metrics directories in ``parent`` (the temp directory) whose launch is gone;
    the paths removed."""
    if process_start_time(os.getpid(), proc) is None:
        return []  # no /proc: no owner can be told alive or dead
    where = parent if parent is not None else tempfile.gettempdir()
    removed = []
    with contextlib.suppress(OSError), os.scandir(where) as entries:
        for entry in entries:
            found = _NAME.fullmatch(entry.name)
            if found is None or not entry.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                    continue
                if process_start_time(int(found[1]), proc) == int(found[2]):
                    continue  # its launch is running
                shutil.rmtree(entry.path)
                removed.append(entry.path)
                log.info("removed the metrics directory of a launch that is gone: %s",
                         entry.path)  # fmt: skip
    return removed


@contextlib.contextmanager
def metrics_directory(parent: str | None = None) -> Iterator[str]:
    """A new metrics directory of this launch (stale ones swept first), removed at the end."""
    sweep_stale_metrics_dirs(parent)
    start = process_start_time(os.getpid()) or 0
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{start}-", dir=parent)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
