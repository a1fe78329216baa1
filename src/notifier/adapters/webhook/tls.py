"""Trust and identity toward webhook receivers (docs/architecture.md §9): which CAs a receiver's
certificate may chain to, and the client certificates the operator declares for mutual TLS.

Trusted: the public roots (certifi's, as httpx bundles them), plus what the operator adds — the
bundle or directory that ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` name, as OpenSSL and Python read
them, and ``workers.webhook.ca_file``. Added, never instead: a public receiver stays reachable.

A client identity is ``[workers.webhook.client_certificates.<name>]``: a certificate file and an
unencrypted key file the operator controls, optionally limited to some tenants. A channel names
one (``tls_client_certificate``); the key is read into an ``ssl.SSLContext`` of its own at start
and never copied anywhere else (not into a channel's config, the API, a log or an error).
"""

from __future__ import annotations

import dataclasses
import os
import re
import ssl
import uuid
from collections.abc import Mapping

import httpx

from notifier.config import WebhookWorkersConfig
from notifier.errors import ConfigError

CERT_FILE_ENV = "SSL_CERT_FILE"
CERT_DIR_ENV = "SSL_CERT_DIR"


@dataclasses.dataclass(frozen=True)
class ClientIdentity:
    """A client certificate a channel may present: its context (trust plus the certificate) and
    the tenants whose channels may name it (empty: every tenant's)."""

    name: str
    context: ssl.SSLContext
    tenants: frozenset[uuid.UUID] = frozenset()

    def allows(self, tenant_id: uuid.UUID) -> bool:
        return not self.tenants or tenant_id in self.tenants


@dataclasses.dataclass(frozen=True)
class Tls:
    """The context that verifies receivers, and the client identities by name."""

    context: ssl.SSLContext
    identities: Mapping[str, ClientIdentity]


def unavailable(name: str) -> str:
    """What a channel naming a client certificate it may not use is told: the same for a name
    that does not exist and for one kept for other tenants, so nothing is learnt of those."""
    shown = name if re.fullmatch(r"[A-Za-z0-9_.-]+", name) else ascii(name)
    return f"no client certificate named {shown} is available to this tenant"


def trusted_context(ca_file: str = "", environ: Mapping[str, str] | None = None) -> ssl.SSLContext:
    """A context that verifies servers against the public roots, ``SSL_CERT_FILE`` and
    ``SSL_CERT_DIR`` of ``environ`` (when set) and ``ca_file`` (when given). ``ConfigError``
    naming the variable or key that does not hold certificates."""
    context = httpx.create_ssl_context(trust_env=False)
    context.set_alpn_protocols(["http/1.1"])
    env = environ or {}
    sources = [
        (CERT_FILE_ENV, {"cafile": env.get(CERT_FILE_ENV, "")}),
        (CERT_DIR_ENV, {"capath": env.get(CERT_DIR_ENV, "")}),
        ("workers.webhook.ca_file", {"cafile": ca_file}),
    ]
    for where, location in sources:
        if not (value := next(iter(location.values()))):
            continue
        if "capath" in location:  # read lazily by OpenSSL: check now that it can be
            for directory in value.split(os.pathsep):
                if not os.path.isdir(directory):
                    raise ConfigError(f"{where}: {directory!r} is not a directory")
        try:
            context.load_verify_locations(**location)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{where}: no CA certificates could be read from it ({exc})") from exc
    return context


def _refuse_passphrase() -> bytes:
    raise ValueError("an encrypted key: give an unencrypted key file protected by its permissions")


def with_identity(context: ssl.SSLContext, cert_file: str, key_file: str, where: str) -> None:
    """Make ``context`` present ``cert_file`` with ``key_file``. ``ConfigError`` naming
    ``where`` when they cannot be loaded (never quoting the key)."""
    try:
        context.load_cert_chain(cert_file, key_file, password=_refuse_passphrase)
    except ValueError as exc:
        raise ConfigError(f"{where}.key_file: {exc}") from None
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or type(exc).__name__
        raise ConfigError(
            f"{where}: the certificate and key could not be loaded ({reason}); cert_file must "
            "hold a PEM certificate and key_file its unencrypted PEM key"
        ) from None


def load_tls(settings: WebhookWorkersConfig, environ: Mapping[str, str]) -> Tls:
    """The trust and the client identities ``[workers.webhook]`` declares, read at start: a
    file that cannot be read is a ``ConfigError`` naming its key then, not an error of every
    delivery later."""
    identities = {}
    for name, cert in settings.client_identities().items():
        # A context of its own (the same trust): one per identity, so a connection presents
        # the certificate of its channel's identity or none.
        context = trusted_context(settings.ca_file, environ)
        where = f"workers.webhook.client_certificates.{name}"
        with_identity(context, cert.cert_file, cert.key_file, where)
        tenants = frozenset(uuid.UUID(t) for t in cert.tenants)
        identities[name] = ClientIdentity(name, context, tenants)
    return Tls(trusted_context(settings.ca_file, environ), identities)
