"""The event-type catalog: a tenant's event types, each with a JSON Schema (draft 2020-12) that
the payloads of that type must match, and the tenant's ``strict_event_types`` switch (a type it
has not registered is then refused).

``compile_schema`` checks a schema before it is stored (the metaschema, its size, only local
``$ref``\\ s that resolve, patterns the linear-time regex engine takes, no recursion and at most
``MAX_EXPANDED_NODES`` with every ``$ref`` inlined); ``Catalog.check`` checks an event; and
``Catalogs`` keeps each tenant's compiled catalog in an ingest process for
``CATALOG_CACHE_SECONDS``, forgotten as soon as the tenant's catalog changes (the NOTIFY on
``notifier_catalogs``, or on ``notifier_tenants`` for the switch, through
``tenants.TenantCaches``), so that checking an event costs no round trip to Postgres; reading
it again compiles only the types whose schema changed.

Validation is ``jsonschema_rs`` (Rust; about half a microsecond for a small payload, where the
pure-Python ``jsonschema`` takes some 80). It runs on the event loop and holds the GIL, so what
a check may cost is bounded at registration: its ``pattern``\\ s run on a regex engine without
backtracking, so a pattern cannot take exponential time (a pure-Python validator gives a
tenant a way to freeze the process's event loop with ``(a+)+$``; the price is that lookaround
and backreferences are refused at registration), and a schema may not be recursive nor expand
(``anyOf`` branches referencing the same definitions multiply) beyond ``MAX_EXPANDED_NODES``.

What is not checked: ``format`` is an annotation (draft 2020-12's default): ``"format":
"email"`` does not refuse a string that is not one. Remote references are never retrieved: a
``$ref`` must point inside the schema (``#/$defs/...``, ``#anchor``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

import jsonschema_rs
import msgspec
import trio

from notifier.errors import NotifierError

log = logging.getLogger("notifier.catalog")

Validator = jsonschema_rs.Draft202012Validator

DRAFT = "https://json-schema.org/draft/2020-12/schema"
MAX_SCHEMA_BYTES = 64 * 1024  # a schema's size as compact JSON
MAX_DESCRIPTION_CHARS = 2000
MAX_EVENT_TYPES = 200  # per tenant (the list route answers them all)
# The schemas of one tenant's catalog in all, as Postgres prints them (``octet_length(schema::
# text)``): what an ingest process holds and compiles per tenant is bounded by it.
MAX_CATALOG_BYTES = 1024 * 1024
# A schema's size with every ``$ref`` replaced by what it points to (each JSON value, object,
# array, key's value or item, counts one). What a check costs grows with it: applicators
# (``anyOf``, ``oneOf``, ``allOf``, ``items``…) may evaluate every branch, so a few ``$defs``
# that each reference the next twice make an exponential number of evaluations from a schema of
# a kilobyte. At this cap a check of the largest payload ingest takes stays in the milliseconds
# (README, *Event-type catalog*).
MAX_EXPANDED_NODES = 5_000
# How long an ingest process trusts a tenant's compiled catalog at most. A change is NOTIFYed
# and forgets it at once; the TTL bounds it only where no NOTIFY can arrive (no LISTEN behind a
# transaction pooler, or the LISTEN connection down).
CATALOG_CACHE_SECONDS = 30.0
# A reason longer than this (it may quote the offending value) is cut.
MAX_REASON_CHARS = 300


class SchemaRefused(NotifierError):
    """A schema that cannot be registered: ``path`` (a JSON path into the schema) and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"schema at {path}: {reason}")
        self.path, self.reason = path, reason


class EventRefused(NotifierError):
    """An event the catalog refuses: ``code`` (``schema_violation`` or
    ``unregistered_event_type``) and the message, which names the failing path."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _refuse(uri: str) -> Any:
    """The validator's retrieval: none (a reference outside the schema is never fetched)."""
    raise ValueError(f"{uri}: references outside the schema are not fetched")


def _cut(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def _step(key: str | int) -> str:
    if isinstance(key, int):
        return f"[{key}]"
    return f".{key}" if key.isidentifier() else f"[{msgspec.json.encode(key).decode()}]"


def json_path(steps: Sequence[str | int]) -> str:
    """``$.order.items[3]["odd key"]``: the JSON path of a list of keys and indexes."""
    return "$" + "".join(_step(s) for s in steps)


def _references(node: Any, path: str) -> Iterator[tuple[str, str, str]]:
    """Every keyword of ``node`` that points elsewhere: (its JSON path, keyword, value)."""
    if isinstance(node, dict):
        for key, value in node.items():
            here = path + _step(key)
            if key in ("$ref", "$dynamicRef", "$recursiveRef", "$id") and isinstance(value, str):
                yield here, key, value
            elif key not in ("const", "enum", "default", "examples"):  # values, not schemas
                yield from _references(value, here)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _references(value, f"{path}[{i}]")


_NOWHERE = re.compile(r"Pointer '(.*)' does not exist")

_NOT_SCHEMAS = ("const", "enum", "default", "examples")


class _Expansion:
    """How big ``schema`` is with every local ``$ref`` inlined (``MAX_EXPANDED_NODES``), each
    referenced location counted once and remembered; ``SchemaRefused`` for a ``$ref`` cycle (a
    recursive schema) or a size over the cap."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self._root = schema
        self._anchors: dict[str, tuple[Any, str]] = {}  # name → (node, its path)
        self._find_anchors(schema, "$")
        self._sizes: dict[int, int] = {}  # id() of a referenced node → its expanded size
        self._open: set[int] = set()  # the referenced nodes being expanded

    def _find_anchors(self, node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("$anchor", "$dynamicAnchor") and isinstance(value, str):
                    self._anchors.setdefault(value, (node, path))
                elif key not in _NOT_SCHEMAS:
                    self._find_anchors(value, path + _step(key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                self._find_anchors(value, f"{path}[{i}]")

    def _target(self, ref: str) -> tuple[Any, str] | None:
        """What ``ref`` points to and its path, or None (the compiler names a reference to
        nothing)."""
        fragment = urllib.parse.unquote(ref[1:])
        if fragment and not fragment.startswith("/"):
            return self._anchors.get(fragment)
        node: Any = self._root
        steps: list[str | int] = []
        for token in fragment.split("/")[1:]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
                steps.append(token)
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
                steps.append(int(token))
            else:
                return None
        return node, json_path(steps)

    def size(self, node: Any, path: str) -> int:
        if isinstance(node, list):
            return 1 + sum(self.size(v, f"{path}[{i}]") for i, v in enumerate(node))
        if not isinstance(node, dict):
            return 1
        total = 1
        for key, value in node.items():
            here = path + _step(key)
            if key in ("$dynamicRef", "$recursiveRef"):
                raise SchemaRefused(here, f"{key} is not supported (recursive schemas are not)")
            if key == "$ref" and isinstance(value, str):
                total += self._referenced(value, here)
            elif key in ("$defs", "definitions") and isinstance(value, dict):
                # Evaluated only where referenced (counted there), but each is expanded once
                # here too: a cycle or an oversized definition is refused even if unused.
                total += 1
                for name, definition in value.items():
                    self._expanded(definition, here + _step(name))
            elif key in _NOT_SCHEMAS:
                total += _values(value)
            else:
                total += self.size(value, here)
            if total > MAX_EXPANDED_NODES:
                raise SchemaRefused("$", _too_big)
        return total

    def _referenced(self, ref: str, path: str) -> int:
        found = self._target(ref)
        if found is None:
            return 1
        target, where = found
        if id(target) in self._open:
            raise SchemaRefused(
                path, f"{_cut(ref)!r} makes the schema recursive (a $ref cycle): not supported"
            )
        return self._expanded(target, where)

    def _expanded(self, target: Any, where: str) -> int:
        """The expanded size of ``target`` (at ``where``), remembered."""
        known = self._sizes.get(id(target))
        if known is not None:
            return known
        self._open.add(id(target))
        try:
            size = self._sizes[id(target)] = self.size(target, where)
        finally:
            self._open.discard(id(target))
        return size


_too_big = (
    f"over {MAX_EXPANDED_NODES} nodes with every $ref inlined (anyOf/oneOf/allOf branches "
    "that reference the same definitions multiply the work of a check)"
)


def _values(node: Any) -> int:
    """How many JSON values ``node`` is (data, not schemas)."""
    if isinstance(node, dict):
        return 1 + sum(_values(v) for v in node.values())
    if isinstance(node, list):
        return 1 + sum(_values(v) for v in node)
    return 1


def expanded_size(schema: dict[str, Any]) -> int:
    """The size of ``schema`` with every local ``$ref`` inlined (JSON values); ``SchemaRefused``
    when it is recursive, uses ``$dynamicRef``/``$recursiveRef`` or is over
    ``MAX_EXPANDED_NODES``."""
    try:
        return _Expansion(schema).size(schema, "$")
    except RecursionError:  # a chain of references (or of nesting) thousands deep
        raise SchemaRefused("$", "references or nesting too deep to expand") from None


def _validator(schema: dict[str, Any]) -> Validator:
    """The compiled validator: ``format`` not asserted, no retrieval, and patterns matched by a
    regular-expression engine that runs in linear time (no backtracking: a tenant's pattern
    cannot stall the ingest process)."""
    return jsonschema_rs.Draft202012Validator(
        schema, validate_formats=False, retriever=_refuse,
        pattern_options=jsonschema_rs.RegexOptions(),
    )  # fmt: skip


def compile_schema(schema: Any) -> Validator:
    """The validator of ``schema``, checked for registration; ``SchemaRefused`` naming the
    path in the schema and the problem otherwise."""
    if not isinstance(schema, dict):
        raise SchemaRefused("$", "a schema must be a JSON object")
    size = len(msgspec.json.encode(schema))
    if size > MAX_SCHEMA_BYTES:
        raise SchemaRefused("$", f"{size} bytes; at most {MAX_SCHEMA_BYTES} bytes as JSON")
    declared = schema.get("$schema", DRAFT)
    if declared not in (DRAFT, DRAFT + "#"):
        raise SchemaRefused(json_path(["$schema"]), f"only draft 2020-12 ({DRAFT}) is supported")
    try:
        jsonschema_rs.meta.validate(schema)  # the metaschema (and every pattern a regex)
    except jsonschema_rs.ValidationError as exc:
        raise SchemaRefused(json_path(exc.instance_path), _cut(exc.message)) from None
    return _compiled(schema)


def _compiled(schema: dict[str, Any]) -> Validator:
    """``compile_schema`` but the metaschema: the references, the expanded size, the
    validator. A stored schema (checked in full when it was registered) is compiled so."""
    found = list(_references(schema, "$"))
    for path, keyword, value in found:
        if keyword == "$id":
            if path != '$["$id"]':
                raise SchemaRefused(path, "$id only at the root (references stay in the schema)")
        elif not value.startswith("#"):
            raise SchemaRefused(
                path, f"{_cut(value)!r}: only references inside the schema (starting with #)"
            )
    expanded_size(schema)
    try:
        return _validator(schema)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError) as exc:
        message = str(getattr(exc, "message", exc)).splitlines()[0]
        nowhere = _NOWHERE.match(message)
        if nowhere is not None:
            for path, keyword, value in found:
                if keyword != "$id" and value == "#" + nowhere[1]:
                    raise SchemaRefused(
                        path, f"{value!r} points to nothing in the schema"
                    ) from None
        steps = getattr(exc, "instance_path", [])
        raise SchemaRefused(json_path(steps), _cut(message)) from None
    except ValueError as exc:  # anything else the compiler refuses
        raise SchemaRefused("$", _cut(str(exc).splitlines()[0])) from None


def schema_error(validator: Validator, payload: Any) -> tuple[str, str] | None:
    """``(JSON path in the payload, reason)`` of the first error of ``payload``, or None when
    it matches."""
    try:
        if validator.is_valid(payload):  # no error collected: the fast path
            return None
        validator.validate(payload)  # stops at the first error
    except jsonschema_rs.ValidationError as error:
        return json_path(error.instance_path), _cut(error.message)
    except Exception as exc:  # a payload must never turn into a 500
        log.warning("checking a payload against its event type's schema failed: %r", exc)
    return "$", "could not be checked against the schema"


@dataclasses.dataclass(frozen=True)
class Catalog:
    """A tenant's catalog as ingest checks events with it: the validators by event type."""

    strict: bool = False
    validators: Mapping[str, Validator] = dataclasses.field(default_factory=dict)

    def check(self, event_type: str, payload: Any, where: str = "") -> None:
        """``EventRefused`` unless an event of ``event_type`` with ``payload`` may be stored;
        ``where`` prefixes the message (``events[3].``, in a batch)."""
        validator = self.validators.get(event_type)
        if validator is None:
            if self.strict:
                raise EventRefused(
                    "unregistered_event_type",
                    f"{where}type: {event_type!r} is not in the tenant's event-type catalog "
                    "(strict_event_types is on)",
                )
            return
        found = schema_error(validator, payload)
        if found is not None:
            path, reason = found
            raise EventRefused(
                "schema_violation",
                f"{where}payload at {path}: {reason} (schema of event type {event_type!r})",
            )

    @property
    def empty(self) -> bool:
        return not self.strict and not self.validators


EMPTY = Catalog()


@dataclasses.dataclass(frozen=True)
class StoredCatalog:
    """What the store keeps of a tenant's catalog: the switch, the schemas by type and, by
    type, a digest of its schema as stored (a type whose digest is the one compiled before is
    not compiled again; without one, the digest of the schema's JSON)."""

    strict: bool
    schemas: Mapping[str, dict[str, Any]]
    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)


