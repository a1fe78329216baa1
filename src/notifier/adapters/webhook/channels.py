"""A webhook channel's config: its struct, its validation at create and PATCH (the URL and SSRF
checks that need no network, the header rule, the secret's form, rotation), and the check of the
destination's addresses at create. None of it needs a secret, so every role that serves the API
builds it; the deliverer is ``adapter.WebhookAdapter``."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any

import httpx
import msgspec
import trio

from notifier.adapters.base import InvalidChannelConfig
from notifier.adapters.webhook.headers import RESERVED_HEADERS, headers_problem
from notifier.adapters.webhook.oauth import CLIENT_SECRET_FIELD
from notifier.adapters.webhook.resolver import dns_resolver
from notifier.adapters.webhook.signing import (
    ROTATION_FIELDS,
    SECRET_PREFIX,
    generate_secret,
    rotate_secret,
)
from notifier.adapters.webhook.ssrf import (
    MAX_URL_LENGTH,
    NetworkRules,
    Resolver,
    blocked_message,
    default_port,
    dial_host,
    literal_address,
    log_blocked,
    validate_url,
)
from notifier.adapters.webhook.tls import unavailable
from notifier.validation import describe, whole

# Config keys never shown after creation and kept across a PATCH that does not name them.
SECRET_FIELDS = frozenset({"secret", *ROTATION_FIELDS, CLIENT_SECRET_FIELD})
EXAMPLE = {"url": "https://hooks.example.com/notifier"}


def _any_case(word: str) -> str:
    """``word`` in any case, without a flag (the document's regexes have none)."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


# What the OpenAPI document says a webhook config holds (the struct's annotations). The server
# refuses a secret or a header outside these patterns (below and headers.py, with messages of
# their own), so document and server agree; a URL: see URL_PATTERN.
# A secret: whsec_ and the standard base64 (padded) of 24 to 64 bytes. 4 characters per 3 bytes:
# 8 to 21 whole groups, then 1 or 2 more bytes ("xx==", "xxx="), 64 bytes at most.
_B64 = "[A-Za-z0-9+/]"
SECRET_PATTERN = whole(
    rf"{SECRET_PREFIX}(?:(?:{_B64}{{4}}){{8,20}}(?:{_B64}{{2}}==|{_B64}{{3}}=)?"
    rf"|(?:{_B64}{{4}}){{21}}(?:{_B64}{{2}}==)?)"
)
# The URLs of this form the server always takes (the network rules aside): http(s), a host
# name (labels of letters, digits, '_' and '-'; the last one not a number), a dotted IPv4
# address or a full bracketed IPv6 one, a port up to 65535, then visible ASCII. The server also
# takes what the pattern leaves out (IDNA host names, '::' in IPv6, other address notations):
# the URL checks (ssrf.validate_url) are the rule, this pattern their common, portable part.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_HOST = (
    rf"(?:{_OCTET}\.){{3}}{_OCTET}|\[(?:[0-9A-Fa-f]{{1,4}}:){{7}}[0-9A-Fa-f]{{1,4}}\]"
    r"|(?:[A-Za-z0-9_-]{1,63}\.)*[A-Za-z_-][A-Za-z0-9_-]{0,62}\.?"
)
_PORT = r"6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}|0"
URL_PATTERN = whole(
    rf"{_any_case('http')}[Ss]?://(?:{_HOST})(?::(?:{_PORT}))?(?:[/?#][\x21-\x7e]*)?"
)
# headers.py's rule: a token, not reserved, not webhook-*; a value of visible ASCII with spaces
# or tabs only between visible characters.
_RESERVED = "|".join(_any_case(name) for name in sorted(RESERVED_HEADERS))
HEADER_NAME_PATTERN = whole(
    rf"(?!(?:{_RESERVED})$)(?!{_any_case('webhook-')})[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
)
HEADER_VALUE_PATTERN = whole(r"(?:[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*)?")

