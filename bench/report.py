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


def scaling_values(stages: list[Stage]) -> dict[str, dict[str, float]]:
    """Per scaled stage: the rate and notifier's CPU per 1,000 with 1 and 2 processes, and
    the ratios of 2 to 1."""
    by = {s.key: s for s in stages}
    out: dict[str, dict[str, float]] = {}
    for key, _ in SCALED:
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
    return out


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
    return "\n".join(lines)


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
    else:  # a run without the paced stage (--delivery, --scaling): no empty frame
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
