"""The harness's pure pieces: reading crashes out of a notifier log, and delivery ids out of
received emails."""

from __future__ import annotations

import pytest

from notifier.testing_smtp import ReceivedMail
from tests.chaos.harness import crash_lines, email_delivery_ids

T = "2026-01-01T00:00:00.000Z"


@pytest.mark.parametrize(
    ("line", "crash"),
    [
        # a component restarted after losing its broker or database: designed, not a crash
        (f"{T} ERROR notifier.service: relay failed, restarting in 0.5 s: BrokerError('x')", False),
        (f"{T} ERROR notifier.service: relay failed, restarting in 1.0 s: "
         "StoreUnavailable('Postgres unavailable')", False),
        # ... restarted after anything else: a crash
        (f"{T} ERROR notifier.service: workers.webhook failed, restarting in 0.5 s: "
         "ExceptionGroup('Exceptions from Trio nursery', [ChannelInvalidStateError('x')])", True),
        (f"{T} ERROR notifier.service: maintenance failed, restarting in 2.0 s: KeyError('k')",
         True),
        (f"{T} ERROR notifier.worker: message m-1: handler failed; rejecting to the DLQ", True),
        (f"{T} ERROR notifier.broker: consumer callback failed; the message returns", True),
        (f"{T} ERROR notifier.ingest: request failed", True),
        (f"{T} ERROR notifier: unexpected failure", True),
        # an adapter raising is the adapter's failure, isolated by the worker: not a crash
        (f"{T} ERROR notifier.worker: delivery d-1: adapter raised", False),
        (f"{T} INFO notifier.worker: delivery d-1 attempt 1: delivered", False),
        ("Traceback (most recent call last):", False),  # follows a line judged above
    ],
)  # fmt: skip
def test_crash_lines(line: str, crash: bool) -> None:
    log = f"{T} INFO notifier.service: notifier running\n{line}\n{T} INFO notifier stopped\n"
    assert crash_lines(log) == ([line] if crash else [])


def test_email_delivery_ids_come_from_the_message_id() -> None:
    def mail(message_id: str) -> ReceivedMail:
        data = f"Message-ID: {message_id}\r\nSubject: s\r\n\r\nbody\r\n".encode()
        return ReceivedMail("a@x", ("b@x",), data, None, 0.0)

    ids = ["4f1c0a52-7f4e-4bd4-9a37-2b8c3f0e9d11", "0b6f1c9e-1d2a-4e8b-8f6a-3c5d7e9f1a2b"]
    assert email_delivery_ids([mail(f"<{i}@chaos.test>") for i in ids]) == ids
    with pytest.raises(AssertionError, match="no delivery id"):
        email_delivery_ids([mail("<not-an-id@chaos.test>")])
