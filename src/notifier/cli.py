"""``notifier migrate | run | check | tenant create|list|rotate-key|disable|enable|expunge|
strict-event-types``.
Exit codes: 0 ok, 1 runtime failure (``check``: a check failed), 2 bad usage or config (a schema
that is not migrated, a tenant name taken or not found)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import secrets
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Literal

import trio

from notifier import __version__, service
from notifier.broker import amqp
from notifier.broker.nodes import node_address, node_urls
from notifier.broker.topology import build_topology, ingest_topology
from notifier.config import Config, load_config, process_count
from notifier.errors import ConfigError, NotifierError, StoreUnavailable
from notifier.ingest.tenants import hash_api_key
from notifier.launch import launch
from notifier.launch_child import READY_FD_ENV, notify_ready, orphaned
from notifier.logs import setup_fallback_logging, setup_logging
from notifier.observability import setup_sentry
from notifier.store import open_store
from notifier.store.errors import TenantExists
from notifier.store.expunge import EXPUNGE_BATCH
from notifier.store.versions import SchemaNotCurrent, SchemaState

log = logging.getLogger("notifier")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
API_KEY_PREFIX = "nk_"
TENANT_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
CHECK_TIMEOUT_SECONDS = 5.0  # each check of `notifier check`
MAX_EXPUNGE_BATCH = 10_000  # `tenant expunge --batch-size`: a transaction stays short


class UsageError(NotifierError):
    """What the operator asked cannot be done as asked (exit 2): a schema not migrated, a
    tenant name that is invalid, taken or unknown."""


def _tenant_name(value: str) -> str:
    if not TENANT_NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"invalid tenant name {value!r}: 1 to 100 letters, digits, '-', '_' or '.'"
        )
    return value


def _utc_time(value: str) -> datetime:
    """An ISO 8601 date (midnight UTC) or date and time (UTC unless it carries an offset)."""
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO date or date and time: {value!r} (e.g. 2026-01-31 or "
            "2026-01-31T12:00:00, UTC)"
        ) from None
    if at.tzinfo is None:
        return at.replace(tzinfo=UTC)
    try:
        return at.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before the first UTC time
        raise argparse.ArgumentTypeError(f"out of range in UTC: {value!r}") from None


def _batch_size(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= MAX_EXPUNGE_BATCH:
        raise argparse.ArgumentTypeError(
            f"expected a number from 1 to {MAX_EXPUNGE_BATCH}, got {value!r}"
        )
    return int(value)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", help="TOML config (default: $NOTIFIER_CONFIG)")
    parser = argparse.ArgumentParser(prog="notifier", description=__doc__)
    parser.add_argument("--version", action="version", version=f"notifier {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "migrate", parents=[common], help="apply the missing schema migrations (migrations/)"
    )
    sub.add_parser(
        "check",
        parents=[common],
        help="check the config, Postgres, the schema version and RabbitMQ's queues",
    )
    run = sub.add_parser("run", parents=[common], help="run the service")
    run.add_argument(
        "--role",
        default=",".join(service.ROLES),
        help=f"comma-separated subset of {','.join(service.ROLES)} (default: all)",
    )
    run.add_argument(
        "--processes",
        type=_processes,
        metavar="N",
        help="run N processes of the roles under a supervising parent, sharing the ingest "
        "port; 'auto' = one per core (default: service.processes, 1)",
    )
    tenant = sub.add_parser("tenant", help="manage tenants")
    tenant_sub = tenant.add_subparsers(dest="tenant_command", required=True)
    create = tenant_sub.add_parser(
        "create", parents=[common], help="create a tenant, print its key"
    )
    create.add_argument("name", type=_tenant_name)
    tenant_sub.add_parser("list", parents=[common], help="the tenants (never their keys)")
    for verb, what in (
        ("rotate-key", "give the tenant a new key, print it; the old one stops working"),
        ("disable", "refuse the tenant's key and fan its events out to no channel"),
        ("enable", "undo disable"),
    ):
        tenant_sub.add_parser(verb, parents=[common], help=what).add_argument(
            "name", type=_tenant_name
        )
    strict = tenant_sub.add_parser(
        "strict-event-types", parents=[common],
        help="on: refuse the tenant's events of types not in its event-type catalog; "
        "off: store them unchecked (the default)",
    )  # fmt: skip
    strict.add_argument("name", type=_tenant_name)
    strict.add_argument("setting", choices=("on", "off"))
    expunge = tenant_sub.add_parser(
        "expunge", parents=[common],
        help="expunge the payloads (and response excerpts) of the tenant's events created "
        "before DATE that have no delivery in flight; print the counts",
    )  # fmt: skip
    expunge.add_argument("name", type=_tenant_name)
    expunge.add_argument(
        "--before", type=_utc_time, required=True, metavar="DATE",
        help="ISO date or date and time, UTC unless it carries an offset; events created "
        "before it (not at it) are expunged",
    )  # fmt: skip
    expunge.add_argument(
        "--batch-size", type=_batch_size, default=EXPUNGE_BATCH, metavar="N",
        help=f"events per transaction (default {EXPUNGE_BATCH})",
    )  # fmt: skip
    return parser


def _processes(value: str) -> int | Literal["auto"]:
    if value == "auto":
        return "auto"
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a number ≥ 1 or 'auto', got {value!r}")
    return int(value)


def _roles(value: str) -> list[str]:
    roles = [r.strip() for r in value.split(",") if r.strip()]
    unknown = sorted(set(roles) - set(service.ROLES))
    if not roles or unknown:
        raise ConfigError(
            f"--role: unknown role(s) {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(service.ROLES)}"
        )
    return roles


async def _run_child(config: Config, roles: list[str]) -> None:
    """A process of a launch: ``service.run`` that tells the parent once every role started."""
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run, config, roles)
        notify_ready()


async def _schema_state(config: Config) -> SchemaState:
    async with open_store(config.database.url, max_size=1, pooler=config.database.pooler) as store:
        return await store.schema_state(CHECK_TIMEOUT_SECONDS)


def _require_schema(config: Config) -> None:
    """Refuse to run on a database whose schema is missing or older than this code's (exit 2,
    once: a launch's parent checks before it starts any process). A newer one — a newer release
    migrated it, migrations only add — is run on, with a warning. Postgres unreachable is not
    decided here: the start goes on and meets it as before (a launch starts its processes
    again, and each checks the schema once it can)."""
    try:
        state = trio.run(_schema_state, config)
    except Exception as exc:
        if not all(isinstance(e, StoreUnavailable) for e in _leaves(exc)):
            raise
        log.warning("schema version not checked: %s", _why(exc))
        return
    if state.status in ("missing", "behind"):
        raise SchemaNotCurrent(state.describe())
    if state.status == "ahead":
        log.warning("%s; running on it", state.describe())


def _run(config: Config, roles: list[str], args: argparse.Namespace) -> int:
    if (parent := orphaned()) is not None:
        # A process of a launch whose parent died before it could ask to die with it.
        log.error("the launch (pid %d) is gone: this process of it exits", parent)
        return EXIT_FAILURE
    _require_schema(config)
    count = process_count(
        args.processes if args.processes is not None else config.service.processes
    )
    if count > 1:
        return launch(
            args.config, roles, count, grace_seconds=config.service.shutdown_grace_seconds,
            bind=config.ingest.bind if "ingest" in roles else None,
            metrics_bind=config.ingest.metrics_bind if "ingest" in roles else None,
            start_timeout_seconds=config.service.start_timeout_seconds,
            session_secret_env=config.console.session_secret_env,
        )  # fmt: skip
    setup_sentry(config.sentry)
    if READY_FD_ENV in os.environ:
        trio.run(_run_child, config, roles)
    else:
        trio.run(service.run, config, roles)
    return EXIT_OK


async def _migrate(config: Config) -> None:
    async with open_store(config.database.url, max_size=2, pooler=config.database.pooler) as store:
        applied = await store.migrate()
        state = await store.schema_state()
    for m in applied:
        print(f"applied {m.version:04d}_{m.name}")
    print(f"schema is up to date: {state.describe()}")


async def _check(config: Config) -> bool:
    """One line per check, ``ok …`` or ``FAIL …`` (addresses, never credentials); whether
    every check passed."""
    passed = True

    def report(ok: bool, what: str) -> None:
        nonlocal passed
        passed = passed and ok
        print(f"{'ok' if ok else 'FAIL'} {what}", flush=True)

    report(True, "config")
    db = config.database
    try:
        with trio.fail_after(CHECK_TIMEOUT_SECONDS * 2):
            async with open_store(
                db.url, max_size=1, pooler=db.pooler,
                connect_timeout_seconds=CHECK_TIMEOUT_SECONDS,
            ) as store:  # fmt: skip
                await store.ping(CHECK_TIMEOUT_SECONDS)
                report(True, "database: Postgres answers")
                state = await store.schema_state(CHECK_TIMEOUT_SECONDS)
                report(state.status in ("current", "ahead"), f"schema: {state.describe()}")
    except Exception as exc:
        report(False, f"database: {_why(exc)}")
    # What the relay declares (and the workers consume), and AMQP ingest's own, if enabled.
    types = list(config.workers.enabled())
    parts = [build_topology(types, config.retry.tiers_seconds, config.broker.queue_type,
                            config.broker.fifo_partitions)]  # fmt: skip
    if config.amqp_ingest.enabled:
        ingest = config.amqp_ingest
        parts.append(ingest_topology(ingest.queue, ingest.dead_letter_queue_name,
                                     config.broker.queue_type))  # fmt: skip
    exchanges = [e for t in parts for e in t.exchanges]
    queues = [q.name for t in parts for q in t.queues]
    declared = len(exchanges) + len(queues)
    for url in node_urls(config.broker.url):
        node = node_address(url)
        try:
            missing = await amqp.missing_topology(
                url, exchanges, queues, timeout_seconds=CHECK_TIMEOUT_SECONDS
            )
        except Exception as exc:
            report(False, f"broker {node}: {_why(exc)}")
            continue
        report(True, f"broker {node}: RabbitMQ answers")
        found = f"{declared - len(missing)}/{declared} exchanges and queues declared"
        report(not missing, f"broker {node}: {found}"
               + (f"; missing {', '.join(missing)}" if missing else ""))  # fmt: skip
    return passed


def _why(exc: BaseException) -> str:
    """What went wrong, from the errors themselves (never a URL: those may carry passwords)."""
    leaves = _leaves(exc)
    return "; ".join(str(e) or type(e).__name__ for e in leaves)


def _new_key() -> str:
    return API_KEY_PREFIX + secrets.token_urlsafe(32)


async def _tenant(config: Config, args: argparse.Namespace) -> None:
    verb, name = args.tenant_command, getattr(args, "name", "")
    async with open_store(config.database.url, max_size=2, pooler=config.database.pooler) as store:
        if verb == "create":
            api_key = _new_key()
            try:
                tenant_id = await store.create_tenant(name, hash_api_key(api_key))
            except TenantExists as exc:
                raise UsageError(str(exc)) from None
            print(json.dumps({"id": str(tenant_id), "name": name, "api_key": api_key}))
        elif verb == "list":
            for t in await store.list_tenants():
                print(json.dumps({"name": t.name, "id": str(t.id),
                                  "created_at": t.created_at.isoformat(),
                                  "enabled": t.enabled}))  # fmt: skip
        elif verb == "expunge":
            owner = await store.tenant_id_by_name(name)
            if owner is None:
                raise UsageError(f"no tenant named {name!r}")
            done = await store.expunge_before(owner, args.before, batch_size=args.batch_size)
            print(json.dumps({"name": name, "before": args.before.isoformat(),
                              "expunged": done.expunged,
                              "skipped_in_flight": done.skipped_in_flight,
                              "batches": done.batches}))  # fmt: skip
        elif verb == "strict-event-types":
            if not await store.set_tenant_strict_event_types(name, args.setting == "on"):
                raise UsageError(f"no tenant named {name!r}")
            print(json.dumps({"name": name, "strict_event_types": args.setting == "on"}))
        elif verb == "rotate-key":
            api_key = _new_key()
            if not await store.rotate_tenant_key(name, hash_api_key(api_key)):
                raise UsageError(f"no tenant named {name!r}")
            print(json.dumps({"name": name, "api_key": api_key}))
        else:
            if not await store.set_tenant_enabled(name, verb == "enable"):
                raise UsageError(f"no tenant named {name!r}")
            print(f"tenant {name!r} {verb}d")


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _describe(exc: BaseException, args: argparse.Namespace) -> str:
    if isinstance(exc, ConfigError):
        return f"config error: {exc}"
    return str(exc) or repr(exc)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # exits 2 on bad usage
    setup_fallback_logging()  # until the config says how
    try:
        config = load_config(args.config)
        setup_logging(config.logging)
        if args.command == "run":
            return _run(config, _roles(args.role), args)
        elif args.command == "migrate":
            trio.run(_migrate, config)
        elif args.command == "check":
            return EXIT_OK if trio.run(_check, config) else EXIT_FAILURE
        else:
            trio.run(_tenant, config, args)
    except Exception as exc:
        errors = _leaves(exc)
        for err in errors:
            print(f"notifier: {_describe(err, args)}", file=sys.stderr)
        if not all(isinstance(e, NotifierError | OSError) for e in errors):
            log.error("unexpected failure", exc_info=exc)
        usage = any(isinstance(e, ConfigError | UsageError | SchemaNotCurrent) for e in errors)
        return EXIT_USAGE if usage else EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
