"""docker-compose.yml runs every role with commands the CLI has, ships no JWT secret, and its
monitoring profile mounts what deploy/ has. (tests/unit/test_deploy_drift.py parses the same
command lines strictly, for the manifests and the Dockerfile alike.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main
import yaml

from agent_engine.cli import app

ROOT = Path(__file__).resolve().parents[2]


def _compose_commands() -> dict[str, list[str]]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    dockerfile = (ROOT / "Dockerfile").read_text()
    entrypoint = re.search(r'^ENTRYPOINT \["([^"]+)"\]', dockerfile, re.M)
    default_cmd = re.search(r"^CMD (\[.*\])", dockerfile, re.M)
    assert entrypoint and entrypoint.group(1) == "agent-engine"
    assert default_cmd
    commands = {"(image default)": yaml.safe_load(default_cmd.group(1))}
    for name, service in compose["services"].items():
        uses_our_image = service.get("build") or service.get("image", "").startswith("agent-engine")
        if uses_our_image and "command" in service:
            commands[name] = service["command"]
    return commands


def test_compose_has_every_role() -> None:
    commands = _compose_commands()
    assert {"migrate", "api", "worker", "clock"} <= set(commands)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert {"postgres", "redis"} <= set(compose["services"])


@pytest.mark.parametrize(("service", "argv"), sorted(_compose_commands().items()))
def test_compose_command_exists_in_the_cli(service: str, argv: list[str]) -> None:
    root = typer.main.get_command(app)
    with root.make_context("agent-engine", [argv[0], "--help"], resilient_parsing=True) as ctx:
        command = root.get_command(ctx, argv[0])  # type: ignore[attr-defined]
        assert command is not None, f"{service}: `agent-engine {argv[0]}` does not exist"
        # Parsing validates every option and argument without running the command.
        command.make_context(argv[0], list(argv[1:]), parent=ctx)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["serve"], {}, "DATABASE_URL is not set"),
        (["serve"], {"DATABASE_URL": "postgresql://x@h/db"}, "no token verification key"),
        (
            ["serve"],
            {"DATABASE_URL": "postgresql://x@h/db", "AGENT_ENGINE_JWT_SECRET": "change-me"},
            "AGENT_ENGINE_JWT_SECRET is 9 bytes long: it must be at least 32 bytes",
        ),
        (
            ["run"],
            {"AGENT_ENGINE_JWT_SECRET": "x" * 31},
            "AGENT_ENGINE_JWT_SECRET is 31 bytes long: it must be at least 32 bytes",
        ),
        (
            ["serve"],
            {"DATABASE_URL": "postgresql://x@h/db", "AGENT_ENGINE_JWT_JWKS_URL": "https://idp/k"},
            "AGENT_ENGINE_JWT_AUDIENCE is not set",
        ),
        (["run"], {"AGENT_ENGINE_JWT_JWKS_URL": "https://idp/k"}, "AGENT_ENGINE_JWT_AUDIENCE"),
        (["worker"], {}, "DATABASE_URL is not set"),
        (["worker"], {"DATABASE_URL": "postgresql://x@h/db"}, "no broker"),
        (["clock"], {}, "no broker"),
    ],
)
def test_production_commands_refuse_to_start_without_their_configuration(
    argv: list[str], env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    for name in (
        "DATABASE_URL",
        "REDIS_URL",
        "BROKER_URL",
        "AGENT_ENGINE_JWT_SECRET",
        "AGENT_ENGINE_JWT_PUBLIC_KEY",
        "AGENT_ENGINE_JWT_PUBLIC_KEY_FILE",
        "AGENT_ENGINE_JWT_JWKS_URL",
        "AGENT_ENGINE_JWT_AUDIENCE",
    ):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, argv, env=env)
    assert result.exit_code == 2
    assert message in result.output


def test_compose_ships_no_jwt_secret() -> None:
    """Anyone who read the repository could sign an admin token for a default deployment:
    compose refuses to start until the operator sets a secret."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    # The services, and the `x-` blocks they merge in (the engine's shared environment).
    blocks = [*compose["services"].values()]
    blocks += [block for key, block in compose.items() if key.startswith("x-")]
    values = [
        block["environment"]["AGENT_ENGINE_JWT_SECRET"]
        for block in blocks
        if isinstance(block.get("environment"), dict)
        and "AGENT_ENGINE_JWT_SECRET" in block["environment"]
    ]
    assert values, "no service sets AGENT_ENGINE_JWT_SECRET"
    text = (ROOT / "docker-compose.yml").read_text()
    assert "${AGENT_ENGINE_JWT_SECRET:?" in text
    assert "AGENT_ENGINE_JWT_SECRET:-" not in text
    for value in values:
        assert value.startswith("${AGENT_ENGINE_JWT_SECRET:?"), value


def test_the_monitoring_profile_provisions_prometheus_and_grafana_from_deploy() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"], name
        for volume in services[name]["volumes"]:
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
    # The default `docker compose up` stays the four engine roles and their servers.
    assert all("profiles" not in services[n] for n in ("api", "worker", "clock", "migrate"))
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    [job] = prometheus["scrape_configs"]
    assert job["dns_sd_configs"][0]["names"] == ["api"]
    assert job["dns_sd_configs"][0]["port"] == 8000
    assert prometheus["rule_files"] == ["alerts.yml"]
