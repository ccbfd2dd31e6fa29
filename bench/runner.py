"""Runs the scenarios on embedded (or given) servers and reports them."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import platform
import shlex
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from rich.console import Console
from rich.table import Table

from agent_engine.db.migrate import upgrade
from agent_engine.embedded import EmbeddedServers
from agent_engine.settings import to_libpq_url
from bench.common import Bench, ScenarioResult, fmt

RESULTS_DIR = Path(__file__).parent / "results"
TEMPLATE = "bench_template"

console = Console(width=160)


def run(*, quick: bool, only: tuple[str, ...], json_path: str | None, ceilings: bool) -> int:
    logging.basicConfig(level=logging.WARNING)
    # Alembic configures its own loggers at INFO; benchmarks only want warnings.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    work_dir = Path(tempfile.mkdtemp(prefix="agent-engine-bench-"))
    database_url = os.environ.get("DATABASE_URL")
    redis_url = os.environ.get("REDIS_URL")
    started = time.monotonic()
    mode = "quick" if quick else "full"
    console.print(f"[bold]Agent Engine benchmarks[/] — {mode} mode, scenarios: {', '.join(only)}")
    with EmbeddedServers(
        work_dir / "servers", database_url=database_url, redis_url=redis_url, ephemeral=True
    ) as servers:
        admin_url = to_libpq_url(servers.database_url)
        asyncio.run(_recreate(admin_url, TEMPLATE))
        template_url = admin_url.rsplit("/", 1)[0] + "/" + TEMPLATE
        upgrade(template_url)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        bench = Bench(
            admin_url=admin_url,
            redis_base_url=servers.redis_url,
            template=TEMPLATE,
            work_dir=work_dir,
            quick=quick,
        )
        console.print(f"servers ready in {time.monotonic() - started:.1f}s")
        report = asyncio.run(_run_all(bench, only, ceilings))
        asyncio.run(_cleanup(bench))
    report["meta"] = _meta(mode, only, time.monotonic() - started, admin_url)
    _print(report)
    path = Path(json_path) if json_path else RESULTS_DIR / f"{mode}-{_stamp()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    console.print(f"results: {path} ({report['meta']['seconds']:.0f}s in all)")
    failed = [s for s in report["scenarios"] if s["error"]]
    return 1 if failed else 0


async def _recreate(admin_url: str, name: str) -> None:
    conn = await asyncpg.connect(admin_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def _cleanup(bench: Bench) -> None:
    for name in bench.databases:
        try:
            await bench.drop_database(bench.database_url(name))
        except Exception:  # the servers are thrown away next anyway
            logging.getLogger(__name__).debug("could not drop %s", name, exc_info=True)


async def _run_all(bench: Bench, only: tuple[str, ...], ceilings: bool) -> dict[str, Any]:
    report: dict[str, Any] = {"ceilings": {}, "ceiling_rows": [], "scenarios": []}
    if ceilings:
        from bench.ceilings import measure

        console.print("measuring ceilings …")
        rows, values = await measure(bench)
        report["ceilings"] = values
        report["ceiling_rows"] = [r.as_json() for r in rows]
        bench.ceilings = values
    for name in only:
        module = importlib.import_module(f"bench.{name}")
        console.print(f"[bold]{name}[/]: {module.TITLE} …")
        started = time.monotonic()
        try:
            result: ScenarioResult = await module.run(bench)
        except Exception as exc:
            result = ScenarioResult(name, module.TITLE)
            result.error = f"{type(exc).__name__}: {exc}"
            result.details["traceback"] = traceback.format_exc()
            console.print(f"[red]{name} failed[/]: {result.error}")
        result.seconds = time.monotonic() - started
        console.print(f"  done in {result.seconds:.1f}s")
        report["scenarios"].append(
            {
                "name": result.name,
                "title": result.title,
                "seconds": result.seconds,
                "error": result.error,
                "rows": [r.as_json() for r in result.rows],
                "details": result.details,
            }
        )
    return report


def _print(report: dict[str, Any]) -> None:
    if report["ceiling_rows"]:
        table = Table(title="Ceilings (this machine, this run)", title_justify="left")
        table.add_column("Ceiling")
        table.add_column("Value", justify="right")
        table.add_column("Unit")
        table.add_column("Note")
        for row in report["ceiling_rows"]:
            table.add_row(row["metric"], fmt(row["value"]), row["unit"], row["note"])
        console.print(table)
    table = Table(
        title="Results (ratio = value ÷ baseline measured in the same run)", title_justify="left"
    )
    for column, justify in (
        ("Scenario", "left"),
        ("Metric", "left"),
        ("Value", "right"),
        ("Unit", "left"),
        ("Baseline", "right"),
        ("Ratio", "right"),
        ("Target", "left"),
        ("OK", "center"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for scenario in report["scenarios"]:
        if scenario["error"]:
            table.add_row(scenario["name"], "[red]error[/]", "", "", "", "", scenario["error"], "✗")
        for index, row in enumerate(scenario["rows"]):
            ok = {True: "[green]✓[/]", False: "[red]✗[/]", None: ""}[row["ok"]]
            baseline = fmt(row["baseline"]) if row["baseline"] is not None else ""
            if row["baseline_label"] and baseline:
                baseline = f"{baseline} ({row['baseline_label']})"
            table.add_row(
                scenario["name"] if index == 0 else "",
                row["metric"],
                fmt(row["value"], 2),
                row["unit"],
                baseline,
                fmt(row["ratio"], 2) if row["ratio"] is not None else "",
                row["target"],
                ok,
            )
        table.add_section()
    console.print(table)
    notes = [
        (s["name"], r["metric"], r["note"])
        for s in report["scenarios"]
        for r in s["rows"]
        if r["note"]
    ]
    for name, metric, note in notes:
        console.print(f"  [dim]{name} · {metric}: {note}[/]")


def _meta(mode: str, only: tuple[str, ...], seconds: float, admin_url: str) -> dict[str, Any]:
    return {
        "mode": mode,
        "scenarios": list(only),
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, "-m", "bench"])
        + (" " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""),
        "started_at": datetime.now(UTC).isoformat(),
        "seconds": seconds,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "database": "embedded (fsync=off, synchronous_commit=off)"
        if not os.environ.get("DATABASE_URL")
        else "DATABASE_URL",
    }


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
