"""Trust, identity and egress of webhooks without sockets: the ``[workers.webhook]`` keys
(``ca_file``, ``proxy_url``, ``client_certificates``) refused naming the key, a channel's
``tls_client_certificate`` and ``oauth2`` refused naming the field (also through the API, with
nothing written), the OAuth2 client secret kept as a secret field, and the pure parts of OAuth2
(the token request, reading an answer, one shared fetch, renewal)."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
import trustme

from notifier.adapters.base import InvalidChannelConfig, public_config
from notifier.adapters.registry import build_adapters
from notifier.adapters.webhook import WebhookChannels
from notifier.adapters.webhook.oauth import (
    CLIENT_SECRET_FIELD,
    Credentials,
    Token,
    Tokens,
    read_token,
    token_request,
)
from notifier.adapters.webhook.proxy import ProxyDialer, connect_target
from notifier.adapters.webhook.tls import load_tls, trusted_context
from notifier.config import WebhookWorkersConfig, parse_config
from notifier.errors import ConfigError, PermanentError, RetriableError
from notifier.ingest.app import create_app
from notifier.ingest.tenants import hash_api_key
from notifier.testing.api import MemoryApiStore

SECRET = "s3cr3t-client-secret-value"
TOKEN_URL = "https://auth.example.com/token"
OAUTH = {"token_url": TOKEN_URL, "client_id": "notifier", "client_secret": SECRET}


def webhook_config(**keys: Any) -> WebhookWorkersConfig:
    return parse_config({"workers": {"webhook": keys}}, env={}).workers.webhook  # type: ignore[return-value]


def config_error(**keys: Any) -> str:
    with pytest.raises(ConfigError) as info:
        webhook_config(**keys)
    return str(info.value)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a client certificate it issued and its key, and a file that is no PEM."""
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    client = ca.issue_cert("notifier-client")
    files = {"ca": directory / "ca.pem", "cert": directory / "client.pem",
             "key": directory / "client.key", "junk": directory / "junk.pem"}  # fmt: skip
    ca.cert_pem.write_to_path(str(files["ca"]))
    client.cert_chain_pems[0].write_to_path(str(files["cert"]))
    client.private_key_pem.write_to_path(str(files["key"]))
    files["junk"].write_text("not a certificate\n")
    return files


# -- [workers.webhook] keys -----------------------------------------------------------------------


def test_a_ca_file_that_is_not_a_file_is_named(tmp_path: Path) -> None:
    message = config_error(ca_file=str(tmp_path / "missing.pem"))
    assert message.startswith("workers.webhook.ca_file: ")
    assert "missing.pem' is not a file" in message


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://proxy.internal:3128", "must be an http:// URL"),  # not a CONNECT proxy
        ("http://proxy.internal", "must name the port"),
        ("http://:3128", "no host name"),
        ("http://proxy.internal:3128/path", "without a path"),
        ("http://proxy.internal:99999", "not a URL that can be read"),
        ("http://user:hunter2-pw@proxy.internal:3128/x", "without a path"),
    ],
)
def test_a_bad_proxy_url_is_named_without_its_password(url: str, problem: str) -> None:
    message = config_error(proxy_url=url)
    assert message.startswith("workers.webhook.proxy_url: ")
    assert problem in message
    assert "hunter2" not in message


def test_a_good_proxy_url_is_taken_and_its_credentials_sent_as_basic() -> None:
    settings = webhook_config(proxy_url="http://egress:p%40ss-unit-only@10.0.0.9:3128")
    dialer = ProxyDialer(settings.proxy_url)
    assert (dialer.host, dialer.port, dialer.name) == ("10.0.0.9", 3128, "10.0.0.9:3128")
    assert dialer._authorization == "Basic " + base64.b64encode(b"egress:p@ss-unit-only").decode()


@pytest.mark.parametrize(
    ("address", "target"),
    [("203.0.113.7", b"203.0.113.7:443"), ("2001:db8::1", b"[2001:db8::1]:443")],
)
def test_connect_names_the_checked_address(address: str, target: bytes) -> None:
    assert connect_target(address, 443) == target


