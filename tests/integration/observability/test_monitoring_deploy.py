"""deploy/: the Grafana dashboard and the Prometheus rules speak about metrics the api exports.

A panel or an alert over a metric name the service does not export shows "No data" or never
fires -- nobody notices until the outage. So: scrape a running api and check every expression.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.api.support import Api

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "agent-engine.json"
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
METRIC_NAME = re.compile(r"\b(agent_engine_[a-z0-9_]+)\b")
# Series Prometheus itself provides; everything else must come from our /metrics.
PROMETHEUS_SERIES = frozenset({"up"})
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


async def exported_families(api: Api) -> dict[str, str]:
    """Family name → type, from a real scrape (after one GraphQL request, so the per-route
    HTTP series exist too)."""
    await api.http.post(f"{api.url}/graphql", json={"query": "{ __typename }"})
    response = await api.http.get(f"{api.url}/metrics")
    assert response.status_code == 200
    return {f.name: f.type for f in text_string_to_metric_families(response.text)}


def unknown_names(expression: str, families: dict[str, str]) -> list[str]:
    unknown = []
    for name in METRIC_NAME.findall(expression):
        if families.get(name) in ("gauge", "unknown", "summary"):
            continue
        if any(
            name.endswith(suffix) and families.get(name.removesuffix(suffix)) == kind
            for kind, suffixes in SUFFIXES.items()
            for suffix in suffixes
        ):
            continue
        unknown.append(name)
    return unknown


def dashboard_expressions() -> list[tuple[str, str]]:
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    found = []
    for panel in panels:
        for nested in [panel, *panel.get("panels", [])]:
            for target in nested.get("targets", []):
                found.append((nested["title"], target["expr"]))
    return found


def alert_rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load((PROMETHEUS_DIR / "alerts.yml").read_text())
    return [rule for group in rules["groups"] for rule in group["rules"]]


async def test_every_dashboard_panel_queries_metrics_the_api_exports(api: Api) -> None:
    families = await exported_families(api)
    expressions = dashboard_expressions()
    assert len(expressions) >= 15
    problems = {
        title: unknown for title, expr in expressions if (unknown := unknown_names(expr, families))
    }
    assert problems == {}
    for title, expr in expressions:
        assert METRIC_NAME.search(expr), f"{title}: names no agent_engine metric"


async def test_every_alert_rule_queries_metrics_the_api_exports(api: Api) -> None:
    families = await exported_families(api)
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} >= {
        "AgentEngineStaleRunsReaped",
        "AgentEngineQueuedRunsWaiting",
        "AgentEngineNoScheduleTick",
        "AgentEngineApi5xx",
    }
    for rule in rules:
        expr = rule["expr"]
        assert not unknown_names(expr, families), rule["alert"]
        names = set(METRIC_NAME.findall(expr)) | (
            PROMETHEUS_SERIES & set(re.findall(r"\b([a-z_]+)\{", expr))
        )
        assert names, f"{rule['alert']}: names no metric"
        assert rule["annotations"]["summary"] and rule["labels"]["severity"]


def test_the_dashboard_is_a_provisionable_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "agent-engine" and dashboard["title"]
    datasource_uids = {
        source["uid"] for source in yaml.safe_load(DATASOURCES.read_text())["datasources"]
    }
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] in datasource_uids, panel["title"]
            assert panel["targets"], panel["title"]


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool: `apt-get install prometheus` (Debian) to validate the rules")
    return promtool


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
        ["check", "config", "prometheus.yml"],
    ],
    ids=["check-rules", "test-rules", "check-config"],
)
def test_promtool_accepts_the_rules_and_their_tests(argv: list[str]) -> None:
    result = subprocess.run(
        [_promtool(), *argv],
        cwd=PROMETHEUS_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
