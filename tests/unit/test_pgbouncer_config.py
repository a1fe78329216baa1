"""The PgBouncer settings: ``database.pooler`` and ``database.listen_url`` in the config, and
deploy/pgbouncer.ini as the tests render it."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from notifier.config import parse_config
from notifier.errors import ConfigError
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
