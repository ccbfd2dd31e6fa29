import pytest

from agent_engine.agents.admin_rules import (
    MAX_CONCURRENT_RUNS,
    base_url_problem,
    iteration_cap_problem,
    max_concurrent_runs_problem,
    provider_problem,
    retention_days_problem,
    weekly_token_cap_problem,
)


@pytest.mark.parametrize("url", ["https://api.example.com/v1", "http://localhost:8080/v1?model=x"])
def test_a_plain_http_url_is_a_base_url(url: str) -> None:
    assert base_url_problem(url) is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://example.com", "http(s) URL"),
        ("https://", "http(s) URL"),
        ("https://example.com:99999", "http(s) URL"),
        ("https://user:pw@example.com", "user:password@"),
        ("https://example.com/v1?api_key=1&sig=2", "(api_key, sig)"),
    ],
)
def test_a_base_url_with_credentials_or_no_host_is_refused(url: str, says: str) -> None:
    problem = base_url_problem(url)
    assert problem is not None and says in problem


def test_only_known_providers_are_accepted() -> None:
    assert provider_problem("openai") is None
    assert provider_problem("anthropic") == "must be one of openai, builtin"


def test_limits_and_caps_take_null_where_it_means_none() -> None:
    assert max_concurrent_runs_problem(None) is None
    assert max_concurrent_runs_problem(MAX_CONCURRENT_RUNS) is None
    assert max_concurrent_runs_problem(0) is not None
    assert weekly_token_cap_problem(None) is None
    assert weekly_token_cap_problem(0) is None
    assert weekly_token_cap_problem(-1) is not None
    assert retention_days_problem(None) is None
    assert retention_days_problem(0) is not None
    # The iteration cap has no "none": every run stops somewhere.
    assert iteration_cap_problem(None) is not None
    assert iteration_cap_problem(1) is None
