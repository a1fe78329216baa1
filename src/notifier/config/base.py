"""What every section of the config is made of: a frozen table refusing unknown keys, and the
constrained numbers the sections use."""

from __future__ import annotations

from typing import Annotated

import msgspec

# Half of RabbitMQ's default consumer_timeout (30 min): the longest a message may be held.
CONSUMER_TIMEOUT_BUDGET_SECONDS = 900

Positive = Annotated[int, msgspec.Meta(ge=1)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
# The lowest rate a limit may have: one an hour. A bucket's period is 1/rate, and Postgres keeps
# times only so far (a rate of 1e-20 put its next token past any timestamp).
MIN_RATE_PER_SECOND = 1 / 3600


class Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass
