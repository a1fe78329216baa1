"""Fakes that ship with notifier, for its own tests and for anyone embedding it.

- ``WebhookSink``: a small HTTP server on trio that records every webhook it receives.
- ``FakeBotApi``: Telegram's ``sendMessage`` on a ``WebhookSink``, recording every call, with
  failures (429 with ``retry_after``, chat not found, bot blocked, 500) scripted per chat.
- ``MemoryOutbox``: an in-memory outbox with the relay's claim/finish/doorbell interface (a
  doorbell that can be lost, and LISTENs that fail on cue).
- ``MemoryBroker``: an in-memory publisher with RabbitMQ's routing, returns and nacks.
- ``fanout_targets``: the fan-out rule in Python, as the store's SQL implements it.
- ``MemoryDeliveries``: the worker's delivery store in memory, with the forward-only status rule.
- ``RecordingAdapter``: an adapter that records messages and succeeds, fails or stalls on cue;
  ``PacedAdapter`` adds a ``RateLimiter`` that lets one message through per interval.
- ``RecordingReporter``: the Sentry reporter's interface, keeping what it was given.
- ``RecordingObserver``: the worker's outcome observer, keeping every outcome it is told.
- ``SettleRecorder``: where a consumed message is settled, keeping each settlement.

Tracing: ``notifier.testing.otlp`` is a local OTLP/HTTP receiver that keeps the spans it is
sent; ``notifier.testing.tracing.RecordingTracing`` is tracing on, in memory.

The HTTP API's store in memory is ``notifier.testing.api.MemoryApiStore`` (its state in
``testing.api_state``, its deliveries' part in ``testing.api_deliveries``).

They implement the same interfaces the production classes do; nothing is monkeypatched.
"""

from __future__ import annotations

from notifier.testing.broker import MemoryBroker
from notifier.testing.deliveries import MemoryDeliveries
from notifier.testing.fanout import fanout_targets, pattern_matches
from notifier.testing.messages import worker_message
from notifier.testing.outbox import MemoryClaim, MemoryDoorbell, MemoryOutbox
from notifier.testing.recorders import (
    Delay,
    DestinationsAdapter,
    PacedAdapter,
    RecordingAdapter,
    RecordingObserver,
    RecordingReporter,
    Report,
    SettleRecorder,
)
from notifier.testing.servers import (
    BOT_BLOCKED,
    CHAT_NOT_FOUND,
    SERVER_ERROR,
    BotApiCall,
    BotApiReply,
    FakeBotApi,
    Received,
    WebhookSink,
    open_fake_bot_api,
    open_sink,
)

__all__ = [
    "BOT_BLOCKED",
    "CHAT_NOT_FOUND",
    "SERVER_ERROR",
    "BotApiCall",
    "BotApiReply",
    "Delay",
    "DestinationsAdapter",
    "FakeBotApi",
    "MemoryBroker",
    "MemoryClaim",
    "MemoryDeliveries",
    "MemoryDoorbell",
    "MemoryOutbox",
    "PacedAdapter",
    "Received",
    "RecordingAdapter",
    "RecordingObserver",
    "RecordingReporter",
    "Report",
    "SettleRecorder",
    "WebhookSink",
    "fanout_targets",
    "open_fake_bot_api",
    "open_sink",
    "pattern_matches",
    "worker_message",
]
