"""The console's unit tests' browser (the ``browser`` fixture, in conftest.py): one cookie jar
on the console of an app over the in-memory stores, with tenants ``a`` and ``b`` (keys
``key-a``, ``key-b``)."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from quart import typing as quart_typing

from notifier.adapters.specs import build_validators
from notifier.config import parse_config
from notifier.ingest.app import create_app
from notifier.ingest.tenants import hash_api_key
from notifier.testing.api import MemoryApiStore

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Browser:
    """One browser (one cookie jar) on the console of an app with tenants ``a`` and ``b``."""

    store: MemoryApiStore
    client: quart_typing.TestClientProtocol
    tenants: dict[str, uuid.UUID]

    async def get(self, path: str) -> tuple[int, str, Any]:
        resp = await self.client.get(path)
        return resp.status_code, (await resp.get_data()).decode(), resp.headers

    async def csrf(self, path: str = "/console/sign-in") -> str:
        _, body, _ = await self.get(path)
        found = CSRF.search(body)
        assert found, body
        return found.group(1)

    async def post(
        self, path: str, form: dict[str, str], *, csrf: str | None = "page", page: str | None = None
    ) -> tuple[int, str, Any]:
        """``csrf`` "page": the token of ``page`` (default: the sign-in form); None: none."""
        data = dict(form)
        if csrf == "page":
            data["csrf"] = await self.csrf(page or "/console/sign-in")
        elif csrf is not None:
            data["csrf"] = csrf
        resp = await self.client.post(path, form=data)
        return resp.status_code, (await resp.get_data()).decode(), resp.headers

    async def sign_in(self, key: str = "key-a") -> None:
        status, body, headers = await self.post("/console/sign-in", {"api_key": key})
        assert status == 303, body
        assert headers["Location"] == "/console/"


@pytest.fixture
async def browser() -> Browser:
    store = MemoryApiStore()
    tenants = {n: await store.create_tenant(n, hash_api_key(f"key-{n}")) for n in ("a", "b")}
    # The webhook validator as served (secrets made and rotated), checking no address: the
    # hooks' host resolves nowhere here.
    config = parse_config({"workers": {"webhook": {"allow_private_networks": True}}}, env={})
    validator = build_validators(config)["webhook"]
    app = create_app(store, config, {"webhook": validator})
    return Browser(store, app.test_client(), tenants)
