"""Config: defaults, refusals that name the key's path, env overrides, file loading, the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from notifier.cli import main
from notifier.config import (
    BrokerConfig,
    Config,
    DatabaseConfig,
    RetryConfig,
    WebhookWorkersConfig,
    load_config,
    parse_config,
)
from notifier.errors import ConfigError

GOOD_TOML = """
[database]
url = "postgresql://file@db/notifier"

[broker]
url = "amqp://file@mq/"

[sentry]
dsn = "https://file@sentry.example/1"

[workers.webhook]
concurrency = 4
prefetch = 8
"""


def write(tmp_path: Path, text: str, name: str = "notifier.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def refusal(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, env={})
    return str(info.value)


# -- defaults -----------------------------------------------------------------------------------


def test_an_empty_document_gives_the_defaults() -> None:
    config = parse_config({}, env={})
    assert config == Config()
    assert config.service.shutdown_grace_seconds == 10.0
    assert config.database.url == DatabaseConfig().url
    assert config.broker.url == "amqp://guest:guest@127.0.0.1:5672/"
    assert config.broker.queue_type == "quorum"
    assert config.ingest.bind == "127.0.0.1:8080"
    assert config.ingest.max_body_bytes == 1_048_576
    assert config.ingest.http2 is False  # HTTP/2 cleartext is opt-in
    assert config.relay.batch_size == 500
    assert config.relay.poll_interval_seconds == 1.0
    assert config.retry.base_seconds == 30
    assert config.retry.max_seconds == 1800
    assert config.retry.tiers_seconds == (1, 5, 15, 30, 60, 120, 240, 480, 960, 1800)
    assert config.sentry.dsn == ""
    assert config.workers.webhook is None


def test_a_present_workers_table_gets_the_section_defaults() -> None:
    config = parse_config({"workers": {"webhook": {}}}, env={})
    assert config.workers.webhook == WebhookWorkersConfig()
    assert config.workers.webhook.max_attempts == 5
    assert config.workers.webhook.allow_private_networks is False


def test_given_values_are_kept() -> None:
    config = parse_config(
        {
            "broker": {"queue_type": "classic", "heartbeat_seconds": 30},
            "retry": {"tiers_seconds": [2, 4, 8]},
            "workers": {"webhook": {"concurrency": 2, "prefetch": 2, "timeout_seconds": 3.5}},
        },
        env={},
    )
    assert config.broker == BrokerConfig(queue_type="classic", heartbeat_seconds=30)
    assert config.retry == RetryConfig(tiers_seconds=(2, 4, 8))
    assert config.workers.webhook == WebhookWorkersConfig(
        concurrency=2, prefetch=2, timeout_seconds=3.5
    )


# -- refusals name the key's path ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "path"),
    [
        # in a section
        ({"service": {"foo": 1}}, "service.foo"),
        # in a nested table
        ({"workers": {"webhook": {"foo": 1}}}, "workers.webhook.foo"),
        # a channel type notifier has no worker group for
        ({"workers": {"carrier_pigeon": {}}}, "workers.carrier_pigeon"),
    ],
)
def test_an_unknown_key_is_refused_with_its_path(data: dict[str, Any], path: str) -> None:
    assert refusal(data) == f"{path}: unknown key"


def test_an_unknown_top_level_key_is_reported_like_nested_ones() -> None:
    # msgspec reports a root-level unknown field without its " - at `$`" suffix.
    assert refusal({"foo": 1}) == "foo: unknown key"


@pytest.mark.parametrize(
    ("data", "path"),
    [
        # a string where an int belongs
        ({"workers": {"webhook": {"concurrency": "32"}}}, "workers.webhook.concurrency"),
        # a string where a bool belongs
        ({"workers": {"webhook": {"allow_private_networks": "yes"}}},
         "workers.webhook.allow_private_networks"),
        # a scalar where a table belongs
        ({"relay": 5}, "relay"),
        # a string where a bool belongs, in the ingest section
        ({"ingest": {"http2": "true"}}, "ingest.http2"),
        # an array element of the wrong type
        ({"retry": {"tiers_seconds": [1, "5"]}}, "retry.tiers_seconds[1]"),
        # not one of the allowed values
        ({"broker": {"queue_type": "stream"}}, "broker.queue_type"),
    ],
)  # fmt: skip
def test_a_wrong_type_is_refused_with_its_path(data: dict[str, Any], path: str) -> None:
    message = refusal(data)
    assert message.startswith(f"{path}: "), message


@pytest.mark.parametrize(
    ("data", "path", "words"),
    [
        # at least one worker task
        ({"workers": {"webhook": {"concurrency": 0}}}, "workers.webhook.concurrency", ">= 1"),
        # heartbeats are 10 to 30 s
        ({"broker": {"heartbeat_seconds": 5}}, "broker.heartbeat_seconds", ">= 10"),
        ({"broker": {"heartbeat_seconds": 31}}, "broker.heartbeat_seconds", "<= 30"),
        # tiers must be strictly increasing
        ({"retry": {"tiers_seconds": [5, 1]}}, "retry.tiers_seconds", "strictly increasing"),
        ({"retry": {"tiers_seconds": [1, 1]}}, "retry.tiers_seconds", "strictly increasing"),
        ({"retry": {"tiers_seconds": []}}, "retry.tiers_seconds", "must not be empty"),
        # prefetch bounds the unacked messages the tasks share: at least one per task
        ({"workers": {"webhook": {"concurrency": 8, "prefetch": 4}}}, "workers.webhook.prefetch",
         "must be at least concurrency (8)"),
        ({"workers": {"email": {"concurrency": 8, "prefetch": 4}}}, "workers.email.prefetch",
         "must be at least concurrency (8)"),
        # networks opened to webhooks are CIDRs: the message names the entry
        ({"workers": {"webhook": {"allowed_cidrs": ["10.0.0.0/8", "10.1.2.3/8"]}}},
         "workers.webhook.allowed_cidrs[1]", "has host bits set"),
        # nameservers are addresses (a name would need a nameserver of its own)
        ({"workers": {"webhook": {"dns_servers": ["192.0.2.53", "ns1.example"]}}},
         "workers.webhook.dns_servers[1]", "must be an IP address"),
        ({"workers": {"webhook": {"dns_servers": ["192.0.2.53:70000"]}}},
         "workers.webhook.dns_servers[0]", "port must be 1-65535"),
        # bind is HOST:PORT
        ({"ingest": {"bind": "8080"}}, "ingest.bind", "HOST:PORT"),
        ({"ingest": {"bind": "localhost:"}}, "ingest.bind", "HOST:PORT"),
        ({"ingest": {"bind": "a b:80"}}, "ingest.bind", "HOST:PORT"),
        # a poll interval of zero would spin
        ({"relay": {"poll_interval_seconds": 0}}, "relay.poll_interval_seconds", "> 0"),
        # the circuit breaker: 0 turns it off, below that means nothing
        ({"workers": {"webhook": {"circuit_failure_threshold": -1}}},
         "workers.webhook.circuit_failure_threshold", ">= 0"),
        ({"workers": {"telegram": {"circuit_probe_base_seconds": 0}}},
         "workers.telegram.circuit_probe_base_seconds", "> 0"),
        # probes back off from the base up to the max: a max below the base is a mistake
        ({"workers": {"webhook": {"circuit_probe_base_seconds": 60,
                                  "circuit_probe_max_seconds": 30}}},
         "workers.webhook.circuit_probe_max_seconds", "at least circuit_probe_base_seconds (60)"),
    ],
)  # fmt: skip
def test_an_out_of_range_value_is_refused_with_its_path(
    data: dict[str, Any], path: str, words: str
) -> None:
    message = refusal(data)
    assert message.startswith(f"{path}: "), message
    assert words in message


def test_http2_can_be_turned_on() -> None:
    assert parse_config({"ingest": {"http2": True}}, env={}).ingest.http2 is True


@pytest.mark.parametrize("bind", ["0.0.0.0:80", "[::1]:8080", "notifier.internal:65535"])
def test_good_binds_are_accepted(bind: str) -> None:
    assert parse_config({"ingest": {"bind": bind}}, env={}).ingest.bind == bind


def test_the_database_waits_are_bounded_by_default_below_a_clients_timeout() -> None:
    database = parse_config({}, env={}).database
    assert database.acquire_timeout_seconds == 1.0
    assert database.statement_timeout_seconds == 3.0
    # A request waits for a connection, then its statement: within a 5 s client timeout.
    assert database.acquire_timeout_seconds + database.statement_timeout_seconds < 5


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        # zero would mean "no bound" to Postgres (statement_timeout = 0)
        ("statement_timeout_seconds", 0, ">= 0.001"),
        ("acquire_timeout_seconds", 0, ">= 0.001"),
        # under a millisecond rounds to zero on the server
        ("statement_timeout_seconds", 0.0001, ">= 0.001"),
        ("acquire_timeout_seconds", -1, ">= 0.001"),
        # a bound of over an hour is no bound for a request
        ("statement_timeout_seconds", 3601, "<= 3600"),
        ("acquire_timeout_seconds", 86_400, "<= 3600"),
        ("statement_timeout_seconds", "3", "Expected `float`"),
    ],
)
def test_a_database_bound_out_of_range_is_refused_with_its_key(
    key: str, value: Any, words: str
) -> None:
    message = refusal({"database": {key: value}})
    assert message.startswith(f"database.{key}: "), message
    assert words in message


def test_database_bounds_are_read_from_the_file(tmp_path: Path) -> None:
    text = "[database]\nacquire_timeout_seconds = 0.5\nstatement_timeout_seconds = 2\n"
    database = load_config(write(tmp_path, text), env={}).database
    assert (database.acquire_timeout_seconds, database.statement_timeout_seconds) == (0.5, 2.0)


# -- environment overrides ----------------------------------------------------------------------


def test_env_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_TOML)
    env = {
        "NOTIFIER_DATABASE_URL": "postgresql://env@db/notifier",
        "NOTIFIER_BROKER_URL": "amqp://env@mq/",
        "NOTIFIER_SENTRY_DSN": "https://env@sentry.example/2",
    }
    config = load_config(path, env=env)
    assert config.database.url == "postgresql://env@db/notifier"
    assert config.broker.url == "amqp://env@mq/"
    assert config.sentry.dsn == "https://env@sentry.example/2"
    assert config.workers.webhook is not None
    assert config.workers.webhook.concurrency == 4  # the rest of the file still counts


def test_without_env_overrides_the_file_counts(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD_TOML), env={})
    assert config.database.url == "postgresql://file@db/notifier"
    assert config.broker.url == "amqp://file@mq/"
    assert config.sentry.dsn == "https://file@sentry.example/1"


def test_env_overrides_apply_to_an_empty_document() -> None:
    config = parse_config({}, env={"NOTIFIER_BROKER_URL": "amqp://env@mq/"})
    assert config.broker.url == "amqp://env@mq/"
    assert config.database.url == DatabaseConfig().url


def test_an_empty_env_override_is_ignored() -> None:
    config = parse_config({"database": {"url": "postgresql://file/x"}},
                          env={"NOTIFIER_DATABASE_URL": ""})  # fmt: skip
    assert config.database.url == "postgresql://file/x"


def test_an_env_override_keeps_the_other_keys_of_its_section() -> None:
    data = {"database": {"url": "postgresql://file/x", "pool_max_size": 3}}
    config = parse_config(data, env={"NOTIFIER_DATABASE_URL": "postgresql://env/y"})
    assert config.database == DatabaseConfig(url="postgresql://env/y", pool_max_size=3)
    assert data["database"]["url"] == "postgresql://file/x"  # the caller's document is untouched


# -- loading files ------------------------------------------------------------------------------


def test_notifier_config_picks_the_file_when_no_path_is_given(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD_TOML)
    config = load_config(None, env={"NOTIFIER_CONFIG": str(path)})
    assert config.database.url == "postgresql://file@db/notifier"


def test_an_explicit_path_wins_over_notifier_config(tmp_path: Path) -> None:
    chosen = write(tmp_path, '[database]\nurl = "postgresql://chosen/x"\n', "chosen.toml")
    other = write(tmp_path, '[database]\nurl = "postgresql://other/x"\n', "other.toml")
    config = load_config(chosen, env={"NOTIFIER_CONFIG": str(other)})
    assert config.database.url == "postgresql://chosen/x"


def test_no_path_and_no_notifier_config_gives_the_defaults() -> None:
    assert load_config(None, env={}) == Config()


def test_a_missing_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"nope\.toml"):
        load_config(missing, env={})


def test_invalid_toml_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[database\nurl = \n", "broken.toml")
    with pytest.raises(ConfigError, match=r"broken\.toml: invalid TOML"):
        load_config(path, env={})


def test_a_refusal_from_a_file_names_the_key_path(tmp_path: Path) -> None:
    path = write(tmp_path, "[workers.webhook]\nfoo = 1\n")
    with pytest.raises(ConfigError, match=r"^workers\.webhook\.foo: unknown key$"):
        load_config(path, env={})


# -- enabled worker groups ----------------------------------------------------------------------


def test_enabled_lists_only_present_worker_tables() -> None:
    assert parse_config({}, env={}).workers.enabled() == {}
    config = parse_config({"workers": {"webhook": {"concurrency": 2}}}, env={})
    assert config.workers.enabled() == {"webhook": WebhookWorkersConfig(concurrency=2)}


# -- the CLI ------------------------------------------------------------------------------------


def test_cli_refuses_a_bad_config_with_exit_2_and_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = write(tmp_path, "[workers.webhook]\nfoo = 1\n")
    assert main(["migrate", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "workers.webhook.foo: unknown key" in err


def test_cli_refuses_a_missing_config_file_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--config", str(tmp_path / "absent.toml")]) == 2
    assert "absent.toml" in capsys.readouterr().err


def test_cli_refuses_an_unknown_role_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path, GOOD_TOML)
    assert main(["run", "--config", str(good), "--role", "bogus"]) == 2
    assert "bogus" in capsys.readouterr().err


def test_cli_bad_usage_exits_2() -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


def test_a_delivery_timeout_that_could_outlast_the_consumer_timeout_is_refused() -> None:
    # 300 s * ceil(64 / 8) = 2400 s a prefetched message could wait: past RabbitMQ's limit.
    message = refusal(
        {"workers": {"webhook": {"timeout_seconds": 300, "prefetch": 64, "concurrency": 8}}}
    )
    assert message.startswith("workers.webhook.timeout_seconds: "), message
    assert "2700 s" in message


def test_a_delivery_timeout_within_the_consumer_timeout_budget_is_accepted() -> None:
    config = parse_config(
        {"workers": {"webhook": {"timeout_seconds": 100, "prefetch": 64, "concurrency": 8}}},
        env={},
    )
    assert config.workers.webhook is not None
    assert config.workers.webhook.timeout_seconds == 100


# -- the ingest rate limit ----------------------------------------------------------------------


@pytest.mark.parametrize("rate", [1e-20, 1 / 3601, 1e-300])
def test_an_ingest_rate_below_one_an_hour_is_refused_naming_the_key(rate: float) -> None:
    # a refilling bucket keeps the time it is full again, 1/rate seconds an event: 1e20 s
    # ahead is past any timestamp Postgres keeps, and every ingest would fail
    message = refusal({"ingest": {"rate_limit_per_second": rate}})
    assert message.startswith("ingest.rate_limit_per_second: "), message
    assert "1/3600" in message
    assert "one event an hour" in message


@pytest.mark.parametrize("rate", [0.0, 1 / 3600, 0.5])
def test_no_ingest_limit_or_one_of_one_an_hour_or_more_is_accepted(rate: float) -> None:
    config = parse_config({"ingest": {"rate_limit_per_second": rate}}, env={})
    assert config.ingest.rate_limit_per_second == rate


def test_a_burst_smaller_than_a_batch_is_refused_naming_the_burst() -> None:
    # a batch is charged every event it holds: a bucket smaller than it could never admit it
    message = refusal(
        {"ingest": {"rate_limit_per_second": 1, "rate_limit_burst": 99, "max_batch_events": 100}}
    )
    assert message.startswith("ingest.rate_limit_burst: "), message
    assert "ingest.max_batch_events (100)" in message
    assert "could never be admitted" in message


@pytest.mark.parametrize(
    ("ingest", "burst"),
    [
        # the burst takes exactly one whole batch
        ({"rate_limit_per_second": 1, "rate_limit_burst": 10, "max_batch_events": 10}, 10),
        # no limit: the burst is not used
        ({"rate_limit_burst": 5, "max_batch_events": 10}, 5),
    ],
)  # fmt: skip
def test_a_burst_that_takes_a_batch_or_no_limit_is_accepted(
    ingest: dict[str, Any], burst: int
) -> None:
    assert parse_config({"ingest": ingest}, env={}).ingest.rate_limit_burst == burst


# -- allowed values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"logging": {"level": "LOUD"}},
         'logging.level: expected one of "DEBUG", "INFO", "WARNING", "ERROR", got "LOUD"'),
        ({"logging": {"format": "xml"}},
         'logging.format: expected one of "json", "console", got "xml"'),
        ({"broker": {"queue_type": "stream"}},
         'broker.queue_type: expected one of "quorum", "classic", got "stream"'),
        ({"workers": {"email": {"smtp_security": "ssl"}}},
         'workers.email.smtp_security: expected one of "none", "starttls", "tls", got "ssl"'),
        ({"database": {"pooler": "odyssey"}},
         'database.pooler: expected one of "none", "pgbouncer", got "odyssey"'),
        # a number or a word: both are told
        ({"service": {"processes": "many"}},
         'service.processes: expected an integer >= 1 or "auto", got "many"'),
    ],
)  # fmt: skip
def test_a_value_outside_a_set_is_refused_listing_the_allowed_ones(
    data: dict[str, Any], message: str
) -> None:
    assert refusal(data) == message


def test_a_wrong_type_for_a_key_with_allowed_values_keeps_the_type_message() -> None:
    assert refusal({"logging": {"level": 10}}) == "logging.level: Expected `str`, got `int`"
