"""Which steps of a failed run a retry carries over, and the conversation rebuilt from them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from agent_engine.db.run_steps import StepRow
from agent_engine.runs.retry import (
    UNKNOWN_OUTCOME,
    NotRetryable,
    carried_steps,
    check_retryable,
)
from agent_engine.runtime.prefill import prefill_from_steps

AT = datetime(2026, 12, 6, 4, 0, tzinfo=UTC)


def step(index: int, kind: str, name: str, **values: Any) -> StepRow:
    values.setdefault("input", None)
    values.setdefault("output", None)
    values.setdefault("error", None)
    values.setdefault("prompt_tokens", None)
    values.setdefault("completion_tokens", None)
    values.setdefault("finished_at", AT)
    return StepRow(run_id=1, index=index, kind=kind, name=name, started_at=AT, **values)


def model(index: int, output: str | None = "", **values: Any) -> StepRow:
    return step(index, "model_call", "gpt", output=output, prompt_tokens=10, **values)


def tool(index: int, name: str, output: str | None, **values: Any) -> StepRow:
    return step(index, "tool_call", name, input={"title": "x"}, output=output, **values)


def test_completed_steps_are_kept_up_to_the_model_call_that_failed() -> None:
    steps = [
        model(0, "looking"),
        tool(1, "search", "found T-1"),
        model(2, output=None, error="gpt failed: HTTP 500"),
        tool(3, "search", "never reached"),
    ]
    kept = carried_steps(steps, {})
    assert [(s.kind, s.output) for s in kept] == [
        ("model_call", "looking"),
        ("tool_call", "found T-1"),
    ]


def test_a_call_without_a_result_is_unknown_unless_it_only_waited_for_approval() -> None:
    steps = [
        model(0),
        tool(1, "create", None, error="tool create failed: no answer within 30 s"),
        tool(2, "create", None, finished_at=None),  # approved, claimed, then the worker died
        tool(3, "create", None),  # waited for the owner, never made
    ]
    kept = carried_steps(steps, {2: True, 3: False})
    assert [(s.output, s.error is not None) for s in kept[1:]] == [
        (UNKNOWN_OUTCOME, True),
        (UNKNOWN_OUTCOME, True),
    ]
    assert len(kept) == 3  # the never-made call is left out: the retry asks the owner again


def test_a_refusal_the_model_saw_is_kept_as_it_was() -> None:
    steps = [model(0), tool(1, "create", "error: title must not be empty", error="title")]
    kept = carried_steps(steps, {})
    assert (kept[1].output, kept[1].error) == ("error: title must not be empty", "title")


def test_the_conversation_pairs_each_answer_with_its_tool_calls() -> None:
    steps = [
        _with(model(0, "First I search."), reused=True),
        _with(tool(1, "search", "T-1"), reused=True),
        _with(tool(2, "create", UNKNOWN_OUTCOME), reused=True),
        _with(model(3, "  "), reused=True),
    ]
    prefill = prefill_from_steps(7, steps)
    roles = [m["role"] for m in prefill.messages]
    assert roles == ["assistant", "tool", "tool", "assistant"]
    first = prefill.messages[0]
    assert [c["function"]["name"] for c in first["tool_calls"]] == ["search", "create"]
    assert first["tool_calls"][0]["function"]["arguments"] == '{"title": "x"}'
    assert prefill.messages[1]["tool_call_id"] == first["tool_calls"][0]["id"]
    assert prefill.messages[2]["content"] == UNKNOWN_OUTCOME
    assert "tool_calls" not in prefill.messages[3]  # no empty list is ever sent
    assert prefill.texts == ["First I search."]
    assert (prefill.iterations, prefill.next_index) == (2, 4)


def _fields(row: StepRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in StepRow.__dataclass_fields__}


def _with(row: StepRow, **values: Any) -> StepRow:
    return StepRow(**{**_fields(row), **values})


@pytest.mark.parametrize(
    ("state", "reason", "named"),
    [
        ("succeeded", None, "SUCCEEDED"),
        ("failed", "cancelled", "CANCELLED"),
        ("failed", "iteration_cap", "ITERATION_CAP"),
        ("failed", "token_cap", "TOKEN_CAP"),
        ("skipped", "budget_exceeded", "SKIPPED"),
    ],
)
def test_only_error_and_stale_failures_are_retryable(
    state: str, reason: str | None, named: str
) -> None:
    with pytest.raises(NotRetryable, match=named):
        check_retryable(5, state, reason)
    check_retryable(5, "failed", "error")
    check_retryable(5, "failed", "stale")
