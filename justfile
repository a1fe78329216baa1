# notifier tasks. `just run` and `just test` set everything up on their own.

set shell := ["bash", "-euo", "pipefail", "-c"]

python := env("PYTHON", "python3")
venv := ".venv"
bin := venv / "bin"
config := env("NOTIFIER_CONFIG", "deploy/notifier.toml")

# list the recipes
default:
    @just --list

# create .venv and install notifier with its dev tools, and promtool (quietly; again only when needed)
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    if [ ! -x {{bin}}/python ]; then {{python}} -m venv {{venv}}; fi
    stamp={{venv}}/.installed
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        {{bin}}/python -m pip install --quiet --upgrade pip
        {{bin}}/python -m pip install --quiet -e '.[dev]'
        touch "$stamp"
    fi
    # promtool checks deploy/prometheus/ in the tests (tests/unit/test_dashboards.py fails without it)
    scripts/install-promtool {{bin}} >/dev/null || echo "warning: promtool not installed (needs apt-get): the dashboard tests will fail" >&2

# start Postgres and RabbitMQ if they are not running (local development machines)
services:
    scripts/ensure-services

# run the service with the example config and show a demo event being delivered
run: setup services
    {{bin}}/python -m notifier.demo --config {{config}}

# the demo without keeping the service running afterwards
demo: setup services
    {{bin}}/python -m notifier.demo --config {{config}} --exit

# the whole test suite (unit and integration, against the local Postgres and RabbitMQ)
test *args: setup services
    {{bin}}/pytest {{args}}

# only the unit tests (no services needed)
test-unit *args: setup
    {{bin}}/pytest tests/unit {{args}}

# lint, format check and strict type check
check: setup
    {{bin}}/ruff check src tests bench
    {{bin}}/ruff format --check src tests bench
    {{bin}}/mypy

# apply the formatter and the safe lint fixes
fmt: setup
    {{bin}}/ruff format src tests bench
    {{bin}}/ruff check --fix src tests bench

# apply the missing schema migrations (migrations/) to the database of the config
migrate: setup services
    {{bin}}/notifier migrate --config {{config}}

# every stage against a baseline run alongside (wrk load, nginx sink; loopback only); see bench/README.md
bench *args: setup services
    #!/usr/bin/env bash
    set -euo pipefail
    if ! command -v wrk >/dev/null || ! { command -v nginx >/dev/null || [ -x /usr/sbin/nginx ]; }; then
        sudo=""; if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
        $sudo apt-get install -y wrk nginx-light
    fi
    {{bin}}/python -m bench {{args}}
