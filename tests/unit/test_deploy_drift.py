"""The deployment files name only what exists: every `agent-engine` command line in deploy/k8s,
docker-compose.yml and the Dockerfile parses with the real CLI, and every `AGENT_ENGINE_*`
variable (and every variable a manifest sets) anywhere in deploy/, the compose file and the
Dockerfile is a setting. A renamed flag or setting fails here, not in a cluster."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from pydantic import AliasChoices

from agent_engine.cli import app
from agent_engine.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_FILES = sorted(
    [
        *(p for p in (ROOT / "deploy").rglob("*") if p.is_file()),
        ROOT / "docker-compose.yml",
        ROOT / "Dockerfile",
    ]
)
VARIABLE = re.compile(r"\bAGENT_ENGINE_[A-Z0-9_]+\b")
# Read by the test suite and .ci/run, not by the service.
NOT_SETTINGS = {"AGENT_ENGINE_TEST_ARTIFACTS"}


def setting_names() -> set[str]:
    """Every environment name Settings reads."""
    prefix = str(Settings.model_config.get("env_prefix", ""))
    names: set[str] = set()
    for field_name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names |= {str(choice) for choice in alias.choices}
        elif isinstance(alias, str):
            names.add(alias)
        else:
            names.add(prefix.upper() + field_name.upper())
    return names


def unknown_variables(text: str) -> set[str]:
    return set(VARIABLE.findall(text)) - setting_names() - NOT_SETTINGS


class CommandLineError(Exception):
    pass


def check_command_line(argv: list[str]) -> None:
    """Parse `agent-engine ARGV` with the real CLI (subcommands, options, values) without running
    it; raise CommandLineError for an unknown command or option or a bad value. (Typer ships its
    own copy of click, so this goes by the commands' methods, not click's classes.)"""
    command: Any = typer.main.get_command(app)
    # A bare context per group: `make_context(..., resilient_parsing=True)` would be inherited by
    # the command's context, which then ignores unknown options.
    ctx = typer.Context(command, info_name="agent-engine")
    rest = list(argv)
    while hasattr(command, "get_command"):  # a group: the next word is a subcommand
        name = rest.pop(0) if rest else ""
        found = command.get_command(ctx, name)
        if found is None:
            raise CommandLineError(f"no such command: {name!r}")
        command = found
        if hasattr(command, "get_command"):
            ctx = typer.Context(command, info_name=name, parent=ctx)
    try:
        command.make_context(command.name or "", rest, parent=ctx)
    except Exception as exc:  # click's UsageError family, from Typer's copy of click
        raise CommandLineError(f"agent-engine {' '.join(argv)}: {exc}") from exc


def _k8s_containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted((ROOT / "deploy" / "k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") not in ("Deployment", "Job", "StatefulSet", "CronJob"):
                continue
            template = doc["spec"].get("jobTemplate", {}).get("spec", doc["spec"])["template"]
            for container in template["spec"]["containers"]:
                yield f"{path.relative_to(ROOT)}:{doc['metadata']['name']}", container


def _command_lines() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for where, container in _k8s_containers():
        if container["image"].split(":")[0].endswith("agent-engine"):
            assert "command" not in container, f"{where}: use the image's entrypoint"
            found.append((where, [str(arg) for arg in container["args"]]))
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        if (service.get("build") or str(service.get("image", "")).startswith("agent-engine")) and (
            "command" in service
        ):
            found.append((f"docker-compose.yml:{name}", service["command"]))
    cmd = re.search(r"^CMD (\[.*\])", (ROOT / "Dockerfile").read_text(), re.M)
    assert cmd
    found.append(("Dockerfile:CMD", yaml.safe_load(cmd.group(1))))
    return found


def test_the_manifests_run_every_role() -> None:
    roles = {argv[0] for where, argv in _command_lines() if where.startswith("deploy/k8s")}
    assert roles == {"serve", "worker", "clock", "migrate"}


@pytest.mark.parametrize(("where", "argv"), _command_lines(), ids=lambda v: str(v))
def test_every_command_line_parses_with_the_cli(where: str, argv: list[str]) -> None:
    check_command_line(argv)


@pytest.mark.parametrize("path", DEPLOY_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_agent_engine_variable_is_a_setting(path: Path) -> None:
    assert unknown_variables(path.read_text(errors="replace")) == set()


def test_every_variable_a_manifest_sets_is_a_setting() -> None:
    names = setting_names()
    for where, container in _k8s_containers():
        for variable in container.get("env", []):
            assert variable["name"] in names, f"{where}: {variable['name']}"
    kustomization = yaml.safe_load((ROOT / "deploy/k8s/base/kustomization.yaml").read_text())
    for generator in kustomization["configMapGenerator"]:
        for literal in generator["literals"]:
            name, _value = literal.split("=", 1)
            assert name in names, f"ConfigMap {generator['name']}: {name}"
    # And the values load: a ConfigMap Settings would refuse fails here.
    literals = dict(
        literal.split("=", 1)
        for generator in kustomization["configMapGenerator"]
        for literal in generator["literals"]
    )
    Settings.model_validate(
        {k.removeprefix("AGENT_ENGINE_").lower(): v for k, v in literals.items()}
    )


def test_the_checks_catch_drift() -> None:
    """The two checks above can fail: a renamed setting, command or option is reported."""
    assert unknown_variables("AGENT_ENGINE_WORKER_DRAIN_SECONDZ: 60") == {
        "AGENT_ENGINE_WORKER_DRAIN_SECONDZ"
    }
    assert unknown_variables("AGENT_ENGINE_RUNS_IN_FLIGHT=200 DATABASE_URL=x") == set()
    with pytest.raises(CommandLineError):
        check_command_line(["serve", "--no-such-option", "1"])
    with pytest.raises(CommandLineError):
        check_command_line(["serve-api"])
    with pytest.raises(CommandLineError):
        check_command_line(["webhook", "listen", "--portt", "9000"])
    check_command_line(["webhook", "listen", "--port", "9000"])
    check_command_line(["worker", "--processes", "1", "--threads", "8"])


def test_the_worker_commands_default_threads_are_the_workers() -> None:
    import typer.main

    from agent_engine.cli import app
    from agent_engine.workers.main import DEFAULT_THREADS

    command = typer.main.get_command(app)
    worker = command.commands["worker"]  # type: ignore[attr-defined]
    threads = next(p for p in worker.params if p.name == "threads")
    assert threads.default == DEFAULT_THREADS