def test_client_certificate_keys_are_named(pki: dict[str, Path], tmp_path: Path) -> None:
    good = {"cert_file": str(pki["cert"]), "key_file": str(pki["key"])}
    missing = config_error(client_certificates={"billing": {**good, "key_file": str(tmp_path)}})
    assert missing.startswith("workers.webhook.client_certificates.billing.key_file: ")
    unknown = config_error(client_certificates={"billing": {**good, "password": "x"}})
    assert unknown.startswith("workers.webhook.client_certificates.billing.password: ")
    tenant = config_error(client_certificates={"billing": {**good, "tenants": ["acme"]}})
    assert tenant.startswith("workers.webhook.client_certificates.billing.tenants[0]: ")
    assert "not a tenant id" in tenant
    name = config_error(client_certificates={"bad name": good})
    assert name.startswith("workers.webhook.client_certificates.'bad name': ")


def test_files_that_hold_no_certificates_are_refused_at_start(pki: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"^workers\.webhook\.ca_file: no CA certificates"):
        load_tls(webhook_config(ca_file=str(pki["junk"])), {})
    with pytest.raises(ConfigError, match=r"^SSL_CERT_FILE: no CA certificates"):
        load_tls(webhook_config(), {"SSL_CERT_FILE": str(pki["junk"])})
    swapped = {"cert_file": str(pki["key"]), "key_file": str(pki["cert"])}
    with pytest.raises(ConfigError) as info:
        load_tls(webhook_config(client_certificates={"billing": swapped}), {})
    message = str(info.value)
    assert message.startswith("workers.webhook.client_certificates.billing: ")
    assert "PRIVATE KEY" not in message  # the key's text is never quoted


def test_an_encrypted_key_is_refused_without_asking_for_a_passphrase(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki["key"].read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    ))  # fmt: skip
    identity = {"cert_file": str(pki["cert"]), "key_file": str(encrypted)}
    with pytest.raises(ConfigError, match=r"client_certificates\.billing\.key_file: an encrypted"):
        load_tls(webhook_config(client_certificates={"billing": identity}), {})


def test_the_operators_cas_are_trusted_besides_the_public_roots(pki: dict[str, Path]) -> None:
    public = len(trusted_context().get_ca_certs())
    assert public > 50  # the bundled public roots
    from_env = trusted_context(environ={"SSL_CERT_FILE": str(pki["ca"])})
    from_key = trusted_context(ca_file=str(pki["ca"]))
    for context in (from_env, from_key):
        assert len(context.get_ca_certs()) == public + 1


def test_each_identity_has_a_context_with_its_tenants(pki: dict[str, Path]) -> None:
    tenant = uuid.uuid4()
    identity = {"cert_file": str(pki["cert"]), "key_file": str(pki["key"])}
    tls = load_tls(webhook_config(client_certificates={
        "billing": {**identity, "tenants": [str(tenant)]}, "shared": identity,
    }), {})  # fmt: skip
    assert set(tls.identities) == {"billing", "shared"}
    assert tls.identities["billing"].context is not tls.context
    assert tls.identities["billing"].allows(tenant)
    assert not tls.identities["billing"].allows(uuid.uuid4())
    assert tls.identities["shared"].allows(uuid.uuid4())


async def test_the_service_builds_the_webhook_deliverer_with_the_environments_trust(
    pki: dict[str, Path],
) -> None:
    config = parse_config({"workers": {"webhook": {}}}, env={})
    with pytest.raises(ConfigError, match=r"^SSL_CERT_DIR: '.*junk.pem' is not a directory"):
        build_adapters(config, {"SSL_CERT_DIR": str(pki["junk"])})
    adapters = build_adapters(config, {"SSL_CERT_FILE": str(pki["ca"])})
    await adapters["webhook"].aclose()


# -- a channel's config ---------------------------------------------------------------------------

TENANT = uuid.uuid4()


def channels(**kwargs: Any) -> WebhookChannels:
    return WebhookChannels(
        timeout_seconds=5, allow_private_networks=False,
        client_certificates={"billing": [str(TENANT)], "shared": []}, **kwargs,
    )  # fmt: skip


def refused(config: dict[str, Any], previous: dict[str, Any] | None = None) -> tuple[str, str]:
    validator = channels()

    def prepare() -> None:
        if previous is None:
            validator.check_tenant(validator.prepare_config(config), uuid.uuid4())
        else:
            validator.prepare_config_update(config, previous)

    with pytest.raises(InvalidChannelConfig) as info:
        prepare()
    return info.value.field, info.value.message


URL = "https://hooks.example.com/in"


