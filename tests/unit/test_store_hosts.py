"""The hosts of a Postgres URL, as the store's connect splits them (``store/hosts.py``)."""

from __future__ import annotations

import pytest

from notifier.store.hosts import url_hosts


@pytest.mark.parametrize(
    ("url", "hosts"),
    [
        (
            "postgresql://u:p@pg1:5432,pg2:5433/db?target_session_attrs=read-write",
            [("pg1", 5432), ("pg2", 5433)],
        ),
        ("postgresql://pg1:5432,[::1]:6432/db", [("pg1", 5432), ("::1", 6432)]),
        ("postgresql://u@127.0.0.1:5432/db", [("127.0.0.1", 5432)]),
        # a host without its port (asyncpg fills it in), or none at all: not split
        ("postgresql://u@pg1,pg2:5432/db", []),
        ("postgresql://u@pg1:5432,[::1]/db", []),
        ("postgresql:///db?host=/run/postgresql", []),
        ("postgresql://u@pg1:x,pg2:5432/db", []),
    ],
)
def test_url_hosts(url: str, hosts: list[tuple[str, int]]) -> None:
    assert url_hosts(url) == hosts
