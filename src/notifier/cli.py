"""``notifier migrate | run | tenant create``. Exit codes: 0 ok, 1 runtime failure, 2 bad usage
or config."""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import sys
from collections.abc import Sequence

import trio

from notifier import service
from notifier.config import Config, load_config
from notifier.errors import ConfigError, NotifierError
from notifier.ingest.tenants import hash_api_key
from notifier.logs import setup_fallback_logging, setup_logging
from notifier.observability import setup_sentry
from notifier.store import open_store

log = logging.getLogger("notifier")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
API_KEY_PREFIX = "nk_"


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", help="TOML config (default: $NOTIFIER_CONFIG)")
    parser = argparse.ArgumentParser(prog="notifier", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", parents=[common], help="create or update the database schema")
    run = sub.add_parser("run", parents=[common], help="run the service")
    run.add_argument(
        "--role",
        default=",".join(service.ROLES),
        help=f"comma-separated subset of {','.join(service.ROLES)} (default: all)",
    )
    tenant = sub.add_parser("tenant", help="manage tenants")
    tenant_sub = tenant.add_subparsers(dest="tenant_command", required=True)
    create = tenant_sub.add_parser(
        "create", parents=[common], help="create a tenant, print its key"
    )
    create.add_argument("name")
    return parser


def _roles(value: str) -> list[str]:
    roles = [r.strip() for r in value.split(",") if r.strip()]
    unknown = sorted(set(roles) - set(service.ROLES))
    if not roles or unknown:
        raise ConfigError(
            f"--role: unknown role(s) {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(service.ROLES)}"
        )
    return roles


async def _migrate(config: Config) -> None:
    async with open_store(config.database.url, max_size=2, pooler=config.database.pooler) as store:
        await store.migrate()
    print("schema is up to date")


async def _tenant_create(config: Config, name: str) -> None:
    api_key = API_KEY_PREFIX + secrets.token_urlsafe(32)
    async with open_store(config.database.url, max_size=2, pooler=config.database.pooler) as store:
        tenant_id = await store.create_tenant(name, hash_api_key(api_key))
    print(json.dumps({"id": str(tenant_id), "name": name, "api_key": api_key}))


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
            roles = _roles(args.role)
            setup_sentry(config.sentry)
            trio.run(service.run, config, roles)
        elif args.command == "migrate":
            trio.run(_migrate, config)
        else:
            trio.run(_tenant_create, config, args.name)
    except Exception as exc:
        errors = _leaves(exc)
        for err in errors:
            print(f"notifier: {_describe(err, args)}", file=sys.stderr)
        if not all(isinstance(e, NotifierError | OSError) for e in errors):
            log.error("unexpected failure", exc_info=exc)
        return EXIT_USAGE if any(isinstance(e, ConfigError) for e in errors) else EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
