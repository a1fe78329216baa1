"""The PgBouncer settings: ``database.pooler`` and ``database.listen_url`` in the config (and
the database URLs asyncpg cannot read), and deploy/pgbouncer.ini as the tests render it."""

from __future__ import annotations

import configparser
from pathlib import Path
from typing import cast

import asyncpg
import pytest

from notifier.bridge import open_bridge
from notifier.config import parse_config
from notifier.errors import ConfigError, StoreError, StoreUnavailable
from notifier.store.outbox import OutboxQueries
from notifier.store.pool import Pool
from tests.pgbouncer import TEMPLATE, render


def test_the_pooler_and_listen_url_default_to_postgres_itself() -> None:
    db = parse_config({}, env={}).database
    assert (db.pooler, db.listen_url) == ("none", "")


def test_an_unknown_pooler_is_refused_with_its_dotted_key() -> None:
    with pytest.raises(ConfigError, match=r"database\.pooler"):
        parse_config({"database": {"pooler": "pgpool"}}, env={})


def test_the_listen_url_comes_from_the_environment_over_the_file() -> None:
    data = {"database": {"pooler": "pgbouncer", "listen_url": "postgresql://file/db"}}
    env = {"NOTIFIER_DATABASE_LISTEN_URL": "postgresql://env/db"}
    assert parse_config(data, env=env).database.listen_url == "postgresql://env/db"


def test_the_deploy_config_is_rendered_with_the_tests_port_paths_and_databases() -> None:
    text = render(
        TEMPLATE.read_text(encoding="utf-8"), port=16432, workdir=Path("/tmp/x"),
        target=("127.0.0.1", 5432), pool_size=3,
    )  # fmt: skip
    ini = configparser.ConfigParser(interpolation=None)
    ini.read_string(text)
    settings = ini["pgbouncer"]
    assert settings["pool_mode"] == "transaction"  # kept from the deploy file
    assert settings["listen_port"] == "16432"
    assert settings["auth_file"] == "/tmp/x/userlist.txt"
    assert settings["logfile"] == "/tmp/x/pgbouncer.log"
    assert settings["default_pool_size"] == "3"
    assert dict(ini["databases"]) == {"*": "host=127.0.0.1 port=5432"}


PASSWORD = "s3cr/e#t?x"  # what a generated password may hold


@pytest.mark.parametrize("key", ["url", "listen_url"])
@pytest.mark.parametrize(
    "url",
    [
        "postgresql://notifier:s3cr/et@db:5432/notifier",  # asyncpg takes `s3cr` for the port
        "postgresql://notifier:s3cr#et@db/notifier",
        "postgresql://notifier:s3cr?et@db/notifier",
        "postgresql://notifier:s3cr@et@db/notifier",  # asyncpg takes `et@db` for the host
        "postgresql://notifier@db:s3cr/notifier",
        "mysql://notifier:s3cr@db/notifier",
    ],
)
def test_a_database_url_asyncpg_cannot_read_is_refused_without_echoing_it(
    key: str, url: str
) -> None:
    with pytest.raises(ConfigError, match=rf"^database\.{key}: ") as refused:
        parse_config({"database": {key: url}}, env={})
    assert "s3cr" not in str(refused.value)
    assert "notifier" not in str(refused.value).removeprefix(f"database.{key}: ")


def test_a_database_url_from_the_environment_is_checked_too() -> None:
    env = {"NOTIFIER_DATABASE_LISTEN_URL": f"postgresql://n:{PASSWORD}@db/n"}
    with pytest.raises(ConfigError, match=r"^database\.listen_url: ") as refused:
        parse_config({}, env=env)
    assert "s3cr" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://notifier:s3cr%2Fe%23t%3Fx%40y@db:5432/notifier",  # percent-encoded
        "postgres://notifier:a:b@db/notifier",  # asyncpg splits user and password at the first :
        "postgresql://notifier@db1:5432,db2:5433/notifier",  # hosts to try in turn
        "postgresql://notifier@[::1]:5432/notifier",
        "postgresql:///notifier?host=/run/postgresql",
    ],
)
def test_database_urls_asyncpg_reads_are_taken(url: str) -> None:
    assert parse_config({"database": {"listen_url": url}}, env={}).database.listen_url == url


async def test_a_listen_url_asyncpg_cannot_read_fails_the_doorbell_without_echoing_it() -> None:
    """Whatever got past the config (a store opened by hand): a ``StoreError`` the doorbell's
    loop logs as a refused LISTEN, with no part of the URL, not even as its context."""
    queries = OutboxQueries(Pool(cast(asyncpg.Pool, None), 1.0), f"postgresql://n:{PASSWORD}@db/n")
    async with open_bridge():
        with pytest.raises(StoreError) as refused:
            async with queries.open_doorbell():
                pass  # pragma: no cover
    assert "database.listen_url" in str(refused.value)
    assert "s3cr" not in str(refused.value)
    assert not isinstance(refused.value, StoreUnavailable)
    assert refused.value.__cause__ is None
    assert refused.value.__context__ is None
