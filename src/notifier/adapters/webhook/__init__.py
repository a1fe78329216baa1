"""The webhook channel: POST a signed Standard Webhooks envelope to the channel's URL.

- ``signing``: secrets, signatures, the envelope of an attempt, secret rotation;
- ``headers``: the rule for a channel's custom headers, and keeping their values and the
  secrets out of errors;
- ``ssrf``: the table of blocked addresses, the URL checks that need no network;
- ``resolver``: host names to addresses without threads (``/etc/hosts``, then DNS), cached;
- ``client``: the HTTP/1.1 client (``http11`` over trio), which dials only the checked
  addresses and reads an answer with a bound;
- ``http11``: the request it writes and the answers it reads, without I/O;
- ``pool``: the client's kept-alive connections, by origin, and when one is not reused;
- ``answers``: an HTTP answer or a transport error turned into a receipt or an error;
- ``tls``: the CAs trusted for receivers and the client identities for mutual TLS;
- ``oauth``: OAuth2 client credentials, the token cache;
- ``proxy``: the egress proxy, a dialer that tunnels to the checked address;
- ``channels``: ``WebhookChannels``, a channel's config validated at create and PATCH;
- ``adapter``: ``WebhookAdapter``, the deliverer, which puts them together.
"""

from notifier.adapters.webhook.adapter import WebhookAdapter
from notifier.adapters.webhook.answers import (
    WebhookAdapterCrash,
    classify,
    parse_retry_after,
    transport_error,
)
from notifier.adapters.webhook.channels import WebhookChannels, WebhookConfig
from notifier.adapters.webhook.headers import header_field, header_problem, request_secrets
from notifier.adapters.webhook.signing import (
    PREVIOUS_SECRET,
    build_request,
    generate_secret,
    rotate_secret,
    sign,
    signing_secrets,
)
from notifier.adapters.webhook.ssrf import check_address, literal_address, validate_url

__all__ = [
    "PREVIOUS_SECRET",
    "WebhookAdapter",
    "WebhookAdapterCrash",
    "WebhookChannels",
    "WebhookConfig",
    "build_request",
    "check_address",
    "classify",
    "generate_secret",
    "header_field",
    "header_problem",
    "literal_address",
    "parse_retry_after",
    "request_secrets",
    "rotate_secret",
    "sign",
    "signing_secrets",
    "transport_error",
    "validate_url",
]
