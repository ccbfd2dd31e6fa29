"""Signatures a Standard Webhooks verifier accepts, and secrets that are refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from agent_engine.delivery.signing import (
    SecretProblem,
    body_bytes,
    load_secret,
    new_secret,
    signed_headers,
)


def test_a_signed_body_verifies_with_the_reference_verifier() -> None:
    secret = new_secret()
    at = datetime.now(UTC)
    body = body_bytes({"type": "run.succeeded", "data": {"runId": "7", "output": "Grüße"}})
    headers = signed_headers(load_secret("S", {"S": secret}), "msg_1", at, body)

    assert Webhook(secret).verify(body, headers) == {
        "type": "run.succeeded",
        "data": {"runId": "7", "output": "Grüße"},
    }
    # The signature is v1,<base64 HMAC-SHA256 of "id.timestamp.body"> keyed by the secret bytes.
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"msg_1.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == f"v1,{expected}"
    assert headers["webhook-timestamp"] == str(int(at.timestamp()))


def test_a_changed_body_or_another_secret_does_not_verify() -> None:
    secret = new_secret()
    body = body_bytes({"a": 1})
    headers = signed_headers(load_secret("S", {"S": secret}), "msg_2", datetime.now(UTC), body)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body_bytes({"a": 2}), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify(body, headers)


def test_the_body_is_the_same_bytes_every_time() -> None:
    payload = {"type": "run.failed", "data": {"b": 1, "a": [1, 2]}, "timestamp": "t"}
    assert body_bytes(payload) == body_bytes(dict(reversed(list(payload.items()))))


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        ({}, "environment variable S is not set"),
        ({"S": ""}, "environment variable S is not set"),
        ({"S": "plain-password"}, "whsec_"),
        ({"S": "whsec_not base64!"}, "not base64"),
        ({"S": "whsec_"}, "empty"),
    ],
)
def test_a_missing_or_malformed_secret_is_a_clear_problem(
    environ: dict[str, str], says: str
) -> None:
    with pytest.raises(SecretProblem, match=says):
        load_secret("S", environ)
