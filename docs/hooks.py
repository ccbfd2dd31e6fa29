"""MkDocs hooks: the parts of the docs that are generated, so they cannot drift from the code.

- `<!-- settings-table … -->`: one row per field of `agent_engine.settings.Settings` (its variable
  names, default and description), with the longer note from `operations/settings-notes.yml`
  where there is one. A note for a variable settings.py does not have fails the build.
- `<!-- graphql-sdl -->`: the exported schema, `schema/schema.graphql`.
- `<!-- bench-table -->`: the rows of the committed benchmark run, `docs/benchmarks/latest.json`
  (written by `python -m bench --quick --json docs/benchmarks/latest.json`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from mkdocs.exceptions import PluginError
from pydantic import AliasChoices

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _variables(name: str, field: Any) -> list[str]:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    return [f"AGENT_ENGINE_{name.upper()}"]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def settings_table() -> str:
    from agent_engine.settings import Settings

    notes: dict[str, dict[str, Any]] = yaml.safe_load(
        (DOCS / "operations" / "settings-notes.yml").read_text()
    )
    known: set[str] = set()
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        variables = _variables(name, field)
        known.update(variables)
        note = next((notes[v] for v in variables if v in notes), None)
        if note is None and not field.description:
            raise PluginError(f"settings.py: {variables[0]} has no description")
        if note is not None:
            label = note["label"]
            default = note["default"]
            meaning = note["meaning"]
        else:
            label = f"`{variables[0]}`"
            default = "unset" if field.default is None else f"`{field.default}`"
            meaning = str(field.description)
        if label in rows[-1]:  # a note that names two settings (e.g. the audience and issuer)
            continue
        rows.append(f"| {label} | {_cell(str(default))} | {_cell(str(meaning))} |")
    for variable, note in notes.items():
        stray = [v for v in note["names"] if v not in known]
        if stray:
            raise PluginError(f"settings-notes.yml: {variable} names {stray}, not in settings.py")
    return "\n".join(rows) + "\n"


def graphql_sdl() -> str:
    sdl = (ROOT / "schema" / "schema.graphql").read_text()
    return "```graphql\n" + sdl + "```\n"


def bench_table() -> str:
    path = DOCS / "benchmarks" / "latest.json"
    if not path.exists():
        missing = path.relative_to(ROOT)
        raise PluginError(f"{missing} is missing: run the quick benchmark with --json")
    report = json.loads(path.read_text())
    meta = report.get("meta", {})
    out = [
        f"Run of {str(meta.get('started_at', '?'))[:10]} (`{meta.get('command', '?')}`), "
        f"{meta.get('mode', '?')} mode, {meta.get('cpus', '?')} CPUs ({path.relative_to(ROOT)}).",
        "",
        "| scenario | row | value | baseline | ratio | target | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario in report["scenarios"]:
        if scenario.get("error"):
            error = _cell(scenario["error"])
            out.append(f"| {scenario['name']} | **failed**: {error} | | | | | ✗ |")
        for row in scenario["rows"]:
            value = row["value"]
            shown = f"{value:,.2f}" if isinstance(value, float) else str(value)
            baseline = row.get("baseline")
            label = _cell(row.get("baseline_label") or "")
            base = "" if baseline is None else f"{baseline:,.2f} ({label})"
            ratio = "" if row.get("ratio") is None else f"{row['ratio']:.2f}"
            ok = {True: "✓", False: "✗"}.get(row.get("ok"), "")
            out.append(
                f"| {scenario['name']} | {_cell(row['metric'])} | {shown} {row.get('unit') or ''} "
                f"| {base} | {ratio} | {_cell(str(row.get('target') or ''))} | {ok} |"
            )
    return "\n".join(out) + "\n"


MARKERS = {
    "<!-- settings-table": settings_table,
    "<!-- graphql-sdl -->": graphql_sdl,
    "<!-- bench-table -->": bench_table,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    lines = []
    for line in markdown.splitlines(keepends=True):
        maker = next((make for marker, make in MARKERS.items() if line.startswith(marker)), None)
        lines.append(maker() if maker else line)
    return "".join(lines)