Url = Annotated[
    str,
    msgspec.Meta(
        description="Where deliveries are POSTed: http or https, at most 2048 characters. "
        "Host names may also be internationalised; a private, loopback or link-local "
        "destination is refused unless the service allows private networks.",
        extra_json_schema={"pattern": URL_PATTERN, "maxLength": MAX_URL_LENGTH},
    ),
]
Secret = Annotated[
    str,
    msgspec.Meta(
        description="The signing secret: whsec_ and the base64 of 24 to 64 bytes.",
        extra_json_schema={"pattern": SECRET_PATTERN},
    ),
]
Headers = Annotated[
    dict[str, Annotated[str, msgspec.Meta(extra_json_schema={"pattern": HEADER_VALUE_PATTERN})]],
    msgspec.Meta(
        description="Headers sent with every delivery (not the signature's, not HTTP's own).",
        extra_json_schema={"propertyNames": {"pattern": HEADER_NAME_PATTERN}},
    ),
]
_SECRET_RE = re.compile(SECRET_PATTERN)


_VISIBLE = r"^[\x21-\x7e]+$"
# RFC 6749 §3.3: scope tokens of visible ASCII but '"' and '\', separated by single spaces.
_SCOPE_TOKEN = r"[\x21\x23-\x5b\x5d-\x7e]+"
_SCOPE = rf"^{_SCOPE_TOKEN}(?: {_SCOPE_TOKEN})*$"
# A token endpoint is sent the client secret: https only.
HTTPS_URL_PATTERN = URL_PATTERN.replace(f"{_any_case('http')}[Ss]?://", f"{_any_case('https')}://")
assert HTTPS_URL_PATTERN != URL_PATTERN
TokenUrl = Annotated[
    str,
    msgspec.Meta(
        description="The token endpoint: https, under the same network rules as the url.",
        extra_json_schema={"pattern": HTTPS_URL_PATTERN, "maxLength": MAX_URL_LENGTH},
    ),
]
ClientId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=256, pattern=_VISIBLE,
                      description="The client id (visible ASCII).")
]  # fmt: skip
ClientSecret = Annotated[
    str, msgspec.Meta(min_length=1, max_length=512, pattern=_VISIBLE,
                      description="The client secret (visible ASCII): never shown after creation.")
]  # fmt: skip
Scope = Annotated[
    str, msgspec.Meta(min_length=1, max_length=1024, pattern=_SCOPE,
                      description="Space-separated scopes.")
]  # fmt: skip
Audience = Annotated[
    str, msgspec.Meta(min_length=1, max_length=1024, pattern=_VISIBLE,
                      description="The audience (resource), for servers that want one.")
]  # fmt: skip


