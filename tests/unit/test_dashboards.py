"""The Grafana dashboard (``deploy/grafana/notifier.json``) and the Prometheus alerts
(``deploy/prometheus/alerts.yaml``) against the service: every metric they query is one the
service registers (names taken from its registry, so a renamed metric fails here), promtool
accepts the rules and their unit tests (``alerts_test.yaml``) pass, and the README's metrics
table lists every registered metric.

promtool comes from ``just setup`` (``scripts/install-promtool``, into ``.venv/bin``); without it
these tests fail rather than skip."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric

from notifier.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "notifier.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
ALERTS_TEST = ROOT / "deploy" / "prometheus" / "alerts_test.yaml"
README = ROOT / "README.md"

# Series Prometheus itself makes for every target it scrapes.
PROMETHEUS_OWN = frozenset({"up"})

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}


def registered_families() -> list[Metric]:
    """Every metric family a process registers: its counters, histograms and gauges, the
    process metrics, and the scrape-time gauges (described even when nothing was read)."""
    metrics = Metrics()
    families = {f.name: f for f in metrics.registry.collect()}
    families.update((f.name, f) for f in metrics.scrape_time.describe())
    return list(families.values())


def sample_names(family: Metric) -> set[str]:
    """The names a family's samples may have, suffixes included."""
    names = {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names | {s.name for s in family.samples}


def exported_names() -> frozenset[str]:
    return frozenset(n for f in registered_families() for n in sample_names(f))


# -- metric names in PromQL ---------------------------------------------------------------------

_STRING = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`""")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_OFFSET = re.compile(r"\boffset\s+-?[\w$]+")
_NAME = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![a-zA-Z0-9_:])(?!\s*\()")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left",
     "group_right", "offset", "inf", "nan"}
)  # fmt: skip
_LABEL_VALUES = re.compile(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: strings, label matchers, ranges, grouping
    labels and offsets taken out, what is left that is not a function call or a keyword."""
    for pattern in (_STRING, _MATCHERS, _RANGE, _GROUPING, _OFFSET):
        expr = pattern.sub(" ", expr)
    return {n for n in _NAME.findall(expr) if n.lower() not in _KEYWORDS}


def test_metric_names_are_found_in_promql() -> None:
    expr = (
        'sum by (le, route) (rate(a_bucket{x="y", z=~"b|c"}[$__rate_interval])) '
        "/ on (instance) group_left(pid) b offset 1h > 3 * 1e3 and c:recorded "
        'unless max(d[15m:1m]) or vector(0) or label_replace(e, "f", "$1", "g", "(.*)")'
    )
    assert metric_names(expr) == {"a_bucket", "b", "c:recorded", "d", "e"}


def dashboard_queries(node: Any) -> Iterator[str]:
    """Every PromQL expression of a dashboard: the panels' targets, those inside rows, and the
    variables' queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "expr" and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, str) and "label_values" in value:
                yield from _LABEL_VALUES.findall(value)
            else:
                yield from dashboard_queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from dashboard_queries(item)


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def unknown(exprs: list[str], known: frozenset[str]) -> dict[str, set[str]]:
    return {e: missing for e in exprs if (missing := metric_names(e) - known - PROMETHEUS_OWN)}


def test_the_dashboard_queries_only_metrics_the_service_exports() -> None:
    exprs = list(dashboard_queries(json.loads(DASHBOARD.read_text())))
    assert len(exprs) > 30
    known = exported_names()
    assert unknown(exprs, known) == {}
    for expr in exprs:
        assert metric_names(expr) & known, f"selects no metric of the service: {expr}"


def test_the_alerts_query_only_metrics_the_service_exports() -> None:
    exprs = [rule["expr"] for rule in alert_rules()]
    assert unknown(exprs, exported_names()) == {}


def test_a_renamed_metric_fails_the_check() -> None:
    exprs = list(dashboard_queries(json.loads(DASHBOARD.read_text())))
    exprs += [rule["expr"] for rule in alert_rules()]
    known = exported_names() - {"notifier_outbox_depth"}
    assert {n for names in unknown(exprs, known).values() for n in names} == {
        "notifier_outbox_depth"
    }


# What the dashboard and the alerts are for: each of these is shown, or alerted on.
DASHBOARD_SHOWS = {
    "ingest rate": "notifier_events_ingested_total",
    "ingest latency": "notifier_ingest_request_duration_seconds_bucket",
    "outbox lag": "notifier_relay_lag_seconds_bucket",
    "outbox depth": "notifier_outbox_depth",
    "queue depths": "notifier_queue_messages",
    "queue consumers": "notifier_queue_consumers",
    "delivery outcomes": "notifier_delivery_attempts_total",
    "attempt latency": "notifier_delivery_attempt_duration_seconds_bucket",
    "circuit state": "notifier_destination_circuit_state",
    "auto-disabled channels": "notifier_channels_auto_disabled",
    "DEAD rate": "notifier_deliveries_dead_total",
    "readiness": "notifier_ready",
}
ALERTED = {
    "outbox lag": "notifier_relay_lag_seconds_bucket",
    "outbox backlog": "notifier_outbox_depth",
    "DEAD rate": "notifier_deliveries_dead_total",
    "a queue growing": "notifier_queue_messages",
    "a consumer missing": "notifier_queue_consumers",
    "readiness": "notifier_ready",
    "scrape down": "up",
    "database down": "notifier_database_up",
}


def test_the_dashboard_and_the_alerts_cover_what_they_are_for() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    shown = set().union(*map(metric_names, dashboard_queries(dashboard)))
    assert {what for what, name in DASHBOARD_SHOWS.items() if name not in shown} == set()
    alerted = set().union(*(metric_names(rule["expr"]) for rule in alert_rules()))
    assert {what for what, name in ALERTED.items() if name not in alerted} == set()


def test_every_alert_has_a_duration_severity_summary_and_description() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        # only a threshold that is already past saving fires at once
        assert "for" in rule or rule["alert"] == "NotifierPartitionsRunningOut", rule["alert"]


def test_the_dashboard_takes_its_prometheus_from_a_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


# -- promtool -----------------------------------------------------------------------------------


def promtool() -> str:
    """The promtool of ``just setup`` (beside this Python), else one on the PATH."""
    beside = Path(sys.executable).parent / "promtool"
    found = str(beside) if beside.is_file() else shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: run `just setup` (scripts/install-promtool .venv/bin)")
    return found


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_accepts_the_rules() -> None:
    done = run_promtool("check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in done.stdout


def test_the_alerts_unit_tests_pass_and_cover_every_alert() -> None:
    tests = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    tested = {e["alertname"] for t in tests for e in t["alert_rule_test"]}
    assert tested == {rule["alert"] for rule in alert_rules()}
    fired = {e["alertname"] for t in tests for e in t["alert_rule_test"] if e["exp_alerts"]}
    quiet = {e["alertname"] for t in tests for e in t["alert_rule_test"] if not e["exp_alerts"]}
    assert fired == quiet == tested  # each one both fires and stays quiet somewhere
    done = run_promtool("test", "rules", str(ALERTS_TEST))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


# -- the README ---------------------------------------------------------------------------------


def readme_metrics_table() -> set[str]:
    """The names in the first column of the README's metrics table (*Operations → Metrics*)."""
    text = README.read_text()
    section = text[text.index("\n### Metrics\n") + 1 :]
    end = re.search(r"\n##+ ", section)  # the next heading
    assert end is not None
    section = section[: end.start()]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([a-zA-Z_:][a-zA-Z0-9_:]*)`", line.split("|")[1]))
    return names


def test_the_readme_metrics_table_lists_every_registered_metric() -> None:
    listed = readme_metrics_table()
    expected = {f.name + ("_total" if f.type == "counter" else "") for f in registered_families()}
    assert expected - listed == set()
