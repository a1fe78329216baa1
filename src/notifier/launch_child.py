"""A process of a launch, as its parent (``notifier.launch``) sees it: how it says it is ready,
and how it ends with its parent.

The parent starts each child with ``PR_SET_PDEATHSIG`` (SIGTERM when the parent dies), set in the
child between fork and exec. A parent that died before that call leaves a child the signal will
never reach: so the child checks, right after the call and again before it starts its roles,
that its parent is still the launch's (``$NOTIFIER_LAUNCH_PID``), and exits at once if not.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable, Mapping

READY_FD_ENV = "NOTIFIER_READY_FD"
# The pid of the launch's parent, which a child compares with its own parent's.
LAUNCH_PID_ENV = "NOTIFIER_LAUNCH_PID"
EXIT_ORPHANED = 1
_PR_SET_PDEATHSIG = 1


def notify_ready(environ: Mapping[str, str] = os.environ) -> None:
    """In a child of a launch: tell the parent that every role has started."""
    if fd := environ.get(READY_FD_ENV):
        with contextlib.suppress(OSError):
            os.write(int(fd), b"1")
            os.close(int(fd))


def orphaned(environ: Mapping[str, str] = os.environ) -> int | None:
    """In a child of a launch whose parent is gone (it is another process's child now): the
    pid of that parent. ``None`` otherwise, and outside a launch."""
    given = environ.get(LAUNCH_PID_ENV, "")
    if not given.isdigit():
        return None
    return int(given) if os.getppid() != int(given) else None


def die_with_parent(parent_pid: int) -> Callable[[], None]:
    """The ``preexec_fn`` of a child of ``parent_pid``: SIGTERM it when the parent dies (Linux),
    and end it at once if the parent died before that was asked."""

    def preexec() -> None:
        if sys.platform == "linux":
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:
            os._exit(EXIT_ORPHANED)

    return preexec
