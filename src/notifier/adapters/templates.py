"""Channel templates (email subject/body, telegram text): Jinja2 in a sandbox.

Templates come from API users, so they run in Jinja2's immutable sandbox (no attribute access
to internals, no mutation of the context) with the operators that could build huge values
bounded, and their output capped. A template that does not compile is refused when the channel
is created (422 naming the field); one that fails while rendering is a ``PermanentError``: the
same template with the same event would fail again.
"""

from __future__ import annotations

import functools
import json
import operator
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from notifier.adapters.base import InvalidChannelConfig
from notifier.errors import PermanentError
from notifier.messages import WorkerMessage

MAX_TEMPLATE_CHARS = 16 * 1024
MAX_OUTPUT_CHARS = 256 * 1024
_MAX_SEQUENCE = 100_000  # the largest string/list a template may build with * or **


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "**":
            if isinstance(right, int | float) and abs(right) > 64:
                raise jinja2.exceptions.SecurityError("exponent too large")
            return operator.pow(left, right)
        for seq, times in ((left, right), (right, left)):
            if (
                isinstance(seq, str | list | tuple)
                and isinstance(times, int)
                and len(seq) * times > _MAX_SEQUENCE
            ):
                raise jinja2.exceptions.SecurityError("result too large")
        return operator.mul(left, right)


_env = _BoundedSandbox(autoescape=False, keep_trailing_newline=True)


@functools.lru_cache(maxsize=1024)
def _compiled(source: str) -> jinja2.Template:
    return _env.from_string(source)


def compile_template(source: str, field: str) -> jinja2.Template:
    """Compile ``source``; raise ``InvalidChannelConfig`` naming ``field`` if it is unusable."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise InvalidChannelConfig(field, f"longer than {MAX_TEMPLATE_CHARS} characters")
    try:
        return _compiled(source)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidChannelConfig(
            field, f"template error on line {exc.lineno}: {exc.message}"
        ) from exc


def context(message: WorkerMessage) -> dict[str, Any]:
    """What a template sees: the event, never the channel's config (it may hold secrets)."""
    return {
        "event_type": message.event_type,
        "event_id": str(message.event_id),
        "delivery_id": str(message.delivery_id),
        "recipient": message.recipient,
        "created_at": message.created_at.isoformat(),
        "payload": message.payload,
        "payload_json": json.dumps(message.payload, indent=2, sort_keys=True, ensure_ascii=False),
    }


def render(source: str, message: WorkerMessage, field: str) -> str:
    """Render ``source`` for ``message``; ``PermanentError`` when it cannot be rendered."""
    try:
        out = compile_template(source, field).render(context(message))
    except InvalidChannelConfig as exc:
        raise PermanentError(str(exc)) from exc
    except (jinja2.TemplateError, ArithmeticError, TypeError, ValueError) as exc:
        raise PermanentError(f"{field}: rendering failed: {type(exc).__name__}: {exc}") from exc
    if len(out) > MAX_OUTPUT_CHARS:
        raise PermanentError(f"{field}: rendered text longer than {MAX_OUTPUT_CHARS} characters")
    return out
