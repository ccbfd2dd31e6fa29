"""The circuit breaker per model: closed, open for its time, then one probe at a time."""

from __future__ import annotations

from agent_engine.runtime.fallback import OPEN_AFTER_FAILED_ATTEMPTS, ModelBreaker

KEY = ("openai", "http://a.example/v1", "gpt", None)
OTHER = ("openai", "http://b.example/v1", "gpt", None)


def test_a_model_is_tried_until_it_is_down_then_skipped_for_the_open_time() -> None:
    breaker = ModelBreaker(open_seconds=30)
    assert breaker.allows(KEY, now=0)
    breaker.failed(KEY, now=1)
    assert not breaker.allows(KEY, now=2)
    assert not breaker.allows(KEY, now=30.9)
    assert breaker.allows(OTHER, now=2)  # per model


def test_after_the_open_time_one_call_probes_and_an_answer_closes_it() -> None:
    breaker = ModelBreaker(open_seconds=30)
    breaker.failed(KEY, now=0)
    assert breaker.allows(KEY, now=31)  # the probe
    assert not breaker.allows(KEY, now=31.5)  # the others keep skipping meanwhile
    breaker.succeeded(KEY)
    assert breaker.allows(KEY, now=32)
    assert breaker.allows(KEY, now=32)
    assert not breaker.is_open(KEY)


def test_a_failed_probe_opens_it_again_and_a_lost_probe_is_replaced() -> None:
    breaker = ModelBreaker(open_seconds=30)
    breaker.failed(KEY, now=0)
    assert breaker.allows(KEY, now=31)
    breaker.failed(KEY, now=32)
    assert not breaker.allows(KEY, now=61)
    assert breaker.allows(KEY, now=62.5)  # probe, never reports back
    assert not breaker.allows(KEY, now=80)
    assert breaker.allows(KEY, now=93)  # replaced after the open time


def test_failed_attempts_in_a_row_open_it_and_an_answer_resets_the_count() -> None:
    breaker = ModelBreaker(open_seconds=30)
    for _ in range(OPEN_AFTER_FAILED_ATTEMPTS - 1):
        assert not breaker.attempt_failed(KEY, now=0)  # keep retrying
    breaker.succeeded(KEY)
    for _ in range(OPEN_AFTER_FAILED_ATTEMPTS - 1):
        assert not breaker.attempt_failed(KEY, now=1)
    assert breaker.attempt_failed(KEY, now=1)  # the fifth in a row: known down, stop retrying
    assert not breaker.allows(KEY, now=2)
    assert breaker.attempt_failed(KEY, now=2)  # already open
