"""Email adapter: one SMTP transaction per delivery, through aiosmtplib on the bridge.

A channel's config is validated by ``EmailChannels`` (no secret needed); ``EmailAdapter``
delivers. The pure parts (``parse_config``, ``build_message``, ``classify_error``,
``receipt``) are kept apart from the thin I/O in ``EmailAdapter.deliver``, so they are tested
as tables without sockets. This is the only aiosmtplib code: ``smtp_errors`` maps its
exceptions to ours.

Anything that becomes a header (``to``, the rendered subject, ``from``) must not hold CR, LF or
NUL: refused with 422 at channel create, a ``PermanentError`` at delivery, a ``ConfigError`` for
``[workers.email] from``. The SMTP password never appears in a log line or an error.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime
from types import UnionType
from typing import Any

import aiosmtplib
import msgspec
import trio

from notifier.adapters.base import InvalidChannelConfig, Receipt
from notifier.adapters.templates import compile_template, render
from notifier.bridge import aio
from notifier.config import EmailWorkersConfig
from notifier.errors import ConfigError, DeliveryError, PermanentError, RetriableError
from notifier.messages import WorkerMessage
from notifier.secrets import register_secret, scrub_known, secret_forms
from notifier.validation import describe

EXAMPLE = {"to": "ops@example.com"}
MAX_RECIPIENTS = 50
MAX_SUBJECT_CHARS = 998  # one header line (RFC 5322 §2.1.1); longer ones are folded anyway
EXCERPT_CHARS = 512
DEFAULT_SUBJECT_TEMPLATE = "[notifier] {{ event_type }}"
DEFAULT_BODY_TEMPLATE = """\
Event: {{ event_type }}
Event id: {{ event_id }}
Created at: {{ created_at }}
{% if recipient %}Recipient: {{ recipient }}
{% endif %}
Payload:
{{ payload_json }}
"""

_HEADER_BREAKERS = frozenset("\r\n\0")
# A plausible address: dot-atom local part, dot-separated host labels; ASCII only.
_LOCAL = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


class EmailConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    to: str | list[str]
    subject_template: str | None = None
    body_template: str | None = None

    @property
    def recipients(self) -> list[str]:
        return [self.to] if isinstance(self.to, str) else list(self.to)


def has_header_breaker(value: str) -> bool:
    return any(c in _HEADER_BREAKERS for c in value)


def address_problem(address: str) -> str | None:
    """Why ``address`` is not a plausible bare address (``user@example.com``), or None."""
    if has_header_breaker(address):
        return "contains CR, LF or NUL"
    if not address.isascii():
        return "must be ASCII (write an international domain in its xn-- form)"
    if len(address) > 254:
        return "longer than 254 characters"
    local, at, domain = address.rpartition("@")
    if not at or not _LOCAL.fullmatch(local) or len(local) > 64:
        return "is not an email address like user@example.com"
    if not all(_LABEL.fullmatch(label) for label in domain.split(".")):
        return "has an invalid domain"
    return None


def validate_address(address: str, field: str) -> None:
    """Raise ``InvalidChannelConfig`` naming ``field`` unless ``address`` is plausible."""
    if (problem := address_problem(address)) is not None:
        raise InvalidChannelConfig(field, problem)


def parse_config(config: dict[str, Any]) -> EmailConfig:
    """Validate a channel config; ``InvalidChannelConfig`` names the offending field."""
    try:
        cfg = msgspec.convert(config, EmailConfig)
    except msgspec.ValidationError as exc:
        raise InvalidChannelConfig(*describe(exc, "config")) from exc
    if isinstance(cfg.to, str):
        validate_address(cfg.to, "config.to")
    else:
        if not cfg.to:
            raise InvalidChannelConfig("config.to", "must name at least one address")
        if len(cfg.to) > MAX_RECIPIENTS:
            raise InvalidChannelConfig("config.to", f"more than {MAX_RECIPIENTS} addresses")
        for i, address in enumerate(cfg.to):
            validate_address(address, f"config.to[{i}]")
    if cfg.subject_template is not None:
        if has_header_breaker(cfg.subject_template):
            raise InvalidChannelConfig(
                "config.subject_template", "contains CR, LF or NUL (the subject is one line)"
            )
        compile_template(cfg.subject_template, "config.subject_template")
    if cfg.body_template is not None:
        compile_template(cfg.body_template, "config.body_template")
    return cfg


def render_subject(message: WorkerMessage, cfg: EmailConfig) -> str:
    """The subject, outer whitespace stripped; ``PermanentError`` if it would break the header."""
    source = cfg.subject_template if cfg.subject_template is not None else DEFAULT_SUBJECT_TEMPLATE
    subject = render(source, message, "config.subject_template").strip()
    if has_header_breaker(subject):
        raise PermanentError("config.subject_template: the rendered subject contains CR, LF or NUL")
    if len(subject) > MAX_SUBJECT_CHARS:
        raise PermanentError(
            f"config.subject_template: the rendered subject is longer than {MAX_SUBJECT_CHARS}"
        )
    return subject


def message_id(delivery_id: uuid.UUID, from_address: str) -> str:
    """The same for every attempt of a delivery, so receivers can drop a duplicate."""
    return f"<{delivery_id}@{from_address.rpartition('@')[2] or 'notifier'}>"


def build_message(
    message: WorkerMessage, cfg: EmailConfig, from_address: str, *, now: datetime | None = None
) -> EmailMessage:
    """The email of one attempt: headers, and a UTF-8 plain-text body, both from templates.

    Raise ``PermanentError`` when a template fails or the rendered subject would break the
    header; the channel's addresses are checked again (config is snapshotted in the message).
    """
    for i, address in enumerate(cfg.recipients):
        if (problem := address_problem(address)) is not None:
            raise PermanentError(f"config.to[{i}]: {problem}")
    subject = render_subject(message, cfg)
    source = cfg.body_template if cfg.body_template is not None else DEFAULT_BODY_TEMPLATE
    body = render(source, message, "config.body_template")
    msg = EmailMessage()
    msg["From"] = from_address
    msg["To"] = ", ".join(cfg.recipients)
    msg["Subject"] = subject
    msg["Date"] = format_datetime(now or datetime.now(UTC))
    msg["Message-ID"] = message_id(message.delivery_id, from_address)
    msg["Auto-Submitted"] = "auto-generated"  # RFC 3834: no out-of-office replies, please
    msg.set_content(body, charset="utf-8", cte="quoted-printable")
    return msg


def _clip(text: str, limit: int = 200) -> str:
    """A server's words as they go into an error or an excerpt: bounded, and no NUL (which
    Postgres text cannot hold)."""
    text = text.replace("\0", "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _code_class_error(code: int, detail: str) -> DeliveryError:
    if 500 <= code < 600:
        return PermanentError(detail, status_code=code)
    return RetriableError(detail, status_code=code)  # 4xx, and anything unexpected


def _recipients_refused(exc: aiosmtplib.SMTPRecipientsRefused) -> DeliveryError:
    refused = _clip("; ".join(f"{r.recipient}: {r.code} {r.message}" for r in exc.recipients), 1000)
    codes = [r.code for r in exc.recipients]
    temporary = [c for c in codes if not 500 <= c < 600]
    # Any recipient refused only for now: a later attempt may reach it.
    code = min(temporary) if temporary else min(codes, default=550)
    return _code_class_error(code, f"all recipients refused: {refused}")


_STEPS = {
    aiosmtplib.SMTPSenderRefused: "sender refused",
    aiosmtplib.SMTPDataError: "message refused",
    aiosmtplib.SMTPAuthenticationError: "login refused",
    aiosmtplib.SMTPHeloError: "greeting refused",
    aiosmtplib.SMTPConnectResponseError: "connection refused by the server",
}


def _refused_reply(exc: aiosmtplib.SMTPResponseException) -> DeliveryError:
    step = _STEPS.get(type(exc), "the server answered")
    return _code_class_error(exc.code, f"SMTP {exc.code}: {step}: {_clip(exc.message)}")


# What aiosmtplib raises → our error, most specific first. 4xx replies, timeouts, connection
# and TLS errors are retriable (timeouts and connection errors: the server unreachable, which
# counts towards the channel's circuit); 5xx replies permanent.
_SMTP_ERRORS: tuple[tuple[type[Exception] | UnionType, Callable[[Any], DeliveryError]], ...] = (
    (aiosmtplib.SMTPRecipientsRefused, _recipients_refused),
    (aiosmtplib.SMTPResponseException, _refused_reply),
    (
        aiosmtplib.SMTPTimeoutError | TimeoutError,
        lambda exc: RetriableError(f"timed out: {_clip(str(exc))}", unreachable=True),
    ),
    (
        aiosmtplib.SMTPConnectError | aiosmtplib.SMTPServerDisconnected | OSError,
        lambda exc: RetriableError(
            f"connection failed: {type(exc).__name__}: {_clip(str(exc))}", unreachable=True
        ),
    ),
    (  # e.g. a server without SMTPUTF8
        aiosmtplib.SMTPNotSupported,
        lambda exc: PermanentError(f"not supported by the server: {_clip(str(exc))}"),
    ),
    (
        # The server lacks what [workers.email] asks for (STARTTLS, AUTH): an operator can fix
        # that, so the delivery waits through the retry tiers rather than dying at once.
        aiosmtplib.SMTPException,
        lambda exc: RetriableError(f"SMTP: {_clip(str(exc))}"),
    ),
    (  # aiosmtplib refusing a malformed command or message
        ValueError,
        lambda exc: PermanentError(f"the message cannot be sent: {_clip(str(exc))}"),
    ),
)


def classify_error(exc: Exception) -> DeliveryError | None:
    """Map what aiosmtplib raised to our error (``_SMTP_ERRORS``); None for something that is
    not SMTP's."""
    return next((make(exc) for kind, make in _SMTP_ERRORS if isinstance(exc, kind)), None)


