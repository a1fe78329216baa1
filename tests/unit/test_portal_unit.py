"""The portal's pure parts: link tokens (random, URL-safe, kept as a hash), link URLs under the
configured public address, the scope a link or session carries, the event types a form may
choose, and ``[console] public_url`` checked as configuration. (Its pages and links run on
Postgres in tests/integration/test_portal.py and in Chromium in test_portal_browser.py.)"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from werkzeug.datastructures import MultiDict

from notifier.config import parse_config
from notifier.console.portal.links import link_url, new_token, token_hash, well_formed
from notifier.console.portal.pages import (
    audience,
    posted_event_types,
    read_event_types,
    tenant_credentials,
)
from notifier.console.web import ConsoleError
from notifier.errors import ConfigError
from notifier.store.portal import PortalScope
from notifier.store.rows import Channel

TENANT = uuid.uuid4()


def test_tokens_are_random_url_safe_and_kept_only_as_their_hash() -> None:
    tokens = {new_token() for _ in range(200)}
    assert len(tokens) == 200
    for token in tokens:
        assert well_formed(token)
        assert token_hash(token) == hashlib.sha256(token.encode()).hexdigest()
        assert token not in token_hash(token)


@pytest.mark.parametrize(
    "token", ["", "short", "x" * 42, "x" * 44, "a/" + "x" * 41, "x" * 42 + "=", "x" * 42 + "\n"]
)
def test_a_token_new_token_could_not_have_made_is_not_well_formed(token: str) -> None:
    assert not well_formed(token)


@pytest.mark.parametrize(
    ("public", "url"),
    [
        ("https://hooks.example.com", "https://hooks.example.com/portal/enter/T"),
        ("https://hooks.example.com/", "https://hooks.example.com/portal/enter/T"),
        ("https://example.com/notify/", "https://example.com/notify/portal/enter/T"),
    ],
)
def test_a_link_is_under_the_public_url_with_its_path(public: str, url: str) -> None:
    assert link_url(public, "T") == url


def test_a_scope_is_a_customer_or_channel_ids_never_both_nor_neither() -> None:
    ids = (uuid.uuid4(),)
    assert PortalScope(tenant_id=TENANT, customer="acme").args() == (TENANT, "acme", None)
    assert PortalScope(tenant_id=TENANT, channel_ids=ids).args() == (TENANT, None, list(ids))
    with pytest.raises(ValueError, match="exactly one"):
        PortalScope(tenant_id=TENANT)
    with pytest.raises(ValueError, match="exactly one"):
        PortalScope(tenant_id=TENANT, customer="acme", channel_ids=ids)


def form(**fields: Any) -> MultiDict[str, str]:
    data: MultiDict[str, str] = MultiDict()
    for name, value in fields.items():
        for v in value if isinstance(value, list) else [value]:
            data.add(name, v)
    return data


def test_with_a_catalog_only_its_types_may_be_chosen() -> None:
    catalog = ["order.paid", "order.refunded"]
    assert read_event_types(form(event_type=["order.paid"]), catalog) == ["order.paid"]
    for chosen in (["order.paid", "user.deleted"], ["*"], ["order.*"]):
        with pytest.raises(ConsoleError) as refused:
            read_event_types(form(event_type=chosen), catalog)
        assert refused.value.status == 400
    with pytest.raises(ConsoleError, match="at least one"):
        read_event_types(form(), catalog)
    # the free text field is not read when there is a catalog
    with pytest.raises(ConsoleError, match="at least one"):
        read_event_types(form(event_types="*"), catalog)


def test_without_a_catalog_patterns_are_read_from_text() -> None:
    assert read_event_types(form(event_types="order.* , user.signed_up order.*"), []) == [
        "order.*", "user.signed_up",
    ]  # fmt: skip
    assert read_event_types(form(event_types="*"), []) == ["*"]
    for bad in ("order.**", "a..b", "x" * 201, "<script>"):
        with pytest.raises(ConsoleError, match="not a type or pattern"):
            read_event_types(form(event_types=bad), [])
    with pytest.raises(ConsoleError, match="at most 100"):
        read_event_types(form(event_types=" ".join(f"t{i}" for i in range(101))), [])


def test_the_public_url_is_checked_naming_its_key() -> None:
    ok = parse_config({"console": {"public_url": "https://hooks.example.com/notify"}}, env={})
    assert ok.console.public_url == "https://hooks.example.com/notify"
    assert parse_config({}, env={}).console.public_url == ""
    for bad in ("hooks.example.com", "ftp://x", "https://", "https://x/?a=1", "https://x/#f",
                "https://user:pw@x"):  # fmt: skip
        with pytest.raises(ConfigError, match=r"console\.public_url"):
            parse_config({"console": {"public_url": bad}}, env={})


def endpoint(recipient: str | None, customer: str | None, **config: Any) -> Channel:
    now = datetime.now(UTC)
    return Channel(
        id=uuid.uuid4(), tenant_id=TENANT, type="webhook", name="e", recipient=recipient,
        config={"url": "https://a.example/", **config}, event_types=["*"], enabled=True,
        max_attempts=None, created_at=now, updated_at=now, customer=customer,
    )  # fmt: skip


def test_event_types_are_the_portals_only_on_a_channel_addressed_to_the_customer() -> None:
    acme = PortalScope(tenant_id=TENANT, customer="acme")
    assert audience(acme, endpoint("acme", "acme")) == "acme"
    for recipient in (None, "globex"):  # the tenant's own events, or another customer's
        assert audience(acme, endpoint(recipient, "acme")) is None
    ids = PortalScope(tenant_id=TENANT, channel_ids=(uuid.uuid4(),))
    assert audience(ids, endpoint("acme", "acme")) == "acme"  # addressed to its own customer
    assert audience(ids, endpoint("acme", "globex")) is None
    assert audience(ids, endpoint(None, None)) is None
    assert audience(ids, endpoint("acme", None)) is None


def test_the_tenants_credentials_in_a_webhook_config_are_named() -> None:
    assert tenant_credentials(endpoint(None, "acme", secret="whsec_x", headers={})) == []
    got = tenant_credentials(endpoint(
        None, "acme", headers={"X-Key": "k"}, oauth2={"client_id": "c"},
        tls_client_certificate="mtls",
    ))  # fmt: skip
    assert got == ["headers", "oauth2", "tls_client_certificate"]


def test_a_read_only_form_posts_no_event_types() -> None:
    assert posted_event_types(form(name="x"), []) is None
    assert posted_event_types(form(name="x"), ["order.paid"]) is None
    assert posted_event_types(form(event_types=""), []) == set()
    assert posted_event_types(form(event_types="a.*, b"), []) == {"a.*", "b"}
    assert posted_event_types(form(event_type=["order.paid"]), ["order.paid"]) == {"order.paid"}
