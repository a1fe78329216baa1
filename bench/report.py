"""The printed table, the ratios to the baselines, the JSON figures and the chart."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.stage import Stage

GROUPS = ("server", "postgres", "pg_own", "rabbitmq", "harness")
# Postgres and RabbitMQ are shared with whatever else runs on the machine: "postgres" is every
# postgres process, "pg_own" only the backends connected to the scratch database.
# (notifier's stage, its baseline, what the ratio is of)
PAIRS = (
    ("delivery", "asyncio", "delivery (log INFO) vs asyncio + httpx"),
    ("delivery", "asyncio_h11", "delivery (log INFO) vs asyncio + h11"),
    ("delivery", "uvloop_aiohttp", "delivery (log INFO) vs uvloop + aiohttp"),
    ("delivery_warning", "asyncio", "delivery (log WARNING) vs asyncio + httpx"),
    ("delivery_warning", "asyncio_h11", "delivery (log WARNING) vs asyncio + h11"),
    ("delivery_warning", "uvloop_aiohttp", "delivery (log WARNING) vs uvloop + aiohttp"),
    ("ingest_single", "quart", "POST /v1/events vs bare quart-trio"),
)


def _ms(value: float | None) -> str:
    return f"{value:8.0f}" if value is not None else f"{'':8}"


def header() -> str:
    return (
        f"{'stage':<46} {'items':>7} {'s':>6} {'per s':>8} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} | CPU s / 1,000: {'server':>6} {'pg all':>6} {'pg own':>6} {'rabbit':>6} "
        f"{'harness':>7}"
    )


def line(s: Stage) -> str:
    cpu = [s.per_1000(g) for g in GROUPS]
    cells = " ".join(
        f"{c:{w}.2f}" if c is not None else " " * w
        for c, w in zip(cpu, (6, 6, 6, 6, 7), strict=True)
    )
    text = (
        f"{s.name:<46} {s.items:>7} {s.seconds:6.1f} {s.rate:8.0f} {_ms(s.p50_ms)} "
        f"{_ms(s.p95_ms)} {_ms(s.p99_ms)} | {'':15}{cells}"
    )
    if note := s.extra.get("note"):
        text += f"\n{'':4}! {note}"
    return text


def ratio_values(stages: list[Stage]) -> dict[str, dict[str, float]]:
    by = {s.key: s for s in stages}
    out: dict[str, dict[str, float]] = {}
    for ours, theirs, _ in PAIRS:
        if ours in by and theirs in by:
            a, b = by[ours], by[theirs]
            per_a, per_b = a.per_1000("server"), b.per_1000("server")
            all_a = sum(a.per_1000(g) or 0 for g in ("server", "pg_own", "rabbitmq"))
            all_b = sum(b.per_1000(g) or 0 for g in ("server", "pg_own", "rabbitmq"))
            out[f"{ours}/{theirs}"] = {
                "rate": a.rate / b.rate if b.rate else 0.0,
                "cpu_per_item": per_a / per_b if per_a and per_b else 0.0,
                "cpu_per_item_with_pg_and_rabbitmq": all_a / all_b if all_b else 0.0,
            }
    return out


def ratios(stages: list[Stage]) -> str:
    values = ratio_values(stages)
    lines = ["", "notifier / baseline, same run:"]
    for ours, theirs, what in PAIRS:
        if (v := values.get(f"{ours}/{theirs}")) is not None:
            lines.append(
                f"  {what:<42} rate {v['rate']:5.2f}x   CPU per item {v['cpu_per_item']:5.2f}x "
                f"(with its Postgres backends and RabbitMQ "
                f"{v['cpu_per_item_with_pg_and_rabbitmq']:.2f}x)"
            )
    return "\n".join(lines)


SCALED = (("scale_ingest", "ingest, POST /v1/events"), ("scale_delivery", "delivery"))
# the groups of the cores-busy table: the stage's own processes (bench/harness.py), in order
BUSY = (
    ("server", "notifier"), ("pg_own", "pg own"), ("pg_server", "pg srv"), ("rabbitmq", "rabbit"),
    ("sink", "sink"), ("wrk", "wrk"), ("bench", "bench"),
)  # fmt: skip
# how the statement names them; Postgres's share is its backends of the scratch database and its
# server processes (checkpointer, walwriter…), not the backends of other databases
NAMES = {"server": "notifier", "postgres": "postgres", "rabbitmq": "rabbitmq", "sink": "nginx",
         "wrk": "wrk", "bench": "bench"}  # fmt: skip
# a sampled mean busy fraction at or above this is a process (or thread) at its one core
SATURATED = 0.9


def _busy_groups(s: Stage) -> dict[str, float]:
    """Cores busy per group of the stage's own processes, Postgres's two groups together."""
    out: dict[str, float] = {}
    for group, _ in BUSY:
        if (v := s.cores_busy(group)) is not None:
            key = "postgres" if group.startswith("pg_") else group
            out[key] = out.get(key, 0.0) + v
    return out


def utilisation(s: Stage) -> dict[str, Any] | None:
    """What a stage's processes kept busy over its measured window: cores per group and CPU s
    per 1,000 items, the whole machine's busy cores and what of it was not the stage's (other
    users, other databases' backends), and the single process (or thread of RabbitMQ or wrk)
    closest to one core, from the sampled busy fractions: the one that asked most of its core,
    on it (busy) or runnable and waiting for it (the machine's cores are shared)."""
    w = s.window
    if w is None or w.seconds <= 0:
        return None
    ours = sum(s.cores_busy(g) or 0.0 for g, _ in BUSY)
    machine = w.machine_cpu / w.seconds
    candidates = [
        b for b in w.busy.get("busiest", [])
        # one core is the limit of a process of notifier, postgres, nginx, and of a thread
        # of the multi-threaded ones (beam.smp's schedulers, wrk's)
        if b["group"] in {g for g, _ in BUSY}
        and b["thread"] == (b["group"] in ("rabbitmq", "wrk"))
    ]  # fmt: skip
    busiest = max(candidates, key=lambda b: (b["mean"] + b["wait"], b["peak"]), default=None)
    return {
        "seconds": w.seconds, "cores": w.cores,
        "cores_busy": {g: s.cores_busy(g) for g, _ in BUSY},
        "cpu_per_1000": {g: s.per_1000(g) for g, _ in BUSY},
        "groups": _busy_groups(s), "ours": ours, "machine": machine,
        "others": max(0.0, machine - ours),
        "busiest": busiest,
        "saturated": [b for b in candidates if b["mean"] + b["wait"] >= SATURATED],
        # each of notifier's processes, then the busiest of each other group
        "each": w.busy.get("processes", []) + [b for b in candidates if b["group"] != "server"],
        # the cores notifier's processes would have taken: on a core or runnable and waiting
        "notifier_asked": sum(b["mean"] + b["wait"] for b in w.busy.get("processes", [])),
        "group_peak": w.busy.get("group_peak", {}), "machine_peak": w.busy.get("machine_peak"),
    }  # fmt: skip


def _processes(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def verdict(what: str, n: int, u: dict[str, Any]) -> str:
    """One sentence from a stage's figures: the cores it used and which process saturates."""
    cores = u["cores"]
    top = sorted(u["groups"].items(), key=lambda kv: kv[1], reverse=True)
    parts = ", ".join(f"{NAMES[g]} {v:.2f}" for g, v in top if v >= 0.005)
    text = (
        f"{what} with {_processes(n)} uses {u['ours']:.2f} of {cores} cores ({parts}); "
        f"the machine {u['machine']:.2f} busy ({u['others']:.2f} of it other load)"
    )
    b = u["busiest"]
    if b is None:
        return text + "; no per-process samples"
    asked = b["mean"] + b["wait"]
    who = f"{b['name']} at {b['mean']:.2f} of a core (peak {b['peak']:.2f})"
    if b["mean"] >= SATURATED:
        return text + f"; the first to saturate: {who}"
    if asked >= SATURATED:
        return (
            text + f"; the first to saturate: {b['name']}, runnable {asked:.2f} of the time "
            f"(on a core {b['mean']:.2f}, waiting for one {b['wait']:.2f}): CPU-bound, it would "
            f"take a whole core that the shared cores did not give it"
        )
    if u["machine"] >= SATURATED * cores:
        big = NAMES[top[0][0]] if top else "?"
        return (
            text + f"; no process asks for a whole core but the {cores} cores are full: the "
            f"machine is the ceiling, {big} its biggest consumer (busiest process: {who}; "
            f"notifier's processes runnable {u['notifier_asked']:.2f} cores' worth)"
        )
    return (
        text + f"; nothing saturated and cores left idle: the limit is waiting, not CPU "
        f"(busiest process: {who}, runnable {asked:.2f} of the time)"
    )


def scaling_values(stages: list[Stage]) -> dict[str, dict[str, Any]]:
    """Per scaled stage: the rate and notifier's CPU per 1,000 with 1 and 2 processes, and
    the ratios of 2 to 1; what each stage kept busy (``utilisation``, under "processes"); and
    under "ceiling" the statements of where the ceiling is on the machine's cores."""
    by = {s.key: s for s in stages}
    out: dict[str, dict[str, Any]] = {}
    statements = []
    for key, what in SCALED:
        one, two = by.get(f"{key}_1"), by.get(f"{key}_2")
        if one is None or two is None:
            continue
        cpu1, cpu2 = one.per_1000("server") or 0.0, two.per_1000("server") or 0.0
        out[key] = {
            "rate_1": one.rate, "rate_2": two.rate,
            "rate_ratio": two.rate / one.rate if one.rate else 0.0,
            "cpu_per_1000_1": cpu1, "cpu_per_1000_2": cpu2,
            "cpu_ratio": cpu2 / cpu1 if cpu1 else 0.0,
        }  # fmt: skip
        used = {str(n): utilisation(s) for n, s in ((1, one), (2, two))}
        out[key]["processes"] = used
        statements += [verdict(what, int(n), u) for n, u in used.items() if u is not None]
    if statements:
        out["ceiling"] = {"cores": max((s.window.cores for s in stages if s.window), default=0),
                          "statements": statements}  # fmt: skip
    return out


def _busy(b: dict[str, Any]) -> str:
    return f"{b['name']} {b['mean']:.2f}+{b['wait']:.2f} (peak {b['peak']:.2f})"


def _cells(values: list[float | None], width: int = 7) -> str:
    return " ".join(f"{v:{width}.2f}" if v is not None else " " * width for v in values)


def scaling(stages: list[Stage]) -> str:
    values = scaling_values(stages)
    if not values:
        return ""
    lines = ["", "scaling, --processes 2 / --processes 1, same run (CPU: notifier's processes):"]
    for key, what in SCALED:
        if (v := values.get(key)) is not None:
            lines.append(
                f"  {what:<26} {v['rate_1']:7.0f}/s -> {v['rate_2']:7.0f}/s  "
                f"rate {v['rate_ratio']:4.2f}x   CPU s per 1,000 {v['cpu_per_1000_1']:5.2f} -> "
                f"{v['cpu_per_1000_2']:5.2f} ({v['cpu_ratio']:4.2f}x)"
            )
    heads = " ".join(f"{h:>7}" for _, h in BUSY)
    lines += [
        "",
        "where the CPU went: cores busy (CPU s / wall s of the measured window) and CPU s per "
        "1,000 items;",
        "per process (or thread), sampled every 0.5 s: mean busy fraction of one core + mean "
        "fraction runnable",
        "but waiting for a core, and the peak busy fraction; the busiest is the one that asked "
        "most of its core:",
        f"  {'':<36} {heads} | {'stage':>7} {'machine':>7} {'other':>7}",
    ]
    for key, what in SCALED:
        for n, u in (values.get(key, {}).get("processes") or {}).items():
            if u is None:
                continue
            busy = [u["cores_busy"][g] for g, _ in BUSY]
            per = [u["cpu_per_1000"][g] for g, _ in BUSY]
            total = sum(p or 0.0 for p in per)
            lines += [
                f"  {what}, {_processes(int(n))}",
                f"    {'cores busy':<34} {_cells(busy)} | "
                f"{_cells([u['ours'], u['machine'], u['others']])}",
                f"    {'CPU s per 1,000':<34} {_cells(per)} | {_cells([total])}",
            ]
            if b := u["busiest"]:
                sat = ", saturated" if b["mean"] + b["wait"] >= SATURATED else ""
                lines.append(f"    busiest: {_busy(b)}{sat}")
            # each of notifier's processes, and the others that asked for 1 % of a core or more
            shown = [
                b for b in u["each"] if b["group"] == "server" or b["mean"] + b["wait"] >= 0.01
            ]
            lines.append("    " + "; ".join(_busy(b) for b in shown))
    ceiling = values.get("ceiling")
    if ceiling:
        lines += ["", f"ceiling on {ceiling['cores']} cores:"]
        lines += [f"  {text}" for text in ceiling["statements"]]
    return "\n".join(lines)


def _scaled_cores(values: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, utilisation) of each scaling stage in ``scaling_values`` (as in the JSON)."""
    out = []
    for key, what in SCALED:
        for n, u in (values.get(key, {}).get("processes") or {}).items():
            if u is not None:
                out.append((f"{what.split(',')[0]}\n{_processes(int(n))}", u))
    return out


def memory(stages: list[Stage]) -> str:
    lines = []
    for s in stages:
        if "rss_peak_kib" in s.extra:
            lines.append(
                f"  {s.extra['server']:<26} draining {s.extra['backlog']:>7}: RSS peak "
                f"{s.extra['rss_peak_kib'] / 1024:6.1f} MiB, at the end "
                f"{s.extra['rss_end_kib'] / 1024:6.1f} MiB  ({s.name.strip()})"
            )
    return "\n".join(["", "memory:", *lines]) if lines else ""


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                model = text.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "loadavg": load}  # fmt: skip


def machine() -> str:
    m = machine_info()
    return (
        f"machine: {m['cpus']} CPUs ({m['cpu_model']}), Linux {m['kernel']}, Python {m['python']}, "
        f"load average {m['loadavg'][0]:.2f}"
    )


def chart(result: dict[str, Any], path: Path) -> None:
    """Rates against the baselines, CPU per item, and the paced latency distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    by = {s["key"]: s for s in result["stages"]}
    # four pairs of bars side by side: the bar panels get the width their labels need
    fig, axes = plt.subplots(1, 3, figsize=(19, 4.5), gridspec_kw={"width_ratios": (4, 4, 3)})
    pairs = [
        ("delivery", "asyncio", "delivery\nvs asyncio + httpx"),
        ("delivery", "asyncio_h11", "delivery\nvs asyncio + h11"),
        ("delivery", "uvloop_aiohttp", "delivery\nvs uvloop + aiohttp"),
        ("ingest_single", "quart", "POST /v1/events\nvs bare quart-trio"),
    ]
    labels, ours, theirs, cpu_ours, cpu_theirs = [], [], [], [], []
    for a, b, label in pairs:
        if a in by and b in by:
            labels.append(label)
            ours.append(by[a]["rate"])
            theirs.append(by[b]["rate"])
            cpu_ours.append(by[a]["cpu_per_1000"]["server"])
            cpu_theirs.append(by[b]["cpu_per_1000"]["server"])
    x = range(len(labels))
    for ax, (mine, base, title) in zip(
        axes[:2],
        ((ours, theirs, "items per second"), (cpu_ours, cpu_theirs, "CPU s per 1,000 (process)")),
        strict=True,
    ):
        if not labels:  # a run with no stage and its baseline (--scaling): no empty frame
            ax.axis("off")
            continue
        ax.bar([i - 0.2 for i in x], mine, 0.4, label="notifier")
        ax.bar([i + 0.2 for i in x], base, 0.4, label="baseline")
        ax.set_xticks(list(x), labels, fontsize=9)
        ax.set_title(title)
        ax.legend()
    lat = result["samples"].get("paced.latency_ms") or []
    ax = axes[2]
    if lat:
        ordered = sorted(lat)
        ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))])
        ax.set_xscale("log")
        # plain numbers at 1, 2 and 5 of each decade, none on the other ticks (they overlap)
        ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        paced = by.get("paced", {})
        ax.set_title(f"ingest→delivered at {paced.get('rate', 0):.0f} events/s")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction delivered")
        ax.grid(True, which="both", alpha=0.3)
    elif used := _scaled_cores(result.get("scaling") or {}):
        # a run without the paced stage but with the scaling stages (--scaling): their cores
        ax.set_title("scaling: cores busy (x: the whole machine)")
        bottom = [0.0] * len(used)
        for group, head in BUSY:
            heights = [u["cores_busy"].get(group) or 0.0 for _, u in used]
            ax.bar(range(len(used)), heights, 0.6, bottom=bottom, label=head)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.plot(range(len(used)), [u["machine"] for _, u in used], "kx", label="machine")
        ax.axhline(used[0][1]["cores"], color="grey", linewidth=0.8)
        ax.set_ylim(0, used[0][1]["cores"] * 1.4)  # room above the cores' line for the legend
        ax.set_xticks(range(len(used)), [label for label, _ in used], fontsize=9)
        ax.legend(fontsize=7, ncol=4, loc="upper center")
    else:  # a run without the paced stage (--delivery): no empty frame
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
