"""The adversarial suite: what hostile clients, sloppy clients and racing requests send.

Each module takes one class of input (HTTP/2 frame sequences, racing writes, header and pattern
tables with control and non-ASCII characters) and holds the service to the same rules as the
rest of the suite: a clear 4xx with a JSON error body, nothing written for bad input, no 500, no
crashed process and no secret in a log.
"""

from __future__ import annotations

# The real services, one database (from a migrated template) and one vhost per test.
from tests.integration.conftest import (  # noqa: F401
    broker_url,
    config,
    database_url,
    pg_template,
    vhost,
)