@pytest.mark.parametrize(
    ("config", "field", "problem"),
    [
        ({"tls_client_certificate": "nope"}, "config.tls_client_certificate",
         "no client certificate named nope is available to this tenant"),
        # kept for another tenant: the same answer as an unknown name
        ({"tls_client_certificate": "billing"}, "config.tls_client_certificate",
         "no client certificate named billing is available to this tenant"),
        ({"url": "http://hooks.example.com/in", "tls_client_certificate": "shared"},
         "config.tls_client_certificate", "needs an https url"),
        ({"tls_client_certificate": 7}, "config.tls_client_certificate", "Expected `str | null`"),
        ({"oauth2": {**OAUTH, "client_secret": None}}, "config.oauth2.client_secret",
         "Expected `str`"),
        ({"oauth2": {"token_url": TOKEN_URL, "client_id": "x"}}, "config.oauth2.client_secret",
         "missing required key"),
        ({"oauth2": {**OAUTH, "token_url": "http://auth.example.com/t"}},
         "config.oauth2.token_url", "must be an https URL"),
        ({"oauth2": {**OAUTH, "token_url": "https://127.0.0.1/t"}}, "config.oauth2.token_url",
         "destination blocked: 127.0.0.1 is a loopback address"),
        ({"oauth2": {**OAUTH, "scope": 'a "b"'}}, "config.oauth2.scope", "Expected `str`"),
        ({"oauth2": {**OAUTH, "client_id": ""}}, "config.oauth2.client_id", "length >= 1"),
        ({"oauth2": {**OAUTH, "grant_type": "password"}}, "config.oauth2.grant_type",
         "unknown"),
        ({"oauth2": OAUTH, "headers": {"Authorization": "Bearer x"}},
         "config.headers.Authorization", "may not be set with config.oauth2"),
        ({CLIENT_SECRET_FIELD: SECRET}, f"config.{CLIENT_SECRET_FIELD}", "unknown"),
    ],
)  # fmt: skip
def test_bad_trust_and_identity_settings_are_refused_naming_the_field(
    config: dict[str, Any], field: str, problem: str
) -> None:
    got_field, message = refused({"url": URL, **config})
    assert got_field == field
    assert problem.lower() in message.lower()
    assert SECRET not in message


def test_a_tenant_may_name_its_own_and_shared_certificates() -> None:
    validator = channels()
    for name in ("billing", "shared"):
        prepared = validator.prepare_config({"url": URL, "tls_client_certificate": name})
        validator.check_tenant(prepared, TENANT)
        assert prepared["tls_client_certificate"] == name


def test_the_client_secret_is_a_secret_field_kept_across_a_patch() -> None:
    validator = channels()
    stored = validator.prepare_config({"url": URL, "oauth2": {**OAUTH, "scope": "hooks:write"}})
    assert stored["oauth2"] == {"token_url": TOKEN_URL, "client_id": "notifier",
                                "scope": "hooks:write"}  # fmt: skip
    assert stored[CLIENT_SECRET_FIELD] == SECRET
    assert SECRET not in str(public_config(validator, stored))
    # What the API does: the stored secret fields carried into the PATCH body where absent.
    body = {"url": URL, "oauth2": {"token_url": TOKEN_URL, "client_id": "notifier"}}
    carried = {**body, **{k: stored[k] for k in validator.secret_fields if k in stored}}
    patched = validator.prepare_config_update(carried, stored)
    assert patched[CLIENT_SECRET_FIELD] == SECRET
    assert "scope" not in patched["oauth2"]
    replaced = {**carried, "oauth2": {**body["oauth2"], "client_secret": "n3w-secret"}}
    assert validator.prepare_config_update(replaced, stored)[CLIENT_SECRET_FIELD] == "n3w-secret"
    dropped = validator.prepare_config_update({"url": URL, **{CLIENT_SECRET_FIELD: SECRET}}, stored)
    assert "oauth2" not in dropped
    assert CLIENT_SECRET_FIELD not in dropped


@pytest.mark.parametrize("changed", ["token_url", "client_id"])
def test_a_patch_that_sends_the_secret_elsewhere_must_give_it_again(changed: str) -> None:
    stored = channels().prepare_config({"url": URL, "oauth2": OAUTH})
    oauth = {"token_url": TOKEN_URL, "client_id": "notifier"}
    oauth[changed] = "https://evil.example.com/t" if changed == "token_url" else "other"
    field, message = refused(
        {"url": URL, "oauth2": oauth, CLIENT_SECRET_FIELD: SECRET}, previous=stored
    )
    assert (field, message) == (
        "config.oauth2.client_secret",
        "required when token_url or client_id changes",
    )


def test_the_client_secret_field_cannot_be_set_directly() -> None:
    stored = channels().prepare_config({"url": URL, "oauth2": OAUTH})
    field, _ = refused({"url": URL, "oauth2": OAUTH, CLIENT_SECRET_FIELD: "mine"}, previous=stored)
    assert field == f"config.{CLIENT_SECRET_FIELD}"