# Compiled types kept across a tenant's lookups: name → (digest of its schema, validator; None
# for a stored schema that is refused).
Compiled = dict[str, tuple[str, Validator | None]]


def _digest(stored: StoredCatalog, name: str, schema: dict[str, Any]) -> str:
    found = stored.versions.get(name)
    return found if found is not None else hashlib.sha256(msgspec.json.encode(schema)).hexdigest()


def compiled(stored: StoredCatalog, known: Compiled | None = None) -> Catalog:
    """``stored`` compiled. A stored schema was checked against the metaschema when it was
    registered and is not again here (the validator's constructor still checks it on its own:
    ``jsonschema_rs`` has no switch for that); its references and expanded size are, as they
    bound what a check costs. A stored schema that no longer compiles (registered by a version with
    other rules, or written by hand) is logged and its type checked by nothing.

    ``known``, the types compiled by a previous call for the same tenant, is updated in place:
    only a type that is new or whose schema changed is compiled, the others reuse their
    validator (a catalog is read again at every change and TTL, and compiling is synchronous)."""
    previous = known if known is not None else {}
    now: Compiled = {}
    validators: dict[str, Validator] = {}
    for name, schema in stored.schemas.items():
        digest = _digest(stored, name, schema)
        kept = previous.get(name)
        if kept is not None and kept[0] == digest:
            validator = kept[1]
        else:
            try:
                if not isinstance(schema, dict):  # written by hand
                    raise SchemaRefused("$", "a schema must be a JSON object")
                validator = _compiled(schema)
            except SchemaRefused as exc:
                log.warning(
                    "event type %r: its stored schema is refused (%s); not checked", name, exc
                )
                validator = None
        now[name] = (digest, validator)
        if validator is not None:
            validators[name] = validator
    if known is not None:
        known.clear()
        known.update(now)
    return Catalog(stored.strict, validators)


