"""notifier's CLI under tracemalloc, for looking for a leak: every EVERY seconds (the first after
a warm-up of EVERY seconds) a snapshot is compared with the first one, and the allocation sites
and object types that grew are appended to OUT.

    python bench/traced.py OUT EVERY FRAMES run --role workers --config FILE

FRAMES is how many frames of each allocation's traceback tracemalloc keeps (1 is the cheapest;
each more slows the process further); 0 leaves tracemalloc off and reports only the cheap
signs: gc-tracked objects by type and ``sys.getallocatedblocks()`` (pymalloc blocks in use),
which grow with any Python-level leak.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path


def _counts() -> Counter[str]:
    return Counter(type(o).__qualname__ for o in gc.get_objects())


def _watch(out: Path, every: float, frames: int) -> None:
    time.sleep(every)
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
    first = tracemalloc.take_snapshot().filter_traces(ignore) if frames else None
    first_counts = _counts()
    first_blocks = sys.getallocatedblocks()
    t0 = time.monotonic()
    while True:
        time.sleep(every)
        counts = _counts()
        blocks = sys.getallocatedblocks()
        lines = [
            f"\n=== {time.monotonic() - t0:.0f} s after the first snapshot: allocated blocks "
            f"{blocks} ({blocks - first_blocks:+d}), gc objects {sum(counts.values())} "
            f"({sum(counts.values()) - sum(first_counts.values()):+d}) ==="
        ]
        if first is not None:
            snap = tracemalloc.take_snapshot().filter_traces(ignore)
            stats = snap.compare_to(first, "traceback")
            grown = sum(s.size_diff for s in stats)
            lines.append(f"traced memory grew {grown / 1024:.1f} KiB; top sites:")
            for stat in stats[:8]:
                if stat.size_diff <= 0:
                    break
                lines.append(f"  +{stat.size_diff / 1024:.1f} KiB, +{stat.count_diff} blocks")
                lines.extend(f"      {line}" for line in stat.traceback.format(limit=frames))
        lines.append("object counts that grew (gc-tracked):")
        diff = Counter({k: v - first_counts.get(k, 0) for k, v in counts.items()})
        lines.extend(f"  {k:<50} {v:+d}" for k, v in diff.most_common(15) if v > 0)
        with out.open("a") as f:
            f.write("\n".join(lines) + "\n")


def main() -> int:
    out, every, frames, argv = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    if frames:
        tracemalloc.start(frames)
    threading.Thread(target=_watch, args=(out, every, frames), daemon=True).start()
    from notifier.cli import main as cli

    return cli(argv)


if __name__ == "__main__":
    sys.exit(main())
