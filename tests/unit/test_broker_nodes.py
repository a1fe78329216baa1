"""``broker.url`` as one node or a cluster's nodes: parsing and refusals, the environment
override, and the order in which a connection tries the nodes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from notifier.broker.nodes import NodeChooser, node_address, node_urls
from notifier.config import parse_config
from notifier.errors import ConfigError

A, B, C = "amqp://u:p@a:5672/v", "amqp://u:p@b:5672/v", "amqps://u:p@c/v"


# -- broker.url -----------------------------------------------------------------------------------


def test_one_url_stays_one_url() -> None:
    config = parse_config({"broker": {"url": A}}, env={})
    assert config.broker.url == A
    assert node_urls(config.broker.url) == (A,)


def test_a_list_of_urls_is_the_nodes_in_order() -> None:
    config = parse_config({"broker": {"url": [A, B, C]}}, env={})
    assert node_urls(config.broker.url) == (A, B, C)


@pytest.mark.parametrize(
    ("url", "path", "words"),
    [
        # not an AMQP URL
        ("http://a/", "broker.url", "amqps?://"),
        # an empty list names no node
        ([], "broker.url", "length >= 1"),
        # the second node is not an AMQP URL: its index is named
        ([A, "b:5672"], "broker.url[1]", "amqps?://"),
        # nor a string at all
        ([A, B, 5], "broker.url[2]", "str"),
        # neither a string nor a list
        (5, "broker.url", "str | array"),
    ],
)  # fmt: skip
def test_a_bad_url_is_refused_naming_it(url: Any, path: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"broker": {"url": url}}, env={})
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert words in message


@pytest.mark.parametrize(
    ("url", "path", "words"),
    [
        # an unencoded / in the password: yarl, as aiormq reads it, finds the port "gu"
        ("amqp://guest:gu/est@h:5672/", "broker.url", "percent-encode"),
        # the same in the second node of a list: its index is named
        ([A, "amqp://guest:gu/est@h:5672/"], "broker.url[1]", "percent-encode"),
        # an unencoded # or ? in the password ends the address there
        ("amqp://guest:gu#est@h/", "broker.url", "percent-encode"),
        ([A, B, "amqps://guest:gu?est@h/"], "broker.url[2]", "percent-encode"),
        # a port out of range, or 0
        ("amqp://guest:guest@h:65536/", "broker.url", "percent-encode"),
        ("amqp://guest:guest@h:0/", "broker.url", "1 to 65535"),
        # no host at all
        ("amqp:///vhost", "broker.url", "no host"),
    ],
)  # fmt: skip
def test_a_url_aiormq_cannot_read_is_refused_naming_it_and_not_its_password(
    url: Any, path: str, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({"broker": {"url": url}}, env={})
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert words in message
    assert "gu" not in message
    assert "est" not in message


def test_a_percent_encoded_password_is_accepted() -> None:
    url = "amqp://guest:gu%2Fest%23%3F@h:5672/v"
    assert parse_config({"broker": {"url": [A, url]}}, env={}).broker.url == (A, url)


def test_a_bad_url_from_the_environment_is_refused_naming_its_place() -> None:
    with pytest.raises(ConfigError, match=r"^broker\.url\[1\]: .*percent-encode"):
        parse_config({}, env={"NOTIFIER_BROKER_URL": f"{A},amqp://guest:gu/est@h:5672/"})


def test_the_env_override_takes_a_comma_separated_list() -> None:
    config = parse_config({"broker": {"url": A}}, env={"NOTIFIER_BROKER_URL": f"{B}, {C}"})
    assert config.broker.url == (B, C)


def test_the_env_override_with_one_url_is_one_url() -> None:
    config = parse_config({}, env={"NOTIFIER_BROKER_URL": B})
    assert config.broker.url == B


def test_an_empty_item_in_the_env_override_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"^broker\.url\[1\]: "):
        parse_config({}, env={"NOTIFIER_BROKER_URL": f"{A},,{B}"})


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("amqp://user:secret@mq.example:5673/prod", "mq.example:5673/prod"),
        ("amqps://user:secret@mq.example/prod", "mq.example:5671/prod"),  # the TLS default
        ("amqp://mq.example", "mq.example:5672/"),  # the default port and vhost
        ("amqp://u:p@[::1]:5672/%2F", "[::1]:5672/%2F"),
        ("amqp://u:p@host:notaport/", "(an unreadable URL)"),  # never the URL itself
    ],
)  # fmt: skip
def test_a_node_address_never_shows_the_credentials(url: str, address: str) -> None:
    assert node_address(url) == address


# -- which node a connection tries first ----------------------------------------------------------


def test_a_connection_tries_every_node_once_from_its_start() -> None:
    chooser = NodeChooser(random.Random(7))
    order = chooser.order("relay", 3)
    assert sorted(order) == [0, 1, 2]
    assert order == [(order[0] + i) % 3 for i in range(3)]  # in turn, wrapping round


def test_a_lost_connection_starts_again_at_the_next_node() -> None:
    chooser = NodeChooser(random.Random(7))
    first = chooser.order("workers.webhook", 3)[0]
    chooser.connected("workers.webhook", first, 3)
    assert chooser.order("workers.webhook", 3)[0] == (first + 1) % 3
    # it went to the node after that one (the next did not answer): it goes on from there
    chooser.connected("workers.webhook", (first + 2) % 3, 3)
    assert chooser.order("workers.webhook", 3)[0] == first


def test_the_connections_of_one_process_start_on_different_nodes() -> None:
    chooser = NodeChooser(random.Random(7))
    starts = [chooser.order(name, 3)[0] for name in ("relay", "workers.webhook", "amqp_ingest")]
    assert sorted(starts) == [0, 1, 2]
    assert chooser.order("relay", 3)[0] == starts[0]  # asking again, unconnected: the same


def test_processes_start_at_their_own_random_node() -> None:
    starts = {NodeChooser(random.Random(seed)).order("relay", 3)[0] for seed in range(30)}
    assert starts == {0, 1, 2}  # a fleet of processes spreads over the cluster


def test_one_node_is_always_node_zero() -> None:
    chooser = NodeChooser(random.Random(7))
    assert chooser.order("relay", 1) == [0]
    chooser.connected("relay", 0, 1)
    assert chooser.order("relay", 1) == [0]


def test_no_node_is_refused() -> None:
    with pytest.raises(ValueError, match="no broker node"):
        NodeChooser().order("relay", 0)
