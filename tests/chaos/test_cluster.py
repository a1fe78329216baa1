"""At-least-once on a 3-node RabbitMQ cluster: notifier is given every node's URL, a node is
killed with ``kill -9`` mid-stream — the one the worker group consumes from, or the leader of
the quorum queue ``deliveries.webhook`` — the load goes on, the node comes back, and the
pipeline drains with nothing lost.

The cluster is the test's own (``tests.chaos.cluster``), on spare ports, started once for the
module; the machine's broker is not touched. Each scenario has a vhost of its own on it, and
starts with every node running.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio

from notifier.bridge import open_bridge
from notifier.broker.amqp import open_connection
from notifier.broker.base import Confirm, Outgoing, Settle
from notifier.broker.topology import build_topology
from notifier.errors import BrokerError
from tests.chaos.cluster import Cluster, Node, open_cluster
from tests.chaos.harness import Context, Fault, Scenario, free_port, run_scenario
from tests.chaos.test_scenarios import assert_guarantees
from tests.integration.conftest import poll

pytestmark = [
    pytest.mark.slow,
    pytest.mark.cluster,
    # as in test_scenarios: the load generator's request bodies cut by a killed connection
    pytest.mark.filterwarnings(
        "ignore:Async generator 'httpx._content.ByteStream.__aiter__':ResourceWarning"
    ),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object ByteStream.__aiter__"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
]

# A lost node takes with it, at most: the unconfirmed publishes of one relay batch (500, the
# relay's batch_size), which stay in the outbox and are published again, and the unacked
# messages of the worker group's consumer (its prefetch, 64), delivered again by the queue.
NODE_LOSS_DUPLICATES = 500 + 64
# How long the node stays down while the load goes on (the fault itself).
DOWN_SECONDS = 6
MORE_DOWN_SECONDS = 20
# AMQP ingest runs too (idle: the load comes over HTTP), so that its connections must move.
AMQP_INGEST: dict[str, dict[str, Any]] = {
    "amqp_ingest": {"enabled": True},
    "amqp_ingest.tenants": {"chaos-producer": "chaos"},
}
# A slower load than the other scenarios' (1000 at 150/s), so that it still runs while the node
# is down: finding the node takes the CLI a few seconds, more on a busy machine.
EVENTS, RATE_PER_SECOND = 1200, 60.0


# What notifier opens, by the name it gives each connection.
CONNECTIONS = (
    "relay", "workers.webhook", "workers.webhook.retry", "amqp_ingest", "amqp_ingest.dead",
)  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with open_cluster() as running:
        yield running


@pytest.fixture
def cluster_vhost(cluster: Cluster) -> Iterator[str]:
    cluster.ensure_running()  # whatever the scenario before left down
    name = f"notifier_cluster_{uuid.uuid4().hex[:12]}"
    cluster.add_vhost(name)
    yield name
    cluster.ensure_running()
    cluster.delete_vhost(name)


@dataclass
class NodeLoss:
    """What a node-loss fault saw: the node it killed and where the connections were."""

    killed: str = ""
    leader: str = ""  # of deliveries.webhook, before the kill
    before: dict[str, str] = field(default_factory=dict)  # connection name -> node
    during: dict[str, str] = field(default_factory=dict)  # ... while the node was down
    delivered_while_down: int = 0
    moved_after_seconds: float = 0.0  # from the kill until the worker group consumed elsewhere


def kill_node(cluster: Cluster, choose: str, loss: NodeLoss) -> Fault:
    """The fault: ``kill -9`` the node ``choose`` names (``workers`` — the worker group's
    consuming connection's — or ``leader``, of ``deliveries.webhook``); wait until the worker
    group consumes again from another node while the load goes on; then start the node again."""

    async def fault(ctx: Context) -> None:
        leader: list[str] = []

        async def read_leader() -> None:
            leader.append(
                await trio.to_thread.run_sync(cluster.queue_leader, ctx.vhost, "deliveries.webhook")
            )

        async with trio.open_nursery() as nursery:  # both at once: each CLI call takes seconds
            nursery.start_soon(read_leader)
            loss.before = await trio.to_thread.run_sync(cluster.connection_nodes)
        loss.leader = leader[0]
        loss.killed = loss.before["workers.webhook"] if choose == "workers" else loss.leader
        node = cluster.node(loss.killed)
        await trio.to_thread.run_sync(cluster.kill, node)
        try:
            down_from = trio.current_time()
            received = len(ctx.sink.received)
            with trio.fail_after(60):
                await poll(lambda: _moved(cluster, node, loss), interval_seconds=0.5)
            loss.moved_after_seconds = trio.current_time() - down_from
            await trio.sleep_until(down_from + DOWN_SECONDS)  # the load goes on meanwhile

            async def delivered() -> bool:
                return len(ctx.sink.received) > received

            # A new leader's consumers can take a few seconds more to resume on a busy machine:
            # the node stays down, up to a bound, until the first delivery without it.
            with trio.move_on_after(MORE_DOWN_SECONDS):
                await poll(delivered, interval_seconds=0.2)
            loss.delivered_while_down = len(ctx.sink.received) - received
        finally:
            with trio.CancelScope(shield=True):  # heal: the node starts and rejoins
                await trio.to_thread.run_sync(cluster.start, node)

    return fault


async def _moved(cluster: Cluster, killed: Node, loss: NodeLoss) -> bool:
    """Every connection of notifier is open again, none on ``killed``."""
    loss.during = await trio.to_thread.run_sync(cluster.connection_nodes)
    return all(loss.during.get(name, killed.nodename) != killed.nodename for name in CONNECTIONS)


@pytest.mark.parametrize("choose", ["workers", "leader"])
async def test_a_lost_node_loses_no_accepted_event(
    choose: str, cluster: Cluster, cluster_vhost: str, database_url: str, tmp_path: Path
) -> None:
    loss = NodeLoss()
    name = {"workers": "the worker group's node", "leader": "the deliveries.webhook leader"}
    scenario = Scenario(
        f"rabbitmq cluster: kill -9 {name[choose]}, restarted", kill_node(cluster, choose, loss),
        max_duplicates=NODE_LOSS_DUPLICATES, events=EVENTS, rate_per_second=RATE_PER_SECOND,
        config=AMQP_INGEST,
    )  # fmt: skip
    urls = cluster.urls(cluster_vhost)
    outcome = await run_scenario(
        scenario, database_url=database_url, broker_url=urls, vhost=cluster_vhost,
        tmp_path=tmp_path, read_depths=cluster.queue_depths,
    )  # fmt: skip
    print(f"\nkilled {loss.killed} (the queue's leader: {loss.leader}); "
          f"connections before {loss.before}; while down {loss.during}; "
          f"moved after {loss.moved_after_seconds:.1f} s; "
          f"{loss.delivered_while_down} webhooks delivered while it was down")  # fmt: skip
    await assert_guarantees(scenario, outcome, urls[0])
    # the pipeline kept delivering on the two nodes left, before the killed one came back
    assert loss.delivered_while_down > 0
    log = outcome.service.log()
    assert f"connected to RabbitMQ at 127.0.0.1:{cluster.node(loss.killed).port}/" in log
    assert "guest:guest" not in log  # a node is logged by its address, never with credentials


async def test_a_connection_goes_to_the_next_node_that_answers(
    cluster: Cluster, cluster_vhost: str
) -> None:
    """Nodes that refuse are passed over within the connect timeout; with none answering the
    error names every node tried (without credentials)."""
    refused = [f"amqp://guest:guest@127.0.0.1:{free_port()}/{cluster_vhost}" for _ in range(2)]
    live = cluster.nodes[0].url(cluster_vhost)
    async with open_bridge():
        for _ in range(3):  # whichever node it starts at, it ends on the live one
            with trio.fail_after(10):
                async with open_connection([*refused, live], name="test") as conn:
                    assert conn.node == f"127.0.0.1:{cluster.nodes[0].port}/{cluster_vhost}"
        with trio.fail_after(10), pytest.raises(BrokerError) as info:
            async with open_connection(refused, name="test"):
                pass  # pragma: no cover - nothing answers
    message = str(info.value)
    assert message.startswith("no RabbitMQ node took the connection")
    assert all(url.split("@")[1].split("/")[0] in message for url in refused)
    assert "guest" not in message


async def test_a_node_that_never_answers_gets_its_share_of_the_connect_bound(
    cluster: Cluster, cluster_vhost: str
) -> None:
    """A node that takes the TCP connection but never speaks (a hung node) holds a connection
    attempt for its share of the bound only: with two nodes and 4 s, 2 s, then the next node
    (which would get no time at all had the silent one kept the whole bound)."""

    async def silent(stream: trio.SocketStream) -> None:
        async with stream:
            await trio.sleep_forever()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    urls = [
        f"amqp://guest:guest@127.0.0.1:{port}/{cluster_vhost}",
        cluster.nodes[0].url(cluster_vhost),
    ]
    took: list[float] = []
    async with trio.open_nursery() as nursery, open_bridge():
        nursery.start_soon(trio.serve_listeners, silent, listeners)
        # after connecting to the live node (the second), a connection starts at the first:
        # of two connections, at least one tries the silent node first
        for _ in range(2):
            began = trio.current_time()
            with trio.fail_after(10):
                async with open_connection(urls, name="test", connect_timeout_seconds=4) as conn:
                    assert conn.node.startswith(f"127.0.0.1:{cluster.nodes[0].port}/")
            took.append(trio.current_time() - began)
        nursery.cancel_scope.cancel()
    assert max(took) >= 2.0, took  # it waited out the silent node's share, then went on


async def test_a_publish_in_flight_on_a_lost_node_is_not_confirmed(
    cluster: Cluster, cluster_vhost: str
) -> None:
    """What the relay relies on to keep an outbox row: the publisher answers CONFIRMED only for
    what the cluster holds. Batches go on to a queue led by the node published to, until that
    node is killed under them; every message confirmed is then read back from another node."""
    node, other = cluster.nodes[0], cluster.nodes[1]
    confirmed: set[str] = set()
    not_confirmed = 0
    async with open_bridge():
        async with open_connection(node.url(cluster_vhost), name="test") as conn:
            await conn.declare(build_topology(["webhook"], [1], "quorum"))  # led from here
            assert cluster.queue_leader(cluster_vhost, "deliveries.webhook") == node.nodename
            async with conn.open_publisher(5) as publisher, trio.open_nursery() as nursery:
                sent = 0
                with trio.fail_after(60):
                    while not not_confirmed:
                        batch = [
                            Outgoing("deliveries", "webhook", b"{}", f"m-{sent + i}")
                            for i in range(200)
                        ]
                        sent += len(batch)
                        results = await publisher.publish_batch(batch)
                        for message, result in zip(batch, results, strict=True):
                            if result is Confirm.CONFIRMED:
                                confirmed.add(message.message_id)
                            else:
                                not_confirmed += 1
                        if sent == len(batch):  # the first batch is in: kill it under the next
                            nursery.start_soon(trio.to_thread.run_sync, cluster.kill, node)
        print(f"\n{len(confirmed)} confirmed, {not_confirmed} not confirmed")
        assert len(confirmed) >= 200
        # every confirmed message is in the queue: consumed from a node that stayed up
        found: set[str] = set()
        with trio.move_on_after(60):
            async with (
                open_connection(other.url(cluster_vhost), name="test") as reading,
                reading.open_consumer("deliveries.webhook", 1000) as consumer,
            ):
                while not confirmed <= found:
                    incoming = await consumer.receive.receive()
                    found.add(incoming.message_id or "")
                    incoming.settle(Settle.ACK)
    missing = confirmed - found
    assert not missing, f"{len(missing)} confirmed messages not in the queue after 60 s"
