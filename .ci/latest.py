"""`make test-latest`: the suite on the newest releases pyproject.toml allows, then each bounded
library moved one release past its bound, printing what breaks.

Run inside .venv-latest (the Makefile makes it). The first pass must be green (exit 1 otherwise):
the bounds promise it. The second pass only reports: a library failing past its bound keeps its
bound; one passing may have it raised (then `make lock-upgrade`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version

from packaging.requirements import Requirement
from packaging.version import Version

# The libraries whose internals we build on (api/execution.py, api/compiled.py, workers/,
# tool_sources/): their upper bounds in pyproject.toml are deliberate.
BOUNDED = ["strawberry-graphql", "graphql-core", "dramatiq", "mcp"]
# Past a bound: the tests that exercise those internals, not the whole suite.
PAST_BOUND_TESTS = [
    "tests/unit",
    "tests/integration/api",
    "tests/integration/tool_sources",
    "-m",
    "not slow",
]


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False
    )


def _pytest(*args: str) -> bool:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *args]
    env = {**os.environ, "AGENT_ENGINE_UNLOCKED": "1"}
    return subprocess.run(cmd, check=False, env=env).returncode == 0


def _upper_bound(name: str) -> Version | None:
    import tomllib

    with open("pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    for dep in deps:
        req = Requirement(dep)
        if req.name == name:
            for spec in req.specifier:
                if spec.operator == "<":
                    return Version(spec.version)
    return None


def _first_release_past(name: str, bound: Version) -> Version | None:
    out = _pip("index", "versions", name).stdout
    match = re.search(r"Available versions: (.*)", out)
    if not match:
        return None
    past = [Version(v.strip()) for v in match.group(1).split(",")]
    past = [v for v in past if v >= bound and not v.is_prerelease]
    return min(past) if past else None


def main() -> int:
    print("== newest releases within the bounds ==")
    for name in BOUNDED:
        print(f"  {name} {version(name)}")
    within_ok = _pytest("-m", "not slow")
    print(f"within the bounds: {'passed' if within_ok else 'FAILED'}")

    results: list[tuple[str, str, str]] = []
    for name in BOUNDED:
        bound = _upper_bound(name)
        before = version(name)
        nxt = _first_release_past(name, bound) if bound else None
        if nxt is None:
            results.append((name, "-", "no release past the bound yet"))
            continue
        install = _pip("install", "--quiet", f"{name}=={nxt}")
        if install.returncode != 0:
            results.append(
                (
                    name,
                    str(nxt),
                    "does not install beside the rest: "
                    + install.stderr.strip().splitlines()[-1][:200],
                )
            )
        else:
            ok = _pytest(*PAST_BOUND_TESTS)
            results.append((name, str(nxt), "passes" if ok else "BREAKS (see the output above)"))
        _pip("install", "--quiet", f"{name}=={before}")
    print("== one release past each bound ==")
    for name, nxt, outcome in results:
        print(f"  {name} {nxt}: {outcome}")
    return 0 if within_ok else 1


if __name__ == "__main__":
    sys.exit(main())
