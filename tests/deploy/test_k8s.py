"""deploy/k8s: every manifest validates against the Kubernetes JSON schemas (kubernetes-validate
ships them, so this runs offline), and the pieces fit together and fit the service."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import jsonschema
import pytest
import yaml

from tests.deploy import prometheus_adapter
from tests.deploy.parsing import (
    ROOT,
    drain_seconds,
    parse_dockerfile,
    route_paths,
    settings_fields,
    settings_from,
)

kubernetes_validate = pytest.importorskip("kubernetes_validate")  # the `test` extra installs it

K8S = ROOT / "deploy" / "k8s"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def schema_versions() -> list[str]:
    """The oldest and the newest Kubernetes release whose schemas the package ships."""
    import importlib.resources

    root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    found = sorted(
        {m[1] for p in root.iterdir() if (m := re.fullmatch(r"v(\d+\.\d+\.\d+)-local", p.name))},
        key=lambda v: tuple(map(int, v.split("."))),
    )
    return [found[0], found[-1]]


@pytest.fixture(scope="module")
def docs() -> dict[tuple[str, str], dict]:
    out = {}
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


@pytest.mark.parametrize("version", schema_versions())
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schema(path: Path, version: str):
    docs = list(yaml.safe_load_all(path.read_text()))
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # strict: unknown fields are errors too


def test_validator_catches_a_wrong_field():
    doc = yaml.safe_load((K8S / "deployment.yaml").read_text())
    doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paths"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, schema_versions()[-1], strict=True)


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in MANIFESTS]
    (image,) = kustomization["images"]
    container = yaml.safe_load((K8S / "deployment.yaml").read_text())["spec"]["template"]["spec"]["containers"][0]
    assert image["name"] == container["image"] and image["newTag"] == "gpu" in parse_dockerfile().names


def api_container(docs) -> dict:
    (container,) = docs[("Deployment", "attnserve")]["spec"]["template"]["spec"]["containers"]
    return container


def test_settings_come_from_the_configmap_and_are_real_settings(docs, monkeypatch):
    container = api_container(docs)
    (source,) = container["envFrom"]
    config = docs[("ConfigMap", source["configMapRef"]["name"])]["data"]
    names = {k.removeprefix("ATTNSERVE_").lower() for k in config}
    assert all(k.startswith("ATTNSERVE_") for k in config)
    unknown = names - settings_fields()
    assert not unknown, f"not fields of service.settings.Settings (the service would refuse to start): {unknown}"
    settings = settings_from(config, monkeypatch)
    assert settings.host == "0.0.0.0" and settings.require_gpu and settings.execution_provider == "cuda"
    assert [p["containerPort"] for p in container["ports"]] == [settings.port, settings.grpc_port]
    # several replicas share attention ids through Redis, reached by its Service name
    assert settings.attention_store == "redis"
    url = urlparse(settings.redis_url)
    redis_service = docs[("Service", url.hostname)]
    assert url.port in [p["port"] for p in redis_service["spec"]["ports"]]
    assert str(settings.model_repository) == parse_dockerfile().stage("gpu").env()["ATTNSERVE_MODEL_REPOSITORY"]


def test_probes_point_at_real_routes(docs):
    container = api_container(docs)
    routes = route_paths()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in routes and get["port"] in ports


def test_gpu_resources_and_limits(docs):
    resources = api_container(docs)["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert resources["requests"].get("nvidia.com/gpu", 1) == resources["limits"]["nvidia.com/gpu"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]


def test_termination_waits_for_the_drain(docs, monkeypatch):
    """The grace period covers the preStop sleep, the service's drain delay and its drain, and a margin;
    the sleep and the delay together give kube-proxy and ingresses 10 s to stop sending to the pod."""
    pod = docs[("Deployment", "attnserve")]["spec"]["template"]["spec"]
    sleep = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    (source,) = pod["containers"][0]["envFrom"]
    settings = settings_from(docs[("ConfigMap", source["configMapRef"]["name"])]["data"], monkeypatch)
    assert pod["terminationGracePeriodSeconds"] >= float(sleep[1]) + drain_seconds(settings) + 5
    assert float(sleep[1]) + settings.drain_delay_s >= 10


def test_runs_as_the_image_user(docs):
    pod = docs[("Deployment", "attnserve")]["spec"]["template"]["spec"]
    image_user = parse_dockerfile().stage("gpu").all("USER")[-1].args
    assert pod["securityContext"]["runAsNonRoot"] and str(pod["securityContext"]["runAsUser"]) == image_user


def test_service_hpa_and_pdb_select_the_api_pods(docs):
    deployment = docs[("Deployment", "attnserve")]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = docs[("Service", "attnserve")]
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"] for p in api_container(docs)["ports"]}
    assert all(p["targetPort"] in ports for p in service["spec"]["ports"])
    pdb = docs[("PodDisruptionBudget", "attnserve")]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = docs[("HorizontalPodAutoscaler", "attnserve")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "attnserve"}
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    # a utilisation target is a share of the request: the container must request what is measured
    for metric in hpa["metrics"]:
        if metric["type"] == "Resource":
            assert metric["resource"]["name"] in api_container(docs)["resources"]["requests"]


def test_disruptions_take_one_pod_at_a_time_and_never_block(docs):
    """A drain evicts API pods one by one at any replica count, and can always evict one, even at the
    autoscaler's minimum (a budget that allows none blocks node drains for good)."""
    budget = docs[("PodDisruptionBudget", "attnserve")]["spec"]
    minimum = docs[("HorizontalPodAutoscaler", "attnserve")]["spec"]["minReplicas"]
    assert budget.get("maxUnavailable") == 1 and "minAvailable" not in budget
    assert budget["maxUnavailable"] < minimum  # at the minimum, one pod still serves while another leaves