class _Lookup:
    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: Catalog | None = None
        self.error: Exception | None = None


class Catalogs:
    """Tenant id → its compiled ``Catalog``, read with ``lookup`` (one call per tenant missing;
    concurrent readers of the same tenant share it), kept ``ttl_seconds`` or until ``forget``.
    A lookup under way when its tenant was forgotten is answered but not kept (it may have read
    the catalog before the change)."""

    def __init__(
        self,
        lookup: Callable[[uuid.UUID], Awaitable[StoredCatalog]],
        ttl_seconds: float = CATALOG_CACHE_SECONDS,
    ) -> None:
        self._lookup = lookup
        self._ttl = ttl_seconds
        self._kept: dict[uuid.UUID, tuple[Catalog, float]] = {}
        self._pending: dict[uuid.UUID, _Lookup] = {}
        self._forgotten = 0
        # Kept when a tenant's catalog is forgotten: its types that did not change are not
        # compiled again.
        self._compiled: dict[uuid.UUID, Compiled] = {}

    async def of(self, tenant_id: uuid.UUID) -> Catalog:
        """Trio-flavoured. The tenant's catalog (from the cache when it is fresh)."""
        while True:
            now = trio.current_time()
            kept = self._kept.get(tenant_id)
            if kept is not None and kept[1] > now:
                return kept[0]
            pending = self._pending.get(tenant_id)
            if pending is None:
                return await self._look_up(tenant_id, now)
            await pending.done.wait()
            if pending.error is not None:
                raise pending.error
            if pending.answer is not None:
                return pending.answer

    async def _look_up(self, tenant_id: uuid.UUID, now: float) -> Catalog:
        pending = self._pending[tenant_id] = _Lookup()
        forgotten = self._forgotten
        try:
            stored = await self._lookup(tenant_id)
            pending.answer = compiled(stored, self._compiled.setdefault(tenant_id, {}))
        except Exception as exc:
            pending.error = exc
            raise
        finally:
            if self._pending.get(tenant_id) is pending:
                del self._pending[tenant_id]
            pending.done.set()
        if forgotten == self._forgotten:
            self._kept[tenant_id] = (pending.answer, now + self._ttl)
        return pending.answer

    def forget(self, tenant_id: uuid.UUID) -> None:
        """The tenant's catalog changed: read it again next time."""
        self._forgotten += 1
        self._kept.pop(tenant_id, None)
        self._pending.pop(tenant_id, None)

    def forget_all(self) -> None:
        self._forgotten += 1
        self._kept.clear()
        self._pending.clear()

    def __len__(self) -> int:
        return len(self._kept)
