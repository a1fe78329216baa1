"""Recording stand-ins: an adapter that succeeds, fails or stalls on cue (and a paced one),
the outcome observer, the settlement sink and the Sentry reporter."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from notifier.adapters.base import Receipt
from notifier.broker.base import Settle
from notifier.messages import WorkerMessage
from notifier.ratelimit import Bucket
from notifier.worker.observe import Outcome

# -- recording adapter --------------------------------------------------------------------------


@dataclass(frozen=True)
class Delay:
    """A ``RecordingAdapter`` step: take ``seconds`` (trio time), then succeed."""

    seconds: float


AdapterStep = Receipt | Exception | Delay | None


class RecordingAdapter:
    """An ``Adapter`` that records every message it is asked to deliver.

    Each ``deliver`` call takes the next step of the script (``then(...)`` appends), or
    ``default`` once the script is used up: a ``Receipt`` or ``None`` succeeds with it, an
    exception instance is raised, a ``Delay`` sleeps that long and then succeeds.
    """

    secret_fields: frozenset[str] = frozenset({"secret"})

    def __init__(
        self,
        channel_type: str = "webhook",
        *steps: AdapterStep,
        default: AdapterStep = None,
    ) -> None:
        self.channel_type = channel_type
        self.default = default
        self.messages: list[WorkerMessage] = []
        self.called_at: list[float] = []  # trio.current_time() of each call
        self.closed = False
        self._script: deque[AdapterStep] = deque(steps)

    def then(self, *steps: AdapterStep) -> RecordingAdapter:
        self._script.extend(steps)
        return self

    def prepare_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return dict(config)

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        self.messages.append(message)
        self.called_at.append(trio.current_time())
        step = self._script.popleft() if self._script else self.default
        if isinstance(step, Delay):
            await trio.sleep(step.seconds)
            return None
        await trio.lowlevel.checkpoint()
        if isinstance(step, Exception):
            raise step
        return step

    async def aclose(self) -> None:
        self.closed = True


class PacedAdapter(RecordingAdapter):
    """A ``RecordingAdapter`` that is also a ``RateLimiter``: at most one delivery per
    ``interval_seconds``, one bucket for all its messages; ``asked`` lists the messages it was
    asked about."""

    def __init__(self, channel_type: str = "webhook", *, interval_seconds: float) -> None:
        super().__init__(channel_type)
        self.interval_seconds = interval_seconds
        self.asked: list[WorkerMessage] = []
        self._bucket = Bucket(f"paced:{channel_type}", 1, interval_seconds)

    def rate_buckets(self, message: WorkerMessage) -> Sequence[Bucket]:
        self.asked.append(message)
        return (self._bucket,)


class DestinationsAdapter(RecordingAdapter):
    """A ``RecordingAdapter`` that is also ``HasDestinations``: a message's destination is its
    channel config's ``url``, and a delivery there takes ``seconds[url]`` (trio time; 0 when
    not listed) before it succeeds. ``running`` is how many deliveries each destination has under
    way, and ``most_running`` the highest it reached."""

    def __init__(self, seconds: dict[str, float], channel_type: str = "webhook") -> None:
        super().__init__(channel_type)
        self.seconds = seconds
        self.running: dict[str, int] = {}
        self.most_running: dict[str, int] = {}
        self.finished_at: dict[str, list[float]] = {}

    def destination(self, message: WorkerMessage) -> str:
        return str(message.channel_config["url"])

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        url = self.destination(message)
        self.messages.append(message)
        self.called_at.append(trio.current_time())
        self.running[url] = self.running.get(url, 0) + 1
        self.most_running[url] = max(self.most_running.get(url, 0), self.running[url])
        try:
            await trio.sleep(self.seconds.get(url, 0.0))
        finally:
            self.running[url] -= 1
        self.finished_at.setdefault(url, []).append(trio.current_time())
        return None


# -- recording observer and settlements ---------------------------------------------------------


class RecordingObserver:
    """The worker's ``OutcomeObserver`` that keeps every outcome it is told, in order."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def observe(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


class SettleRecorder:
    """A ``SettleSink`` that keeps how each message was settled, in order."""

    def __init__(self) -> None:
        self.settled: list[Settle] = []

    def settle(self, delivery_tag: int, how: Settle) -> None:
        self.settled.append(how)


# -- recording reporter -------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    summary: str
    tags: dict[str, str]
    exc: BaseException | None
    contexts: dict[str, dict[str, Any]] | None = None


class RecordingReporter:
    """A ``Reporter`` that keeps every report, for tests."""

    def __init__(self) -> None:
        self.reports: list[Report] = []

    def report(
        self,
        summary: str,
        *,
        tags: Mapping[str, str],
        exc: BaseException | None = None,
        contexts: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        kept = {name: dict(c) for name, c in contexts.items()} if contexts is not None else None
        self.reports.append(Report(summary, dict(tags), exc, kept))
