"""``[tracing]``: OpenTelemetry traces exported over OTLP/HTTP (protobuf); off while
``otlp_endpoint`` is empty."""

from __future__ import annotations

import urllib.parse
from typing import Annotated

import msgspec

from notifier.config.base import Section
from notifier.validation import key_error

# How long an export may take before it is given up (the exporter's own bound); a stop waits
# for the last flush at most this long.
ExportTimeout = Annotated[float, msgspec.Meta(gt=0, le=60)]


class TracingConfig(Section, frozen=True):
    # The base URL of an OTLP/HTTP receiver (http://127.0.0.1:4318); spans go to
    # `<otlp_endpoint>/v1/traces`. Empty: no tracing (an incoming traceparent is still kept
    # and passed on unchanged).
    otlp_endpoint: str = ""
    service_name: str = "notifier"
    # The share of new traces recorded (an incoming traceparent's sampled flag is followed).
    sample_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0
    # Finished spans are sent in batches at most this far apart, each send bounded by
    # export_timeout_seconds.
    export_interval_seconds: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 5.0
    export_timeout_seconds: ExportTimeout = 10.0

    def __post_init__(self) -> None:
        if self.otlp_endpoint and (problem := otlp_endpoint_problem(self.otlp_endpoint)):
            raise key_error("otlp_endpoint", problem)
        if not self.service_name.strip():
            raise key_error("service_name", "must not be empty")

    @property
    def enabled(self) -> bool:
        return bool(self.otlp_endpoint)

    def receiver(self) -> str:
        """``scheme://host:port`` of the endpoint, to log (never its user part or path)."""
        parts = urllib.parse.urlsplit(self.otlp_endpoint)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        return f"{parts.scheme}://{host}:{port}"

    def traces_url(self) -> str:
        """Where the spans are posted: the OTLP/HTTP traces path below ``otlp_endpoint``."""
        return self.otlp_endpoint.rstrip("/") + "/v1/traces"


def otlp_endpoint_problem(url: str) -> str | None:
    """What is wrong with an OTLP/HTTP base URL, or ``None``; never repeats the URL (it may
    carry a token in its user part)."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (raises on a port out of range)
    except ValueError:
        return "not a URL (expected http(s)://host:port)"
    if parts.scheme not in ("http", "https"):
        return "must start with http:// or https://"
    if not parts.hostname:
        return "has no host"
    if parts.query or parts.fragment:
        return "must not have a query or fragment"
    return None
