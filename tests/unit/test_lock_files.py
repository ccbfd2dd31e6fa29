"""The environment the suite runs in is exactly the lock file (make/CI install from it), and the
lock files agree with pyproject.toml's bounds."""

from __future__ import annotations

import os
import re
import tomllib
from importlib.metadata import distributions
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")
# Installed by venv/pip themselves, or the project (installed --no-deps from the tree).
NOT_LOCKED = {"pip", "setuptools", "wheel", "agent-engine"}


def _pins(name: str) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements" / name).read_text().splitlines():
        match = PIN.match(line)
        if not match:
            continue
        package, pinned, marker = match.groups()
        if marker and not Marker(marker).evaluate():
            continue
        pins[canonicalize_name(package)] = Version(pinned)
    return pins


def test_every_dependency_of_pyproject_is_locked_within_its_bounds() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for lock, extras in (("app.txt", []), ("dev.txt", ["dev", "embedded", "docs"])):
        pins = _pins(lock)
        wanted = list(project["dependencies"])
        for extra in extras:
            wanted += project["optional-dependencies"][extra]
        for spec in wanted:
            req = Requirement(spec)
            if req.marker and not req.marker.evaluate():
                continue
            name = canonicalize_name(req.name)
            assert name in pins, f"{req.name} is not in requirements/{lock}: run `make lock`"
            assert pins[name] in req.specifier, (
                f"requirements/{lock} pins {req.name} {pins[name]}, outside {req.specifier}"
            )


@pytest.mark.skipif(
    os.environ.get("AGENT_ENGINE_UNLOCKED") == "1",
    reason="make test-latest runs unlocked on purpose",
)
def test_installed_versions_are_exactly_the_lock() -> None:
    pins = _pins("dev.txt")
    installed = {canonicalize_name(d.metadata["Name"]): Version(d.version) for d in distributions()}
    differ = {
        name: (str(pins[name]), str(version))
        for name, version in installed.items()
        if name in pins and pins[name] != version
    }
    missing = sorted(set(pins) - set(installed))
    extra = sorted(set(installed) - set(pins) - NOT_LOCKED)
    assert not differ, f"installed versions differ from requirements/dev.txt: {differ}"
    assert not missing, f"locked but not installed: {missing}"
    assert not extra, f"installed but not locked (pip freeze must equal the lock): {extra}"
