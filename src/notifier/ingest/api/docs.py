"""``/docs``: the API reference for people, Redoc rendering ``/openapi.json`` in the browser.

The Redoc bundle (``static/redoc/``, its licences beside it) ships inside the package and is
served from the same origin: the page loads nothing from elsewhere. The page itself holds no
script: Redoc starts on the ``<redoc spec-url>`` element by itself. Its Content-Security-Policy
allows scripts from this origin only; Redoc also needs inline styles (it injects its CSS at run
time), ``blob:`` workers (its search index runs in a worker made from a blob) and ``data:``
images (its icons), and to fetch ``/openapi.json``."""

from __future__ import annotations

import functools
from importlib import resources

from quart import Blueprint, Response

routes = Blueprint("docs", __name__)

BUNDLE = "redoc.standalone.js"
BUNDLE_PATH = f"/docs/{BUNDLE}"
JAVASCRIPT = "text/javascript; charset=utf-8"
HTML = "text/html; charset=utf-8"
# The least Redoc renders under (tried in Chromium): without inline styles it fails to render,
# without blob: workers its search, without data: images its icons. Nothing else is allowed:
# no other origin (its footer's logo from a CDN is blocked), no font, no frame, no form.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; worker-src blob:; style-src 'unsafe-inline'; "
    "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>notifier API reference</title>
</head>
<body>
<redoc spec-url="/openapi.json"></redoc>
<script src="{BUNDLE_PATH}"></script>
</body>
</html>
""".encode()


@functools.cache
def bundle() -> bytes:
    """The vendored Redoc bundle, read from the package once."""
    return (resources.files("notifier.ingest") / "static" / "redoc" / BUNDLE).read_bytes()


@routes.get("/docs")
async def api_reference() -> Response:
    return Response(PAGE, content_type=HTML, headers=SECURITY_HEADERS)


@routes.get(BUNDLE_PATH)
async def redoc_bundle() -> Response:
    return Response(
        bundle(), content_type=JAVASCRIPT,
        headers={**SECURITY_HEADERS, "Cache-Control": "public, max-age=86400"},
    )  # fmt: skip