def quantity(value: str | int) -> float:
    """A Kubernetes quantity as a number: ``100m`` is 0.1."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(m|k|M|G)?", str(value))
    assert m, f"not a quantity: {value!r}"
    return float(m[1]) * {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}[m[2]]


@pytest.fixture(scope="module")
def adapter_config(docs) -> dict:
    return yaml.safe_load(docs[("ConfigMap", "attnserve-prometheus-adapter")]["data"]["config.yaml"])


def test_adapter_rules_are_what_prometheus_adapter_reads(adapter_config):
    """The adapter's strict reading of its config.yaml, as a schema: a misspelt field fails here, as it
    would fail the adapter's start."""
    jsonschema.validate(adapter_config, prometheus_adapter.CONFIG)
    broken = {"rules": [{**adapter_config["rules"][0], "metricQuery": "up"}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, prometheus_adapter.CONFIG)


def test_hpa_scales_on_the_queue_time_the_adapter_serves(docs, adapter_config, monkeypatch):
    """The autoscaler's Pods metric is the one the adapter's rule names, made per pod from a histogram the
    service exports, with a target above the wait that batching alone adds."""
    from service.metrics import Metrics

    (pods,) = [
        m["pods"] for m in docs[("HorizontalPodAutoscaler", "attnserve")]["spec"]["metrics"] if m["type"] == "Pods"
    ]
    (rule,) = [r for r in adapter_config["rules"] if r["name"]["as"] == pods["metric"]["name"]]
    assert re.search(rule["name"]["matches"], rule["seriesQuery"].split("{")[0])
    # per pod: the pod label is the pod resource, the namespace label its namespace
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "by (<<.GroupBy>>)" in rule["metricsQuery"]
    histograms = {m.name for m in Metrics().registry.collect() if m.type == "histogram"}
    named = set(re.findall(r"\b(attnserve_\w+?)_(?:sum|count|bucket)\b", rule["seriesQuery"] + rule["metricsQuery"]))
    assert named == {"attnserve_queue_wait_seconds"} <= histograms, named
    assert pods["target"]["type"] == "AverageValue"
    batching_wait = settings_from({}, monkeypatch).max_queue_delay_ms / 1000
    assert quantity(pods["target"]["averageValue"]) > 10 * batching_wait


def test_redis(docs):
    deployment = docs[("Deployment", "attnserve-redis")]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "redis:7-alpine"
    args = container["args"]
    assert args[args.index("--maxmemory") + 1] == "256mb" and "allkeys-lru" in args
    service = docs[("Service", "attnserve-redis")]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
