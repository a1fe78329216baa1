"""The HTTP API of the live service, run as a separate process as an operator runs it
(``python -m notifier run --role ingest``, a config file, a tenant made with ``notifier tenant
create``):

- schemathesis generates requests from ``/openapi.json`` and runs every one of its checks on the
  answers (no server error, a documented status, content type and headers, a body that matches
  its schema, schema-valid requests accepted and invalid ones refused, 405 with ``Allow`` for
  other methods, 401 without the key, sequences that follow the document's links, …). The only
  failures allowed are the rules listed in ``ALLOWED_REFUSALS``, each with its reason. It runs as
  its CLI, in a subprocess, so its warnings and its event loop stay out of pytest's; its NDJSON
  report says which checks failed and on what answer. The run is bounded (examples per
  operation, deterministic generation): about 35 s on two cores.
- ``/docs`` renders the document in a headless Chromium under its Content-Security-Policy.
- a connection still carries requests after an answer that went out before its request's
  body was read (a race that does not show with the client on the server's own event loop).

Only the ingest role runs, so nothing is delivered; webhook channels are enabled, with private
networks allowed so that a generated URL is never resolved.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest

from notifier.ingest.api import docs
from tests.integration.test_cli import notifier

MAX_EXAMPLES = 50
# Every check runs. The only answers allowed to break one: a request the document allows and the
# server refuses (positive_data_acceptance) for a rule JSON Schema cannot state, because it ties
# a value to another field or to what is stored. Each is (error code, message pattern): reason.
ALLOWED_REFUSALS: dict[tuple[str, str], str] = {
    ("invalid_cursor", r"cursor is not valid"):
        "a cursor is a `next_cursor` the API gave out (a position in a listing), not any string",
    ("validation_error", r"idempotency_key: differs from the Idempotency-Key header"):
        "the body's idempotency_key and the Idempotency-Key header must be equal when both are "
        "given (two fields)",
    ("validation_error", r"(events\[\d+\]\.)?channel_ids: unknown channel ids: .*"):
        "channel_ids must name channels of the key's tenant (stored data)",
    ("validation_error", r"config\.tls_client_certificate: no client certificate named .*"):
        "a client certificate is one the operator declares for the tenant (the service's config)",
    ("validation_error", r"config\.tls_client_certificate: needs an https url"):
        "a client certificate goes with an https url (two fields)",
    ("validation_error", r"config\.oauth2\.client_secret: required .*"):
        "a PATCH keeps the stored client secret only for the same token_url and client_id "
        "(stored data)",
    ("validation_error", r"config\.headers\.\S+: may not be set with config\.oauth2 .*"):
        "oauth2 sends the Authorization header itself (two fields)",
    ("invalid_schema", r"schema at .*"):
        "an event type's schema must be a usable JSON Schema (draft 2020-12, local references, "
        "evaluable): the metaschema and more, which the document does not repeat",
    ("schema_violation", r"(events\[\d+\]\.)?payload at .*"):
        "a payload must match the schema registered for its event type (stored data)",
    ("unregistered_event_type", r"(events\[\d+\]\.)?type: .*"):
        "with strict_event_types on, an event type must be registered (stored data)",
    ("validation_error",
     r"filter\S*: (more than \d+ conditions in the filter|nested deeper than \d+ levels of "
     r"filters|\d+ bytes of JSON, more than \d+)"):
        "a payload filter's conditions, nesting and size are bounded over the whole filter; "
        "JSON Schema bounds one level at a time (the limits are in ChannelFilter's description)",
    ("validation_error", r"give exactly one of customer and channel_ids"):
        "a portal link is scoped to a customer or to channel ids, not both nor neither (two "
        "fields)",
    ("unknown_channels", r"unknown channel ids: .*"):
        "a portal link's channel_ids must name channels of the key's tenant (stored data)",
}  # fmt: skip
SCHEMATHESIS_TIMEOUT_SECONDS = 240


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_config(tmp_path: Path, database_url: str, broker_url: str, bind: str) -> Path:
    path = tmp_path / "notifier.toml"
    path.write_text(
        "[service]\nshutdown_grace_seconds = 2\n"
        f'[database]\nurl = "{database_url}"\n'
        f'[broker]\nurl = "{broker_url}"\n'
        f'[ingest]\nbind = "{bind}"\n'
        '[logging]\nlevel = "WARNING"\n'
        "[workers.webhook]\nallow_private_networks = true\n"
        '[console]\npublic_url = "https://hooks.example.com"\n'
    )
    return path


@pytest.fixture
def ingest_server(tmp_path: Path, database_url: str, broker_url: str) -> Iterator[tuple[str, str]]:
    """A running ``notifier run --role ingest``: its base URL and a tenant's API key."""
    bind = f"127.0.0.1:{free_port()}"
    cfg = write_config(tmp_path, database_url, broker_url, bind)
    created = notifier("tenant", "create", "schemathesis", "--config", str(cfg))
    assert created.returncode == 0, created.stderr
    api_key = json.loads(created.stdout)["api_key"]
    log = (tmp_path / "notifier.log").open("wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "notifier", "run", "--role", "ingest", "--config", str(cfg)],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        wait_listening(process, bind, tmp_path / "notifier.log")
        yield f"http://{bind}", api_key
    finally:
        process.terminate()  # SIGTERM: a graceful stop
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def wait_listening(process: subprocess.Popen[bytes], bind: str, log: Path) -> None:
    """Return once ``bind`` accepts connections; fail if the process exits first or 30 s pass
    (each refused attempt waits up to 50 ms for the process to exit)."""
    host, port = bind.rsplit(":", 1)
    for _ in range(600):
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return
        except ConnectionRefusedError:
            try:
                code = process.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail(f"notifier exited with {code}:\n{log.read_text(errors='replace')}")
    pytest.fail(f"notifier is not listening on {bind} after 30 s")


def schemathesis(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    st = shutil.which("st", path=str(Path(sys.executable).parent))
    assert st is not None, "schemathesis is not installed (pip install -e '.[dev]')"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFIER_")}
    return subprocess.run(
        [st, "run", *args], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=SCHEMATHESIS_TIMEOUT_SECONDS,
    )  # fmt: skip


def report_events(report_dir: Path) -> list[dict[str, Any]]:
    """The run's NDJSON report: one ``{kind: details}`` per event."""
    (path,) = report_dir.glob("*.ndjson")
    return [json.loads(line) for line in path.read_text().splitlines()]


def failed_checks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every check that did not pass: its name, the operation, and the answer's status and
    error body (``{}`` when it has none)."""
    failed = []
    for event in events:
        scenario = event.get("ScenarioFinished")
        if scenario is None:
            continue
        recorder = scenario["recorder"]
        for case_id, checks in recorder.get("checks", {}).items():
            for check in checks:
                if check["status"] == "success":
                    continue
                interaction = recorder.get("interactions", {}).get(case_id) or {}
                response = interaction.get("response") or {}
                content = response.get("content") or {}
                try:
                    body = json.loads(base64.b64decode(content.get("$base64", "")) or b"{}")
                except ValueError:
                    body = {}
                failed.append({
                    "check": check["name"], "operation": recorder["label"],
                    "status": response.get("status_code"),
                    "error": body.get("error", {}) if isinstance(body, dict) else {},
                })  # fmt: skip
    return failed


def allowed(failure: dict[str, Any]) -> bool:
    error = failure["error"]
    return (
        failure["check"] == "positive_data_acceptance" and failure["status"] == 422
        and any(
            error.get("code") == code and re.fullmatch(message, error.get("message", ""))
            for code, message in ALLOWED_REFUSALS
        )
    )  # fmt: skip


def test_the_live_service_keeps_its_openapi_document(
    ingest_server: tuple[str, str], tmp_path: Path
) -> None:
    base_url, api_key = ingest_server
    done = schemathesis(
        f"{base_url}/openapi.json",
        "--header", f"Authorization: Bearer {api_key}",
        "--checks", "all",
        "--max-examples", str(MAX_EXAMPLES),
        "--generation-deterministic",
        "--wait-for-schema", "30",
        "--request-timeout", "10",
        "--workers", "2",
        "--no-color",
        "--continue-on-failure",
        "--report", "ndjson", "--report-dir", str(tmp_path / "report"),
        cwd=tmp_path,
    )  # fmt: skip
    log = (tmp_path / "notifier.log").read_text(errors="replace")
    shown = f"{done.stdout}\n{done.stderr}\n--- notifier log ---\n{log}"
    assert done.returncode in (0, 1), shown  # 1: some check failed (sorted out below)
    # The run really tested the operations (it says so in its summary), all of them.
    assert "passed" in done.stdout, shown
    assert "Operations:       28 selected / 28 total" in done.stdout, shown
    events = report_events(tmp_path / "report")
    kinds = {kind for event in events for kind in event}
    assert "EngineFinished" in kinds, shown
    assert not {kind for kind in kinds if kind.endswith("Error")}, shown  # none could not run
    failures = failed_checks(events)
    unexpected = [f for f in failures if not allowed(f)]
    assert not unexpected, f"{unexpected}\n{shown}"
    assert done.returncode == 0 or failures, shown


# -- a connection after an early answer ----------------------------------------------------------

ROUNDS = 5
# An answer that comes before its request's body does so within a few milliseconds; now none
# comes before the body.
EARLY_ANSWER_SECONDS = 0.05


def receive_response(sock: socket.socket, conn: h11.Connection, timeout: float) -> int | None:
    """The status of the next answer on ``sock``, or None if none is complete within
    ``timeout`` seconds (EOF: 0)."""
    sock.settimeout(timeout)
    status = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            try:
                conn.receive_data(sock.recv(65536))
            except TimeoutError:
                return None
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.EndOfMessage):
            if conn.our_state is h11.DONE:  # else the caller still sends the body
                conn.start_next_cycle()
            return status
        elif isinstance(event, h11.ConnectionClosed):
            return 0


def test_an_early_answer_leaves_the_connection_usable(ingest_server: tuple[str, str]) -> None:
    """An error decided before the body is read (405, 404, 401, 415) used to go out while the
    body was still coming; hypercorn then gave up on the connection without closing it, and the
    next request on it was often never answered. Now the body is read first and the connection
    carries the next request. The old failure depends on timing (about one round in three
    here), hence a few rounds of each: the body sent after an early answer, on its own."""
    base_url, api_key = ingest_server
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    body = b'{"type": "order.created", "payload": {}}'
    for method, path, headers, status in [
        ("TRACE", "/v1/events", {"Content-Type": "application/json"}, 405),
        ("PATCH", "/v1/channels/not-a-uuid", {"Content-Type": "application/json"}, 404),
        ("POST", "/v1/events", {"Content-Type": "application/json"}, 401),
        ("POST", "/v1/events", {"Content-Type": "text/plain",
                                "Authorization": f"Bearer {api_key}"}, 415),
    ]:  # fmt: skip
        for round_ in range(ROUNDS):
            conn = h11.Connection(h11.CLIENT)
            with socket.create_connection((host, int(port)), timeout=5) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                head = [("Host", host), ("Content-Length", str(len(body))), *headers.items()]
                sock.sendall(conn.send(h11.Request(method=method, target=path, headers=head)))
                early = receive_response(sock, conn, EARLY_ANSWER_SECONDS)
                sock.sendall(conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))
                if early is None:
                    first = receive_response(sock, conn, 5)
                else:  # the old behaviour: let the body arrive on its own
                    first = early
                    conn.start_next_cycle()
                    assert receive_response(sock, conn, EARLY_ANSWER_SECONDS) is None
                assert first == status, (method, path, round_)
                get = h11.Request(method="GET", target="/healthz", headers=[("Host", host)])
                sock.sendall(conn.send(get) + conn.send(h11.EndOfMessage()))
                assert receive_response(sock, conn, 5) == 200, (method, path, round_)


# -- /docs in a browser --------------------------------------------------------------------------

# Operations Redoc lists once it has read /openapi.json (their summaries).
RENDERED = ("Create a channel", "Ingest one event", "List deliveries, newest first")
CHROMIUM_SECONDS = 90


def chromium() -> str:
    """Debian's Chromium, installed if missing (the tests run as root on a fresh machine)."""
    found = shutil.which("chromium")
    if found is None and os.geteuid() == 0:
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=300", "chromium"],
            capture_output=True, timeout=900, check=False,
        )  # fmt: skip
        found = shutil.which("chromium")
    if found is None:
        pytest.fail("chromium is not installed and could not be: apt-get install chromium")
    return found


def test_docs_render_the_document_with_scripts_from_the_service_only(
    ingest_server: tuple[str, str], tmp_path: Path
) -> None:
    """/docs is Redoc, served by notifier itself: the page and the bundle have the right
    types, the page holds no inline script and forbids any other script, and a headless
    Chromium under that policy renders the operations from /openapi.json. The only thing the
    policy blocks is Redoc's footer logo, which it would fetch from elsewhere."""
    base_url, _ = ingest_server
    page = httpx.get(f"{base_url}/docs", timeout=10)
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    policy = page.headers["content-security-policy"]
    assert policy == docs.CONTENT_SECURITY_POLICY
    assert "default-src 'none'; script-src 'self';" in policy
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page.text, flags=re.DOTALL)
    assert scripts == [(' src="/docs/redoc.standalone.js"', "")], "one script, from the service"
    bundle = httpx.get(f"{base_url}/docs/redoc.standalone.js", timeout=10)
    assert bundle.status_code == 200
    assert bundle.headers["content-type"] == "text/javascript; charset=utf-8"
    assert bundle.content == docs.bundle()
    assert bundle.content.startswith(b"/*! For license information please see")
    done = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=15000",
         "--enable-logging=stderr", "--dump-dom", f"{base_url}/docs"],
        capture_output=True, text=True, timeout=CHROMIUM_SECONDS,
    )  # fmt: skip
    for summary in RENDERED:
        assert summary in done.stdout, done.stderr[-3000:]
    blocked = [line for line in done.stderr.splitlines() if "Content Security Policy" in line]
    assert all("https://cdn.redoc.ly/" in line for line in blocked), blocked
