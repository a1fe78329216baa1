"""The webhook resolver against real local DNS servers (UDP on 127.0.0.1 spare ports, started by
the test): a name whose nameserver never answers holds up no delivery to any other name, costs
one question however many deliveries wait for it, uses none of trio's threads, and is then
remembered as failing for a while; channel create asks the same nameservers. The cache and the
per-name bound on the mock clock are in ``tests/unit/test_webhook_resolver.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest
import trio
import trio.testing

from notifier.adapters.base import InvalidChannelConfig
from notifier.adapters.webhook import WebhookAdapter, WebhookChannels, generate_secret
from notifier.errors import RetriableError
from notifier.messages import WorkerMessage
from notifier.testing import open_sink, worker_message
from tests.integration.conftest import poll

pytestmark = pytest.mark.integration


@dataclass
class DnsServer:
    """Answers A questions from ``records`` (TTL 60; AAAA: no records), NXDOMAIN for other
    names, and never answers a question about a name under ``silent``. Records every
    question as (name, type)."""

    records: dict[str, str]
    silent: str = "stall.test"
    drops_aaaa: frozenset[str] = frozenset()  # names whose AAAA questions go unanswered
    port: int = 0
    questions: list[tuple[str, str]] = field(default_factory=list)

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
        with sock:
            await sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
            task_status.started()
            while True:
                data, peer = await sock.recvfrom(4096)
                query = dns.message.from_wire(data)
                question = query.question[0]
                name = question.name.to_text(omit_final_dot=True).lower()
                self.questions.append((name, dns.rdatatype.to_text(question.rdtype)))
                if name == self.silent or name.endswith(f".{self.silent}"):
                    continue  # a nameserver that never answers
                if name in self.drops_aaaa and question.rdtype == dns.rdatatype.AAAA:
                    continue  # one that answers A but drops AAAA (they exist)
                reply = dns.message.make_response(query)
                if name not in self.records:
                    reply.set_rcode(dns.rcode.NXDOMAIN)
                elif question.rdtype == dns.rdatatype.A:
                    reply.answer.append(
                        dns.rrset.from_text(question.name, 60, "IN", "A", self.records[name])
                    )
                await sock.sendto(reply.to_wire(), peer)


@asynccontextmanager
async def open_dns(
    records: dict[str, str], drops_aaaa: frozenset[str] = frozenset()
) -> AsyncIterator[DnsServer]:
    server = DnsServer(records, drops_aaaa=drops_aaaa)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server
        nursery.cancel_scope.cancel()


def message(url: str) -> WorkerMessage:
    return worker_message(channel_config={"url": url, "secret": generate_secret()})


async def test_a_name_whose_nameserver_never_answers_stalls_no_other_delivery() -> None:
    async with open_dns({"good.test": "127.0.0.1"}) as dns_server, open_sink() as sink:
        adapter = WebhookAdapter(
            timeout_seconds=3, allow_private_networks=True,
            dns_servers=[f"127.0.0.1:{dns_server.port}"],
        )  # fmt: skip
        stalled_errors: list[str] = []

        async def stalled() -> None:
            with pytest.raises(RetriableError) as info:
                await adapter.deliver(message(f"http://hook.stall.test:{sink.port}/hook"))
            stalled_errors.append(str(info.value))

        async def asked_both() -> bool:
            await trio.lowlevel.checkpoint()
            return {t for n, t in dns_server.questions if n == "hook.stall.test"} == {"A", "AAAA"}

        start = trio.current_time()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for _ in range(40):
                    nursery.start_soon(stalled)
                await poll(asked_both)  # the silent name's question is out
                await trio.testing.wait_all_tasks_blocked()  # and all 40 wait for its answer
                assert trio.to_thread.current_default_thread_limiter().borrowed_tokens == 0
                for _ in range(5):
                    receipt = await adapter.deliver(message(f"http://good.test:{sink.port}/hook"))
                    assert receipt is not None
                assert len(stalled_errors) == 0  # the stalled ones are all still waiting
                good_done = trio.current_time() - start
            stalled_done = trio.current_time() - start
            # later deliveries to the silent name fail at once: its silence is remembered
            again = trio.current_time()
            await stalled()
            assert trio.current_time() - again < 0.5
        await adapter.aclose()

    assert good_done < 1.0  # not behind the 40 waiting for the silent name
    assert len(sink.received) == 5
    # the silent name was asked once (A and AAAA), not once per delivery
    asked = [q for q in dns_server.questions if q[0] == "hook.stall.test"]
    assert sorted(asked) == [("hook.stall.test", "A"), ("hook.stall.test", "AAAA")]
    # a question may take half of the attempt (1.5 s), after which every waiter has its answer
    assert 1.5 <= stalled_done < 2.5
    assert stalled_errors == ["could not resolve hook.stall.test: no answer within 1.5 s"] * 41


async def test_channel_create_asks_the_same_nameservers() -> None:
    async with open_dns({"internal.test": "10.0.0.7", "public.test": "93.184.216.34"}) as server:
        validator = WebhookChannels(
            timeout_seconds=3, allow_private_networks=False,
            dns_servers=[f"127.0.0.1:{server.port}"],
        )  # fmt: skip
        with pytest.raises(InvalidChannelConfig) as info:
            await validator.check_destination({"url": "https://internal.test/hook"})
        await validator.check_destination({"url": "https://public.test/hook"})
    assert info.value.field == "config.url"
    assert info.value.message.startswith(
        "destination blocked: internal.test resolves to a private address"
    )
    assert "10.0.0.7" not in str(info.value)
    assert ("internal.test", "A") in server.questions
    assert ("public.test", "A") in server.questions


async def test_a_name_that_does_not_exist_is_told_without_the_nameserver() -> None:
    async with open_dns({}) as server:
        adapter = WebhookAdapter(
            timeout_seconds=3, allow_private_networks=True,
            dns_servers=[f"127.0.0.1:{server.port}"],
        )  # fmt: skip
        with trio.fail_after(5), pytest.raises(RetriableError) as info:
            await adapter.deliver(message("https://nowhere.test/hook"))
        await adapter.aclose()
    assert str(info.value) == "could not resolve nowhere.test: no such name"
    assert str(server.port) not in str(info.value)


async def test_a_nameserver_that_drops_aaaa_questions_costs_no_ipv4_address() -> None:
    records = {"v4only.test": "127.0.0.1"}
    async with open_dns(records, drops_aaaa=frozenset(records)) as server, open_sink() as sink:
        adapter = WebhookAdapter(
            timeout_seconds=3, allow_private_networks=True,
            dns_servers=[f"127.0.0.1:{server.port}"],
        )  # fmt: skip
        start = trio.current_time()
        with trio.fail_after(5):
            receipt = await adapter.deliver(message(f"http://v4only.test:{sink.port}/hook"))
        elapsed = trio.current_time() - start
        await adapter.aclose()
    assert receipt is not None
    assert len(sink.received) == 1
    assert elapsed < 1.0  # A's answer and a short grace for AAAA, not the question's 1.5 s
    assert ("v4only.test", "AAAA") in server.questions