def test_a_patch_adding_oauth2_without_a_secret_is_refused() -> None:
    stored = channels().prepare_config({"url": URL})
    oauth = {"token_url": TOKEN_URL, "client_id": "notifier"}
    field, message = refused({"url": URL, "oauth2": oauth}, previous=stored)
    assert (field, message) == ("config.oauth2.client_secret", "required (none is stored)")


async def test_the_token_endpoint_is_checked_against_the_network_rules_at_create() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        await trio.lowlevel.checkpoint()
        return {"auth.example.com": ["10.1.2.3"]}.get(host, ["93.184.216.34"])

    validator = channels(resolver=resolver)
    prepared = validator.prepare_config({"url": URL, "oauth2": OAUTH})
    with pytest.raises(InvalidChannelConfig) as info:
        await validator.check_destination(prepared)
    assert info.value.field == "config.oauth2.token_url"
    assert "auth.example.com resolves to a private address" in info.value.message
    assert "10.1.2.3" not in info.value.message  # a tenant never learns what it resolves to


# -- through the API: 422 naming the field, nothing written ------------------------------------


async def test_the_api_refuses_another_tenants_certificate_and_writes_nothing() -> None:
    store = MemoryApiStore()
    owner = await store.create_tenant("a", hash_api_key("key-a"))
    await store.create_tenant("b", hash_api_key("key-b"))
    validator = WebhookChannels(
        timeout_seconds=5, allow_private_networks=True, client_certificates={"billing": [owner]}
    )
    app = create_app(store, parse_config({"workers": {"webhook": {}}}, env={}),
                     {"webhook": validator})  # fmt: skip
    client = app.test_client()
    body = {"type": "webhook", "config": {"url": URL, "tls_client_certificate": "billing"}}

    async def post(key: str, json: dict[str, Any]) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key}"}
        resp = await client.post("/v1/channels", json=json, headers=headers)
        return resp.status_code, await resp.get_json()

    status, answer = await post("key-b", body)
    assert status == 422
    assert answer["error"]["message"] == (
        "config.tls_client_certificate: no client certificate named billing is available to "
        "this tenant"
    )
    assert store.channels == {}
    status, answer = await post("key-b", {**body, "config": {"url": URL, "oauth2": OAUTH}})
    assert status == 201
    assert CLIENT_SECRET_FIELD in answer["config"]  # shown in the answer to its creation only
    channel_id = answer["id"]
    status, created = await post("key-a", body)
    assert status == 201
    assert created["config"]["tls_client_certificate"] == "billing"
    resp = await client.get(f"/v1/channels/{channel_id}", headers={"Authorization": "Bearer key-b"})
    shown = await resp.get_json()
    assert CLIENT_SECRET_FIELD not in shown["config"]
    assert SECRET not in str(shown)
    # A PATCH of another tenant's channel to the certificate: refused, the channel unchanged.
    resp = await client.patch(
        f"/v1/channels/{channel_id}", headers={"Authorization": "Bearer key-b"},
        json={"config": {"url": URL, "tls_client_certificate": "billing"}},
    )  # fmt: skip
    assert resp.status_code == 422
    assert "config.tls_client_certificate" in (await resp.get_json())["error"]["message"]
    assert "tls_client_certificate" not in store.channels[uuid.UUID(channel_id)].config


# -- OAuth2's pure parts ------------------------------------------------------------------------

CREDS = Credentials(TOKEN_URL, "notifier", SECRET, "hooks:write", "https://hooks.example.com")


def test_the_token_request_is_client_credentials_with_basic_authentication() -> None:
    headers, body = token_request(CREDS)
    basic = base64.b64encode(f"notifier:{SECRET}".encode()).decode()
    assert ("authorization", f"Basic {basic}") in headers
    assert ("content-type", "application/x-www-form-urlencoded") in headers
    assert body == (
        b"grant_type=client_credentials&scope=hooks%3Awrite"
        b"&audience=https%3A%2F%2Fhooks.example.com"
    )
    assert SECRET not in repr(CREDS)


@pytest.mark.parametrize(
    ("body", "renew_at"),
    [
        (b'{"access_token": "abc", "token_type": "Bearer", "expires_in": 3600}', 1000 + 3570),
        (b'{"access_token": "abc", "token_type": "bearer", "expires_in": "40"}', 1000 + 20),  # half
        (b'{"access_token": "abc"}', 1000 + 270),  # no expiry: 300 s, renewed 30 s early
    ],
)
def test_a_token_is_renewed_before_it_expires(body: bytes, renew_at: float) -> None:
    assert read_token(200, body, 1000.0, endpoint="auth:443") == Token("abc", renew_at)