class OAuth2(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """OAuth2 client credentials: a bearer token from ``token_url`` on every delivery."""

    token_url: TokenUrl
    client_id: ClientId
    client_secret: ClientSecret
    scope: Scope | None = None
    audience: Audience | None = None


class OAuth2Update(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A PATCH's ``oauth2``, for the OpenAPI document: without ``client_secret`` the stored one
    is kept, as long as ``token_url`` and ``client_id`` stay the same."""

    token_url: TokenUrl
    client_id: ClientId
    client_secret: ClientSecret | msgspec.UnsetType = msgspec.UNSET
    scope: Scope | None = None
    audience: Audience | None = None


ClientCertificateName = Annotated[
    str,
    msgspec.Meta(
        description="A client certificate the operator declares for mutual TLS "
        "([workers.webhook.client_certificates.<name>]); https URLs only.",
        max_length=64,
    ),
]


class WebhookConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: Url
    # None (or left out) at create: notifier generates one, shown in the answer only.
    secret: Secret | None = None
    headers: Headers = {}
    tls_client_certificate: ClientCertificateName | None = None
    oauth2: OAuth2 | None = None


class WebhookConfigUpdate(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A PATCH's webhook config, for the OpenAPI document: no secret keeps the stored one, a
    secret starts a rotation, and null is refused (a generated secret would never be shown)."""

    url: Url
    secret: Secret | msgspec.UnsetType = msgspec.UNSET
    headers: Headers = {}
    tls_client_certificate: ClientCertificateName | None = None
    oauth2: OAuth2Update | None = None


class WebhookChannels:
    """The ``ChannelValidator`` of webhook channels, under ``[workers.webhook]``'s network rules."""

    secret_fields = SECRET_FIELDS

    def __init__(
        self,
        *,
        timeout_seconds: float,
        allow_private_networks: bool,
        allowed_cidrs: Iterable[str] = (),
        secret_rotation_grace_seconds: float = 86_400.0,
        dns_servers: Iterable[str] = (),
        client_certificates: Mapping[str, Iterable[str]] | None = None,
        resolver: Resolver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``dns_servers`` as the deliverer's (``WebhookAdapter``): a name is resolved at
        create as it will be at delivery. ``client_certificates``: the client identities
        channels may name, each with the tenant ids that may (none: every tenant).
        ``resolver`` (replaces the nameservers) is for tests and embedding; ``clock`` gives
        epoch seconds."""
        if resolver is None:
            resolver = dns_resolver(dns_servers, timeout_seconds=timeout_seconds)
        self._rules = NetworkRules.of(
            timeout_seconds, allow_private_networks, allowed_cidrs, resolver
        )
        self._grace = secret_rotation_grace_seconds
        self._clock = clock
        self._certificates = {
            name: frozenset(uuid.UUID(str(t)) for t in tenants)
            for name, tenants in (client_certificates or {}).items()
        }

    def prepare_config(self, config: dict[str, Any]) -> dict[str, Any]:
        try:
            cfg = msgspec.convert(config, WebhookConfig)
        except msgspec.ValidationError as exc:
            raise InvalidChannelConfig(*describe(exc, "config")) from exc
        validate_url(cfg.url, allow_private_networks=self._rules.allow_private_networks,
                     allowed_cidrs=self._rules.allowed)  # fmt: skip
        if (problem := headers_problem(cfg.headers)) is not None:
            raise InvalidChannelConfig(*problem)
        secret = cfg.secret
        if secret is None:
            secret = generate_secret()
        else:
            # The document's pattern is the rule: it admits only padded base64 of 24-64 bytes.
            if not _SECRET_RE.search(secret):
                raise InvalidChannelConfig(
                    "config.secret",
                    "must be whsec_ followed by the standard, padded base64 of 24 to 64 bytes",
                )
        prepared: dict[str, Any] = {"url": cfg.url, "secret": secret, "headers": dict(cfg.headers)}
        if (name := cfg.tls_client_certificate) is not None:
            if name not in self._certificates:
                raise InvalidChannelConfig("config.tls_client_certificate", unavailable(name))
            if not cfg.url.lower().startswith("https:"):
                raise InvalidChannelConfig("config.tls_client_certificate", "needs an https url")
            prepared["tls_client_certificate"] = name
        if cfg.oauth2 is not None:
            prepared.update(self._oauth2(cfg.oauth2, cfg.headers))
        return prepared

    def _oauth2(self, oauth: OAuth2, headers: Mapping[str, str]) -> dict[str, Any]:
        """The stored form of ``oauth2``: its secret beside it, as a secret field."""
        field = "config.oauth2.token_url"
        try:
            validate_url(oauth.token_url, allow_private_networks=self._rules.allow_private_networks,
                         allowed_cidrs=self._rules.allowed)  # fmt: skip
        except InvalidChannelConfig as exc:
            raise InvalidChannelConfig(field, exc.message) from None
        if not oauth.token_url.lower().startswith("https:"):
            raise InvalidChannelConfig(field, "must be an https URL (it is sent the client secret)")
        for name in headers:
            if name.lower() == "authorization":
                raise InvalidChannelConfig(
                    f"config.headers.{name}", "may not be set with config.oauth2 (which sends "
                    "the bearer token in it)",
                )  # fmt: skip
        kept = {k: v for k, v in msgspec.structs.asdict(oauth).items() if v is not None}
        secret = kept.pop("client_secret")
        return {"oauth2": kept, CLIENT_SECRET_FIELD: secret}

    def check_tenant(self, config: dict[str, Any], tenant_id: uuid.UUID) -> None:
        """``ChecksTenant``: the client certificate is one this tenant may use (the same answer
        as for an unknown name, so a tenant learns nothing of others' certificates)."""
        name = config.get("tls_client_certificate")
        if name is not None:
            tenants = self._certificates.get(name)
            if tenants is None or (tenants and tenant_id not in tenants):
                raise InvalidChannelConfig("config.tls_client_certificate", unavailable(name))

    def prepare_config_update(
        self, config: dict[str, Any], previous: dict[str, Any]
    ) -> dict[str, Any]:
        """``prepare_config`` for a PATCH of a channel whose stored config is ``previous``: a
        new secret starts a rotation (the replaced one keeps signing for the grace period)."""
        config = dict(config)
        if "secret" in config and config["secret"] is None:
            # A generated secret is shown only in the 201 of a create: after a PATCH nobody
            # would ever learn it.
            raise InvalidChannelConfig("config.secret", "a PATCH must give the new secret")
        for key in ROTATION_FIELDS:
            # The API carries secret fields over from the stored config; anything else is a
            # client trying to set them.
            if key in config and config.pop(key) != previous.get(key):
                raise InvalidChannelConfig(f"config.{key}", "is managed by notifier")
        self._keep_client_secret(config, previous)
        prepared = self.prepare_config(config)
        prepared.update(
            rotate_secret(previous, prepared["secret"], now=self._clock(),
                          grace_seconds=self._grace)
        )  # fmt: skip
        return prepared

    def config_destination(self, config: dict[str, Any]) -> str | None:
        """``NamesDestinations``: the origin a stored config's URL points at, as the adapter's
        ``destination`` names it (``scheme://host:port``, the host as dialed); None for a URL
        that cannot be sent to (a destination of its own)."""
        try:
            url = httpx.URL(config["url"])
        except (KeyError, TypeError, httpx.InvalidURL):
            return None
        if url.scheme not in ("http", "https") or not url.raw_host:
            return None
        host = dial_host(url)
        host = f"[{host}]" if ":" in host else host
        return f"{url.scheme}://{host}:{default_port(url)}"

    @staticmethod
    def _keep_client_secret(config: dict[str, Any], previous: dict[str, Any]) -> None:
        """A PATCH's ``oauth2`` without ``client_secret`` keeps the stored one, if it still goes
        to the same token endpoint for the same client (else whoever may PATCH could have the
        secret sent to a server of theirs). ``oauth2_client_secret`` is notifier's to set."""
        stored = previous.get(CLIENT_SECRET_FIELD)
        if config.pop(CLIENT_SECRET_FIELD, stored) != stored:
            raise InvalidChannelConfig(
                f"config.{CLIENT_SECRET_FIELD}", "is managed by notifier (give "
                "config.oauth2.client_secret)",
            )  # fmt: skip
        oauth = config.get("oauth2")
        if not isinstance(oauth, dict) or oauth.get("client_secret") is not None:
            return
        before = previous.get("oauth2") or {}
        same = all(oauth.get(k) == before.get(k) for k in ("token_url", "client_id"))
        if stored is None:
            raise InvalidChannelConfig("config.oauth2.client_secret", "required (none is stored)")
        if not same:
            raise InvalidChannelConfig(
                "config.oauth2.client_secret", "required when token_url or client_id changes"
            )
        config["oauth2"] = {**oauth, "client_secret": stored}

    async def check_destination(self, config: dict[str, Any]) -> None:
        """At channel create/patch: refuse a host (of the URL, and of the OAuth2 token endpoint)
        that resolves to a blocked address now (with private networks allowed, only the
        always-closed ones are). A host that does not resolve is accepted (its DNS may not be
        set up yet); every delivery resolves again and fails closed."""
        await self._check_host(config["url"], "config.url")
        if (oauth := config.get("oauth2")) is not None:
            await self._check_host(oauth["token_url"], "config.oauth2.token_url")

    async def _check_host(self, raw_url: str, field: str) -> None:
        url = httpx.URL(raw_url)
        host = dial_host(url)
        if literal_address(host) is not None:
            return  # checked by validate_url already
        try:
            addresses = await self._rules.resolve(host, default_port(url))
        except (OSError, trio.TooSlowError):
            return
        if (blocked := self._rules.first_blocked(addresses)) is not None:
            log_blocked(host, *blocked, at="channel create/patch")
            raise InvalidChannelConfig(field, blocked_message(host, *blocked))
