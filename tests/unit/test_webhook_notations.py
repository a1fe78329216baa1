"""The SSRF guard at create and at delivery agree on every notation of a host: a URL is refused
at create exactly when a delivery to it would be refused (``allow_private_networks`` off),
because both check the host httpx dials (after IDNA mapping), not the one ``urlsplit`` reads.

Deliveries use a fake resolver and a dialer that records what is dialed and then fails the
connection, both passed to the adapter's constructor.
"""

from __future__ import annotations

import socket

import pytest
import trio

from notifier.adapters.base import InvalidChannelConfig
from notifier.adapters.webhook import WebhookAdapter, validate_url
from notifier.errors import PermanentError, RetriableError
from notifier.testing import worker_message

PUBLIC = "93.184.216.34"
DNS = {
    "localhost": ["127.0.0.1"], "localhost.": ["127.0.0.1"],
    "example.com": [PUBLIC], "example.com.": [PUBLIC],
}  # fmt: skip

# (URL, refused): refused at create and at delivery alike, or at neither.
NOTATIONS = [
    ("http://127\u30020\u30020\u30021/hook", True),  # ideographic full stops
    ("http://127\uff0e0\uff0e0\uff0e1/hook", True),  # fullwidth full stops
    ("http://127\uff610\uff610\uff611/hook", True),  # halfwidth ideographic full stops
    ("http://127\u30021/hook", True),  # ... short form
    ("http://0x7f\u30021/hook", True),  # ... hex
    ("http://2130706433\u3002/hook", True),  # ... decimal, a trailing ideographic stop
    ("http://10\u30020\u30020\u30021/hook", True),  # private
    ("http://169\u3002254\u3002169\u3002254/latest/meta-data/", True),  # cloud metadata
    ("http://0\u30020\u30020\u30020/hook", True),  # unspecified
    ("http://\uff11\uff12\uff17.0.0.1/hook", True),  # fullwidth digits: not a valid host
    ("http://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54/hook", True),  # ... letters
    ("http://2130706433/hook", True),  # decimal
    ("http://017700000001/hook", True),  # octal
    ("http://0177.0.0.1/hook", True),  # octal parts: not a valid host to httpx
    ("http://0x7f.1/hook", True),  # hex
    ("http://0x7f000001/hook", True),
    ("http://127.0.0.1./hook", True),  # a trailing dot
    ("http://[::ffff:127.0.0.1]/hook", True),  # IPv4-mapped IPv6
    ("http://[::ffff:7f00:1]/hook", True),
    ("http://localhost./hook", True),  # the loopback name, fully qualified
    ("http://LOCALHOST/hook", True),
    ("http://93\u3002184\u3002216\u300234/hook", False),  # a public address, ideographic
    (f"http://{PUBLIC}./hook", False),
    ("http://1572395042/hook", False),  # ... decimal
    ("http://[::ffff:93.184.216.34]/hook", False),
    ("http://example.com/hook", False),  # a name resolving to a public address
    ("http://EXAMPLE.com./hook", False),
]


class FakeDns:
    async def __call__(self, host: str, port: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        if host.lower() not in DNS:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return DNS[host.lower()]


class RefusingDialer:
    """Records each address it is asked to dial, then refuses the connection."""

    def __init__(self) -> None:
        self.dialed: list[str] = []

    async def __call__(self, host: str, port: int) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        self.dialed.append(host)
        raise ConnectionRefusedError("refused by the test dialer")


def refused_at_create(url: str) -> str | None:
    """The field the create error names, or None when the URL is accepted."""
    try:
        validate_url(url, allow_private_networks=False)
    except InvalidChannelConfig as exc:
        return exc.field
    return None


async def refused_at_delivery(url: str) -> tuple[BaseException, list[str]]:
    """What the delivery raised, and the addresses dialed."""
    backend = RefusingDialer()
    adapter = WebhookAdapter(
        timeout_seconds=5, allow_private_networks=False, resolver=FakeDns(),
        dialer=backend,
    )  # fmt: skip
    message = worker_message(channel_config={"url": url, "secret": None, "headers": {}})
    try:
        with pytest.raises((PermanentError, RetriableError)) as info:
            await adapter.deliver(message)
    finally:
        await adapter.aclose()
    return info.value, backend.dialed


@pytest.mark.parametrize(("url", "refused"), NOTATIONS, ids=[u for u, _ in NOTATIONS])
async def test_create_refuses_exactly_what_delivery_refuses(url: str, refused: bool) -> None:
    error, dialed = await refused_at_delivery(url)
    assert refused_at_create(url) == ("config.url" if refused else None)
    if refused:
        assert isinstance(error, PermanentError)
        assert dialed == []  # a blocked address is never dialed
    else:  # the connection was tried (and the test dialer refused it)
        assert isinstance(error, RetriableError)
        assert "refused by the test dialer" in str(error)
        assert len(dialed) == 1


def test_the_blocked_address_is_named_as_it_would_be_dialed() -> None:
    with pytest.raises(InvalidChannelConfig) as info:
        validate_url("http://127\u30020\u30020\u30021/hook", allow_private_networks=False)
    assert info.value.message.startswith("destination blocked: 127.0.0.1 is a loopback address")
