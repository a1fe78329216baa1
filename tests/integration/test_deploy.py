"""The deploy kit, checked as far as this machine allows: the systemd units with
``systemd-analyze`` (no running systemd needed), the RabbitMQ definitions imported into a scratch
vhost with notifier delivering through it, compose.yaml against the Compose specification's
JSON schema, the Dockerfile with hadolint, and the wheel the image installs built from the
image's build context. No container is built or started here (no container daemon)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
import uuid
import zipfile
from pathlib import Path
from typing import Any

import aiormq
import pytest
import trio
import yaml

from notifier.config import ENV_OVERRIDES, parse_config
from notifier.testing import open_sink
from tests.integration.conftest import (
    AMQP_BASE,
    create_tenant,
    make_config,
    poll,
    rabbitmqctl,
    run_notifier,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
INSTALLED_BINARY = "/opt/notifier/bin/notifier"
ROLES = ("ingest", "relay", "workers", "maintenance")
# systemd-analyze security: the overall exposure must stay at or below 2.0 ("OK")
MAX_EXPOSURE_TENTHS = 20


def tool(name: str, debian_package: str) -> str:
    """The path of ``name``, installing its Debian package first when it is missing."""
    found = shutil.which(name)
    if found is None:
        for command in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", debian_package],
        ):
            subprocess.run(command, check=True, capture_output=True, timeout=600)
        found = shutil.which(name)
    assert found is not None, f"{name} is not installed (Debian package {debian_package})"
    return found


def venv_tool(name: str) -> str:
    """A tool that a dev dependency installs beside this interpreter."""
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{path} is missing: install the dev extras (pip install -e '.[dev]')"
    return str(path)


# -- systemd ------------------------------------------------------------------------------------


def directives(unit: Path) -> dict[str, list[str]]:
    """Pure: every ``Key=value`` of a unit file, by key, in order (keys may repeat)."""
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


@pytest.fixture
def rendered_units(tmp_path: Path) -> Path:
    """The units as shipped, except that ExecStart names this checkout's ``notifier`` (verify
    refuses a unit whose binary does not exist)."""
    for unit in UNITS.iterdir():
        text = unit.read_text()
        (tmp_path / unit.name).write_text(text.replace(INSTALLED_BINARY, venv_tool("notifier")))
    return tmp_path


def systemd_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("systemd-analyze", "systemd"), *args], capture_output=True, text=True, timeout=60
    )


def test_the_systemd_units_verify_cleanly(rendered_units: Path) -> None:
    units = [rendered_units / f"notifier@{role}.service" for role in ROLES]
    units += [rendered_units / "notifier.service", rendered_units / "notifier.target"]
    for unit in units:
        done = systemd_analyze("verify", str(unit))
        # verify exits 0 even for unknown keys and unparsable values; it only warns
        assert (done.returncode, done.stdout + done.stderr) == (0, ""), unit.name
    for unit in units[:-1]:  # the services, hardened
        done = systemd_analyze(
            "security", "--offline=yes", f"--threshold={MAX_EXPOSURE_TENTHS}", str(unit)
        )
        assert done.returncode == 0, done.stdout[-2000:]


def test_systemd_analyze_catches_a_broken_unit(rendered_units: Path) -> None:
    """The check above can fail: a misspelt key and a bad signal are reported."""
    unit = rendered_units / "notifier@.service"
    unit.write_text(
        unit.read_text().replace("KillSignal=SIGTERM", "KillSignal=SIGNOPE\nNoNewPrivilege=yes")
    )
    done = systemd_analyze("verify", str(rendered_units / "notifier@ingest.service"))
    assert "SIGNOPE" in done.stderr
    assert "NoNewPrivilege" in done.stderr


@pytest.mark.parametrize("unit", ["notifier@.service", "notifier.service"])
def test_the_units_are_hardened_and_stop_within_their_timeout(unit: str) -> None:
    found = directives(UNITS / unit)
    required = {
        "User": "notifier",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "EnvironmentFile": "/etc/notifier/notifier.env",
        "KillSignal": "SIGTERM",
        "Restart": "on-failure",
        "RestartPreventExitStatus": "2",  # a bad config: restarting cannot fix it
    }
    assert {k: found.get(k, [None])[-1] for k in required} == required
    (exec_start,) = found["ExecStart"]
    expected = "--role %i" if unit.startswith("notifier@") else "--processes auto"
    assert exec_start.startswith(f"{INSTALLED_BINARY} run {expected} "), exec_start
    assert exec_start.endswith("--config /etc/notifier/notifier.toml")
    # systemd must not kill a process still draining: the stop timeout exceeds the grace
    timeout = int(found["TimeoutStopSec"][-1])
    for config in ("production.toml", "notifier.toml"):
        grace = tomllib.loads((DEPLOY / config).read_text())["service"]["shutdown_grace_seconds"]
        assert timeout > grace, (config, timeout, grace)


def test_the_production_config_takes_every_secret_from_the_environment() -> None:
    text = (DEPLOY / "production.toml").read_text()
    data = tomllib.loads(text)
    env_file = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^#?([A-Z_]+)=(.*)$", (DEPLOY / "notifier.env").read_text(), re.M)
    }
    config = parse_config(data, env=env_file)
    assert config.database.url == env_file["NOTIFIER_DATABASE_URL"]
    assert config.broker.url == env_file["NOTIFIER_BROKER_URL"]
    # the file names no URL, DSN, password or token itself
    assert "url" not in data["database"]
    assert "url" not in data["broker"]
    assert "dsn" not in data["sentry"]
    # with its email and Telegram tables enabled, the config still parses, and the variables
    # they name for the password and the token are in the example environment file
    lines = text.splitlines()
    start = lines.index("# [workers.email]")
    for i in range(start, len(lines)):  # the commented block of both tables
        if not lines[i].startswith("#"):
            break
        lines[i] = lines[i].removeprefix("# ").removeprefix("#")
    enabled = "\n".join(lines)
    workers = parse_config(tomllib.loads(enabled), env=env_file).workers
    assert workers.email is not None
    assert workers.telegram is not None
    read = set(ENV_OVERRIDES) | {workers.email.smtp_password_env, workers.telegram.bot_token_env}
    assert read <= set(env_file), read - set(env_file)
    assert all(name.startswith("NOTIFIER_") for name in env_file), env_file
    # notifier.env and compose.yaml reach Postgres through PgBouncer in transaction pooling
    # mode: the production config must say so to the store
    assert config.database.pooler == "pgbouncer"


# -- RabbitMQ definitions -----------------------------------------------------------------------


def scratch_definitions(vhost: str, user: str) -> dict[str, Any]:
    """deploy/rabbitmq-definitions.json with its vhost and user renamed."""
    defs = json.loads((DEPLOY / "rabbitmq-definitions.json").read_text())
    for u in defs["users"]:
        u["name"] = user
    for v in defs["vhosts"]:
        v["name"] = vhost
    for p in defs["permissions"]:
        p["user"], p["vhost"] = user, vhost
    for p in defs["policies"]:
        p["vhost"] = vhost
    return defs


def _declare(url: str, queue: str) -> None:
    async def run() -> None:
        conn = await aiormq.connect(url)
        try:
            channel = await conn.channel()
            await channel.queue_declare(queue, durable=True)
        finally:
            await conn.close()

    asyncio.run(run())


def import_definitions(definitions: str) -> None:
    """``rabbitmqctl import_definitions``, the file on standard input (the broker's node reads
    a path itself, and may not be allowed into the test's directory)."""
    done = subprocess.run(
        ["rabbitmqctl", "-q", "import_definitions"], input=definitions, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


async def test_notifier_delivers_through_the_imported_rabbitmq_definitions(
    database_url: str,
) -> None:
    suffix = uuid.uuid4().hex[:10]
    vhost, user, password = f"deploy_test_{suffix}", f"deploy_test_{suffix}", uuid.uuid4().hex
    defs = scratch_definitions(vhost, user)
    try:
        await trio.to_thread.run_sync(import_definitions, json.dumps(defs))
        policies = {p["name"] for p in defs["policies"]}

        async def imported() -> bool:  # the import finishes in the background
            out = await trio.to_thread.run_sync(
                rabbitmqctl, "list_policies", "-p", vhost, "--no-table-headers"
            )
            return policies <= {line.split("\t")[1] for line in out.splitlines() if line}

        with trio.fail_after(30):
            await poll(imported, interval_seconds=0.5)
        # the operator's step after the import: the user is created without a password
        await trio.to_thread.run_sync(rabbitmqctl, "change_password", user, password)
        host = AMQP_BASE.rsplit("@", 1)[1]
        broker_url = f"amqp://{user}:{password}@{host}/{vhost}"

        config = make_config(database_url, broker_url)
        key = await create_tenant(database_url)
        async with (
            open_sink() as sink,
            run_notifier(config) as running,
            running.client(key) as api,
        ):
            resp = await api.post("/v1/channels", json={"type": "webhook", "config": {
                "url": sink.url}})  # fmt: skip
            assert resp.status_code == 201, resp.text
            resp = await api.post("/v1/events", json={"type": "deploy.check", "payload": {}})
            assert resp.status_code == 202, resp.text
            with trio.fail_after(20):
                (got,) = await sink.wait_for(1)
            assert got.headers["webhook-id"] == resp.json()["deliveries"][0]["id"]

        # the policies apply where intended and do not touch what notifier declares itself
        out = await trio.to_thread.run_sync(
            rabbitmqctl, "list_queues", "-p", vhost, "name", "policy", "type",
            "--no-table-headers",
        )  # fmt: skip
        queues = {row[0]: row[1:] for row in (line.split("\t") for line in out.splitlines())}
        assert queues["deliveries.webhook.dead"] == ["notifier-dead-letter-queues", "quorum"]
        assert queues["deliveries.webhook"] == ["", "quorum"]
        # the user may use notifier's names only
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await trio.to_thread.run_sync(_declare, broker_url, "something.else")
        # a queue declared without a type (not by notifier, which names it) is a quorum queue
        await trio.to_thread.run_sync(_declare, broker_url, "deliveries.untyped")
        out = await trio.to_thread.run_sync(
            rabbitmqctl, "list_queues", "-p", vhost, "name", "type", "--no-table-headers"
        )
        assert "deliveries.untyped\tquorum" in out.splitlines()
    finally:
        with trio.CancelScope(shield=True):
            for command in (("delete_vhost", vhost), ("delete_user", user)):
                # not there if the import failed early
                with contextlib.suppress(subprocess.CalledProcessError):
                    await trio.to_thread.run_sync(rabbitmqctl, *command)


# -- compose.yaml -------------------------------------------------------------------------------


def check_compose_schema(path: Path) -> subprocess.CompletedProcess[str]:
    """Validate against the Compose specification's JSON schema, as vendored by
    check-jsonschema (``vendor.compose-spec``)."""
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_compose_yaml_follows_the_compose_specification(tmp_path: Path) -> None:
    done = check_compose_schema(ROOT / "compose.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    # ... and the check can fail: an unknown depends_on condition is refused
    broken = tmp_path / "compose.yaml"
    broken.write_text(
        (ROOT / "compose.yaml").read_text().replace("service_completed_successfully", "done", 1)
    )
    assert check_compose_schema(broken).returncode != 0


def test_compose_yaml_wires_the_services_together() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, (name, dependency)
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):  # a file of this repository, mounted
                assert (ROOT / source).is_file(), (name, source)
            else:
                assert source in compose["volumes"], (name, source)
    # migrate runs to completion before notifier starts; both run the image's entrypoint
    assert services["notifier"]["depends_on"]["migrate"] == {
        "condition": "service_completed_successfully"
    }
    assert services["migrate"]["command"][0] == "migrate"
    assert services["notifier"]["build"] == "."
    # RabbitMQ loads the definitions from where they are mounted
    conf = (DEPLOY / "rabbitmq.conf").read_text()
    (target,) = re.findall(r"^load_definitions\s*=\s*(\S+)", conf, re.M)
    mounts = services["rabbitmq"]["volumes"]
    assert f"./deploy/rabbitmq-definitions.json:{target}:ro" in mounts
    # secrets only from the environment: notifier's are interpolated, never written out
    for key, value in services["notifier"]["environment"].items():
        assert "${" in value, key
    # the shutdown grace fits in compose's stop timeout
    service = tomllib.loads((DEPLOY / "production.toml").read_text())["service"]
    stop_grace = int(services["notifier"]["stop_grace_period"].rstrip("s"))
    assert stop_grace > service["shutdown_grace_seconds"]


# -- Dockerfile ---------------------------------------------------------------------------------


def test_the_dockerfile_passes_hadolint() -> None:
    done = subprocess.run(
        [venv_tool("hadolint"), "--no-color", str(ROOT / "Dockerfile")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_dockerfile_runs_notifier_from_its_wheel_as_a_user() -> None:
    lines = [
        line for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line and not line.startswith("#")
    ]  # fmt: skip
    stages = [line for line in lines if line.startswith("FROM ")]
    assert stages == ["FROM python:3.11-slim AS build", "FROM python:3.11-slim"]
    final = lines[lines.index(stages[1]) :]
    (user,) = [line for line in final if line.startswith("USER ")]
    assert user.split()[1].split(":")[0] not in ("0", "root")
    assert 'ENTRYPOINT ["notifier"]' in final
    assert 'CMD ["run", "--config", "/etc/notifier/notifier.toml"]' in final
    assert any("pip install" in line and ".whl" in line for line in final)


def test_the_image_build_context_makes_a_complete_wheel(tmp_path: Path) -> None:
    """The wheel built from exactly what the Dockerfile copies (and .dockerignore lets in)
    carries the schema, the migrations that ``notifier migrate`` applies and the ``notifier``
    command."""
    context = tmp_path / "context"
    context.mkdir()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            *sources, _ = line.split()[1:]
            for source in sources:
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, context / source, symlinks=True,
                                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
                else:
                    shutil.copy(ROOT / source, context / source)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "dist"), str(context)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("notifier-*.whl")
    with zipfile.ZipFile(wheel) as z:
        schema = z.read("notifier/store/schema.sql").decode()
        migrations = {
            Path(n).name: z.read(n).decode()
            for n in z.namelist()
            if n.startswith("notifier/store/migrations/")
        }
        (entry_points,) = [n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")]
        scripts = z.read(entry_points).decode()
        redoc = "notifier/ingest/static/redoc"  # /docs: the bundle and its licences
        bundle = z.read(f"{redoc}/redoc.standalone.js")
        assert {f"{redoc}/LICENSE", f"{redoc}/redoc.standalone.js.LICENSE.txt"} <= set(z.namelist())
    assert schema == (ROOT / "schema.sql").read_text()
    assert bundle == (ROOT / "src" / redoc / "redoc.standalone.js").read_bytes()
    shipped = {p.name: p.read_text() for p in (ROOT / "migrations").glob("*.sql")}
    assert migrations == shipped
    assert {"0001_initial.sql", "0002_tenant_enabled.sql"} <= set(shipped)
    assert "notifier = notifier.cli:main" in scripts
