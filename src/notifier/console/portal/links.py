"""Portal links' tokens: 256 random bits, URL-safe, in the link's URL only; the store keeps
their SHA-256. A link's URL is the console's public address (``[console] public_url``, never a
request's Host header) and ``/portal/enter/<token>``."""

from __future__ import annotations

import hashlib
import re
import secrets

ENTER_PATH = "/portal/enter/"
# What ``new_token`` makes: 32 bytes in unpadded URL-safe base64 (43 characters).
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{43}")


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What the store keeps of a token: its SHA-256, in hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def well_formed(token: str) -> bool:
    """Whether ``token`` could be one ``new_token`` made (others are refused unread)."""
    return TOKEN_RE.fullmatch(token) is not None


def link_url(public_url: str, token: str) -> str:
    """The URL a customer opens: under ``public_url`` (its path prefix kept)."""
    return public_url.rstrip("/") + ENTER_PATH + token
