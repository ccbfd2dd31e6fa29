"""Tokens at rest: AES-GCM under AGENT_ENGINE_TOKEN_KEYS (the first encrypts, all decrypt), each
value bound to what it is."""

from __future__ import annotations

import base64

import pytest

from agent_engine.oauth.keys import NoTokenKeys, TokenKeys, Undecryptable, key_problem, new_key
from agent_engine.settings import Settings

OLD, NEW = new_key(), new_key()


def test_the_first_key_encrypts_and_every_key_decrypts() -> None:
    old = TokenKeys.parse(OLD)
    sealed = old.encrypt("access-token-value", "access:1:2")
    assert b"access-token-value" not in sealed
    rotated = TokenKeys.parse(f"{NEW},{OLD}")
    assert rotated.decrypt(sealed, "access:1:2") == "access-token-value"
    assert not rotated.is_current(sealed)
    again = rotated.reencrypt(sealed, "access:1:2")
    assert rotated.is_current(again)
    assert TokenKeys.parse(NEW).decrypt(again, "access:1:2") == "access-token-value"
    with pytest.raises(Undecryptable):
        old.decrypt(again, "access:1:2")


def test_a_value_moved_to_another_row_or_altered_does_not_decrypt() -> None:
    keys = TokenKeys.parse(OLD)
    sealed = keys.encrypt("token", "access:1:2")
    with pytest.raises(Undecryptable):
        keys.decrypt(sealed, "access:3:2")
    altered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(Undecryptable):
        keys.decrypt(altered, "access:1:2")
    assert keys.encrypt("token", "access:1:2") != sealed  # a fresh nonce each time


def test_bad_keys_are_named_without_echoing_them() -> None:
    assert key_problem(None) is None and key_problem("") is None
    assert key_problem("not base64!") == "key 1 is not base64"
    short = base64.b64encode(b"x" * 16).decode()
    assert key_problem(f"{OLD},{short}") == (
        "key 2 is 16 bytes; each key must be 32 bytes (base64)"
    )
    with pytest.raises(NoTokenKeys):
        TokenKeys.parse(None)
    with pytest.raises(ValueError, match="key 1 is 3 bytes") as refused:
        Settings(token_keys="nope")
    assert "nope" not in str(refused.value)
    assert Settings(token_keys=f" {OLD} , {NEW} ").token_keyring() is not None
    assert Settings(token_keys="").token_keyring() is None


def test_the_public_url_follows_the_outbound_rules() -> None:
    with pytest.raises(ValueError, match="loopback"):
        Settings(public_url="http://engine.example.com")
    assert Settings(public_url="https://engine.example.com").public_url == (
        "https://engine.example.com"
    )
