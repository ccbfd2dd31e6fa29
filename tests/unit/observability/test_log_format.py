"""Which log renderer each command gets."""

from __future__ import annotations

import pytest

from agent_engine.observability.logging import resolve_log_format


@pytest.mark.parametrize(
    ("setting", "interactive", "expected"),
    [
        ("auto", True, "console"),  # `agent-engine run` on a terminal
        ("auto", False, "json"),  # run with output to a file; serve, worker, clock always
        ("json", True, "json"),
        ("console", False, "console"),  # AGENT_ENGINE_LOG_FORMAT=console for the services
        ("CONSOLE", False, "console"),
        ("", False, "json"),
    ],
)
def test_log_format(setting: str, interactive: bool, expected: str) -> None:
    assert resolve_log_format(setting, interactive=interactive) == expected
