"""A real SMTP server for tests: aiosmtpd on an asyncio loop in a thread of its own.

``open_smtp_server()`` is a trio context manager yielding an ``SmtpSink`` that records every
message it accepts (``received``, ``wait_for``), answers chosen recipients with a chosen reply
(``refuse``), can require a login (``credentials``) and can speak STARTTLS or implicit TLS.

It lives apart from ``notifier.testing`` because aiosmtpd is a development dependency: importing
``notifier.testing`` must keep working without it. The server's loop is not the trio-asyncio
bridge, so the code under test talks to it over a real socket like to any other SMTP server.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from typing import Any

import trio
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session


@dataclass(frozen=True)
class ReceivedMail:
    mail_from: str
    rcpt_tos: tuple[str, ...]
    data: bytes  # the message as it came over the wire
    login: str | None  # the user the client logged in as, if it did
    at: float  # trio.current_time() when it arrived

    def message(self) -> EmailMessage:
        """The message as a mail client reads it (CRLF line ends shown as line breaks)."""
        parsed = BytesParser(policy=policy.default).parsebytes(self.data.replace(b"\r\n", b"\n"))
        assert isinstance(parsed, EmailMessage)
        return parsed


@dataclass
class SmtpSink:
    """The recording state of one server; create it with ``open_smtp_server``.

    ``refuse`` maps a recipient to the reply its ``RCPT TO`` gets (``"550 5.1.1 no such
    user"``); ``data_reply``, when set, answers every ``DATA`` instead of accepting it.
    Both may be changed while the server runs.
    """

    refuse: dict[str, str] = field(default_factory=dict)
    data_reply: str | None = None
    credentials: tuple[str, str] | None = None
    tls_context: ssl.SSLContext | None = None
    implicit_tls: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    received: list[ReceivedMail] = field(default_factory=list)
    failed_logins: int = 0
    _changed: trio.Event = field(default_factory=trio.Event)
    _ready: trio.Event = field(default_factory=trio.Event)
    # A plain selector loop: trio-asyncio's policy refuses new_event_loop() under trio.
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.SelectorEventLoop)
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    _servers: list[SMTP] = field(default_factory=list)

    async def wait_for(self, count: int) -> list[ReceivedMail]:
        """Wait until at least ``count`` messages arrived (bound it with ``trio.fail_after``)."""
        while len(self.received) < count:
            await self._changed.wait()
        return self.received

    # -- called on the trio thread (through trio.from_thread) ---------------------------------

    def _record(self, mail_from: str, rcpt_tos: list[str], data: bytes, login: str | None) -> None:
        self.received.append(
            ReceivedMail(mail_from, tuple(rcpt_tos), data, login, trio.current_time())
        )
        self._changed.set()
        self._changed = trio.Event()

    def _login_failed(self) -> None:
        self.failed_logins += 1

    # -- aiosmtpd hooks: asyncio-flavoured, on the server's thread -----------------------------

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if self.credentials is not None and not session.authenticated:
            return "530 5.7.0 Authentication required"
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if (reply := self.refuse.get(address)) is not None:
            return reply
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(options)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.data_reply is not None:
            return self.data_reply
        data = envelope.original_content or b""
        auth = session.auth_data
        login = auth.login.decode() if isinstance(auth, LoginPassword) else None
        # Blocks this thread until recorded, so a 250 means the message is in ``received``.
        trio.from_thread.run_sync(
            self._record, envelope.mail_from or "", list(envelope.rcpt_tos), data, login
        )
        return f"250 2.0.0 OK queued as {len(self.received)}"

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth: Any
    ) -> AuthResult:
        ok = (
            self.credentials is not None
            and isinstance(auth, LoginPassword)
            and (auth.login.decode(), auth.password.decode()) == self.credentials
        )
        if not ok:
            trio.from_thread.run_sync(self._login_failed)
        return AuthResult(success=ok, handled=False, auth_data=auth if ok else None)

    def _factory(self) -> SMTP:
        server = SMTP(
            self,
            hostname="smtp.test",
            loop=self._loop,
            enable_SMTPUTF8=True,
            tls_context=None if self.implicit_tls else self.tls_context,
            authenticator=self._authenticate if self.credentials is not None else None,
            # Logins over plain text are allowed so the tests need no certificate.
            auth_require_tls=self.credentials is None,
        )
        self._servers.append(server)
        return server

    async def _main(self) -> None:
        # Accepting by hand (not ``create_server``) keeps every connection in reach, even one
        # still in its TLS handshake, so stopping can end them all: nothing is left unclosed.
        listener = socket.create_server((self.host, self.port))
        listener.setblocking(False)
        handshakes: set[asyncio.Task[None]] = set()

        async def accept() -> None:
            while True:
                sock, _ = await self._loop.sock_accept(listener)
                task = self._loop.create_task(self._connect(sock))
                handshakes.add(task)
                task.add_done_callback(handshakes.discard)

        acceptor = self._loop.create_task(accept())
        try:
            self.port = listener.getsockname()[1]
            trio.from_thread.run_sync(self._ready.set)
            await self._stopping.wait()
        finally:
            acceptor.cancel()
            for task in list(handshakes):
                task.cancel()  # asyncio aborts a connection whose handshake is cancelled
            await asyncio.gather(acceptor, *handshakes, return_exceptions=True)
            for smtp in self._servers:
                if isinstance(smtp.transport, asyncio.WriteTransport):
                    smtp.transport.abort()  # no TLS goodbye to wait for: closed at once
            for _ in range(3):  # let the aborts run their connection_lost callbacks
                await asyncio.sleep(0)
            current = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not current]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            listener.close()

    async def _connect(self, sock: socket.socket) -> None:
        tls = self.tls_context if self.implicit_tls else None
        try:
            await self._loop.connect_accepted_socket(self._factory, sock, ssl=tls)
        except OSError:  # e.g. a client refusing our certificate during the TLS handshake
            return

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        finally:
            self._loop.close()

    def _stop(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stopping.set)


@asynccontextmanager
async def open_smtp_server(
    *,
    refuse: Mapping[str, str] | None = None,
    data_reply: str | None = None,
    credentials: tuple[str, str] | None = None,
    tls_context: ssl.SSLContext | None = None,
    implicit_tls: bool = False,
) -> AsyncIterator[SmtpSink]:
    """Trio-flavoured. An SMTP server on ``127.0.0.1`` and a free port, recording what it gets.

    ``credentials`` (user, password) makes it require a login; ``tls_context`` (a server
    context) offers STARTTLS, or with ``implicit_tls`` wraps every connection in TLS.
    """
    sink = SmtpSink(
        refuse=dict(refuse or {}), data_reply=data_reply, credentials=credentials,
        tls_context=tls_context, implicit_tls=implicit_tls,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, sink._run)
        try:
            with trio.fail_after(10):
                await sink._ready.wait()
            yield sink
        finally:
            sink._stop()
