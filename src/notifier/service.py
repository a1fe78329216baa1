"""THE supervisor: the whole task tree of ``notifier run``, in pipeline order."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
from collections.abc import Iterable, Mapping

import trio

from notifier.adapters.base import Adapter, ChannelValidator
from notifier.adapters.registry import build_adapters
from notifier.adapters.specs import build_validators
from notifier.alerts import Alerts, open_alerts
from notifier.broker import amqp
from notifier.broker.topology import build_topology
from notifier.config import Config
from notifier.ingest.amqp_ingest import run_amqp_ingest
from notifier.ingest.app import create_app
from notifier.ingest.limits import ConnectionLimits, max_connections
from notifier.ingest.metrics_access import (
    METRICS_MAX_BODY_BYTES,
    create_metrics_app,
    metrics_endpoint,
    open_metrics_listeners,
)
from notifier.ingest.serve import open_listeners, serve_ingest
from notifier.ingest.tenants import TenantCaches, keep_tenant_caches_fresh
from notifier.lifecycle import Stop, supervise
from notifier.maintenance import run_maintenance
from notifier.metrics import Metrics, run_process_metrics
from notifier.observability import Reporter, SentryReporter
from notifier.relay.relay import relay_loop
from notifier.store import Store, open_store
from notifier.tracing import NO_TRACING, Tracing, open_tracing
from notifier.worker.group import run_worker_group

log = logging.getLogger("notifier.service")

ROLES = ("ingest", "relay", "workers", "maintenance")


async def run_relay(
    config: Config,
    store: Store,
    stop: Stop,
    *,
    metrics: Metrics | None = None,
    tracing: Tracing = NO_TRACING,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. The relay on an AMQP connection of its own (docs/architecture.md §4)."""
    types = list(config.workers.enabled())
    async with amqp.open_connection(
        config.broker.url, name="relay", heartbeat_seconds=config.broker.heartbeat_seconds
    ) as conn:
        await conn.declare(
            build_topology(types, config.retry.tiers_seconds, config.broker.queue_type,
                           config.broker.fifo_partitions)
        )  # fmt: skip
        async with conn.open_publisher(config.broker.publish_timeout_seconds) as publisher:
            await relay_loop(
                store, publisher, stop, batch_size=config.relay.batch_size,
                poll_interval_seconds=config.relay.poll_interval_seconds, metrics=metrics,
                tracing=tracing, fifo_partitions=config.broker.fifo_partitions,
                task_status=task_status,
            )  # fmt: skip


