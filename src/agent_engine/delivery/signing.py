"""Standard Webhooks signatures (https://www.standardwebhooks.com), via the `standardwebhooks`
package: `webhook-id`, `webhook-timestamp` and `webhook-signature: v1,<base64 HMAC-SHA256 of
"id.timestamp.body">`, keyed by a `whsec_<base64>` secret read from the environment by the worker.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from standardwebhooks.webhooks import Webhook

from agent_engine.domain.delivery import SECRET_PREFIX

# Random bytes in a generated secret (the spec asks for 24 to 64).
SECRET_BYTES = 32


class SecretProblem(Exception):
    """The signing secret is missing or malformed: the delivery fails, the run does not."""


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def load_secret(secret_env: str, environ: Mapping[str, str] | None = None) -> Webhook:
    """The signer for the secret held by the environment variable `secret_env`."""
    value = (os.environ if environ is None else environ).get(secret_env)
    if not value:
        raise SecretProblem(
            f"the signing secret is missing: environment variable {secret_env} is not set on the"
            " worker"
        )
    return signer(value, where=f"environment variable {secret_env}")


def signer(secret: str, *, where: str = "the secret") -> Webhook:
    raw = secret.strip()
    if not raw.startswith(SECRET_PREFIX):
        raise SecretProblem(f"{where} must hold a {SECRET_PREFIX}<base64> secret")
    try:
        key = base64.b64decode(raw[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SecretProblem(f"{where}: the part after {SECRET_PREFIX} is not base64") from exc
    if not key:
        raise SecretProblem(f"{where}: the secret is empty")
    return Webhook(key)


def body_bytes(payload: Any) -> bytes:
    """The request body: compact JSON, keys in a fixed order, so every attempt sends the same."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def signed_headers(webhook: Webhook, webhook_id: str, at: datetime, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": webhook.sign(webhook_id, at, body.decode()),
        "content-type": "application/json",
    }
