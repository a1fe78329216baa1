"""``[database]`` and ``[broker]``: where Postgres and RabbitMQ are, and the checks that catch a
URL asyncpg or aiormq would misread, at the start, without ever printing it (it holds a
password)."""

from __future__ import annotations

import re
import urllib.parse
from typing import Annotated, Literal

import msgspec
import yarl

from notifier.config.base import (
    Positive,
    PositiveFloat,
    Section,
)

# Postgres takes statement_timeout in whole milliseconds, and 0 would turn it off.
DatabaseTimeout = Annotated[float, msgspec.Meta(ge=0.001, le=3600)]


class DatabaseConfig(Section, frozen=True):
    url: str = "postgresql://postgres@127.0.0.1:5432/notifier"
    # What sits between notifier and Postgres at `url`: "none" (Postgres itself, or PgBouncer
    # in session pooling mode) or "pgbouncer" (PgBouncer in transaction pooling mode: no
    # prepared statement cache, the statement timeout set per transaction, no LISTEN on `url`).
    pooler: Literal["none", "pgbouncer"] = "none"
    # A direct connection to Postgres (not through a transaction pooler) for the outbox
    # doorbell's LISTEN; "" = LISTEN on `url` when pooler is "none", and no LISTEN at all (the
    # relay polls every relay.poll_interval_seconds) when it is "pgbouncer".
    listen_url: str = ""
    pool_max_size: Positive = 20
    connect_timeout_seconds: PositiveFloat = 5.0
    # Every store call waits at most this long for a pooled connection, then each of its
    # statements at most `statement_timeout_seconds` (plus a moment for the cancel to come
    # back): together below the 5-10 s HTTP clients usually wait, so a stalled Postgres answers
    # 503 instead of a client's timeout.
    acquire_timeout_seconds: DatabaseTimeout = 1.0
    statement_timeout_seconds: DatabaseTimeout = 3.0


AmqpUrl = Annotated[str, msgspec.Meta(pattern=r"^amqps?://")]


class BrokerConfig(Section, frozen=True):
    # One node, or the nodes of one cluster: each connection picks a node and moves to the next
    # one that answers when its node is lost (docs/architecture.md §4).
    url: AmqpUrl | Annotated[tuple[AmqpUrl, ...], msgspec.Meta(min_length=1)] = (
        "amqp://guest:guest@127.0.0.1:5672/"
    )
    queue_type: Literal["quorum", "classic"] = "quorum"
    publish_timeout_seconds: PositiveFloat = 10.0
    heartbeat_seconds: Annotated[int, msgspec.Meta(ge=10, le=30)] = 15
    # FIFO channels' single-active-consumer queues per channel type (README "Ordered delivery
    # (FIFO)"); every relay and worker of a fleet must use the same number.
    fifo_partitions: Annotated[int, msgspec.Meta(ge=1, le=256)] = 8


_ENCODE_HINT = "percent-encode / # ? : @ in the user name and password (%2F %23 %3F %3A %40)"


def postgres_url_problem(url: str) -> str | None:
    """What keeps asyncpg from reading ``url`` as a Postgres DSN, or ``None``. Never a part of
    the URL: it holds a password. Checked as asyncpg reads it (the user and password before
    the first ``@``; hosts separated by commas, each with an optional numeric port), so a
    password with an unencoded ``/``, ``#``, ``?`` or ``@`` is caught here, at the start,
    not as a baffling error of every connection."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("postgres", "postgresql"):
        return "must be a postgresql:// URL"
    hosts = parts.netloc.partition("@")[2] if "@" in parts.netloc else parts.netloc
    for host in hosts.split(",") if hosts else ():
        if host.startswith("["):
            bracketed = re.fullmatch(r"\[[^\]]+\](?::(.*))?", host)
            port = (bracketed.group(1) or "") if bracketed else "x"
        else:
            name, _, port = host.partition(":")
            if "@" in name:
                return f"a host name with @ in it: {_ENCODE_HINT}"
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            return f"a port that is not a number from 1 to 65535: {_ENCODE_HINT}"
    return None


def amqp_url_problem(url: str) -> str | None:
    """What keeps aiormq from reading ``url`` as a RabbitMQ node's URL, or ``None``. Never a
    part of the URL: it holds a password. Read with yarl, as aiormq reads it, so that a password
    with an unencoded ``/``, ``#``, ``?`` or ``@`` is caught here, at the start, not as an error
    of every connection to the node."""
    try:
        parsed = yarl.URL(url)
        port = parsed.explicit_port
    except ValueError:
        return f"not a URL that can be read: {_ENCODE_HINT}"
    if parsed.scheme not in ("amqp", "amqps"):
        return "must be an amqp:// or amqps:// URL"
    if not parsed.host:
        return "no host name"
    if port is not None and not 0 < port < 65536:
        return f"a port that is not a number from 1 to 65535: {_ENCODE_HINT}"
    return None
