"""``[workers.webhook]``: the webhook workers' trust, identities, resolver and egress."""

from __future__ import annotations

import ipaddress
import os
import re
import urllib.parse
import uuid
from typing import Any

import msgspec

from notifier.config.base import (
    NonNegativeFloat,
    Section,
)
from notifier.config.workers import WorkerGroupConfig
from notifier.validation import key_error, locate


class ClientCertificateConfig(Section, frozen=True):
    """``[workers.webhook.client_certificates.<name>]``: a client identity for mutual TLS, which a
    webhook channel names in ``tls_client_certificate``. The key never leaves its file."""

    cert_file: str  # PEM: the certificate, then any intermediates
    key_file: str  # PEM, unencrypted: the file's permissions protect it
    # Tenant ids whose channels may name it; empty: every tenant's.
    tenants: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in ("cert_file", "key_file"):
            if problem := file_problem(getattr(self, key)):
                raise key_error(key, problem)
        for i, tenant in enumerate(self.tenants):
            try:
                uuid.UUID(tenant)
            except ValueError:
                raise key_error(f"tenants[{i}]", f"not a tenant id (a UUID): {tenant!r}") from None


CLIENT_CERTIFICATE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class WebhookWorkersConfig(WorkerGroupConfig, frozen=True):
    allow_private_networks: bool = False
    # Networks opened for internal receivers even while private networks are refused.
    allowed_cidrs: tuple[str, ...] = ()
    # After a channel's secret changes, the previous one keeps signing alongside it this long.
    secret_rotation_grace_seconds: NonNegativeFloat = 86_400.0
    # The nameservers webhook hosts are resolved with (`ip` or `ip:port`, `[ipv6]:port`);
    # empty: those of /etc/resolv.conf. /etc/hosts is read first either way.
    dns_servers: tuple[str, ...] = ()
    # A PEM bundle of CA certificates trusted besides the public roots (and SSL_CERT_FILE/_DIR).
    ca_file: str = ""
    # An HTTP CONNECT proxy every webhook connection goes through: http://[user:pass@]host:port.
    proxy_url: str = ""
    # Client identities for mutual TLS by name: tables of ClientCertificateConfig (read by
    # client_identities(), so that an error names the identity, which msgspec's path would not).
    client_certificates: dict[str, dict[str, Any]] = {}

    def client_identities(self) -> dict[str, ClientCertificateConfig]:
        """``client_certificates``, each table checked; an error names its whole key."""
        identities = {}
        for name, table in self.client_certificates.items():
            where = (
                f"client_certificates.{name}"
                if CLIENT_CERTIFICATE_NAME.fullmatch(name)
                else f"client_certificates.{name!r}"
            )
            try:
                identities[name] = msgspec.convert(table, ClientCertificateConfig)
            except msgspec.ValidationError as exc:
                path, text = locate(exc)
                raise key_error(f"{where}.{path}" if path else where, text) from None
        return identities

    def __post_init__(self) -> None:
        super().__post_init__()
        for i, cidr in enumerate(self.allowed_cidrs):
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise key_error(f"allowed_cidrs[{i}]", str(exc)) from exc
        for i, server in enumerate(self.dns_servers):
            try:
                nameserver_address(server)
            except ValueError as exc:
                raise key_error(f"dns_servers[{i}]", str(exc)) from exc

        if self.ca_file and (problem := file_problem(self.ca_file)):
            raise key_error("ca_file", problem)
        if self.proxy_url and (problem := proxy_url_problem(self.proxy_url)):
            raise key_error("proxy_url", problem)
        for name in self.client_certificates:
            if not CLIENT_CERTIFICATE_NAME.fullmatch(name):
                raise key_error(
                    f"client_certificates.{name!r}",
                    "a name is 1 to 64 letters, digits, '_', '.' or '-', starting with a letter "
                    "or digit",
                )
        self.client_identities()


def nameserver_address(text: str) -> tuple[str, int]:
    """A ``workers.webhook.dns_servers`` entry as ``(ip, port)``: ``192.0.2.53``,
    ``192.0.2.53:5353``, ``2001:db8::53`` or ``[2001:db8::53]:5353`` (port 53 by default)."""
    host, port = text, "53"
    if m := re.fullmatch(r"\[([^\]]+)\]:(\d{1,5})|([^:\[\]]+):(\d{1,5})", text):
        host, port = m[1] or m[3], m[2] or m[4]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"must be an IP address, optionally with :PORT, got {text!r}") from None
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"port must be 1-65535, got {text!r}")
    return str(address), int(port)


def file_problem(path: str) -> str | None:
    """Why ``path`` is not a file this process can read, or None."""
    if not path:
        return "must not be empty"
    if not os.path.isfile(path):
        return f"{path!r} is not a file"
    if not os.access(path, os.R_OK):
        return f"{path!r} cannot be read by this process"
    return None


def proxy_url_problem(url: str) -> str | None:
    """Why ``url`` is not ``http://[user:pass@]host:port``, or None. Never quotes the URL, which
    may hold a password."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return (
            "not a URL that can be read (a port from 1 to 65535; percent-encode : @ / in the "
            "user name and password)"
        )
    if parts.scheme != "http":
        return "must be an http:// URL (an HTTP CONNECT proxy)"
    if not parts.hostname:
        return "no host name"
    if port is None:
        return "must name the port (http://host:port)"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "must be http://[user:pass@]host:port, without a path, query or fragment"
    return None
