"""The benchmark runner answers `--help` (the benchmarks themselves never run in the suite)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_help_lists_the_scenarios() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "--quick" in done.stdout
    assert "scheduler_tick" in done.stdout
