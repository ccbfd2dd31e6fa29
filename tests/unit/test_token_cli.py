"""`agent-engine token`: its default lifetime is within what the api accepts, and it says so
when asked for a longer one."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from typer.testing import CliRunner

from agent_engine.cli import app

SECRET = "a-32-byte-secret-for-the-cli-test!"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AGENT_ENGINE_JWT_MAX_LIFETIME_SECONDS", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENT_ENGINE_JWT_SECRET", SECRET)
    monkeypatch.setenv("AGENT_ENGINE_DATA_DIR", str(tmp_path))


def test_the_default_token_fits_the_default_limit() -> None:
    result = runner.invoke(app, ["token", "--user-id", "7", "--admin"])
    assert result.exit_code == 0, result.output
    claims = jwt.decode(result.stdout.strip(), SECRET, algorithms=["HS256"])
    assert claims["sub"] == "7" and claims["roles"] == ["agent_admin"]
    assert 11 * 3600 < claims["exp"] - time.time() <= 24 * 3600
    assert result.stderr == ""


def test_a_longer_token_is_printed_with_a_warning() -> None:
    result = runner.invoke(app, ["token", "--user-id", "7", "--ttl", "7d"])
    assert result.exit_code == 0
    assert jwt.decode(result.stdout.strip(), SECRET, algorithms=["HS256"])["sub"] == "7"
    assert "longer than the api accepts" in result.stderr
    assert "AGENT_ENGINE_JWT_MAX_LIFETIME_SECONDS" in result.stderr


def test_beside_run_the_limit_is_the_demos_unless_the_operator_set_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With the secret `agent-engine run` generated in the data dir, its api takes week-long
    tokens; with AGENT_ENGINE_JWT_MAX_LIFETIME_SECONDS set, `run` passes that on instead."""
    monkeypatch.delenv("AGENT_ENGINE_JWT_SECRET")
    (tmp_path / "jwt-secret").write_text(SECRET)
    week = runner.invoke(app, ["token", "--user-id", "7", "--ttl", "7d"])
    assert week.exit_code == 0, week.output
    assert jwt.decode(week.stdout.strip(), SECRET, algorithms=["HS256"])["sub"] == "7"
    assert week.stderr == ""
    monkeypatch.setenv("AGENT_ENGINE_JWT_MAX_LIFETIME_SECONDS", "3600")
    hours = runner.invoke(app, ["token", "--user-id", "7", "--ttl", "2h"])
    assert hours.exit_code == 0
    assert "longer than the api accepts (3600 s" in hours.stderr
