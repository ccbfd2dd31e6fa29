"""Delivery rules: acceptable target URLs and the retry schedule."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agent_engine.domain.delivery import (
    env_name_problem,
    retry_delay,
    secret_env_problem,
    target_url_problem,
)


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/agent-engine",
        "https://hooks.example.com:8443/x?team=ops",
        "http://127.0.0.1:9000/hooks",
        "http://127.8.9.10/",
        "http://localhost:9000/",
        "http://[::1]:9000/",
    ],
)
def test_https_and_loopback_http_are_accepted(url: str) -> None:
    assert target_url_problem(url) is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://hooks.example.com/", "loopback"),
        ("http://10.0.0.5/", "loopback"),
        ("ftp://hooks.example.com/", "https://"),
        ("hooks.example.com/x", "https://"),
        ("https://", "https://"),
        ("https://user:pw@hooks.example.com/", "credentials"),
        ("https://token@hooks.example.com/", "credentials"),
        ("https://hooks.example.com:99999/", "not a valid URL"),
        ("https://hooks.example.com/a b", "spaces"),
        ("https://example.com/" + "a" * 2100, "at most"),
    ],
)
def test_other_urls_are_refused_with_a_reason(url: str, says: str) -> None:
    problem = target_url_problem(url)
    assert problem is not None and says in problem


def test_secret_env_must_be_a_variable_name() -> None:
    assert env_name_problem("HOOK_SECRET_1") is None
    for bad in ("1SECRET", "HOOK-SECRET", "", "A B", "whsec_abc=="):
        assert env_name_problem(bad) is not None, bad
    assert secret_env_problem("HOOK_SECRET") is None
    problem = secret_env_problem("whsec_AAAA")
    assert problem is not None and "secret itself" in problem


def test_the_schedule_is_about_1s_5s_30s_2min_10min_1h_6h_then_failed() -> None:
    waits = [retry_delay(n) for n in range(1, 9)]
    assert waits == [
        timedelta(seconds=1),
        timedelta(seconds=5),
        timedelta(seconds=30),
        timedelta(minutes=2),
        timedelta(minutes=10),
        timedelta(hours=1),
        timedelta(hours=6),
        None,
    ]
    assert retry_delay(1, [timedelta(seconds=2)]) == timedelta(seconds=2)
    assert retry_delay(2, [timedelta(seconds=2)]) is None
    with pytest.raises(ValueError):
        retry_delay(0)