@pytest.mark.parametrize(
    ("status", "body", "problem"),
    [
        (401, b'{"error": "invalid_client", "client_secret": "' + SECRET.encode() + b'"}',
         "HTTP 401: "),
        (200, b"<html>", "not a JSON object"),
        (200, b'{"token_type": "Bearer"}', "no valid access_token"),
        (200, b'{"access_token": "a b"}', "no valid access_token"),  # not a header value
        (200, b'{"access_token": "abc", "token_type": "mac"}', "token_type must be Bearer"),
        (200, b'{"access_token": "abc", "expires_in": 0}', "expires_in must be a positive"),
        (200, b'{"access_token": "abc", "expires_in": true}', "expires_in must be a positive"),
    ],
)  # fmt: skip
def test_a_bad_token_answer_is_retriable_and_quotes_no_secret(
    status: int, body: bytes, problem: str
) -> None:
    with pytest.raises(RetriableError) as info:
        read_token(status, body, 0.0, endpoint="auth.example.com:443", secrets=CREDS.secrets())
    assert str(info.value).startswith("OAuth2 token endpoint auth.example.com:443: ")
    assert problem in str(info.value)
    assert SECRET not in str(info.value)


class FakeEndpoint:
    """A token endpoint as ``Tokens.get``'s ``fetch``: each fetch takes a second (trio time)
    and gives ``token-<n>``, valid ``life`` seconds; ``fail`` makes it raise instead."""

    def __init__(self, life: float = 100.0) -> None:
        self.life = life
        self.fetched = 0
        self.fail = False

    async def __call__(self, creds: Credentials) -> Token:
        await trio.sleep(1)
        self.fetched += 1
        if self.fail:
            raise RetriableError("OAuth2 token endpoint auth:443: HTTP 503")
        return Token(f"token-{self.fetched}", trio.current_time() + self.life)


async def test_concurrent_attempts_share_one_fetch(autojump_clock: trio.testing.MockClock) -> None:
    tokens, endpoint = Tokens(trio.current_time), FakeEndpoint()
    got: list[str] = []

    async def attempt() -> None:
        got.append(await tokens.get(CREDS, endpoint))

    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(attempt)
    assert got == ["token-1"] * 5
    assert endpoint.fetched == 1
    assert trio.current_time() == 1.0  # one fetch's time, not five


async def test_a_token_is_reused_until_renewal_then_fetched_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tokens, endpoint = Tokens(trio.current_time), FakeEndpoint(life=100)
    assert await tokens.get(CREDS, endpoint) == "token-1"  # renew at 1 + 100
    await trio.sleep(99.5)
    assert await tokens.get(CREDS, endpoint) == "token-1"
    await trio.sleep(0.5)
    assert await tokens.get(CREDS, endpoint) == "token-2"
    other = Credentials(TOKEN_URL, "notifier", "another-secret")
    assert await tokens.get(other, endpoint) == "token-3"  # another secret: its own token


async def test_a_dropped_token_is_fetched_again_unless_already_replaced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tokens, endpoint = Tokens(trio.current_time), FakeEndpoint()
    first = await tokens.get(CREDS, endpoint)
    tokens.drop(CREDS, first)
    second = await tokens.get(CREDS, endpoint)
    assert second == "token-2"
    tokens.drop(CREDS, first)  # a late 401 of the old token: the new one stays
    assert await tokens.get(CREDS, endpoint) == "token-2"


async def test_a_failed_fetch_fails_every_waiter_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tokens, endpoint = Tokens(trio.current_time), FakeEndpoint()
    endpoint.fail = True
    errors: list[str] = []

    async def attempt() -> None:
        try:
            await tokens.get(CREDS, endpoint)
        except RetriableError as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(attempt)
    assert errors == ["OAuth2 token endpoint auth:443: HTTP 503"] * 3
    assert endpoint.fetched == 1
    endpoint.fail = False
    assert await tokens.get(CREDS, endpoint) == "token-2"  # the next attempt tries again


def test_a_stored_config_without_the_secret_is_a_permanent_error() -> None:
    with pytest.raises(PermanentError, match=r"^config\.oauth2 needs token_url, client_id"):
        Credentials.of({"url": URL, "oauth2": {"token_url": TOKEN_URL, "client_id": "x"}})
    assert Credentials.of({"url": URL}) is None
