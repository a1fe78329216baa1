"""``just bench --tracing``: its modes' configs, the order of its runs, the OTLP sink's span
count and the arithmetic of its report (bench/tracing.py, bench/otlp_sink.py)."""

from __future__ import annotations

import gzip
import tomllib

import pytest
from bench.otlp_sink import Counts, WireError, fields, span_names
from bench.stage import Stage, Window
from bench.tracing import (
    known_modes,
    order,
    pooled,
    ratio,
    report,
    span_cost_values,
    tracing_section,
    values,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from notifier.config import parse_config

ENDPOINT = "http://127.0.0.1:4318"


def test_only_the_tracing_modes_configure_tracing() -> None:
    assert tracing_section("before", ENDPOINT) == ""
    assert tracing_section("off", ENDPOINT) == ""
    assert not parse_config({}, env={}).tracing.enabled  # no [tracing]: off


@pytest.mark.parametrize(("mode", "ratio_"), [("ratio0", 0.0), ("ratio1", 1.0)])
def test_a_tracing_mode_is_a_valid_tracing_section(mode: str, ratio_: float) -> None:
    config = parse_config(tomllib.loads(tracing_section(mode, ENDPOINT)), env={})
    assert config.tracing.enabled
    assert config.tracing.traces_url() == f"{ENDPOINT}/v1/traces"
    assert config.tracing.sample_ratio == ratio_
    assert config.tracing.export_interval_seconds == 1.0


def test_rounds_alternate_the_order_of_the_modes() -> None:
    assert order(["a", "b", "c"], 3) == [
        (0, "a"), (0, "b"), (0, "c"),
        (1, "c"), (1, "b"), (1, "a"),
        (2, "a"), (2, "b"), (2, "c"),
    ]  # fmt: skip


def test_the_modes_asked_run_in_their_order_and_an_unknown_one_is_refused() -> None:
    assert known_modes("off, before") == ["before", "off"]
    assert known_modes("before,off,ratio0,ratio1") == ["before", "off", "ratio0", "ratio1"]
    assert known_modes("off,ratio2") == []
    assert known_modes(" , ") == []


# -- the OTLP sink: protobuf wire format written by hand --


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _span(name: str) -> bytes:
    return (
        _len(1, b"\x01" * 16)  # trace_id
        + _len(2, b"\x02" * 8)  # span_id
        + _len(5, name.encode())
        + _varint(6 << 3) + _varint(2)  # kind: a varint
        + _varint(7 << 3 | 1) + (123).to_bytes(8, "little")  # start_time_unix_nano: fixed64
    )  # fmt: skip


def _request(*scopes: list[str]) -> bytes:
    resource = _len(1, _len(1, b"attrs"))  # resource (content not read)
    for names in scopes:
        resource += _len(2, _len(1, b"scope") + b"".join(_len(2, _span(n)) for n in names))
    return _len(1, resource)


def test_the_sink_counts_spans_by_name_across_scopes() -> None:
    body = _request(["POST /v1/events", "relay publish"], ["deliver webhook"]) + _request(
        ["deliver webhook"]
    )
    assert span_names(body) == {"POST /v1/events": 1, "relay publish": 1, "deliver webhook": 2}


def test_the_sink_agrees_with_the_otlp_protobuf_classes() -> None:
    request = ExportTraceServiceRequest()
    for count in (3, 2):
        scope = request.resource_spans.add().scope_spans.add()
        for i in range(count):
            span = scope.spans.add()
            span.name = f"span {i}"
            span.trace_id = bytes(16)
            span.start_time_unix_nano = 1_700_000_000_000_000_000
            span.attributes.add(key="k").value.int_value = -1
    assert span_names(request.SerializeToString()) == {"span 0": 2, "span 1": 2, "span 2": 1}


def test_the_sink_unpacks_gzip_and_keeps_totals() -> None:
    counts = Counts()
    plain = _request(["a", "b"])
    counts.add(plain, "")
    counts.add(gzip.compress(plain), "gzip")
    stats = counts.as_dict()
    assert stats["requests"] == 2
    assert stats["spans"] == 4
    assert stats["names"] == {"a": 2, "b": 2}
    assert stats["bytes"] == len(plain) + len(gzip.compress(plain))


@pytest.mark.parametrize(
    "body",
    [
        b"\x0a\x05ab",  # a length past the end
        b"\x0a",  # a key without its length
        b"\x0b",  # wire type 3 (a group): not in OTLP
        b"\x09\x00\x00",  # a fixed64 cut short
        b"\x08" + b"\xff" * 11,  # a varint that never ends
    ],
)
def test_a_body_that_is_not_protobuf_is_refused(body: bytes) -> None:
    with pytest.raises(WireError):
        list(fields(body))
    with pytest.raises(WireError):
        span_names(body)


# -- the report's arithmetic --


def _run(mode: str, r: int, events: int, seconds: float, server: float, spans: int = 0,
         workload: str = "unpaced") -> Stage:  # fmt: skip
    return Stage(
        f"tracing_{mode}_{r}", f"{mode} {r}", "events", events, seconds,
        cpu={"server": server, "pg_own": 1.0, "rabbitmq": 0.5, "sink": 0.1, "wrk": 0.1,
             "otlp_sink": 0.2 if spans else 0.0, "pg_server": 0.0, "bench": 0.1},
        window=Window(seconds + 1.5, machine_cpu=(seconds + 1.5) * 2, cores=2),
        extra={"mode": mode, "round": r, "spans": spans, "workload": workload,
               "target_per_s": 150.0 if workload == "paced" else None,
               "span_names": {"a": spans // 2, "b": spans - spans // 2}},
    )  # fmt: skip


def test_rounds_of_a_mode_are_pooled_events_over_seconds() -> None:
    p = pooled([_run("off", 0, 1000, 2.0, 2.0), _run("off", 1, 3000, 8.0, 3.0)])
    assert p is not None
    assert p["rate"] == pytest.approx(400.0)  # 4,000 events in 10 s, not the mean of 500 and 375
    assert p["cpu_per_1000"]["server"] == pytest.approx(1.25)  # 5 s over 4,000 events
    assert p["cpu_per_1000_with_services"] == pytest.approx(1.25 + 0.5 + 0.25)
    # two windows of 3.5 and 9.5 s, the machine at 2 cores, the stage's processes 3.8 + 4.8 s
    assert p["other_cores"] == pytest.approx((26.0 - 8.6) / 13.0)
    assert pooled([]) is None


def test_the_ratios_are_pooled_and_round_by_round() -> None:
    stages = [
        _run("off", 0, 1000, 2.0, 2.0), _run("ratio1", 0, 900, 2.0, 2.4, spans=4500),
        _run("ratio1", 1, 1100, 2.0, 2.6, spans=5500), _run("off", 1, 1000, 2.0, 2.0),
        _run("ratio0", 0, 1000, 2.0, 2.0), _run("ratio0", 1, 1000, 2.0, 2.0),
    ]  # fmt: skip
    v = values(stages)["unpaced"]
    assert "before" not in v["modes"]
    assert "off/before" not in v["ratios"]
    on = v["ratios"]["ratio1/off"]
    assert on["pooled"]["rate"] == pytest.approx(1.0)
    assert on["pooled"]["cpu_per_item"] == pytest.approx((5.0 / 2000) / (4.0 / 2000))
    assert [r["rate"] for r in on["rounds"]] == pytest.approx([0.9, 1.1])
    assert v["ratios"]["ratio0/off"]["pooled"]["cpu_per_item"] == pytest.approx(1.0)
    assert v["modes"]["ratio1"]["spans_per_event"] == pytest.approx(5.0)
    assert v["modes"]["ratio1"]["span_names_per_event"] == {"a": 2.5, "b": 2.5}
    assert set(values(stages)) == {"unpaced"}
    text = report(stages)
    assert "tracing on, sample_ratio 1.0 / tracing off" in text
    assert "rate 1.000x [0.90-1.10]" in text
    assert "spans per event at sample_ratio 1.0: a 2.50, b 2.50" in text


def test_the_paced_runs_are_compared_apart_from_the_unpaced() -> None:
    stages = [
        _run("off", 0, 1000, 2.0, 2.0), _run("ratio1", 0, 1000, 2.0, 3.0),
        _run("off", 0, 300, 2.0, 1.0, workload="paced"),
        _run("ratio1", 0, 300, 2.0, 1.1, workload="paced"),
    ]  # fmt: skip
    v = values(stages)
    assert v["unpaced"]["ratios"]["ratio1/off"]["pooled"]["cpu_per_item"] == pytest.approx(1.5)
    assert v["paced"]["ratios"]["ratio1/off"]["pooled"]["cpu_per_item"] == pytest.approx(1.1)
    assert v["paced"]["modes"]["off"]["rate"] == pytest.approx(150.0)
    text = report(stages)
    assert "wrk unpaced" in text
    assert "wrk paced at 150 events/s" in text


def test_a_ratio_over_nothing_is_zero_not_an_error() -> None:
    empty = {"rate": 0.0, "cpu_per_1000": {}, "cpu_per_1000_with_services": 0.0}
    some = {"rate": 5.0, "cpu_per_1000": {"server": 1.0}, "cpu_per_1000_with_services": 2.0}
    assert ratio(some, empty) == {"rate": 0.0, "cpu_per_item": 0.0,
                                  "cpu_per_item_with_services": 0.0}  # fmt: skip
    assert values([]) == {}
    assert report([]) == ""


def _cost(mode: str, r: int, cpu: float, spans: int = 0, otlp: float = 0.0) -> dict[str, object]:
    return {"mode": mode, "round": r, "events": 1000, "cpu_seconds": cpu, "spans": spans,
            "otlp_cpu_seconds": otlp}  # fmt: skip


def test_the_spans_alone_cost_what_a_mode_takes_over_the_loop() -> None:
    costs = [
        _cost("off", 0, 0.005), _cost("ratio0", 0, 0.04), _cost("ratio1", 0, 0.3, 3000, 0.02),
        _cost("ratio1", 1, 0.2, 3000, 0.02), _cost("ratio0", 1, 0.04), _cost("off", 1, 0.005),
    ]  # fmt: skip
    # notifier's CPU end to end with tracing off: 2 ms an event
    stages = [_run("off", 0, 1000, 2.0, 2.0)]
    found = span_cost_values(costs, stages)
    assert found["off"]["cpu_us_per_event"] == pytest.approx(5.0)
    assert found["ratio1"]["cpu_us_per_event"] == pytest.approx(250.0)  # 0.5 s over 2,000
    assert found["ratio1"]["otlp_cpu_us_per_event"] == pytest.approx(20.0)
    assert found["ratio1"]["spans_per_event"] == pytest.approx(3.0)
    assert found["ratio1"]["over_off_us"] == pytest.approx(245.0)
    assert found["ratio1"]["share_of_e2e"] == pytest.approx(245.0 / 2000.0)
    assert found["ratio0"]["over_off_us"] == pytest.approx(35.0)
    assert "over off +245.0 µs = 12.2% of notifier's CPU per event" in report(stages, costs)
    # without the end-to-end runs there is no share to give
    assert span_cost_values(costs)["ratio1"]["share_of_e2e"] is None
