"""deploy/k8s renders with `kubectl kustomize` and every resource validates offline against the
Kubernetes API schemas (`kubernetes-validate --strict`); KEDA's resources, which those schemas do
not cover, are checked structurally against the fields of KEDA's published CRDs; and the
manifests keep the promises the README makes (probes, limits, non-root, drain, secrets)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_engine.settings import Settings
from agent_engine.workers.actors import RUNS_QUEUE
from agent_engine.workers.main import THREAD_JOIN_MARGIN_SECONDS

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
TARGETS = {"base": K8S, "example": K8S / "overlays" / "example"}
# A Kubernetes version kubernetes-validate ships strict schemas for (1.25 … 1.37 in 1.37.0).
KUBERNETES_VERSION = "1.33.0"
KEDA_KINDS = {"ScaledObject", "TriggerAuthentication"}
# Dramatiq's RedisBroker keeps a queue's pending message ids in the list `<namespace>:<queue>`,
# with the default namespace `dramatiq` (our broker sets none: workers/broker.py). The
# integration test tests/integration/runs/test_keda_queue_key.py checks it on a real Valkey.
RUNS_LIST = f"dramatiq:{RUNS_QUEUE}"


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (Debian package `kubectl`): cannot render deploy/k8s")
    return kubectl


def _render(target: Path) -> str:
    done = subprocess.run(
        [_kubectl(), "kustomize", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _resources(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@pytest.fixture(scope="module", params=sorted(TARGETS))
def rendered(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param, _render(TARGETS[request.param])


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    validator = Path(sys.executable).parent / "kubernetes-validate"
    if not validator.exists():
        pytest.skip("kubernetes-validate is not installed (the dev extra)")
    return subprocess.run(
        [str(validator), "--strict", "-k", KUBERNETES_VERSION, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_resource_validates_strictly(rendered: tuple[str, str], tmp_path: Path) -> None:
    name, text = rendered
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    done = _validate(path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    passed = [line for line in lines if line.startswith("INFO") and " passed " in line]
    kinds = {doc["kind"] for doc in _resources(text)}
    assert len(passed) == len(_resources(text)) - sum(
        doc["kind"] in KEDA_KINDS for doc in _resources(text)
    ), done.stdout
    # Only KEDA's kinds lack a schema there (they are checked below).
    for line in lines:
        if line.startswith("WARN"):
            assert any(f"kind {kind} " in line for kind in KEDA_KINDS), line
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"} <= kinds
    assert {"Job", "ConfigMap", *KEDA_KINDS} <= kinds


def test_the_validation_is_strict(tmp_path: Path) -> None:
    """A typo in a container is refused, so the test above can fail."""
    resources = _resources(_render(K8S))
    deployment = next(doc for doc in resources if doc["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(deployment))
    done = _validate(path)
    assert done.returncode != 0, done.stdout


def _by_kind(resources: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in resources if doc["kind"] == kind}


def _pod_specs(resources: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in resources:
        if doc["kind"] in ("Deployment", "Job"):
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def test_every_container_is_hardened_limited_and_configured(rendered: tuple[str, str]) -> None:
    resources = _resources(rendered[1])
    [configmap] = _by_kind(resources, "ConfigMap")
    for name, pod in _pod_specs(resources):
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
        for container in pod["containers"]:
            where = f"{name}/{container['name']}"
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["readOnlyRootFilesystem"] is True, where
            assert security["capabilities"]["drop"] == ["ALL"], where
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind]), where
            # A writable emptyDir only where written: /tmp.
            for mount in container.get("volumeMounts", []):
                assert "emptyDir" in volumes[mount["name"]], where
                assert mount["mountPath"] == "/tmp", where
            assert container["envFrom"] == [{"configMapRef": {"name": configmap}}], where
            for variable in container.get("env", []):
                # Secrets only by reference, never a literal value in a manifest.
                assert "value" not in variable, f"{where}: {variable['name']} is a literal"
                assert set(variable["valueFrom"]) == {"secretKeyRef"}, where


def test_the_api_is_probed_autoscaled_and_protected(rendered: tuple[str, str]) -> None:
    resources = _resources(rendered[1])
    api = _by_kind(resources, "Deployment")["agent-engine-api"]
    assert api["spec"]["replicas"] >= 2
    [container] = api["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    hpa = _by_kind(resources, "HorizontalPodAutoscaler")["agent-engine-api"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "agent-engine-api"
    assert hpa["spec"]["minReplicas"] >= 2
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    pdb = _by_kind(resources, "PodDisruptionBudget")["agent-engine-api"]
    assert pdb["spec"]["selector"]["matchLabels"] == api["spec"]["selector"]["matchLabels"]
    service = _by_kind(resources, "Service")["agent-engine-api"]
    assert service["spec"]["selector"] == api["spec"]["selector"]["matchLabels"]
    clock = _by_kind(resources, "Deployment")["agent-engine-clock"]
    assert clock["spec"]["replicas"] == 2


def test_the_worker_outlives_its_drain(rendered: tuple[str, str]) -> None:
    """SIGTERM: the worker drains for AGENT_ENGINE_WORKER_DRAIN_SECONDS (+ Dramatiq's thread
    joins); the kubelet must not SIGKILL it before."""
    resources = _resources(rendered[1])
    [configmap] = _by_kind(resources, "ConfigMap").values()
    drain = Settings.model_validate(
        {"worker_drain_seconds": configmap["data"]["AGENT_ENGINE_WORKER_DRAIN_SECONDS"]}
    ).worker_drain_seconds
    worker = _by_kind(resources, "Deployment")["agent-engine-worker"]
    grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > drain + 2 * THREAD_JOIN_MARGIN_SECONDS
    # KEDA owns the count.
    assert "replicas" not in worker["spec"]


# The fields of KEDA's published CRDs (keda.sh/v1alpha1, config/crd/bases/ of kedacore/keda)
# that a ScaledObject's and a TriggerAuthentication's spec may hold.
SCALED_OBJECT_SPEC = {
    "advanced",
    "cooldownPeriod",
    "fallback",
    "idleReplicaCount",
    "initialCooldownPeriod",
    "maxReplicaCount",
    "minReplicaCount",
    "pollingInterval",
    "scaleTargetRef",
    "triggers",
}
SCALE_TARGET_REF = {"apiVersion", "envSourceContainerName", "kind", "name"}
TRIGGER = {"authenticationRef", "metadata", "metricType", "name", "type", "useCachedMetrics"}
HPA_BEHAVIOR_RULE = {"policies", "selectPolicy", "stabilizationWindowSeconds"}
SECRET_TARGET_REF = {"parameter", "name", "key"}


def _is_int32(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


def test_keda_scales_the_workers_on_the_runs_queue(rendered: tuple[str, str]) -> None:
    resources = _resources(rendered[1])
    [scaled] = _by_kind(resources, "ScaledObject").values()
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert set(spec) <= SCALED_OBJECT_SPEC and {"scaleTargetRef", "triggers"} <= set(spec)
    assert set(spec["scaleTargetRef"]) <= SCALE_TARGET_REF
    workers = _by_kind(resources, "Deployment")
    assert spec["scaleTargetRef"]["name"] == "agent-engine-worker" in workers
    for field in ("pollingInterval", "cooldownPeriod", "minReplicaCount", "maxReplicaCount"):
        assert _is_int32(spec[field]), field
    # Never to zero (the workers also tick and deliver); a real range.
    assert 1 <= spec["minReplicaCount"] < spec["maxReplicaCount"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert set(behavior) <= {"scaleUp", "scaleDown"}
    for rule in behavior.values():
        assert set(rule) <= HPA_BEHAVIOR_RULE
        assert 0 <= rule["stabilizationWindowSeconds"] <= 3600
        for policy in rule["policies"]:
            assert policy["type"] in ("Pods", "Percent") and _is_int32(policy["value"])
            assert 0 < policy["periodSeconds"] <= 1800
    # The cooldown lets a burst's runs finish: no scale-down within a run's wall clock.
    run_timeout = Settings.model_fields["run_timeout_seconds"].default
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= run_timeout
    [trigger] = spec["triggers"]
    assert set(trigger) <= TRIGGER and trigger["type"] == "redis"
    metadata = trigger["metadata"]
    assert all(isinstance(value, str) for value in metadata.values())  # a map of strings
    assert metadata["listName"] == RUNS_LIST
    assert int(metadata["listLength"]) > 0
    auth = _by_kind(resources, "TriggerAuthentication")[trigger["authenticationRef"]["name"]]
    assert auth["apiVersion"] == "keda.sh/v1alpha1"
    assert set(auth["spec"]) == {"secretTargetRef"}
    secrets_of_pods = {
        variable["valueFrom"]["secretKeyRef"]["name"]
        for _, pod in _pod_specs(resources)
        for container in pod["containers"]
        for variable in container.get("env", [])
    }
    for ref in auth["spec"]["secretTargetRef"]:
        assert set(ref) == SECRET_TARGET_REF
        assert ref["parameter"] in ("address", "password", "host", "port", "username")
        assert ref["name"] in secrets_of_pods  # the pods' Secret, no second one


def test_the_example_overlay_sets_image_replicas_and_a_websocket_ingress() -> None:
    resources = _resources(_render(TARGETS["example"]))
    images = {
        container["image"] for _, pod in _pod_specs(resources) for container in pod["containers"]
    }
    [image] = images
    assert image.rsplit(":", 1)[1] == "0.1.0"
    assert _by_kind(resources, "Deployment")["agent-engine-api"]["spec"]["replicas"] == 3
    [scaled] = _by_kind(resources, "ScaledObject").values()
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (2, 30)
    [ingress] = _by_kind(resources, "Ingress").values()
    annotations = ingress["metadata"]["annotations"]
    for name in ("proxy-read-timeout", "proxy-send-timeout"):
        assert int(annotations[f"nginx.ingress.kubernetes.io/{name}"]) >= 3600
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] in _by_kind(resources, "Service")
    assert all(doc["metadata"].get("namespace") == "agent-engine" for doc in resources)