@contextmanager
def smtp_errors(password: str | None = None) -> Iterator[None]:
    """What aiosmtplib raises inside, raised as our error (``classify_error``). An error whose
    text would hold ``password`` or a registered secret (a server echoing it) has it replaced
    and keeps no cause; anything not SMTP's passes through."""
    try:
        yield
    except Exception as exc:
        error = classify_error(exc)
        if error is None:
            raise
        text = str(error)
        clean = scrub_known(text, secret_forms(password or ""), marker="***")
        if clean != text:
            error.args = (clean,)
            raise error from None
        raise error from exc


def receipt(refused: Mapping[str, aiosmtplib.SMTPResponse], reply: str) -> Receipt:
    """What the server's final 250 tells the attempt log. Recipients refused while others
    took the message are noted: the delivery is done (retrying would repeat it to the others)."""
    excerpt = reply
    if refused:
        notes = "; ".join(f"{address}: {r.code} {r.message}" for address, r in refused.items())
        excerpt = f"{reply} (refused: {notes})"
    return Receipt(status_code=250, response_excerpt=_clip(excerpt, EXCERPT_CHARS) or None)


def _scrubbed(got: Receipt, secret: str | None) -> Receipt:
    text = got.response_excerpt
    clean = text and scrub_known(text, secret_forms(secret or ""), marker="***")
    if clean == text:
        return got
    return msgspec.structs.replace(got, response_excerpt=clean)


