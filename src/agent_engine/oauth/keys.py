"""Tokens at rest: AES-256-GCM under `AGENT_ENGINE_TOKEN_KEYS`.

The variable holds comma-separated base64 keys of 32 bytes. The first encrypts; every key
decrypts, so a key is rotated by putting a new one first, running `agent-engine
rotate-token-keys` (re-encrypts every stored token with the first key) and then dropping the old.

A stored value is `version (1 byte) | key id (4 bytes: SHA-256 of the key, first 4) | nonce (12) |
ciphertext+tag`. The associated data names what the value is (e.g. `tool_connections.access:17`),
so a ciphertext copied to another row or column does not decrypt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

ENV = "AGENT_ENGINE_TOKEN_KEYS"
VERSION = b"\x01"
NONCE_BYTES = 12
KEY_ID_BYTES = 4


class NoTokenKeys(Exception):
    """No AGENT_ENGINE_TOKEN_KEYS: owners' accounts cannot be connected or used."""

    def __init__(self) -> None:
        super().__init__(
            f"the engine has no token keys ({ENV} is not set): an administrator must set it"
            " before accounts can be connected"
        )


class Undecryptable(Exception):
    """A stored token none of the keys decrypts (its key was dropped, or the value was altered)."""


def key_problem(value: str | None) -> str | None:
    """Why `value` is not a valid AGENT_ENGINE_TOKEN_KEYS, or None (unset is valid: no keys)."""
    if value is None or not value.strip():
        return None
    for position, part in enumerate(value.split(","), start=1):
        part = part.strip()
        try:
            raw = base64.b64decode(part, validate=True)
        except (binascii.Error, ValueError):
            return f"key {position} is not base64"
        if len(raw) != 32:
            return f"key {position} is {len(raw)} bytes; each key must be 32 bytes (base64)"
    return None


def new_key() -> str:
    """A fresh key, base64 (what `agent-engine rotate-token-keys --new-key` prints)."""
    return base64.b64encode(secrets.token_bytes(32)).decode()


class TokenKeys:
    def __init__(self, keys: list[bytes]) -> None:
        if not keys:
            raise NoTokenKeys()
        self._keys = [(hashlib.sha256(k).digest()[:KEY_ID_BYTES], AESGCM(k)) for k in keys]

    @classmethod
    def parse(cls, value: str | None) -> TokenKeys:
        if problem := key_problem(value):
            raise ValueError(f"{ENV}: {problem}")
        if value is None or not value.strip():
            raise NoTokenKeys()
        return cls([base64.b64decode(p.strip()) for p in value.split(",")])

    @classmethod
    def from_env(cls) -> TokenKeys:
        return cls.parse(os.environ.get(ENV))

    @staticmethod
    def configured() -> bool:
        value = os.environ.get(ENV)
        return bool(value and value.strip()) and key_problem(value) is None

    def encrypt(self, plaintext: str, purpose: str) -> bytes:
        key_id, aead = self._keys[0]
        nonce = secrets.token_bytes(NONCE_BYTES)
        sealed = aead.encrypt(nonce, plaintext.encode(), purpose.encode())
        return VERSION + key_id + nonce + sealed

    def decrypt(self, stored: bytes, purpose: str) -> str:
        stored = bytes(stored)
        if len(stored) < 1 + KEY_ID_BYTES + NONCE_BYTES + 16 or stored[:1] != VERSION:
            raise Undecryptable("not a stored token")
        key_id = stored[1 : 1 + KEY_ID_BYTES]
        nonce = stored[1 + KEY_ID_BYTES : 1 + KEY_ID_BYTES + NONCE_BYTES]
        sealed = stored[1 + KEY_ID_BYTES + NONCE_BYTES :]
        for candidate_id, aead in self._keys:
            if candidate_id != key_id:
                continue
            try:
                return aead.decrypt(nonce, sealed, purpose.encode()).decode()
            except InvalidTag:
                break
        raise Undecryptable("no key of AGENT_ENGINE_TOKEN_KEYS decrypts this token")

    def is_current(self, stored: bytes) -> bool:
        """Whether `stored` was encrypted with the first key."""
        return bytes(stored)[1 : 1 + KEY_ID_BYTES] == self._keys[0][0]

    def reencrypt(self, stored: bytes, purpose: str) -> bytes:
        return self.encrypt(self.decrypt(stored, purpose), purpose)