async def run(
    config: Config,
    roles: Iterable[str] = ROLES,
    *,
    stop: Stop | None = None,
    adapters: Mapping[str, Adapter] | None = None,
    validators: Mapping[str, ChannelValidator] | None = None,
    reporter: Reporter | None = None,
    tenant_caches: TenantCaches | None = None,
    environ: Mapping[str, str] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Trio-flavoured. Run the chosen roles until SIGINT/SIGTERM (or ``stop``), then drain.

    Children start in pipeline order with ``nursery.start``, so a component that cannot start
    (port taken, broker refusing the topology) fails the start-up before the next one starts.
    ``task_status`` receives the ingest server's bound addresses (empty without ingest).
    ``adapters`` replaces the registry's deliverers (by channel type; tests pass fakes; one
    that also validates configs, like ``notifier.testing.RecordingAdapter``, replaces its type's
    validator too), ``validators`` the specs' validators, and ``reporter`` the Sentry reporter
    that every supervisor and worker group reports to. ``tenant_caches`` holds the ingest
    role's tenant caches (tests pass one with another TTL). ``environ`` holds the variable
    ``ingest.metrics_token_env`` names (default: this process's environment).

    Deliverers, which read the adapters' secrets from the environment, are built only for the
    ``workers`` role; the API validates channel configs with the specs' validators.
    """
    roles = set(roles)
    stop = stop or Stop()
    # a reporter given (a test's) or Sentry configured: dead deliveries' alerts go to it too
    sentry_on = reporter is not None or bool(config.sentry.dsn)
    reporter = reporter if reporter is not None else SentryReporter()
    supervised = functools.partial(supervise, reporter=reporter)
    overrides = dict(adapters or {})
    validators = {
        **build_validators(config),
        **{t: a for t, a in overrides.items() if isinstance(a, ChannelValidator)},
        **(validators or {}),
    }
    built = build_adapters(config) if "workers" in roles else {}
    adapters = {**built, **overrides}
    grace = config.service.shutdown_grace_seconds
    db = config.database
    metrics = Metrics()  # this process's; /metrics serves it where ingest runs
    # Spans only with [tracing] otlp_endpoint set; the last of them sent at the end (bounded).
    async with open_tracing(config.tracing) as tracing, open_store(
        db.url, max_size=db.pool_max_size, connect_timeout_seconds=db.connect_timeout_seconds,
        acquire_timeout_seconds=db.acquire_timeout_seconds,
        statement_timeout_seconds=db.statement_timeout_seconds, pooler=db.pooler,
        listen_dsn=db.listen_url,
    ) as store:  # fmt: skip
        async with trio.open_nursery() as root:
            root.start_soon(_stop_on_signals, stop, root.cancel_scope)
            root.start_soon(_bound_shutdown, stop, root.cancel_scope, grace)
            root.start_soon(run_process_metrics, metrics)
            alerts: Alerts | None = None
            if "workers" in roles:
                # Failure alerts of dead deliveries: a task of their own, beside the services,
                # so the deliveries that die while the workers drain are still told.
                alerts = open_alerts(
                    config.alerts, store, os.environ if environ is None else environ,
                    reporter=reporter if sentry_on else None, metrics=metrics,
                )  # fmt: skip
                await root.start(alerts.run)
            binds: list[str] = []
            async with contextlib.AsyncExitStack() as owned, trio.open_nursery() as services:
                if "ingest" in roles:
                    # One LISTEN connection: a changed tenant is forgotten by every cache here
                    # (not awaited: a Postgres down at start delays nothing; the caches are
                    # emptied once it listens, and bounded by their TTL until then).
                    caches = tenant_caches if tenant_caches is not None else TenantCaches()
                    root.start_soon(keep_tenant_caches_fresh, store, caches)
                    app = create_app(
                        store, config, validators,
                        check_broker=functools.partial(amqp.probe, config.broker.url),
                        metrics=metrics,
                        read_queue_depths=functools.partial(amqp.queue_depths, config.broker.url),
                        tenant_caches=caches, environ=environ, tracing=tracing,
                    )  # fmt: skip
                    # Bound once (a port taken fails the start), kept while the server restarts.
                    listeners = owned.enter_context(open_listeners(config.ingest.bind))
                    binds = listeners.binds
                    limits = ConnectionLimits(
                        max_connections(config.ingest.max_connections),
                        config.ingest.max_connections_per_address,
                    )
                    ingest = functools.partial(
                        serve_ingest, app, listeners, stop, grace_seconds=grace,
                        http2=config.ingest.http2, max_body_bytes=config.ingest.max_body_bytes,
                        write_timeout_seconds=config.ingest.write_timeout_seconds,
                        limits=limits, metrics=metrics,
                    )  # fmt: skip
                    await services.start(supervised, "ingest", ingest, stop)
                    if config.ingest.metrics_bind:
                        # /metrics on an address of its own; the ingest port answers 404 for it.
                        metrics_app = create_metrics_app(metrics_endpoint(app))
                        metrics_listeners = owned.enter_context(
                            open_metrics_listeners(config.ingest.metrics_bind)
                        )
                        log.info("serving /metrics on %s", " ".join(metrics_listeners.binds))
                        serve_metrics = functools.partial(
                            serve_ingest, metrics_app, metrics_listeners, stop,
                            grace_seconds=grace, http2=False,
                            max_body_bytes=METRICS_MAX_BODY_BYTES,
                            write_timeout_seconds=config.ingest.write_timeout_seconds,
                        )  # fmt: skip
                        await services.start(supervised, "metrics", serve_metrics, stop)
                    if config.amqp_ingest.enabled:
                        amqp_ingest = functools.partial(
                            run_amqp_ingest, config, store, stop, metrics=metrics,
                            tenant_caches=caches,
                        )  # fmt: skip
                        await services.start(supervised, "amqp_ingest", amqp_ingest, stop)
                if "relay" in roles:
                    relay = functools.partial(
                        run_relay, config, store, stop, metrics=metrics, tracing=tracing
                    )
                    await services.start(supervised, "relay", relay, stop)
                if "workers" in roles:
                    for channel_type, workers in config.workers.enabled().items():
                        group = functools.partial(
                            run_worker_group, channel_type, config, workers, store,
                            adapters[channel_type], stop, reporter=reporter, metrics=metrics,
                            alerts=alerts,
                            tracing=tracing,
                        )  # fmt: skip
                        await services.start(supervised, f"workers.{channel_type}", group, stop)
                if "maintenance" in roles:
                    maintenance = functools.partial(
                        run_maintenance, config.maintenance, store, stop
                    )
                    await services.start(supervised, "maintenance", maintenance, stop)
                log.info("notifier running: roles %s%s", ",".join(sorted(roles)),
                         f", listening on {' '.join(binds)}" if binds else "")  # fmt: skip
                task_status.started(binds)
            if alerts is not None:  # the last alerts get one try each, within the grace
                await alerts.drain(config.alerts.timeout_seconds)
            root.cancel_scope.cancel()  # every service has stopped: end the signal watcher
        for adapter in {id(a): a for a in [*built.values(), *adapters.values()]}.values():
            await adapter.aclose()
    log.info("notifier stopped")


async def _stop_on_signals(stop: Stop, root: trio.CancelScope) -> None:
    """First SIGINT/SIGTERM: graceful stop. Second: stop now."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            name = signal.Signals(signum).name
            if stop.is_set():
                log.warning("second %s: stopping now", name)
                root.cancel()
                return
            log.info("%s: stopping", name)
            stop.set()


async def _bound_shutdown(stop: Stop, root: trio.CancelScope, grace_seconds: float) -> None:
    """Once a stop is requested, whatever is still running after the grace period is cancelled
    (its unacked messages go back to the queue)."""
    await stop.wait()
    log.info("draining: in-flight work has %.1f s", grace_seconds)
    root.deadline = trio.current_time() + grace_seconds + 1.0