def _check_from(from_address: str) -> None:
    if (problem := address_problem(from_address)) is not None:
        raise ConfigError(f"workers.email.from: {from_address!r} {problem}")


class EmailChannels:
    """The ``ChannelValidator`` of email channels. Built in every role: it needs no password,
    and refuses a ``[workers.email] from`` that could not head a message."""

    secret_fields: frozenset[str] = frozenset()  # nothing secret in an email channel's config

    def __init__(self, settings: EmailWorkersConfig) -> None:
        _check_from(settings.from_address)

    def prepare_config(self, config: dict[str, Any]) -> dict[str, Any]:
        cfg = parse_config(config)
        out: dict[str, Any] = {"to": cfg.to}
        if cfg.subject_template is not None:
            out["subject_template"] = cfg.subject_template
        if cfg.body_template is not None:
            out["body_template"] = cfg.body_template
        return out


class EmailAdapter:
    """The email deliverer: holds the SMTP password."""

    channel_type = "email"

    def __init__(
        self,
        settings: EmailWorkersConfig,
        *,
        password: str | None = None,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        """``password`` is the resolved SMTP password (see ``from_config``); ``tls_context``
        replaces the system's trust store (tests pass one that trusts their own certificate)."""
        _check_from(settings.from_address)
        self._settings = settings
        self._password = password or None
        if self._password:
            register_secret(self._password)  # scrubbed from every log line from now on
        self._tls_context = tls_context

    @classmethod
    def from_config(cls, settings: EmailWorkersConfig, environ: Mapping[str, str]) -> EmailAdapter:
        """The adapter of ``[workers.email]``, the password read from ``smtp_password_env``
        when ``smtp_username`` is set."""
        password = None
        if settings.smtp_username:
            var = settings.smtp_password_env
            password = environ.get(var, "")
            if not password:
                raise ConfigError(
                    f"workers.email.smtp_password_env: the environment variable {var} (the SMTP "
                    "password, needed because smtp_username is set) is not set or empty"
                )
        return cls(settings, password=password)

    def __repr__(self) -> str:  # never the password
        s = self._settings
        return f"EmailAdapter(smtp={s.smtp_host}:{s.smtp_port}, security={s.smtp_security})"

    async def deliver(self, message: WorkerMessage) -> Receipt | None:
        """Trio-flavoured. Send one email; ``RetriableError``/``PermanentError`` on failure."""
        try:
            cfg = msgspec.convert(message.channel_config, EmailConfig)
        except msgspec.ValidationError as exc:
            raise PermanentError("channel config: {}: {}".format(*describe(exc, "config"))) from exc
        msg = build_message(message, cfg, self._settings.from_address)
        timeout = self._settings.timeout_seconds
        try:
            with trio.fail_after(timeout), smtp_errors(self._password):
                refused, reply = await aio(self._send, msg)
        except trio.TooSlowError as exc:
            raise RetriableError(f"timed out after {timeout:g} s", unreachable=True) from exc
        return _scrubbed(receipt(refused, reply), self._password)

    async def _send(self, msg: EmailMessage) -> tuple[dict[str, aiosmtplib.SMTPResponse], str]:
        """Asyncio-flavoured. Connect, (STARTTLS,) log in, send, quit; always closed."""
        s = self._settings
        smtp = aiosmtplib.SMTP(
            hostname=s.smtp_host,
            port=s.smtp_port,
            use_tls=s.smtp_security == "tls",
            start_tls=s.smtp_security == "starttls",  # never opportunistically: as configured
            username=s.smtp_username or None,
            password=self._password,
            timeout=s.timeout_seconds,
            tls_context=self._tls_context,
        )
        transport = None
        try:
            await smtp.connect()
            result = await smtp.send_message(msg)
            transport = smtp.transport  # quit() forgets it
            with suppress(aiosmtplib.SMTPException, OSError):
                await smtp.quit()  # the message was accepted; a failed goodbye changes nothing
            return result
        finally:
            # Abort, not just close: after QUIT (or a failure) nothing is left to say, and a TLS
            # close would wait for the server's close_notify, leaving the socket open past the
            # bridge loop if that ends first.
            transport = transport or smtp.transport
            if isinstance(transport, asyncio.WriteTransport):
                transport.abort()
            smtp.close()

    async def aclose(self) -> None:
        """Nothing is kept open between deliveries."""
